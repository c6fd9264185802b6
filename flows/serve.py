"""Prefect deployments: one per phase and one for the whole pipeline, served from this checkout.

``python -m flows.serve`` (started for you by ``python -m flows.ui start``) registers and serves:

- ``pipeline/mimesis-pipeline``: ``dvc repro`` (optionally of some stages, optionally forced) in the
  project root — exactly what ``make pipeline`` runs, DVC caching included;
- ``seeds/mimesis-seeds``: the whole chain re-run with other training seeds and its effects pooled over the
  chains (:mod:`flows.seeds`; each chain holds the training concurrency limit while it runs);
- ``phase/<phase>`` for every training and evaluation phase (``midtrain``, ``sft``, ``sim_rl``,
  ``agent_sft``, ``agent_grpo``, ``agent_csd``, ``sim_eval``, ``agent_eval``, ``report``) with typed
  parameters: ``profile`` (``tiny`` | ``paper``), ``steps``, ``seed``, ``alpha`` (CSD) and free
  ``overrides`` (dotted keys; a shared setting lands in its shared group, e.g. ``agent_rl``). The
  merged params are validated and written to ``.prefect/params/<flow-run-id>.yaml``; the phase
  runs the same flow and job as the DVC stage and writes to the same MLflow store (runs started
  with overrides are not recorded by DVC).

Training deployments run one at a time (deployment ``concurrency_limit`` 1, and a global
concurrency limit ``mimesis-training`` of 1 shared by every training phase, so two phases started here
never share the CPU cores; only the ``agent_rl`` stage of a pipeline run trains its two siblings side by side,
by design, each job with half the cores). Each run publishes its summary and MLflow link as Prefect artifacts.
Needs a Prefect server (``PREFECT_API_URL``); the UI launcher sets it.
"""
from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import yaml  # noqa: E402
from prefect import flow, get_run_logger  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from flows.prefect_api import TRAINING_LIMIT  # noqa: E402  (the training slot, shared with flows.seeds)

TRAIN_PHASES = ("midtrain", "sft", "sim_rl", "agent_sft", "agent_grpo", "agent_csd")
EVAL_PHASES = ("sim_eval", "agent_eval", "report")
PHASES = TRAIN_PHASES + EVAL_PHASES
PROFILES = {"tiny": None, "paper": "configs/paper/params.paper.yaml"}

Phase = Literal["midtrain", "sft", "sim_rl", "agent_sft", "agent_grpo", "agent_csd", "sim_eval", "agent_eval",
                "report"]


def set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    """``set_dotted(p, "agent_csd.csd.alpha", 0.02)``; unknown sections are created (validation follows)."""
    parts = key.split(".")
    cur = d
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
        if not isinstance(cur, dict):
            raise ValueError(f"override {key!r}: {p!r} is not a section")
    cur[parts[-1]] = value


def merged_params(phase: str, profile: str = "tiny", steps: int | None = None, seed: int | None = None,
                  alpha: float | None = None, overrides: dict[str, Any] | None = None,
                  base: str | Path = ROOT / "params.yaml") -> dict[str, Any]:
    """params.yaml + the profile + the typed overrides + ``overrides``; validated (raises ConfigError).

    An override of a setting that the phase takes from its shared group (``agent_rl``, ``sft_run``) is
    written to the group, so ``agent_grpo`` and ``agent_csd`` stay siblings by construction; a key the
    phase section writes itself, and ``alpha`` (``agent_csd.csd.alpha``), stay in the phase section."""
    from mimesis_lab.config import merge_profile, override_target, parse_params

    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; expected one of {sorted(PROFILES)}")
    data = yaml.safe_load(Path(base).read_text())
    if PROFILES[profile]:
        data = merge_profile(data, yaml.safe_load((ROOT / PROFILES[profile]).read_text()))
    data = copy.deepcopy(data)

    def put(key: str, value: Any) -> None:
        set_dotted(data, override_target(data, key), value)

    if steps is not None:
        put(f"{phase}.steps", int(steps))
    if seed is not None:
        put(f"{phase}.seed", int(seed))
    if alpha is not None:
        if phase != "agent_csd":
            raise ValueError("alpha is the CSD weight: only for phase agent_csd")
        put("agent_csd.csd.alpha", float(alpha))
    for k, v in (overrides or {}).items():
        put(k, v)
    parse_params(data, f"<{phase} deployment params>")
    return data


def _run_phase_flow(phase: str, params_path: str) -> Any:
    if phase in TRAIN_PHASES:
        from flows.train import train_flow

        return train_flow(phases=[phase], params_path=params_path)[phase]
    from flows.eval import FLOWS as EVAL

    return EVAL[phase](params_path=params_path)


