"""All bundled gyms by ``data_source``: their task loaders, row builders and Gym classes.

Train on five gyms, evaluate on eight (SPEC §3.1): :data:`TRAIN_GYMS` are used for agent
training (train/val rows), :data:`HELD_OUT_GYMS` only for evaluation.

Rows as UserRL publishes them are accepted as they are: their ``data_source`` names
(``interact_turtlegym``…, :data:`~mimesis_lab.envs.gyms.base.USERRL_DATA_SOURCES`; ours stay as
aliases), no ``gym``/``task_id``/``split`` columns (:func:`row_identity` derives them from
``data_source``, ``create_kwargs`` and ``extra_info.split``), and the task inline in
``create_kwargs`` where UserRL puts it there (turtle, telepathy, persuade: the module's
``task_from_kwargs``); otherwise the task is looked up by id in the gym's task file
(:func:`resolve_task`).
"""
from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType
from typing import Any

from mimesis_lab.envs.gyms import function, intention, persuade, search, tau, telepathy, travel, turtle
from mimesis_lab.envs.gyms.base import GYMS, Gym, UserSide, create_kwargs, gym_name

__all__ = ["MODULES", "TRAIN_GYMS", "HELD_OUT_GYMS", "ALL_GYMS", "SPLITS", "load_tasks", "load_tasks_or_unreadable",
           "gym_for_row", "TaskLookupError", "UnreadableTasks", "RowError", "row_identity", "normalise_row",
           "resolve_task", "inline_task"]

MODULES: dict[str, ModuleType] = {m.__name__.rsplit(".", 1)[1]: m for m in
                                  (travel, turtle, function, tau, persuade, intention, telepathy, search)}
TRAIN_GYMS = ("travel", "turtle", "function", "tau", "persuade")
HELD_OUT_GYMS = ("intention", "telepathy", "search")
ALL_GYMS = TRAIN_GYMS + HELD_OUT_GYMS


SPLITS = ("train", "val", "test")
_SPLIT_ALIASES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test"}


class TaskLookupError(KeyError):
    """A row whose task id is not in its gym's task file (the message names both); ``reason`` is
    ``task_missing``, or ``task_file`` when the gym's task file could not be read at all."""

    def __init__(self, message: str, reason: str = "task_missing"):
        super().__init__(message)
        self.reason = reason


class UnreadableTasks(dict):
    """The (empty) tasks of a gym whose task file could not be read; ``error`` says why. Rows that carry
    their task inline still resolve; the others raise :class:`TaskLookupError` with reason ``task_file``."""

    def __init__(self, error: str):
        super().__init__()
        self.error = error


