"""Integration: the real `dvc repro` over the data stages on a copy of the project.

Checks the DVC contract of the data stages (run up to ``validate``): a full run succeeds, every stage's metrics hold
`rows_in == rows_out + rows_quarantined`, a second `dvc repro` is a no-op in <= 8 s (best of 3),
changing one stage's params re-runs only that stage and its dependants, an edit of one stage's source re-runs only
that stage (code fingerprints, :mod:`mimesis_lab.code_deps`), and every stage
run is recorded in the project's MLflow store with params, counts and provenance.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

DATA_STAGES = ["world", "role_swap", "thoughttrace", "behaviors", "behavior_tasks", "splits", "gyms", "validate"]
TEST_PROFILE = "configs/test/params.test.yaml"   # the small profile the suite runs the pipeline on


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.update(DVC_NO_ANALYTICS="1", GX_ANALYTICS_ENABLED="false", PYTHONUNBUFFERED="1")
    env.pop("MIMESIS_PARENT_RUN_ID", None)
    return env


def _repro(cwd: Path, *args: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    res = subprocess.run(["dvc", "repro", *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=1500)
    dt = time.perf_counter() - t0
    assert res.returncode == 0, f"dvc repro failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout + res.stderr, dt


def _ran(output: str) -> set[str]:
    return {s for s in DATA_STAGES if f"Running stage '{s}'" in output}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("project")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file() and not rel.startswith(("tests/", "bench/")):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    subprocess.run([sys.executable, "-m", "mimesis_lab.config", "--params", "params.yaml", "--profile", TEST_PROFILE,
                    "-o", "params.yaml"], cwd=dst, check=True, env=_env())
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dst, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], cwd=dst, check=True)
    out, _ = _repro(dst, "validate")
    dst.joinpath("first_run.log").write_text(out)
    return dst


def test_full_run_accounts_for_every_row(project):
    assert _ran(project.joinpath("first_run.log").read_text()) == set(DATA_STAGES)
    for stage in ["world", "role_swap", "thoughttrace", "behaviors", "behavior_tasks", "splits", "gyms"]:
        m = json.loads((project / "metrics" / f"{stage}.json").read_text())
        assert m["rows_in"] == m["rows_out"] + m["rows_quarantined"], stage
        assert (project / "data" / "quarantine" / f"{stage}.parquet").exists()
    world = json.loads((project / "metrics" / "world.json").read_text())
    assert world["files"]["thoughttrace/thoughttrace.jsonl"] == 80          # the test profile's world
    gy = json.loads((project / "metrics" / "gyms.json").read_text())
    assert all(gy["sizes"][s] > 0 for s in ("train", "val", "test"))
    assert all((project / "data" / "gyms" / f"{s}.parquet").exists() for s in ("train", "val", "test"))
    v = json.loads((project / "metrics" / "validate.json").read_text())
    assert v["suites"] and all(s["success"] for s in v["suites"].values())
    assert {"gyms/train", "gyms/val", "gyms/test", "metrics/gyms"} <= set(v["suites"])


def test_second_repro_is_a_fast_noop(project):
    times = []
    for _ in range(3):   # best of three: the Prefect server the data stages pre-started may still be starting
        out, dt = _repro(project, "validate")
        assert _ran(out) == set(), out
        times.append(dt)
    dt = min(times)
    # dvc's own start-up and hashing: 2.5 s on an idle 2-core machine, 3.8 s on a slower CI one, 5.8 s once in a
    # clean-clone CI run sharing its 2 cores with another test run. A stage that ran fails _ran above; the bound
    # catches a no-op gone slow (one that re-hashes every output, say).
    assert dt <= 8.0, f"no-op dvc repro took {times} s"


def test_source_edit_reruns_only_the_stages_importing_it(project):
    """Code deps reach DVC as one fingerprint per stage (data/code/<stage>.txt, written by the `code` stage):
    an edit of stages/gyms.py re-runs `gyms` alone (its outputs are unchanged, so `validate` is not re-run), and
    the fingerprint names the file with its new hash."""
    import hashlib

    path = project / "stages" / "gyms.py"
    path.write_text(path.read_text() + "\n# an edit that changes no output\n")
    out, _ = _repro(project, "validate")
    assert "Running stage 'code'" in out and _ran(out) == {"gyms"}, out
    assert f"{hashlib.sha256(path.read_bytes()).hexdigest()}  stages/gyms.py" in \
        (project / "data" / "code" / "gyms.txt").read_text()
    out, _ = _repro(project, "validate")
    assert "Running stage" not in out, out


@pytest.mark.long
def test_param_change_reruns_only_dependants(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["splits"]["seed"] = params["splits"]["seed"] + 1
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out, _ = _repro(project, "validate")
    assert _ran(out) == {"splits", "validate"}, out
    params["thoughttrace"]["include_reactions"] = True
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out, _ = _repro(project, "validate")
    assert _ran(out) == {"thoughttrace", "behaviors", "splits", "validate"}, out


def test_each_params_section_reaches_its_stage_in_dvc_yaml():
    """The cheap half of the param-change contract, for every stage (`dvc repro` above runs two of them):
    each stage that reads a params section names it, so a change there re-runs that stage."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name in ("world", "role_swap", "thoughttrace", "behaviors", "behavior_tasks", "splits", "gyms"):
        deps = stages[name].get("params") or []
        keys = {k for d in deps for k in ([d] if isinstance(d, str) else [x for v in d.values() for x in v])}
        assert name in keys or any(str(k).startswith(f"{name}.") for k in keys), (name, deps)