@flow(name="phase", log_prints=True)
def phase_flow(phase: Phase = "agent_grpo", profile: Literal["tiny", "paper"] = "tiny", steps: int | None = None,
               seed: int | None = None, alpha: float | None = None,
               overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """One phase with typed overrides, as the DVC stage runs it (same flow, job and MLflow store)."""
    from prefect.runtime import flow_run

    data = merged_params(phase, profile, steps, seed, alpha, overrides)
    out = ROOT / ".prefect" / "params" / f"{flow_run.get_id() or 'local'}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    print(f"[{phase}] params: {out} (profile {profile}, steps {steps}, seed {seed}, alpha {alpha}, "
          f"overrides {overrides or {}})")
    cwd = os.getcwd()
    os.chdir(ROOT)          # relative paths in params are relative to the project root, as under dvc
    try:
        if phase in TRAIN_PHASES:
            from prefect.concurrency.sync import concurrency

            with concurrency(TRAINING_LIMIT, occupy=1, strict=False):
                result = _run_phase_flow(phase, str(out))
        else:
            result = _run_phase_flow(phase, str(out))
    finally:
        os.chdir(cwd)
    return {"phase": phase, "params": str(out), "result": result if isinstance(result, dict) else str(result)[:2000]}


@flow(name="pipeline", log_prints=True)
def pipeline_flow(stages: list[str] | None = None, force: bool = False) -> dict[str, Any]:
    """``dvc repro [stages] [--force]`` in the project root: the whole pipeline as ``make pipeline``
    runs it (cached stages are skipped). The log streams into the flow run's logs; the metrics
    files and the MLflow link are published as an artifact."""
    import json

    from mimesis_lab.config import load_params
    from mimesis_lab import tracking

    logger = get_run_logger()
    cmd = [sys.executable, "-m", "dvc", "repro", *(stages or [])] + (["--force"] if force else [])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "DVC_NO_ANALYTICS": "1"}
    env.pop("PREFECT__FLOW_RUN_ID", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    ran = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.startswith("Running stage '"):
            ran.append(line.split("'")[1])
        logger.info(line)
    rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"dvc repro failed with exit code {rc} (see the flow run's logs)")
    metrics = {}
    for f in sorted((ROOT / "metrics").glob("*.json")):
        try:
            metrics[f.stem] = json.loads(f.read_text())
        except ValueError:
            continue
    params = load_params(ROOT / "params.yaml")
    base = os.environ.get(tracking.UI_ENV, "http://127.0.0.1:5000").rstrip("/")
    head = metrics.get("report", {})
    body = "\n".join(f"| {k} | {v:.4g} |" for k, v in head.items() if isinstance(v, (int, float)))
    md = (f"# MIMESIS pipeline\n\nStages run: {', '.join(ran) or 'none (all up to date)'}\n\n"
          f"MLflow: [{base}]({base}) (experiment `{params.tracking.experiment}`)\n\n"
          f"Report: `{params.report.output if params.report else 'n/a'}`\n\n| headline | value |\n|---|---|\n{body}\n")
    create_markdown_artifact(markdown=md, key="mimesis-pipeline", description="Pipeline run summary")
    return {"ran": ran, "metrics_files": sorted(metrics)}


def deployments() -> list[Any]:
    """The RunnerDeployments served by :func:`main` (one per phase + the pipeline)."""
    deps = [pipeline_flow.to_deployment(name="mimesis-pipeline", concurrency_limit=1, tags=["mimesis", "pipeline"],
                                        description="dvc repro of the whole pipeline (cached stages skipped).")]
    from flows.seeds import seeds_flow

    deps.append(seeds_flow.to_deployment(
        name="mimesis-seeds", concurrency_limit=1, tags=["mimesis", "seeds"],
        description="The whole chain re-run with other training seeds (clones of HEAD), effects pooled over chains: "
                    "reports/seeds.md, metrics/seeds.json."))
    for phase in PHASES:
        deps.append(phase_flow.to_deployment(
            name=phase, parameters={"phase": phase}, concurrency_limit=1,
            tags=["mimesis", "training" if phase in TRAIN_PHASES else "evaluation"],
            description=f"The `{phase}` phase with typed overrides (profile, steps, seed, alpha, dotted keys)."))
    return deps


def ensure_training_limit(limit: int = 1) -> None:
    """Create the global concurrency limit shared by the training phases (idempotent)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as c:
        try:
            c.read_global_concurrency_limit_by_name(TRAINING_LIMIT)
        except Exception:
            c.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=TRAINING_LIMIT, limit=limit))


def main(argv: list[str] | None = None) -> int:
    from prefect import serve

    ap = argparse.ArgumentParser(prog="flows.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=2, help="flow runs executed at once by this server process")
    args = ap.parse_args(argv)
    if not os.environ.get("PREFECT_API_URL"):
        print("flows.serve needs a Prefect server: run `python -m flows.ui start` (it serves the deployments), "
              "or set PREFECT_API_URL", file=sys.stderr)
        return 2
    ensure_training_limit()
    serve(*deployments(), limit=args.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
