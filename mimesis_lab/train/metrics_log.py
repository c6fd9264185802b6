"""Per-step records of a training job: ``output_dir/metrics.jsonl`` always, MLflow when the job
runs inside a run (``MLFLOW_RUN_ID``, set by the training flow). Rank 0 writes; other ranks hold an
inactive log. Paths in the records are relative to the project root (portable logs)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from mimesis_lab.train.checkpoint import relative_path

__all__ = ["MetricsLog", "PhaseClock", "truncate_jsonl", "window_means"]


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep only the records of ``path`` (JSON lines with a ``step``) up to ``step``."""
    if not path.is_file():
        return
    keep = [ln for ln in path.read_text(encoding="utf-8").splitlines()
            if ln.strip() and json.loads(ln).get("step", 0) <= step]
    path.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")


def window_means(history: list[dict[str, float]], keys: tuple[str, ...], k: int = 3) -> dict[str, Any]:
    """``first_<key>`` / ``last_<key>``: means over the first and last ``k`` steps (``/`` -> ``_``)."""
    def window(key: str, rows: list[dict[str, float]]) -> float | None:
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else None

    out: dict[str, Any] = {}
    for key in keys:
        name = key.replace("/", "_")
        out[f"first_{name}"] = window(key, history[:k])
        out[f"last_{name}"] = window(key, history[-k:])
    return out


class PhaseClock:
    """Wall seconds of a job's phases (start-up, engine, evaluation, steps, checkpoints, export), each summed
    over its repeats: :meth:`lap` charges the time since the previous lap to a phase, so the phases add up to
    the job's time. ``startup_s`` (the process's age when the clock starts: interpreter, imports, params)
    opens the account. The final record carries them (``phases_s``): a short run's fixed costs."""

    def __init__(self, startup_s: float | None):
        self.seconds: dict[str, float] = {} if startup_s is None else {"startup": startup_s}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._last
        self._last = now


class MetricsLog:
    """Rank-0 metrics: always ``out_dir/metrics.jsonl``; MLflow when ``MLFLOW_RUN_ID`` is set."""

    def __init__(self, out_dir: Path, active: bool):
        self.active = active
        self.path = out_dir / "metrics.jsonl"
        self.mlflow = None
        if active and os.environ.get("MLFLOW_RUN_ID"):
            import mlflow

            if os.environ.get("MLFLOW_TRACKING_URI"):
                mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
            mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"])
            self.mlflow = mlflow

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` (written by a killed run that is being resumed)."""
        if self.active:
            truncate_jsonl(self.path, step)

    def history(self) -> list[dict[str, float]]:
        """The ``metrics`` of the ``train`` records written so far (a resumed run continues them)."""
        if not (self.active and self.path.is_file()):
            return []
        recs = [json.loads(ln) for ln in self.path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        return [r["metrics"] for r in recs if r.get("kind") == "train" and "metrics" in r]

    def write(self, record: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        if not self.active:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.mlflow is not None and metrics:
            self.mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None}, step=record["step"])

    def checkpoint(self, step: int, path: Path, info: dict[str, Any]) -> None:
        digests = {k: v["sha256"] for k, v in info["files"].items()}
        self.write({"kind": "checkpoint", "step": step, "path": relative_path(path), "sha256": digests})
        if self.mlflow is not None:
            self.mlflow.log_dict({"path": relative_path(path), "files": info["files"]},
                                 f"checkpoints/{path.name}.json")
            self.mlflow.set_tag("last_checkpoint", relative_path(path))

    def final(self, step: int, final: Path, summary: dict[str, Any], wall_time_s: float,
              phases_s: dict[str, float] | None = None) -> None:
        """Record the export: the summary (also an MLflow artifact), the wall time and the seconds per
        phase (:class:`PhaseClock`), which stay out of the exported folder so that its DVC hash depends on
        the weights only."""
        record = {"kind": "final", "step": step, "path": relative_path(final), "wall_time_s": wall_time_s}
        self.write(record if phases_s is None else {**record, "phases_s": phases_s})
        if self.mlflow is not None:
            self.mlflow.log_dict(summary, "training_summary.json")
            self.mlflow.log_metric("wall_time_s", wall_time_s, step=step)

    def close(self, ok: bool) -> None:
        if self.mlflow is not None:
            self.mlflow.end_run(status="FINISHED" if ok else "FAILED")
