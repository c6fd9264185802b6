"""DVC stage ``gyms``: the UserRL rows of the eight agent gyms (SPEC §3.1).

Every gym's task file (``gyms.tasks``; null = the bundled one) is read and each task is built
into one UserRL row by its gym module's ``build_rows``, one task at a time, and proven to
resolve: the row's gym is constructed once (``registry.gym_for_row`` with no user side and
``random.Random(0)``). A task that fails — a malformed entry the gym's loader rejects, a
duplicate id, ``build_rows`` raising, a row that names another gym or task, a gym that cannot
be constructed — is quarantined (gym, task id, reason) and the others survive. A missing,
unreadable or non-JSON task file is a file-level error naming the file.

Rows of the training gyms (``gyms.train_gyms``) are split per gym into ``train``/``val`` by a
seeded shuffle of the sorted task ids (``max(1, round(val_fraction * n))`` val tasks, at least
one left in train); rows of every other (held-out) gym all go to ``test``. Writes
``<output_dir>/{train,val,test}.parquet`` with ``data_source, gym, task_id, split, prompt,
ability, reward_model, extra_info`` (the last two as JSON strings: their keys differ per gym).
``extra_info.split`` is the row's split and ``extra_info.index`` its position in its file.
"""
from __future__ import annotations

import json
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from mimesis_lab.config import GymsParams, Params
from mimesis_lab.envs.gyms import registry
from mimesis_lab.envs.gyms.base import create_kwargs
from mimesis_lab.io import InputFileError, Quarantine, read_bytes
from stages.common import StageError, StageResult, main

STAGE = "gyms"
SPLITS = ("train", "val", "test")
PROMPT = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
SCHEMA = {"data_source": pl.String, "gym": pl.String, "task_id": pl.String, "split": pl.String, "prompt": PROMPT,
          "ability": pl.String, "reward_model": pl.String, "extra_info": pl.String}


class TaskError(Exception):
    """One task cannot become a row; the message is the quarantine reason (``<kind>: …``)."""


@dataclass
class Entry:
    """One record of a task file: 1-based position, its id (None if it has none), the raw JSON."""

    row: int
    task_id: str | None
    item: Any          # what the record is in the file: the record, or (key, record) for an {id: record} file
    raw: str


def task_file(gym: str, path: str | None) -> Path:
    """The file ``registry.load_tasks(gym, path)`` reads."""
    if path is not None:
        return Path(path)
    mod = registry.MODULES[gym]
    default = getattr(mod, "TASKS_PATH", None) or getattr(mod, "DEFAULT_TASKS", None)
    if default is None:
        raise StageError(f"gym {gym!r} has no bundled task file; set gyms.tasks.{gym}")
    return Path(default)


