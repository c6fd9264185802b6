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

**UserRL's own rows** (``gyms.userrl_rows``: a folder of ``*.parquet`` files, searched
recursively, or a glob; null = build the rows from the task files as above) replace the built
rows: every row of every file is imported as published (:func:`import_userrl_rows`) or
quarantined with its reason — ``unknown_data_source``/``no_task_id``/``bad_split`` (the row names
no gym, task or split), ``prompt`` (not a non-empty list of ``{role, content}`` strings),
``task_file`` (the gym's task file cannot be read), ``task_missing`` (the id is not in the gym's
task file, ``gyms.tasks.<gym>``), ``malformed task`` (the task, inline or in the file, misses a field
or cannot be played: the gym loader's reason), ``ground_truth`` (a FunctionGym row whose ground truth
is not its task's expected result), ``gym`` (the episode cannot be built), ``duplicate`` (a
``(gym, task id)`` already imported). Inline tasks (turtle, telepathy, persuade) are read from
``create_kwargs``; the others from the gym's task file. Imported rows get our ``data_source``
(``interact_<gym>``; UserRL's name is kept in ``extra_info.userrl_data_source``) and
``create_kwargs.id`` = ``task_id``. UserRL's split is kept (``extra_info.split``), except that a
held-out gym's rows all go to ``test`` (counted as ``moved_to_test``); a training gym's rows without
a split, or a training gym with no ``val`` row, get ``train``/``val`` from the seeded shuffle above.
``metrics/gyms.json`` has ``rows_in``/``rows_out``/``rows_quarantined`` in total and per gym
(``per_gym``), with the quarantine reasons per gym, and ``gyms_without_rows``: each gym left without a
row (UserRL published none, or all were quarantined) with the reason (also logged as a warning; the
``validate`` suites then do not require it, and ``agent_eval`` notes its cells as having no rows).

The quarantine (``data/quarantine/gyms.parquet``) is written even when the stage then fails
(e.g. a training gym with fewer than two usable tasks), so the reasons are not lost.
"""
from __future__ import annotations

import json
import random
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from mimesis_lab.config import GymsParams, Params
from mimesis_lab.envs.gyms import registry
from mimesis_lab.envs.gyms.base import GYMS, create_kwargs, gym_name
from mimesis_lab.io import InputFileError, Quarantine, expand_glob, read_bytes, read_parquet
from stages.common import StageError, StageResult, log, main, quarantine_path

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


def _load_one(gym: str, file: Path, layout: str, entry: Entry, tmp: Path,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
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
        got = registry.load_tasks(gym, path, **(options or {}))
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


def check_search_corpus(file: Path, records: list[Any]) -> None:
    """Without ``gyms.search_corpus`` a search task is searched in the ``passages.jsonl`` beside its task
    file (or the passages its record names): when that corpus is missing, the file-level error names it
    and the key to set, instead of one quarantined row per task (Bamboogle's questions come without one)."""
    sibling = file.parent / "passages.jsonl"
    if sibling.is_file():
        return
    if all(isinstance(r, dict) and isinstance(r.get("passages_path"), str) for r in records):
        return
    raise InputFileError(f"{display(file)}: the search tasks have no corpus: no gyms.search_corpus is set and "
                         f"{display(sibling)} (the default, beside the task file) does not exist; set "
                         "gyms.search_corpus to a JSONL corpus of {id, title, text} passages, or leave "
                         "gyms.tasks.search null")


def load_gym(gym: str, path: str | None, quarantine: Quarantine,
             options: dict[str, Any] | None = None) -> tuple[Path, int, list[tuple[Entry, str, dict]]]:
    """Read ``gym``'s task file: (file, records read, [(entry, task id, task)] of the loadable records).

    The gym's loader runs on the whole file; if it rejects the file (one malformed record) or
    the file has duplicate ids, every record is loaded on its own and the bad ones quarantined.
    """
    file = task_file(gym, path)
    layout, entries = read_entries(file)
    src = display(file)
    ids = [e.task_id for e in entries]
    if gym == "search" and not (options or {}).get("corpus"):
        check_search_corpus(file, [e.item[1] if layout == "dict" else e.item for e in entries])
    try:
        tasks = registry.load_tasks(gym, path, **(options or {}))
    except Exception:  # noqa: BLE001 - a malformed record: isolate it below
        tasks = None
    if tasks is not None and None not in ids and list(tasks) == ids:
        return file, len(entries), [(e, e.task_id, tasks[e.task_id]) for e in entries]
    loaded: list[tuple[Entry, str, dict]] = []
    first: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix=".gyms-") as d:
        for e in entries:
            try:
                tid, task = _load_one(gym, file, layout, e, Path(d), options)
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


def save_quarantine(quarantine: Quarantine) -> Path:
    """Write the stage's quarantine file now (before a failure stops the stage)."""
    path = quarantine_path(STAGE)
    path.parent.mkdir(parents=True, exist_ok=True)
    quarantine.to_frame().sort("source_file", "row", maintain_order=True).write_parquet(path)
    return path


def run_gyms(cfg: GymsParams) -> StageResult:
    """The stage (module docstring): UserRL rows imported from ``cfg.userrl_rows``, or built from the task
    files. A failure after rows were quarantined writes the quarantine first."""
    quarantine = Quarantine()
    try:
        if cfg.userrl_rows:
            return import_userrl_rows(cfg, quarantine)
        return build_from_tasks(cfg, quarantine)
    except (StageError, InputFileError) as e:
        if len(quarantine):
            where = save_quarantine(quarantine)
            raise type(e)(f"{e} (the {len(quarantine)} quarantined row(s) and their reasons are in {where})") from None
        raise


def build_from_tasks(cfg: GymsParams, quarantine: Quarantine) -> StageResult:
    held_out = cfg.held_out_gyms
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    per_gym: dict[str, dict[str, int]] = {}
    files: dict[str, str] = {}
    inputs: list[Path] = []
    rows_in = 0
    for gym in registry.ALL_GYMS:
        q0 = len(quarantine)
        file, n, loaded = load_gym(gym, cfg.tasks.get(gym), quarantine, cfg.task_options(gym))
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
        per_gym[gym] = {"tasks_in": n, **{s: counts.get(s, 0) for s in SPLITS}, "quarantined": len(quarantine) - q0,
                        "quarantine_by_reason": dict(sorted(Counter(
                            r.split(":")[0] for r in quarantine.reason[q0:]).items()))}
        for tid, row in built:
            split = split_of[tid]
            rows[split].append({"gym": gym, "task_id": tid, "row": row})
    frames = split_frames(rows, held_out)
    outputs = {str(Path(cfg.output_dir) / f"{s}.parquet"): frames[s] for s in SPLITS}
    extra = {
        "sizes": {s: frames[s].height for s in SPLITS},
        "per_gym": per_gym,
        "train_gyms": list(cfg.train_gyms),
        "held_out_gyms": list(held_out),
        "task_files": files,
        "leaked_task_keys": 0,
    }
    return StageResult(outputs=outputs, rows_in=rows_in, rows_out=sum(f.height for f in frames.values()),
                       quarantine=quarantine, inputs=inputs, extra=extra)


def split_frames(rows: dict[str, list[dict[str, Any]]], held_out: list[str] | tuple[str, ...]
                 ) -> dict[str, pl.DataFrame]:
    """The output frames of ``rows`` (split → ``[{gym, task_id, row}]``), checked for leaks and held-out rows."""
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
    return frames


# ------------------------------------------------------------------------------ UserRL rows as published
def userrl_files(spec: str) -> list[Path]:
    """The parquet files ``gyms.userrl_rows`` names: a folder (its ``*.parquet``, recursively) or a glob."""
    p = Path(spec)
    if p.is_dir():
        files = sorted(p.rglob("*.parquet"))
        if not files:
            raise InputFileError(f"{spec}: gyms.userrl_rows names a folder without *.parquet files")
        return files
    return expand_glob(spec)


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """``reward_model``/``extra_info`` as objects (they may be JSON strings, e.g. in our own files)."""
    out = dict(row)
    for k in ("reward_model", "extra_info"):
        v = out.get(k)
        if isinstance(v, str):
            try:
                out[k] = json.loads(v)
            except json.JSONDecodeError as e:
                raise registry.RowError("malformed_row", f"field {k} is not JSON: {e}") from None
        if out.get(k) is None:
            out[k] = {}
        if not isinstance(out[k], dict):
            raise registry.RowError("malformed_row", f"field {k} is not an object")
    return out


def _check_prompt(prompt: Any) -> list[dict[str, str]]:
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt):
        raise TaskError("prompt: not a non-empty list of {role, content} strings")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def _check_ground_truth(gym: str, row: dict[str, Any], task: dict[str, Any]) -> None:
    """A FunctionGym row whose ground truth is not its task's expected result rewards another answer."""
    if gym != "function":
        return
    gt = (row.get("reward_model") or {}).get("ground_truth")
    try:
        g, e = float(gt), float(task["expected_result"])
    except (TypeError, ValueError):
        raise TaskError(f"ground_truth: function row's ground_truth {gt!r} is not a number") from None
    if abs(g - e) > 1e-6 * max(1.0, abs(e)):
        raise TaskError(f"ground_truth: function row's ground_truth {gt!r} differs from task "
                        f"{task.get('id')!r}'s expected_result {task['expected_result']!r}")


