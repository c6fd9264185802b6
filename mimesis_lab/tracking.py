"""MLflow helpers: the project's sqlite store, provenance tags, one run per stage/phase.

Every run gets: flattened params of its ``params.yaml`` section, the git commit, the
``dvc.lock`` hashes of the stage (when present), input file hashes, and metrics.
A parent run is attached when ``MIMESIS_PARENT_RUN_ID`` is set (flows set it).

**Killed runs.** A run's status is set by the process that created it; a process killed with
SIGKILL (or the machine going down) leaves it ``RUNNING`` for ever. :func:`create_run` therefore
records its creator (:func:`process_identity`: tags ``mimesis.pid``, ``mimesis.host`` and
``mimesis.pid_started``, the process start time that tells a reused pid apart), and the flows call
:func:`mark_killed_runs` when they create a phase's run: every ``RUNNING`` run of that phase in the
experiment whose creator is gone from this host becomes ``FAILED`` with the tag
``mimesis.killed=true``. Runs of other hosts, and runs without the tags (older ones), are left alone.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Iterable

from mimesis_lab.config import TrackingParams
from mimesis_lab.tracking_base import (  # noqa: F401 - re-exported: the module's public names
    PARENT_ENV,
    dvc_lock_hashes,
    file_sha256,
    git_commit,
    git_dirty,
    project_root,
    resolve_tracking_uri,
)


def _setup(tracking: TrackingParams):
    import mlflow

    from mimesis_lab.tracking_queue import wait_drained

    root = project_root()
    wait_drained(root)          # the data stages' queued runs first: store order = stage order, one writer
    mlflow.set_tracking_uri(resolve_tracking_uri(tracking.tracking_uri, root))
    exp = mlflow.get_experiment_by_name(tracking.experiment)
    if exp is None:
        art = Path(tracking.artifact_location)
        art = art if art.is_absolute() else root / art
        art.mkdir(parents=True, exist_ok=True)
        # the UI opens a training experiment on its runs table (not the GenAI traces overview)
        mlflow.create_experiment(tracking.experiment, artifact_location=art.resolve().as_uri(),
                                 tags={"mlflow.experimentKind": "custom_model_development"})
    mlflow.set_experiment(tracking.experiment)
    return mlflow


def log_stage_run(
    tracking: TrackingParams,
    stage: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    input_hashes: dict[str, str],
    artifacts: Iterable[Path] = (),
    tags: dict[str, str] | None = None,
) -> str | None:
    """Record one data-stage run; returns the MLflow run id (None when tracking is off)."""
    if not tracking.enabled:
        return None
    mlflow = _setup(tracking)
    root = project_root()
    run_tags = {
        "mimesis.stage": stage,
        "mimesis.kind": "data",
        "git_commit": git_commit(root) or "unknown",
        "git_dirty": str(git_dirty(root)),
    }
    parent = os.environ.get(PARENT_ENV)
    if parent:
        run_tags["mlflow.parentRunId"] = parent
    run_tags.update(tags or {})
    with mlflow.start_run(run_name=stage, tags=run_tags) as run:
        # MLflow param values are capped in length; keep them as readable strings.
        mlflow.log_params({k: str(v)[:6000] for k, v in params.items()})
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        mlflow.log_dict({"inputs": input_hashes, "dvc_lock": dvc_lock_hashes(stage, root)}, "provenance.json")
        for name, digest in sorted(input_hashes.items())[:50]:
            mlflow.set_tag(f"input_sha256.{Path(name).name}"[:250], digest)
        for path in artifacts:
            if Path(path).exists():
                mlflow.log_artifact(str(path))
        return run.info.run_id


def record_stage_run(tracking: TrackingParams, stage: str, params: dict[str, Any], metrics: dict[str, float],
                     input_hashes: dict[str, str], artifacts: Iterable[Path] = (),
                     start_time_ms: int | None = None) -> str | None:
    """A data stage's MLflow record: queued (:func:`mimesis_lab.tracking_queue.enqueue`) when
    :func:`mimesis_lab.tracking_queue.deferred`, else logged now (:func:`log_stage_run`). Returns a line for the
    stage's log (None: tracking off). Imports no MLflow when the record is queued."""
    if not tracking.enabled:
        return None
    from mimesis_lab.tracking_queue import deferred, enqueue

    if deferred():
        rec = enqueue(tracking, stage, params, metrics, input_hashes, artifacts, start_time_ms=start_time_ms)
        return f"MLflow run queued ({rec.relative_to(project_root()) if rec else '-'}; logged in the background)"
    run_id = log_stage_run(tracking, stage, params, metrics, input_hashes, artifacts)
    return f"MLflow run {run_id}" if run_id else None


