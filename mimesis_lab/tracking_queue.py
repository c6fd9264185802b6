"""Deferred MLflow records for the data stages: a stage writes its run to a local queue and returns; a
background drainer logs the queue to MLflow.

Why: a data stage's own work is about a second, but importing MLflow and opening its SQLAlchemy store cost
about 3.4 s per stage on 2 cores (``bench/bench_overhead.py``). Under ``dvc repro`` (``DVC_STAGE`` set) the
stages of :mod:`stages` therefore *enqueue* their run instead (:func:`enqueue`, no MLflow import) and start
``python -m mimesis_lab.tracking_queue drain`` detached. One drainer at a time holds ``.lock`` in the queue
folder, logs every record in the order it was written (start and end time, tags, params, metrics, the
provenance and the artifacts as they were when the stage ended: the artifacts are copied into the record),
deletes it once MLflow has it, and waits ``IDLE_S`` for more before it exits. A drainer started while
another holds the lock exits at once; the holder re-checks the queue after releasing the lock, so no record
waits on a drainer that has already decided to stop.

Nothing is lost: a record that MLflow refuses moves to ``failed/`` with ``error.txt`` and is counted by
:func:`wait_drained` (the training and evaluation flows call it before their own MLflow work, so the runs
of a ``dvc repro`` appear in MLflow in stage order and two processes never write the store at once), and
``python -m mimesis_lab.tracking_queue drain`` retries it after the cause is fixed (``--retry-failed``).

``MIMESIS_TRACKING_DEFER=0`` logs synchronously, as a stage run by hand outside ``dvc repro`` always does.
"""
from __future__ import annotations

import argparse
import fcntl
import getpass
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from mimesis_lab.config import TrackingParams
from mimesis_lab.tracking_base import PARENT_ENV, dvc_lock_hashes, git_commit, git_dirty, project_root, resolve_tracking_uri

log = logging.getLogger("mimesis.tracking_queue")

DEFER_ENV = "MIMESIS_TRACKING_DEFER"
IDLE_S = 20.0          # a drainer waits this long for the next stage's record before it exits
POLL_S = 0.2
RECORD = "record.json"


def queue_dir(root: Path | None = None) -> Path:
    return (root or project_root()) / ".mimesis" / "tracking_queue"


def deferred() -> bool:
    """Defer under ``dvc repro`` (``DVC_STAGE`` set) unless ``MIMESIS_TRACKING_DEFER=0``; ``=1`` always."""
    flag = os.environ.get(DEFER_ENV, "").strip()
    if flag in ("0", "1"):
        return flag == "1"
    return bool(os.environ.get("DVC_STAGE"))


def _now_ms() -> int:
    return int(time.time() * 1000)


def enqueue(tracking: TrackingParams, stage: str, params: dict[str, Any], metrics: dict[str, float],
            input_hashes: dict[str, str], artifacts: Iterable[Path] = (), tags: dict[str, str] | None = None,
            start_time_ms: int | None = None, root: Path | None = None, start_drainer: bool = True) -> Path | None:
    """Write one data-stage run as a queue record (what :func:`mimesis_lab.tracking.log_stage_run` would log,
    the same tags and params) and start a drainer. Returns the record folder (None when tracking is off)."""
    if not tracking.enabled:
        return None
    root = root or project_root()
    q = queue_dir(root)
    q.mkdir(parents=True, exist_ok=True)
    run_tags = {
        "mimesis.stage": stage, "mimesis.kind": "data",
        "git_commit": git_commit(root) or "unknown", "git_dirty": str(git_dirty(root)),
        # what MLflow's fluent start_run adds from its context, so a deferred run looks like a direct one
        "mlflow.user": _user(), "mlflow.source.name": sys.argv[0] or stage, "mlflow.source.type": "LOCAL",
    }
    commit = run_tags["git_commit"]
    if commit != "unknown":
        run_tags["mlflow.source.git.commit"] = commit
    parent = os.environ.get(PARENT_ENV)
    if parent:
        run_tags["mlflow.parentRunId"] = parent
    run_tags.update(tags or {})
    for name, digest in sorted(input_hashes.items())[:50]:
        run_tags[f"input_sha256.{Path(name).name}"[:250]] = digest
    tmp = q / f".tmp-{uuid.uuid4().hex}"
    (tmp / "artifacts").mkdir(parents=True)
    names = []
    for art in artifacts:
        art = Path(art)
        if art.exists():                       # copied now: the next run of the stage rewrites them
            shutil.copy2(art, tmp / "artifacts" / art.name)
            names.append(art.name)
    record = {
        "tracking": {"tracking_uri": resolve_tracking_uri(tracking.tracking_uri, root),
                     "experiment": tracking.experiment,
                     "artifact_location": str((root / tracking.artifact_location).resolve()
                                              if not Path(tracking.artifact_location).is_absolute()
                                              else Path(tracking.artifact_location))},
        "run_name": stage, "tags": run_tags,
        "params": {k: str(v)[:6000] for k, v in params.items()},
        "metrics": {k: float(v) for k, v in metrics.items()},
        "provenance": {"inputs": input_hashes, "dvc_lock": dvc_lock_hashes(stage, root)},
        "artifacts": names,
        "start_time_ms": start_time_ms or _now_ms(), "end_time_ms": _now_ms(),
    }
    (tmp / RECORD).write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    final = q / f"{time.time_ns():020d}-{stage}-{os.getpid()}"
    os.rename(tmp, final)                      # a drainer sees whole records only
    if start_drainer:
        spawn_drainer(root)
    return final


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:                          # no passwd entry (containers): MLflow falls back the same way
        return "unknown"