class _TaskFiles:
    """The task files of the gyms, loaded on first use, record by record (bad records remembered)."""

    def __init__(self, cfg: GymsParams):
        self.cfg = cfg
        self.tasks: dict[str, dict[str, dict[str, Any]]] = {}
        self.bad: dict[str, dict[str, str]] = {}     # gym -> task id -> why its record was rejected
        self.errors: dict[str, str] = {}
        self.files: dict[str, str] = {}
        self.paths: list[Path] = []

    def get(self, gym: str) -> dict[str, dict[str, Any]]:
        if gym in self.errors:
            raise TaskError(f"task_file: {self.errors[gym]}")
        if gym not in self.tasks:
            q = Quarantine()
            try:
                file, _, loaded = load_gym(gym, self.cfg.tasks.get(gym), q, self.cfg.task_options(gym))
            except (InputFileError, StageError) as e:
                self.errors[gym] = str(e)
                raise TaskError(f"task_file: {e}") from None
            self.paths.append(file)
            self.files[gym] = display(file)
            self.tasks[gym] = {tid: task for _, tid, task in loaded}
            self.bad[gym] = {}
            for raw, reason in zip(q.raw, q.reason):
                try:
                    rec = json.loads(raw)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and len(rec) == 1 and isinstance(next(iter(rec.values())), dict) \
                        and "id" not in rec:
                    key, rec = next(iter(rec.items()))
                    rec = dict(rec, id=rec.get("id", key))
                if isinstance(rec, dict) and rec.get("id") is not None:
                    self.bad[gym].setdefault(str(rec["id"]), reason)
        return self.tasks[gym]