def test_stage_runs_recorded_in_mlflow(project):
    import mlflow

    from mimesis_lab.tracking_queue import failed, wait_drained

    # under dvc repro the data stages queue their runs; a background drainer logs them (a flow waits the same way)
    assert wait_drained(project, timeout_s=120)["pending"] == 0 and failed(project) == []

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mimesis")
    runs = client.search_runs([exp.experiment_id])
    by_name = {}
    for r in runs:
        by_name.setdefault(r.info.run_name, r)
    assert set(DATA_STAGES) <= set(by_name)
    rs = by_name["role_swap"]
    assert rs.data.metrics["rows_in"] == rs.data.metrics["rows_out"] + rs.data.metrics["rows_quarantined"]
    assert "role_swap.seed" in rs.data.params
    assert len(rs.data.tags["git_commit"]) == 40
    assert any(k.startswith("input_sha256.") for k in rs.data.tags)


TRAIN_STAGES = ["tokenizer", "midtrain", "sft", "sim_rl", "agent_traces", "agent_sft", "agent_rl"]
EVAL_STAGES = ["sim_eval", "agent_eval", "report"]


@pytest.mark.long
@pytest.mark.timeout(1800)
def test_full_repro_trains_through_sim_rl(project):
    """`dvc repro` continues past the data stages: tokenizer -> midtrain -> sft -> sim_rl -> agents
    -> evaluation -> report (real Prefect + DeepSpeed + MLflow), then is a no-op."""
    env_out, dt = _repro(project)
    project.joinpath("full_run.log").write_text(env_out + f"\n[full repro wall time {dt:.0f} s]\n")
    ran = {s for s in TRAIN_STAGES + EVAL_STAGES if f"Running stage '{s}'" in env_out}
    assert ran == set(TRAIN_STAGES + EVAL_STAGES), env_out[-3000:]
    for phase in ("midtrain", "sft"):
        m = json.loads((project / "metrics" / f"{phase}.json").read_text())
        assert m["steps"] > 0 and m["final_val_loss"] < m["initial_val_loss"], m
        assert (project / "models" / phase / "final" / "config.json").exists()
    rl = json.loads((project / "metrics" / "sim_rl.json").read_text())
    assert rl["steps"] > 0 and rl["rollouts_total"] > 0 and rl["registered_version"]
    assert set(rl["task_rows"]) == {"usersim_behavior", "usersim_next_turn", "usersim_persona", "usersim_tom"}
    assert (project / "models" / "sim_rl" / "final" / "config.json").exists()
    tr = json.loads((project / "metrics" / "agent_traces.json").read_text())
    assert tr["rows_in"] == tr["rows_out"] + tr["rows_quarantined"] and tr["sizes"]["train"] > 0
    assert all(v["success"] for v in tr["validation"].values())
    sft = json.loads((project / "metrics" / "agent_sft.json").read_text())
    assert sft["final_val_loss"] < sft["initial_val_loss"], sft
    _check_agent_runs_in_mlflow(project)
    _check_evaluation(project)
    # the best of two no-op runs: the shared Prefect server this run started is still up (idle timeout)
    # and its background services share the 2 cores with the first timing (6.03 s seen once in CI)
    times = []
    for _ in range(2):
        out, dt = _repro(project)
        assert "Running stage" not in out, out
        times.append(dt)
    assert min(times) <= 6.0, f"no-op dvc repro of the whole pipeline took {times} s"   # 2.5 s on an idle 2-core machine


