"""Task rows for the simulator-RL mixture: ``data_source`` → rows from a split parquet.

- ``usersim_behavior``: the ABCD behaviour-task rows of the ``behaviors`` stage (split by ``splits``).
- ``usersim_next_turn`` / ``usersim_persona`` / ``usersim_tom``: built from ThoughtTrace split
  rows (:mod:`mimesis_lab.envs.usersim_tasks`); conversations that cannot make a row are
  skipped *with a reason* and counted (the job logs the counts).

Importing this module registers every task.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import mimesis_lab.envs.behavior_task as behavior_task
import mimesis_lab.envs.usersim_tasks as usersim_tasks
from mimesis_lab.envs.base import TASKS

__all__ = ["load_task_rows", "TaskDataError"]


class TaskDataError(ValueError):
    """A task's data file is missing or has no usable row; the message names the file and task."""


def load_task_rows(data_source: str, path: str | Path, max_rows: int | None = None
                   ) -> tuple[list[dict[str, Any]], int]:
    """Rows of ``data_source`` from ``path`` (first ``max_rows``) and the number of skipped source rows."""
    if data_source not in TASKS:
        raise TaskDataError(f"sim_rl.tasks: unknown data_source {data_source!r} (known: {sorted(TASKS)})")
    p = Path(path)
    if not p.is_file():
        raise TaskDataError(f"{p}: task data for {data_source} not found (run `dvc repro splits`?)")
    skipped = 0
    if data_source == behavior_task.BehaviorEpisode.data_source:
        rows = behavior_task.load_behavior_rows(p)
    else:
        rows, skips = usersim_tasks.build_rows_with_skips(data_source, usersim_tasks.load_thoughttrace_rows(p))
        skipped = len(skips)
    if max_rows is not None:
        rows = rows[:max_rows]
    if not rows:
        raise TaskDataError(f"{p}: no usable {data_source} rows ({skipped} source rows skipped)")
    return rows, skipped