def _import_row(row: dict[str, Any], files: _TaskFiles) -> tuple[dict[str, Any], str | None]:
    """One published row → ``({gym, task_id, row}, UserRL split or None)``; raises :class:`TaskError` /
    :class:`registry.RowError` with the quarantine reason."""
    row = _decoded(row)
    ident = registry.row_identity(row)
    gym, tid = ident["gym"], str(ident["task_id"])
    prompt = _check_prompt(row.get("prompt"))
    try:
        inline = registry.inline_task(gym, row)
    except ValueError as e:
        raise TaskError(f"malformed task: inline {gym} task {tid!r}: {e}") from None
    if inline is not None:
        task = inline
    else:
        tasks = files.get(gym)
        task = tasks.get(tid)
        if task is None:
            why = files.bad.get(gym, {}).get(tid)
            if why is not None:
                raise TaskError(f"malformed task: {gym} task {tid!r} in {files.files[gym]} was rejected: {why}")
            raise TaskError(f"task_missing: {gym} task id {tid!r} is not in the {gym} task file {files.files[gym]} "
                            f"(gyms.tasks.{gym})")
    _check_ground_truth(gym, row, task)
    ds = f"interact_{gym}"
    try:
        GYMS[ds](task, user=None, rng=random.Random(0))
    except Exception as e:  # noqa: BLE001 - the task does not make a working episode
        raise TaskError(f"gym: {gym} task {tid!r}: {type(e).__name__}: {e}") from None
    extra = dict(row.get("extra_info") or {})
    tk = dict(extra.get("tools_kwargs") or {})
    iw = dict(tk.get("interact_with_env") or {})
    iw["create_kwargs"] = {**create_kwargs(row), "id": tid}
    tk["interact_with_env"] = iw
    extra["tools_kwargs"] = tk
    if str(row.get("data_source")) != ds:
        extra["userrl_data_source"] = str(row.get("data_source"))
    ability = row.get("ability")
    out = {"data_source": ds, "prompt": prompt, "ability": ability if isinstance(ability, str) else "interaction",
           "reward_model": dict(row.get("reward_model") or {}), "extra_info": extra}
    try:
        json.dumps([out["reward_model"], out["extra_info"]])
    except (TypeError, ValueError) as e:
        raise TaskError(f"malformed_row: not JSON-serialisable: {e}") from None
    return {"gym": gym, "task_id": tid, "row": out}, ident["split"]