def display(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (bundled files are absolute)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_entries(file: Path) -> tuple[str, list[Entry]]:
    """The layout (``list``, ``dict`` or ``wrapped`` = ``{"tasks": [...]}``) and records of a task file."""
    data = read_bytes(file)
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputFileError(f"{file}: not a JSON task file: {e}") from None
    if isinstance(doc, dict) and set(doc) == {"tasks"} and isinstance(doc["tasks"], list):
        layout, items = "wrapped", doc["tasks"]
    elif isinstance(doc, list):
        layout, items = "list", doc
    elif isinstance(doc, dict):
        layout, items = "dict", list(doc.items())
    else:
        raise InputFileError(f"{file}: a task file is a JSON list of tasks or an {{id: task}} object, "
                             f"got {type(doc).__name__}")
    entries = []
    for i, item in enumerate(items, 1):
        if layout == "dict":
            key, rec = item
            tid = rec.get("id", key) if isinstance(rec, dict) else key
            raw = json.dumps({key: rec}, ensure_ascii=False)
        else:
            tid = item.get("id") if isinstance(item, dict) else None
            raw = json.dumps(item, ensure_ascii=False)
        entries.append(Entry(i, None if tid is None else str(tid), item, raw))
    return layout, entries


def _load_one(gym: str, file: Path, layout: str, entry: Entry, tmp: Path) -> tuple[str, dict[str, Any]]:
    """Load a single record with the gym's own loader (it rejects the whole file on one bad record).

    The record is written alone to ``tmp`` (same file name, same layout); paths the loader derives
    from the file's folder (SearchGym passages, TauGym db) are mapped back to the real folder.
    """
    if layout == "dict":
        one: Any = dict([entry.item])
    else:
        one = [entry.item] if layout == "list" else {"tasks": [entry.item]}
    path = tmp / file.name
    path.write_text(json.dumps(one, ensure_ascii=False), encoding="utf-8")
    try:
        got = registry.load_tasks(gym, path)
    except Exception as e:  # noqa: BLE001 - any loader failure is this record's fault
        msg = str(e).replace(str(path), display(file)).splitlines()[0] if str(e) else ""
        raise TaskError(f"malformed task: {gym} task {entry.task_id!r}: {type(e).__name__}: {msg}") from None
    if len(got) != 1:
        raise TaskError(f"malformed task: {gym} task {entry.task_id!r}: the {gym} loader read {len(got)} tasks "
                        "from this entry")
    (tid, task), = got.items()
    here, real = str(tmp), str(file.parent)
    task = {k: real + v[len(here):] if isinstance(v, str) and v.startswith(here) else v for k, v in task.items()}
    return tid, task


def load_gym(gym: str, path: str | None, quarantine: Quarantine) -> tuple[Path, int, list[tuple[Entry, str, dict]]]:
    """Read ``gym``'s task file: (file, records read, [(entry, task id, task)] of the loadable records).

    The gym's loader runs on the whole file; if it rejects the file (one malformed record) or
    the file has duplicate ids, every record is loaded on its own and the bad ones quarantined.
    """
    file = task_file(gym, path)
    layout, entries = read_entries(file)
    src = display(file)
    ids = [e.task_id for e in entries]
    try:
        tasks = registry.load_tasks(gym, path)
    except Exception:  # noqa: BLE001 - a malformed record: isolate it below
        tasks = None
    if tasks is not None and None not in ids and list(tasks) == ids:
        return file, len(entries), [(e, e.task_id, tasks[e.task_id]) for e in entries]
    loaded: list[tuple[Entry, str, dict]] = []
    first: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix=".gyms-") as d:
        for e in entries:
            try:
                tid, task = _load_one(gym, file, layout, e, Path(d))
                if tid in first:
                    raise TaskError(f"duplicate: {gym} task {tid!r}: the id is already used by entry {first[tid]}")
            except TaskError as err:
                quarantine.add(src, e.row, str(err), e.raw)
                continue
            first[tid] = e.row
            loaded.append((e, tid, task))
    return file, len(entries), loaded


def build_task(gym: str, tid: str, task: dict[str, Any]) -> dict[str, Any]:
    """The UserRL row of one task (``build_rows`` on a one-task dict), proven to resolve to its gym."""
    ds = f"interact_{gym}"
    try:
        rows = registry.MODULES[gym].build_rows({tid: task}, "train")
    except Exception as e:  # noqa: BLE001 - any build failure is this task's fault
        raise TaskError(f"build: {gym} task {tid!r}: {type(e).__name__}: {e}") from None
    if not isinstance(rows, list) or len(rows) != 1 or not isinstance(rows[0], dict):
        raise TaskError(f"build: {gym} task {tid!r}: build_rows returned {rows!r:.80} for one task, not one row")
    row = rows[0]
    if row.get("data_source") != ds:
        raise TaskError(f"build: {gym} task {tid!r}: data_source is {row.get('data_source')!r}, not {ds!r}")
    if str(create_kwargs(row).get("id")) != tid:
        raise TaskError(f"build: {gym} task {tid!r}: create_kwargs id is {create_kwargs(row).get('id')!r}")
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and set(m) == {"role", "content"} and all(isinstance(v, str) for v in m.values())
            for m in prompt):
        raise TaskError(f"build: {gym} task {tid!r}: prompt is not a non-empty list of {{role, content}} strings")
    for key in ("reward_model", "extra_info"):
        if not isinstance(row.get(key), dict):
            raise TaskError(f"build: {gym} task {tid!r}: {key} is not an object")
    if not isinstance(row.get("ability"), str):
        raise TaskError(f"build: {gym} task {tid!r}: ability is not a string")
    try:
        json.dumps([row["reward_model"], row["extra_info"]])
    except (TypeError, ValueError) as e:
        raise TaskError(f"build: {gym} task {tid!r}: not JSON-serialisable: {e}") from None
    try:
        registry.gym_for_row(row, {gym: {tid: task}}, None, random.Random(0))
    except Exception as e:  # noqa: BLE001 - the task does not resolve to a working episode
        raise TaskError(f"gym: {gym} task {tid!r}: {type(e).__name__}: {e}") from None
    return row


