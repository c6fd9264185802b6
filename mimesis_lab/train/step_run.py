"""Bookkeeping of a step-based training job (the RL recipes): resume or fresh start, per-step
metrics and episode logs, checkpoint cadence, and the final export with its summary.

The recipe keeps its loop; this object only does what every recipe would otherwise repeat::

    run = StepRun(phase, cfg, engine, tokenizer, fingerprint, rank, world, t_start=job.t_start)
    step = run.start(resume, info)                 # loads the checkpoint or clears old outputs
    while step < cfg.steps:
        t0 = time.perf_counter()
        metrics, records = ...                     # one rollout batch + update (rank 0's metrics)
        step += 1
        run.end_step(step, metrics, records, t0)   # logs, episodes, checkpoint every save_every
    summary = run.finish(summary_fields)           # export to output_dir/final

Checkpoints carry the fingerprint (``resume: auto`` continues only the same run, see
:mod:`mimesis_lab.train.checkpoint`); a resumed run truncates the logs of the killed run after
its checkpoint and continues the metric history from ``metrics.jsonl``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from mimesis_lab.progress import Progress
from mimesis_lab.train.checkpoint import (CHECKPOINTS, MARKER, ResumeError, checkpoint_at, clear_outputs,
                                          drop_checkpoints_after, export_final, final_checkpoint,
                                          load_resume_checkpoint, save_checkpoint)
from mimesis_lab.train.metrics_log import MetricsLog, truncate_jsonl
from mimesis_lab.train.runtime import say

__all__ = ["StepRun", "EPISODES"]

EPISODES = "rollouts.jsonl"


class StepRun:
    """See the module docstring. Rank 0 writes; every rank takes part in checkpoints."""

    def __init__(self, phase: str, cfg: Any, engine: Any, tokenizer: Any, fingerprint: str, rank: int, world: int,
                 show: Sequence[str] = (), *, t_start: float):
        self.phase, self.cfg, self.engine, self.tokenizer = phase, cfg, engine, tokenizer
        self.fingerprint, self.rank, self.world = fingerprint, rank, world
        self.show = tuple(show)
        self.out_dir = Path(cfg.output_dir)
        self.ckpt_root = self.out_dir / CHECKPOINTS
        self.episodes = self.out_dir / EPISODES
        self.total = cfg.steps
        self.info: dict[str, Any] = {}
        self.history: list[dict[str, float]] = []
        self.t_start = t_start        # wall_time_s counts from here: the job's opening (PolicyJob.t_start)
        self.log = MetricsLog(self.out_dir, rank == 0)
        self.prog: Progress | None = None

    def start(self, resume: tuple[Path, str] | None, info: dict[str, Any]) -> int:
        """Load ``resume`` (or clear the outputs of an earlier run); log the start record; the first step."""
        step = 0
        if resume is not None:
            root, tag = resume
            client = load_resume_checkpoint(self.engine, root, tag)
            step = int(client["step"])
            if step > self.total:
                raise ResumeError(f"{root / tag}: checkpoint is at step {step}, past this run's {self.total} steps")
            if self.rank == 0:
                drop_checkpoints_after(self.ckpt_root, step)
                self.log.truncate_after(step)
                truncate_jsonl(self.episodes, step)
            say(self.rank, f"resumed from {root / tag} at step {step}")
        elif self.rank == 0:
            clear_outputs(self.out_dir, self.ckpt_root, ("metrics.jsonl", EPISODES))
        self.info = dict(info)
        self.log.write({"kind": "start", "step": step, "phase": self.phase, "world_size": self.world,
                        "zero_stage": self.engine.zero_optimization_stage(), "total_steps": self.total,
                        "resumed": resume is not None, **self.info})
        say(self.rank, f"{self.phase}: {self.info}, steps {step}->{self.total}, "
                       f"ZeRO-{self.engine.zero_optimization_stage()}")
        if self.rank == 0 and resume is not None:
            self.history = self.log.history()
        self.engine.train()
        self.prog = Progress(self.total, self.phase, unit="step", initial=step, mode="off")
        return step

    def save(self, step: int) -> None:
        client = {"step": step, "phase": self.phase, "fingerprint": self.fingerprint, "world_size": self.world,
                  "total_steps": self.total}
        save_checkpoint(self.engine, self.ckpt_root, step, client, self.log, self.cfg.keep_last, self.rank,
                        self.world)

    def end_step(self, step: int, metrics: dict[str, float] | None, records: list[dict[str, Any]],
                 started: float) -> None:
        """After step ``step`` (counted from 1): rank 0 logs ``metrics`` and appends ``records`` to the
        episode log; every ``save_every`` steps all ranks checkpoint."""
        self.prog.update(1)
        if self.rank == 0 and metrics is not None:
            metrics["step_time_s"] = time.perf_counter() - started
            self.history.append(metrics)
            if getattr(self.cfg, "save_rollouts", True) and records:
                with open(self.episodes, "a", encoding="utf-8") as f:
                    for r in records:
                        f.write(json.dumps({"step": step, **r}, default=str) + "\n")
            if step % self.cfg.log_every == 0 or step == self.total:
                self.log.write({"kind": "train", "step": step, "metrics": metrics}, metrics)
                shown = {k: round(v, 4) for k, v in metrics.items() if k in self.show}
                say(self.rank, self.prog.line({**shown, "step_s": round(metrics["step_time_s"], 2)}))
        if step % self.cfg.save_every == 0:
            self.save(step)

    def finish(self, summary_fields: dict[str, Any]) -> dict[str, Any] | None:
        """Checkpoint the last step where the export reads it (:func:`~mimesis_lab.train.checkpoint.final_checkpoint`),
        export ``output_dir/final`` with its ``training_summary.json`` (rank 0; deterministic: no wall time, no
        absolute path)."""
        import torch.distributed as dist

        source = final_checkpoint(self.engine, self.ckpt_root, self.total)
        if source is not None and not (source / MARKER).is_file():
            self.save(self.total)
        summary = None
        if self.rank == 0:
            final = self.out_dir / "final"
            export_final(self.engine, self.tokenizer, source, final)
            summary = {"phase": self.phase, "steps": self.total, "world_size": self.world,
                       "zero_stage": self.engine.zero_optimization_stage(), **self.info, **summary_fields,
                       "checkpoint": checkpoint_at(self.ckpt_root, self.total)}
            (final / "training_summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
            self.log.final(self.total, final, summary, time.time() - self.t_start)
            say(self.rank, f"exported {final}")
        dist.barrier()
        return summary

    def close(self, ok: bool) -> None:
        self.log.close(ok)