def import_userrl_rows(cfg: GymsParams, quarantine: Quarantine) -> StageResult:
    """The ``gyms`` outputs from UserRL's published rows (module docstring)."""
    held_out = cfg.held_out_gyms
    files = _TaskFiles(cfg)
    paths = userrl_files(str(cfg.userrl_rows))
    stats: dict[str, Counter] = {g: Counter() for g in registry.ALL_GYMS}
    reasons: dict[str, Counter] = {g: Counter() for g in registry.ALL_GYMS}
    by_gym: dict[str, list[tuple[dict[str, Any], str | None]]] = {g: [] for g in registry.ALL_GYMS}
    seen: dict[tuple[str, str], str] = {}
    rows_in = 0
    per_file: dict[str, int] = {}
    for path in paths:
        src = display(path)
        frame = read_parquet(path, "UserRL gym rows")
        per_file[src] = frame.height
        for i, row in enumerate(frame.iter_rows(named=True), 1):
            rows_in += 1
            gym = gym_name(row.get("data_source"))
            try:
                rec, split = _import_row(row, files)
                key = (rec["gym"], rec["task_id"])
                if key in seen:
                    raise TaskError(f"duplicate: {rec['gym']} task {rec['task_id']!r} was already imported from "
                                    f"{seen[key]}")
            except (TaskError, registry.RowError) as e:
                reason = str(e)
                quarantine.add(src, i, reason, json.dumps(row, ensure_ascii=False, default=str))
                g = gym or "unknown"
                stats.setdefault(g, Counter()).update(rows_in=1, rows_quarantined=1)
                reasons.setdefault(g, Counter())[reason.split(":")[0]] += 1
                continue
            seen[key] = f"{src} row {i}"
            stats[rec["gym"]].update(rows_in=1, rows_out=1)
            by_gym[rec["gym"]].append((rec, split))
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for gym, items in by_gym.items():
        if gym in held_out:
            for rec, split in items:
                stats[gym]["moved_to_test"] += split not in (None, "test")
                rows["test"].append(rec)
                stats[gym]["test"] += 1
            continue
        given = Counter(split for _, split in items)
        pool = [rec["task_id"] for rec, split in items if split is None or (split == "train" and not given["val"])]
        val: set[str] = set()
        if len(pool) >= 2:
            val = assign_val(gym, pool, cfg.val_fraction, cfg.seed)
        for rec, split in items:
            if split is None or (split == "train" and not given["val"]):
                split = "val" if rec["task_id"] in val else "train"
            rows[split].append(rec)
            stats[gym][split] += 1
    if not any(rows.values()):
        raise StageError(f"0 usable row(s) of {rows_in} in {cfg.userrl_rows}")
    frames = split_frames(rows, held_out)
    per_gym = {g: {"rows_in": c["rows_in"], "rows_out": c["rows_out"], "rows_quarantined": c["rows_quarantined"],
                   **{sp: c[sp] for sp in SPLITS}, "moved_to_test": c["moved_to_test"],
                   "quarantine_by_reason": dict(sorted(reasons[g].items()))}
               for g, c in stats.items() if c["rows_in"]}
    without = gyms_without_rows(per_gym)
    if without:
        log.warning("gyms: no rows for %s", "; ".join(f"{g} ({why})" for g, why in without.items()))
    outputs = {str(Path(cfg.output_dir) / f"{s}.parquet"): frames[s] for s in SPLITS}
    extra = {
        "source": "userrl_rows",
        "gyms_without_rows": without,
        "userrl_rows": str(cfg.userrl_rows),
        "row_files": per_file,
        "sizes": {s: frames[s].height for s in SPLITS},
        "per_gym": per_gym,
        "train_gyms": list(cfg.train_gyms),
        "held_out_gyms": list(held_out),
        "task_files": files.files,
        "task_records_rejected": {g: len(b) for g, b in files.bad.items()},
        "leaked_task_keys": 0,
    }
    return StageResult(outputs=outputs, rows_in=rows_in, rows_out=sum(f.height for f in frames.values()),
                       quarantine=quarantine, inputs=[*paths, *files.paths], extra=extra)


def gyms_without_rows(per_gym: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Gym -> why it has no row in the output (UserRL published none in ``gyms.userrl_rows``, or every one
    was quarantined, with the reasons): such a gym is not evaluated, and says so."""
    out = {}
    for g in registry.ALL_GYMS:
        v = per_gym.get(g)
        if not v:
            out[g] = "no row in gyms.userrl_rows"
        elif not v["rows_out"]:
            why = ", ".join(f"{k}: {n}" for k, n in v["quarantine_by_reason"].items())
            out[g] = f"all {v['rows_in']} row(s) quarantined ({why})"
    return out


def build(params: Params) -> StageResult:
    return run_gyms(params.gyms)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main(STAGE, build, lambda p: p.gyms))