# ---------------------------------------------------------------- training runs (flows + jobs)
UI_ENV = "MIMESIS_MLFLOW_UI"


def client(tracking: TrackingParams):
    """An MlflowClient on the project store (experiment created if needed) and the experiment id."""
    mlflow = _setup(tracking)
    exp = mlflow.get_experiment_by_name(tracking.experiment)
    return mlflow.MlflowClient(tracking_uri=mlflow.get_tracking_uri()), exp.experiment_id


def log_metrics(c, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
    """Log ``metrics`` to run ``run_id`` with client ``c`` (:func:`client`) in batches of 500, one timestamp."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    items = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
    for i in range(0, len(items), 500):
        c.log_batch(run_id, metrics=items[i:i + 500])


def tracking_env(tracking: TrackingParams, run_id: str) -> dict[str, str]:
    """Environment that lets a launched job attach to ``run_id`` (``MLFLOW_RUN_ID``)."""
    return {
        "MLFLOW_TRACKING_URI": resolve_tracking_uri(tracking.tracking_uri),
        "MLFLOW_EXPERIMENT_NAME": tracking.experiment,
        "MLFLOW_RUN_ID": run_id,
    }


def provenance(stage: str) -> dict[str, str]:
    root = project_root()
    tags = {"git_commit": git_commit(root) or "unknown", "git_dirty": str(git_dirty(root))}
    for k, v in dvc_lock_hashes(stage, root).items():
        tags[f"dvc.{k}"[:250]] = v
    return tags


def _process_started(pid: int) -> str:
    """The process start time (clock ticks since boot, ``/proc/<pid>/stat`` field 22), ``""`` if unknown."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def process_age_s(pid: int | None = None) -> float | None:
    """Seconds since process ``pid`` (default: this one) started, to a clock tick (10 ms); ``None`` where
    ``/proc`` is unavailable."""
    started = _process_started(os.getpid() if pid is None else pid)
    if not started:
        return None
    return time.clock_gettime(time.CLOCK_BOOTTIME) - int(started) / os.sysconf("SC_CLK_TCK")


def process_identity(pid: int | None = None) -> dict[str, str]:
    """Tags naming a process: ``mimesis.pid``, ``mimesis.host``, ``mimesis.pid_started``."""
    pid = os.getpid() if pid is None else pid
    return {"mimesis.pid": str(pid), "mimesis.host": socket.gethostname(), "mimesis.pid_started": _process_started(pid)}


def process_alive(pid: int, started: str = "") -> bool:
    """Whether process ``pid`` of this host still runs: it exists, is not a zombie, and (when
    ``started`` is given and readable) started at that time, i.e. the pid was not reused."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # exists, another user's
        pass
    try:
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
    except (OSError, IndexError):
        return True
    now = _process_started(pid)
    return not (started and now and now != started)


def _of_phase(tags: dict[str, str], name: str, phase: str) -> bool:
    return (tags.get("mimesis.phase") == phase or name == phase or name.startswith(f"{phase}:")
            or phase in tags.get("mimesis.phases", "").split(","))


def mark_killed_runs(tracking: TrackingParams, phase: str) -> list[str]:
    """Mark ``FAILED`` (tag ``mimesis.killed=true``) every ``RUNNING`` run of ``phase`` — tagged
    ``mimesis.phase``, named ``phase`` or ``phase:…``, or a flow run listing it in ``mimesis.phases`` —
    whose creating process is gone from this host; returns their ids. Call it before creating the
    phase's new run (module docstring)."""
    if not tracking.enabled:
        return []
    c, exp_id = client(tracking)
    host = socket.gethostname()
    killed = []
    for run in c.search_runs([exp_id], filter_string="attributes.status = 'RUNNING'", max_results=5000):
        tags = run.data.tags
        pid = tags.get("mimesis.pid", "")
        if not (_of_phase(tags, run.info.run_name or tags.get("mlflow.runName", ""), phase)
                and tags.get("mimesis.host") == host and pid.isdigit()):
            continue
        if process_alive(int(pid), tags.get("mimesis.pid_started", "")):
            continue
        c.set_tag(run.info.run_id, "mimesis.killed", "true")
        c.set_tag(run.info.run_id, "mimesis.killed_note", f"process {pid} on {host} was gone when the next "
                                                          f"{phase} run started")
        c.set_terminated(run.info.run_id, "FAILED")
        killed.append(run.info.run_id)
    return killed


def create_run(tracking: TrackingParams, name: str, parent_id: str | None = None,
               params: dict[str, Any] | None = None, tags: dict[str, str] | None = None) -> str:
    """Create (and leave open) a run, nested under ``parent_id`` when given, tagged with this process
    (:func:`process_identity`); returns its id."""
    c, exp_id = client(tracking)
    run_tags = {"mlflow.runName": name, **process_identity(), **(tags or {})}
    if parent_id:
        run_tags["mlflow.parentRunId"] = parent_id
    run = c.create_run(exp_id, tags=run_tags, run_name=name)
    if params:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            c.log_batch(run.info.run_id, params=items[i:i + 100])
    return run.info.run_id


def run_url(tracking: TrackingParams, run_id: str) -> str:
    """Link to the run in the MLflow UI (base from ``MIMESIS_MLFLOW_UI``, default 127.0.0.1:5000)."""
    c, exp_id = client(tracking)
    base = os.environ.get(UI_ENV, "http://127.0.0.1:5000").rstrip("/")
    return f"{base}/#/experiments/{exp_id}/runs/{run_id}"


def register_model(tracking: TrackingParams, run_id: str, artifact_path: str, name: str,
                   alias: str, description: str = "") -> str:
    """Register ``runs:/<run>/<artifact_path>`` as a new version of ``name`` and point ``alias`` at it."""
    from mlflow.exceptions import MlflowException

    c, _ = client(tracking)
    try:
        c.create_registered_model(name, description="MIMESIS user simulator checkpoints (HF folders)")
    except MlflowException:
        pass  # already registered
    source = f"{c.get_run(run_id).info.artifact_uri}/{artifact_path}"
    mv = c.create_model_version(name, source=source, run_id=run_id, description=description,
                                tags={"phase": alias})
    c.set_registered_model_alias(name, alias, mv.version)
    return str(mv.version)


def evaluated_model(tracking: TrackingParams, model_path: str | None) -> dict[str, str]:
    """Provenance tags of an evaluated checkpoint ``models/<phase>/final``: the registered model
    version with alias ``<phase>`` (simulator or agent registry) and the run that produced it.
    Empty values when the path is not a pipeline checkpoint or nothing is registered."""
    from mlflow.exceptions import MlflowException

    tags = {"mimesis.evaluated_path": str(model_path or "")}
    parts = Path(str(model_path or "")).parts
    if len(parts) < 2 or parts[-1] != "final":
        return tags
    phase = parts[-2]
    name = tracking.agent_model if phase.startswith("agent") else tracking.simulator_model
    try:
        c, _ = client(tracking)
        mv = c.get_model_version_by_alias(name, phase)
    except MlflowException:
        return tags
    tags.update({"mimesis.evaluated_model": name, "mimesis.evaluated_version": str(mv.version),
                 "mimesis.evaluated_run_id": str(mv.run_id or ""), "mimesis.evaluated_phase": phase})
    return tags