def _check_agent_runs_in_mlflow(project: Path) -> None:
    """agent_grpo and agent_csd: sibling child runs (same initial agent and seed) with per-step
    reward curves; CSD adds its own per-step metrics; both agents registered with their alias."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mimesis")
    runs = {}
    for r in client.search_runs([exp.experiment_id], filter_string="tags.`mimesis.kind` = 'train'"):
        runs.setdefault(r.info.run_name, r)
    grpo, csd = runs["agent_grpo"], runs["agent_csd"]
    for r in (grpo, csd):
        assert r.info.status == "FINISHED"
        hist = client.get_metric_history(r.info.run_id, "reward/mean")
        assert len(hist) >= 2, r.info.run_name
        assert "invalid_total" in r.data.metrics and "tool_call_error_rate" in r.data.metrics
    # one param prefix for both siblings: MLflow's compare view lines them up row by row
    assert grpo.data.params["agent.init_from"] == csd.data.params["agent.init_from"]
    assert grpo.data.params["agent.seed"] == csd.data.params["agent.seed"]
    assert (grpo.data.params["phase"], csd.data.params["phase"]) == ("agent_grpo", "agent_csd")
    assert "agent.csd.alpha" in csd.data.params and "agent.csd.alpha" not in grpo.data.params
    assert float(csd.data.params["agent.csd.alpha"]) > 0
    for key in ("csd/coached_turn_share", "csd/coach_ok", "csd/leaks_dropped", "csd/rows_skipped_width"):
        assert key in csd.data.metrics, key
    assert not any(k.startswith("csd/") for k in grpo.data.metrics)
    versions = {v.version: v for v in client.search_model_versions("name='mimesis-agent'")}
    aliases = client.get_registered_model("mimesis-agent").aliases
    assert {"agent_sft", "agent_grpo", "agent_csd"} <= set(aliases), aliases
    assert versions


def _check_evaluation(project: Path) -> None:
    """sim_eval, agent_eval and report: DVC metrics, the report, and MLflow eval runs tagged with the
    evaluated model's registered version and training run."""
    import mlflow

    sim = json.loads((project / "metrics" / "sim_eval.json").read_text())
    assert set(sim) == {"mimesis", "sft", "prompted", "base"}
    for name, m in sim.items():
        assert 0 <= m["fi"] <= 100 and "usi5" in m and "turing_distance" in m, (name, m)
    ag = json.loads((project / "metrics" / "agent_eval.json").read_text())
    assert set(ag["overall"]["mean"]) == {"base", "grpo", "csd"}
    assert set(ag["per_user"]) == {"scripted", "midtrain_sim", "prompted"}
    assert ag["counts"]["rollouts"] == 3 * 3 * 8 * 2
    report = (project / "reports" / "report.md").read_text()
    assert "Overall Mean" in report and "Simulator benchmarks" in report
    for png in ("reward_curves.png", "per_gym.png", "fi_dims.png"):
        assert (project / "reports" / "plots" / png).stat().st_size > 1000, png
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{project / 'mlflow' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mimesis")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`mimesis.kind` = 'eval'")
    names = {r.info.run_name: r for r in runs}
    assert {"sim_eval", "agent_eval", "sim_eval:mimesis", "agent_eval:grpo", "agent_eval:csd"} <= set(names)
    grpo = names["agent_eval:grpo"]
    train = {r.info.run_name: r for r in client.search_runs(
        [exp.experiment_id], filter_string="tags.`mimesis.kind` = 'train'")}
    assert grpo.data.tags["mimesis.evaluated_run_id"] == train["agent_grpo"].info.run_id
    assert grpo.data.tags["mimesis.evaluated_version"]
    assert "mean/overall" in grpo.data.metrics
    assert names["sim_eval:mimesis"].data.tags["mimesis.evaluated_run_id"] == train["sim_rl"].info.run_id