def spawn_drainer(root: Path | None = None) -> None:
    """Start ``python -m mimesis_lab.tracking_queue drain`` detached (nothing waits for it)."""
    root = root or project_root()
    try:
        subprocess.Popen([sys.executable, "-m", "mimesis_lab.tracking_queue", "drain", "--no-wait", "--root", str(root)],
                         cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))})
    except OSError as e:                       # the record stays queued; the next drainer or flow logs it
        log.warning("could not start the MLflow queue drainer: %s", e)


def pending(root: Path | None = None) -> list[Path]:
    q = queue_dir(root)
    if not q.is_dir():
        return []
    return sorted(p for p in q.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "failed")


def failed(root: Path | None = None) -> list[Path]:
    f = queue_dir(root) / "failed"
    return sorted(p for p in f.iterdir() if p.is_dir()) if f.is_dir() else []


@contextmanager
def _drain_lock(root: Path | None, blocking: bool = True) -> Iterator[bool]:
    q = queue_dir(root)
    q.mkdir(parents=True, exist_ok=True)
    with open(q / ".lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def log_record(path: Path) -> str:
    """Log one queue record to MLflow; returns the run id."""
    import mlflow
    from mlflow.entities import Metric, Param

    rec = json.loads((path / RECORD).read_text(encoding="utf-8"))
    t = rec["tracking"]
    client = mlflow.MlflowClient(tracking_uri=t["tracking_uri"])
    exp = client.get_experiment_by_name(t["experiment"])
    if exp is None:
        art = Path(t["artifact_location"])
        art.mkdir(parents=True, exist_ok=True)
        try:
            exp_id = client.create_experiment(t["experiment"], artifact_location=art.resolve().as_uri(),
                                              tags={"mlflow.experimentKind": "custom_model_development"})
        except mlflow.exceptions.MlflowException:   # created meanwhile by a flow
            exp_id = client.get_experiment_by_name(t["experiment"]).experiment_id
    else:
        exp_id = exp.experiment_id
    run = client.create_run(exp_id, start_time=rec["start_time_ms"], tags=rec["tags"], run_name=rec["run_name"])
    run_id = run.info.run_id
    try:
        ts = rec["end_time_ms"]
        metrics = [Metric(k, v, ts, 0) for k, v in rec["metrics"].items()]
        params = [Param(k, v) for k, v in rec["params"].items()]
        for i in range(0, max(len(metrics), 1), 1000):
            client.log_batch(run_id, metrics=metrics[i:i + 1000])
        for i in range(0, len(params), 100):
            client.log_batch(run_id, params=params[i:i + 100])
        client.log_dict(run_id, rec["provenance"], "provenance.json")
        for name in rec["artifacts"]:
            client.log_artifact(run_id, str(path / "artifacts" / name))
    except Exception:
        try:                                   # no half-logged run: the record is retried as a whole
            client.delete_run(run_id)
        except Exception:  # noqa: BLE001
            client.set_terminated(run_id, "FAILED", end_time=rec["end_time_ms"])
        raise
    client.set_terminated(run_id, "FINISHED", end_time=rec["end_time_ms"])
    return run_id


def _drain_once(root: Path, counts: dict[str, int]) -> None:
    """Log the records queued now, oldest first (the caller holds the drain lock)."""
    for rec in pending(root):
        try:
            run_id = log_record(rec)
        except Exception as e:  # noqa: BLE001 - kept with its reason, never dropped
            dest = queue_dir(root) / "failed" / rec.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            (rec / "error.txt").write_text(f"{type(e).__name__}: {e}\n", encoding="utf-8")
            os.rename(rec, dest)
            counts["failed"] += 1
            log.error("MLflow refused the queued run %s: %s (kept in %s)", rec.name, e, dest)
        else:
            shutil.rmtree(rec)
            counts["logged"] += 1
            log.info("logged queued run %s -> %s", rec.name, run_id)


def drain(root: Path | None = None, idle_s: float = IDLE_S, retry_failed: bool = False,
          wait_for_lock: bool = True) -> dict[str, int]:
    """Log every queued record (oldest first) while holding the drain lock; wait ``idle_s`` for more.
    A record MLflow refuses moves to ``failed/`` with its error; returns ``{"logged", "failed"}``.

    ``wait_for_lock=False`` (the drainers the stages start): return at once when another drainer holds the
    lock. That one re-checks the queue after releasing the lock, so a record written while it was deciding
    to stop is still logged (by it, or by whoever holds the lock next)."""
    root = root or project_root()
    counts = {"logged": 0, "failed": 0}
    blocking = wait_for_lock
    while True:
        with _drain_lock(root, blocking=blocking) as mine:
            if not mine:
                return counts
            if retry_failed:
                for p in failed(root):
                    (p / "error.txt").unlink(missing_ok=True)
                    os.rename(p, queue_dir(root) / p.name)
                retry_failed = False
            idle_since = time.monotonic()
            while True:
                if pending(root):
                    _drain_once(root, counts)
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= idle_s:
                    break
                else:
                    time.sleep(POLL_S)
        if not pending(root):
            return counts
        blocking = False                       # a record came in as the lock was released


def wait_drained(root: Path | None = None, timeout_s: float = 120.0) -> dict[str, Any]:
    """Wait until every queued record is in MLflow, logging them here when no drainer holds the lock.
    Returns ``{"waited_s", "pending", "failed"}``; a record still queued after ``timeout_s`` is reported,
    not dropped (it stays for the next drainer)."""
    root = root or project_root()
    t0 = time.monotonic()
    counts = {"logged": 0, "failed": 0}
    while pending(root) and time.monotonic() - t0 < timeout_s:
        with _drain_lock(root, blocking=False) as mine:
            if mine:                            # no drainer is running: log them here
                _drain_once(root, counts)
                continue
        time.sleep(POLL_S)
    left, bad = pending(root), failed(root)
    if left or bad:
        log.warning("MLflow queue %s: %d run(s) still queued, %d refused (see error.txt; retry with "
                    "`python -m mimesis_lab.tracking_queue drain --retry-failed`)", queue_dir(root), len(left), len(bad))
    return {"waited_s": round(time.monotonic() - t0, 3), "pending": len(left), "failed": len(bad)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mimesis_lab.tracking_queue")
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drain", help="log the queued data-stage runs to MLflow")
    d.add_argument("--root", type=Path, default=None, help="project root (default: this checkout)")
    d.add_argument("--idle-s", type=float, default=IDLE_S, help="wait this long for more records (default %(default)s)")
    d.add_argument("--retry-failed", action="store_true", help="queue the records MLflow refused again first")
    d.add_argument("--no-wait", action="store_true", help="exit at once when another drainer is running")
    s = sub.add_parser("status", help="count queued and refused records")
    s.add_argument("--root", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.cmd == "status":
        print(json.dumps({"pending": len(pending(args.root)), "failed": len(failed(args.root)),
                          "queue": str(queue_dir(args.root))}))
        return 0
    counts = drain(args.root, idle_s=args.idle_s, retry_failed=args.retry_failed, wait_for_lock=not args.no_wait)
    print(json.dumps(counts))
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