def assign_val(gym: str, ids: list[str], val_fraction: float, seed: int) -> set[str]:
    """The val task ids of a training gym: a seeded shuffle of the sorted ids, its first n_val."""
    n = len(ids)
    if n < 2:
        raise StageError(f"training gym {gym!r} has {n} usable task(s); at least 2 are needed (1 train, 1 val)")
    n_val = min(n - 1, max(1, round(val_fraction * n)))
    order = sorted(ids)
    random.Random(f"{seed}:{gym}").shuffle(order)
    return set(order[:n_val])


def leaked_task_keys(frames: dict[str, pl.DataFrame]) -> list[str]:
    """``data_source:task_id`` keys that occur in more than one split."""
    seen: dict[str, set[str]] = {}
    for split, df in frames.items():
        for ds, tid in df.select("data_source", "task_id").iter_rows():
            seen.setdefault(f"{ds}:{tid}", set()).add(split)
    return sorted(k for k, s in seen.items() if len(s) > 1)


def run_gyms(cfg: GymsParams) -> StageResult:
    quarantine = Quarantine()
    held_out = cfg.held_out_gyms
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    per_gym: dict[str, dict[str, int]] = {}
    files: dict[str, str] = {}
    inputs: list[Path] = []
    rows_in = 0
    for gym in registry.ALL_GYMS:
        q0 = len(quarantine)
        file, n, loaded = load_gym(gym, cfg.tasks.get(gym), quarantine)
        rows_in += n
        inputs.append(file)
        files[gym] = display(file)
        built: list[tuple[str, dict[str, Any]]] = []
        for entry, tid, task in loaded:
            try:
                built.append((tid, build_task(gym, tid, task)))
            except TaskError as err:
                quarantine.add(files[gym], entry.row, str(err), entry.raw)
        if gym in cfg.train_gyms:
            val = assign_val(gym, [t for t, _ in built], cfg.val_fraction, cfg.seed)
            split_of = {t: "val" if t in val else "train" for t, _ in built}
        else:
            split_of = {t: "test" for t, _ in built}
        counts = Counter(split_of.values())
        per_gym[gym] = {"tasks_in": n, **{s: counts.get(s, 0) for s in SPLITS}, "quarantined": len(quarantine) - q0}
        for tid, row in built:
            split = split_of[tid]
            rows[split].append({"gym": gym, "task_id": tid, "row": row})
    frames: dict[str, pl.DataFrame] = {}
    for split in SPLITS:
        records = []
        for i, r in enumerate(rows[split]):
            row = r["row"]
            extra = dict(row["extra_info"], split=split, index=i)
            records.append({
                "data_source": row["data_source"], "gym": r["gym"], "task_id": r["task_id"], "split": split,
                "prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
                "ability": row["ability"],
                "reward_model": json.dumps(row["reward_model"], ensure_ascii=False),
                "extra_info": json.dumps(extra, ensure_ascii=False),
            })
        frames[split] = pl.DataFrame(records, schema=SCHEMA)
    leaked = leaked_task_keys(frames)
    if leaked:
        raise StageError(f"leak: task(s) in two splits: {leaked[:5]}")
    wrong = frames["train"].vstack(frames["val"]).filter(pl.col("gym").is_in(list(held_out)))
    if wrong.height:
        raise StageError(f"held-out gym rows in train/val: {wrong.get_column('gym').unique().to_list()}")
    outputs = {str(Path(cfg.output_dir) / f"{s}.parquet"): frames[s] for s in SPLITS}
    extra = {
        "sizes": {s: frames[s].height for s in SPLITS},
        "per_gym": per_gym,
        "train_gyms": list(cfg.train_gyms),
        "held_out_gyms": list(held_out),
        "task_files": files,
        "leaked_task_keys": len(leaked),
    }
    return StageResult(outputs=outputs, rows_in=rows_in, rows_out=sum(f.height for f in frames.values()),
                       quarantine=quarantine, inputs=inputs, extra=extra)


def build(params: Params) -> StageResult:
    return run_gyms(params.gyms)


if __name__ == "__main__":
    sys.exit(main(STAGE, build, lambda p: p.gyms))
