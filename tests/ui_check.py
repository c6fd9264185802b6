"""Browser check of the UIs (issue: operator experience): headless Chromium (Debian's, driven by
Playwright) loads the MLflow UI and finds the experiment, the GRPO and CSD runs and their compare
view with the reward metric; loads the Prefect UI and finds a completed ``pipeline`` flow run.
Screenshots are saved to ``shots``.

Used by ``tests/test_pipeline_dvc.py::test_uis_in_a_browser`` on the pipeline's project copy; also a
script against any project with the UIs running::

    python -m tests.ui_check --mlflow http://127.0.0.1:5000 --prefect http://127.0.0.1:4200 --out shots/
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import urllib.parse
import urllib.request
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def chromium_path() -> str | None:
    for c in CHROMIUM_CANDIDATES:
        if Path(c).exists():
            return c
    return shutil.which("chromium")


def check(mlflow_url: str, prefect_url: str, experiment_id: str, grpo_run: str, csd_run: str,
          shots: Path, timeout_ms: int = 60000) -> dict[str, str]:
    """Drive the pages; raise AssertionError (with the page text) when something is missing."""
    from playwright.sync_api import sync_playwright

    shots.mkdir(parents=True, exist_ok=True)
    found: dict[str, str] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(timeout_ms)

        # MLflow: the experiment lists both agent runs
        page.goto(f"{mlflow_url}/#/experiments/{experiment_id}/runs")
        page.get_by_text("agent_csd", exact=False).first.wait_for()
        page.get_by_text("agent_grpo", exact=False).first.wait_for()
        page.screenshot(path=str(shots / "mlflow_experiment.png"), full_page=True)
        found["mlflow_experiment"] = page.url

        # MLflow: the compare view of the GRPO and CSD runs (side by side: CSD's own metrics are there,
        # NaN for GRPO)
        runs = json.dumps([grpo_run, csd_run])
        exps = json.dumps([experiment_id])
        page.goto(f"{mlflow_url}/#/compare-runs?" + urllib.parse.urlencode({"runs": runs, "experiments": exps}))
        page.get_by_text("Comparing 2 Runs", exact=False).first.wait_for()
        page.get_by_text("csd/coached_turn_share", exact=False).first.wait_for()
        page.screenshot(path=str(shots / "mlflow_compare.png"), full_page=True)
        found["mlflow_compare"] = page.url

        # MLflow: both reward curves on one chart
        page.goto(f"{mlflow_url}/#/metric?" + urllib.parse.urlencode({
            "runs": runs, "metric": json.dumps("reward/mean"), "experiments": exps,
            "plot_metric_keys": json.dumps(["reward/mean"])}))
        page.get_by_text("agent_grpo (reward/mean)", exact=False).first.wait_for()
        page.get_by_text("agent_csd (reward/mean)", exact=False).first.wait_for()
        page.screenshot(path=str(shots / "mlflow_reward_curves.png"), full_page=True)
        found["mlflow_reward_curves"] = page.url

        # Prefect: a completed run of the `pipeline` flow (its flow page lists its runs and their states)
        with urllib.request.urlopen(f"{prefect_url}/api/flows/name/pipeline", timeout=30) as r:
            flow_id = json.loads(r.read())["id"]
        page.goto(f"{prefect_url}/flows/flow/{flow_id}")
        page.get_by_text("pipeline", exact=False).first.wait_for()
        page.get_by_text("Completed", exact=False).first.wait_for()
        page.screenshot(path=str(shots / "prefect_pipeline_runs.png"), full_page=True)
        page.goto(f"{prefect_url}/runs")
        page.get_by_text("pipeline", exact=False).first.wait_for()
        page.screenshot(path=str(shots / "prefect_runs.png"), full_page=True)
        found["prefect_runs"] = f"{prefect_url}/flows/flow/{flow_id}"
        browser.close()
    return found


def main(argv: list[str] | None = None) -> int:
    import mlflow

    ap = argparse.ArgumentParser(prog="tests.ui_check")
    ap.add_argument("--mlflow", default="http://127.0.0.1:5000")
    ap.add_argument("--prefect", default="http://127.0.0.1:4200")
    ap.add_argument("--experiment", default="mimesis")
    ap.add_argument("--out", type=Path, default=Path("shots"))
    args = ap.parse_args(argv)
    c = mlflow.MlflowClient(tracking_uri=args.mlflow)
    exp = c.get_experiment_by_name(args.experiment)
    runs: dict[str, str] = {}
    for r in c.search_runs([exp.experiment_id], filter_string="tags.`mimesis.kind` = 'train'"):
        runs.setdefault(r.info.run_name, r.info.run_id)          # newest first
    print(json.dumps(check(args.mlflow, args.prefect, exp.experiment_id, runs["agent_grpo"], runs["agent_csd"],
                           args.out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