@pytest.mark.long
@pytest.mark.browser
@pytest.mark.timeout(900)
def test_uis_in_a_browser(project):
    """The operator path on the pipeline's own stores: `python -m flows.ui start` serves the Prefect
    and MLflow UIs and the deployments; a run of the `pipeline` deployment (dvc repro: all cached)
    and of the `report` phase deployment complete through the Prefect API and write to the same
    MLflow store; headless Chromium finds the experiment, the GRPO and CSD runs, their compare view
    with `reward/mean`, and the completed pipeline flow run. Screenshots: test-artifacts/screenshots/."""
    from tests import ui_check

    if ui_check.chromium_path() is None:
        pytest.skip("no chromium installed (`apt-get install chromium`; `make test-all` runs this test)")
    pytest.importorskip("playwright")
    import mlflow

    from flows import ui
    from mimesis_lab.train.launch import free_port

    if not (project / "reports" / "report.md").exists():
        pytest.skip("needs the full repro of test_full_repro_trains_through_sim_rl")
    state = ui.start(project, prefect_port=free_port(), mlflow_port=free_port(), timeout_s=240)
    try:
        env = {**_env(), "PREFECT_API_URL": state["prefect_api"], "PREFECT_HOME": str(project / ".prefect"),
               "PYTHONPATH": str(project)}
        code = ("import sys, time\n"
                "from prefect.deployments import run_deployment\n"
                "for name, params in (('pipeline/mimesis-pipeline', {}), ('phase/report', {'phase': 'report'})):\n"
                "    deadline = time.time() + 120\n"
                "    while True:\n"
                "        try:\n"
                "            r = run_deployment(name, parameters=params, timeout=600)\n"
                "            break\n"
                "        except Exception as e:  # the served deployments register a few seconds after start\n"
                "            if time.time() > deadline: raise\n"
                "            time.sleep(2)\n"
                "    print(name, r.state.type.value, flush=True)\n"
                "    assert r.state.is_completed(), (name, r.state)\n")
        res = subprocess.run([sys.executable, "-c", code], cwd=project, env=env, capture_output=True, text=True,
                             timeout=780)
        serve_log = (project / ".ui" / "serve.log").read_text()[-4000:] if (project / ".ui" / "serve.log").exists() else ""
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:] + serve_log
        client = mlflow.MlflowClient(tracking_uri=state["mlflow_ui"])
        exp = client.get_experiment_by_name("mimesis")
        reports = client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'report'")
        assert len(reports) >= 2, "the report deployment did not write to the pipeline's MLflow store"
        runs: dict[str, str] = {}
        for r in client.search_runs([exp.experiment_id], filter_string="tags.`mimesis.kind` = 'train'"):
            runs.setdefault(r.info.run_name, r.info.run_id)          # newest first
        shots = ROOT / "test-artifacts" / "screenshots"
        found = ui_check.check(state["mlflow_ui"], state["prefect_ui"], exp.experiment_id, runs["agent_grpo"],
                               runs["agent_csd"], shots)
        assert set(found) == {"mlflow_experiment", "mlflow_compare", "mlflow_reward_curves", "prefect_runs"}
        assert all((shots / f).stat().st_size > 5000 for f in ("mlflow_experiment.png", "mlflow_compare.png",
                                                                "mlflow_reward_curves.png", "prefect_runs.png"))
    finally:
        ui.stop(project)