class RowError(ValueError):
    """A row that names no gym or no task; ``reason`` is the kind (``unknown_data_source``, ``no_task_id``,
    ``bad_split``, ``gym_mismatch``, ``malformed task`` for an inline task without its id field), the
    message says which field."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def inline_task(name: str, row: dict[str, Any]) -> dict[str, Any] | None:
    """The task a row carries inline in its create_kwargs (None when the gym or the row has none)."""
    fn = getattr(MODULES[name], "task_from_kwargs", None)
    return fn(create_kwargs(row), row.get("reward_model") or {}) if fn is not None else None


def row_identity(row: dict[str, Any]) -> dict[str, str | None]:
    """``{gym, task_id, split}`` of a row: the row's own columns where present, else derived —
    ``gym`` from ``data_source`` (ours or UserRL's name), ``task_id`` from ``create_kwargs.id``,
    ``reward_model.id`` or the inline task's id (a title), ``split`` from ``extra_info.split``
    (``None`` when absent; ``validation``/``valid``/``dev`` read as ``val``).

    Raises :class:`RowError` (``unknown_data_source``, ``no_task_id``, ``bad_split``)."""
    ds = row.get("data_source")
    name = gym_name(ds)
    if name is None:
        raise RowError("unknown_data_source", f"no gym for data_source {ds!r} (known: {sorted(GYMS)})")
    if row.get("gym") not in (None, "") and str(row["gym"]) != name:
        raise RowError("gym_mismatch", f"column gym is {row['gym']!r} but data_source {ds!r} is the {name} gym")
    tid = row.get("task_id")
    if tid in (None, ""):
        ck = create_kwargs(row)
        tid = ck.get("id") or (row.get("reward_model") or {}).get("id")
        if tid in (None, ""):
            try:
                inline = inline_task(name, row)
            except ValueError as e:
                raise RowError("malformed task", f"inline {name} task in create_kwargs: {e}") from None
            tid = inline.get("id") if inline else None
    if tid in (None, ""):
        raise RowError("no_task_id", f"{ds} row names no task: no create_kwargs id, reward_model id or inline task")
    split = row.get("split")
    if split in (None, ""):
        split = (row.get("extra_info") or {}).get("split")
    if split not in (None, ""):
        if str(split).lower() not in _SPLIT_ALIASES:
            raise RowError("bad_split", f"extra_info.split {split!r} is not one of {list(_SPLIT_ALIASES)}")
        split = _SPLIT_ALIASES[str(split).lower()]
    else:
        split = None
    return {"gym": name, "task_id": str(tid), "split": split}


def normalise_row(row: dict[str, Any], default_split: str | None = None) -> dict[str, Any]:
    """``row`` with ``gym``, ``task_id`` and ``split`` filled in from :func:`row_identity` (a missing split
    becomes ``default_split``). Raises :class:`RowError`."""
    ident = row_identity(row)
    if ident["split"] is None:
        ident["split"] = default_split
    return {**row, **ident}


def resolve_task(row: dict[str, Any], tasks: dict[str, dict[str, dict[str, Any]]]) -> tuple[str, str, dict[str, Any]]:
    """``(gym, task id, task)`` of a row: the task inline in its create_kwargs when the gym's rows carry
    it (turtle, telepathy, persuade rows as UserRL publishes them), else the task file's record by id.

    Raises :class:`RowError` (no gym / no task id), :class:`TaskLookupError` (the id is not in the task
    file) or ``ValueError`` (an inline task that misses a field; the message names it)."""
    ident = row_identity(row)
    name, tid = ident["gym"], str(ident["task_id"])
    inline = inline_task(name, row)
    if inline is not None:
        return name, tid, inline
    task = (tasks.get(name) or {}).get(tid)
    if task is None and isinstance(tasks.get(name), UnreadableTasks):
        raise TaskLookupError(f"{row.get('data_source')}: task id {tid!r} needs the {name} task file, which "
                              f"cannot be read: {tasks[name].error}", reason="task_file")
    if task is None:
        raise TaskLookupError(f"{row.get('data_source')}: task id {tid!r} is not in the {name} task file")
    return name, tid, task


def load_tasks(gym: str, path: str | Path | None = None, **options: Any) -> dict[str, dict[str, Any]]:
    """Tasks of ``gym`` by id, from ``path`` or the bundled file; ``options`` go to the gym's loader
    (``GymsParams.task_options(gym)``: tau's ``db``, search's ``corpus``)."""
    mod = MODULES[gym]
    return mod.load_tasks(path, **options) if path is not None else mod.load_tasks(**options)


def load_tasks_or_unreadable(gym: str, path: str | Path | None = None, **options: Any) -> dict[str, dict[str, Any]]:
    """:func:`load_tasks`, or :class:`UnreadableTasks` (naming the file and the error) when the file cannot
    be read or parsed: for consumers of rows, where rows with inline tasks need no file (UserRL's
    turtle, telepathy and persuade rows) and the others are accounted for by reason, not a crash."""
    try:
        return load_tasks(gym, path, **options)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return UnreadableTasks(f"{path if path is not None else f'the bundled {gym} tasks'}: "
                               f"{type(e).__name__}: {e}")


def gym_for_row(row: dict[str, Any], tasks: dict[str, dict[str, dict[str, Any]]], user: UserSide | None,
                rng: random.Random, max_steps: int = 16) -> Gym:
    """The episode of a UserRL row: its gym (by ``data_source``) on the task its create_kwargs name
    (or carry inline, :func:`resolve_task`).

    ``tasks`` maps gym name → (task id → task), e.g. ``{g: load_tasks(g) for g in ALL_GYMS}``.
    """
    ds = str(row.get("data_source"))
    if ds not in GYMS:
        raise KeyError(f"no gym for data_source {ds!r} (known: {sorted(GYMS)})")
    _, _, task = resolve_task(row, tasks)
    return GYMS[ds](task, user=user, rng=rng, max_steps=max_steps)
