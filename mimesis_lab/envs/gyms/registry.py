"""All bundled gyms by ``data_source``: their task loaders, row builders and Gym classes.

Train on five gyms, evaluate on eight (SPEC §3.1): :data:`TRAIN_GYMS` are used for agent
training (train/val rows), :data:`HELD_OUT_GYMS` only for evaluation.
"""
from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType
from typing import Any

from mimesis_lab.envs.gyms import function, intention, persuade, search, tau, telepathy, travel, turtle
from mimesis_lab.envs.gyms.base import GYMS, Gym, UserSide, create_kwargs

__all__ = ["MODULES", "TRAIN_GYMS", "HELD_OUT_GYMS", "ALL_GYMS", "load_tasks", "gym_for_row", "TaskLookupError"]

MODULES: dict[str, ModuleType] = {m.__name__.rsplit(".", 1)[1]: m for m in
                                  (travel, turtle, function, tau, persuade, intention, telepathy, search)}
TRAIN_GYMS = ("travel", "turtle", "function", "tau", "persuade")
HELD_OUT_GYMS = ("intention", "telepathy", "search")
ALL_GYMS = TRAIN_GYMS + HELD_OUT_GYMS


class TaskLookupError(KeyError):
    """A row whose task id is not in its gym's task file (the message names both)."""


def load_tasks(gym: str, path: str | Path | None = None, **options: Any) -> dict[str, dict[str, Any]]:
    """Tasks of ``gym`` by id, from ``path`` or the bundled file; ``options`` go to the gym's loader
    (``GymsParams.task_options(gym)``: tau's ``db``, search's ``corpus``)."""
    mod = MODULES[gym]
    return mod.load_tasks(path, **options) if path is not None else mod.load_tasks(**options)


def gym_for_row(row: dict[str, Any], tasks: dict[str, dict[str, dict[str, Any]]], user: UserSide | None,
                rng: random.Random, max_steps: int = 16) -> Gym:
    """The episode of a UserRL row: its gym (by ``data_source``) on the task its create_kwargs name.

    ``tasks`` maps gym name → (task id → task), e.g. ``{g: load_tasks(g) for g in ALL_GYMS}``.
    """
    ds = str(row.get("data_source"))
    if ds not in GYMS:
        raise KeyError(f"no gym for data_source {ds!r} (known: {sorted(GYMS)})")
    name = ds.removeprefix("interact_")
    tid = str(create_kwargs(row).get("id") or (row.get("reward_model") or {}).get("id"))
    task = (tasks.get(name) or {}).get(tid)
    if task is None:
        raise TaskLookupError(f"{ds}: task id {tid!r} is not in the {name} task file")
    return GYMS[ds](task, user=user, rng=rng, max_steps=max_steps)
