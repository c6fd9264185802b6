"""A pre-tokenised cache of the SFT-style splits: tokenise once, not on every run and on every rank.

The rows :func:`mimesis_lab.train.data.load_rows` builds from a split parquet (chat tokenisation with
the loss mask, fitting to ``max_len``, packing or one example per row) are a pure function of

- the tokenizer: its files (``tokenizer.json``, ``tokenizer_config.json``, the chat template, …; never
  a model's weights), the chat template it renders with, and the transformers / tokenizers versions;
- the bytes of the split file (not its path);
- the settings: ``train_role`` (the loss mask), ``max_len``, ``overlong``, the resolved ``batching``
  mode and, for the training split, the mixture expansion (``seed``);
- the code that builds them: :func:`mimesis_lab.code_deps.code_identity` of
  :mod:`mimesis_lab.train.data` (the source files it imports: chat tokenisation, packing, …).

:func:`cache_key` hashes all of it. ``<output_dir>/token_cache/<split>.parquet`` holds one split's
rows (int32 list columns :data:`COLUMNS`, one row per :class:`~mimesis_lab.packing.PackedRow`) and, in
the file's metadata, the key, the build statistics and a sha256 of the column buffers. A file with
another key is rebuilt and overwritten (never reused); a file that cannot be read, or whose buffers
do not match their sha256, is rebuilt with a :class:`TokenCacheWarning`. Writes are atomic (a
temporary file, then a rename), and a failed write only warns: the cache is an optimisation.

In a job (:func:`load_split_rows`) rank 0 reads or builds and writes the cache, then a barrier; the
other ranks read what rank 0 wrote (a rank that finds no usable cache, e.g. on another node without a
shared ``output_dir``, tokenises itself, with a warning). With ``sft_run.token_cache: false`` every
rank tokenises as before and the cache is neither read nor written; the folder is created anyway
(with its ``README.md``) because ``dvc.yaml`` declares it as a persistent output of the stage.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from mimesis_lab.packing import PackedRow
from mimesis_lab.train.data import load_rows

__all__ = ["CACHE_DIR", "COLUMNS", "TokenCacheWarning", "CacheMiss", "CacheCorrupt", "tokenizer_identity",
           "row_settings", "cache_key", "write_rows", "read_rows", "cached_rows", "ensure_cache_dir",
           "load_split_rows"]

CACHE_DIR = "token_cache"
FORMAT = 2                                 # bump when the file layout changes (2: parents)
META_KEY = b"mimesis.token_cache"
COLUMNS = ("input_ids", "labels", "position_ids", "seq_lens", "example_ids", "parents")   # parents: [] = plain
#: Files of a tokenizer (or model) folder that define the tokenizer; a model's weights and config are not hashed.
TOKENIZER_FILES = frozenset({"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                             "added_tokens.json", "chat_template.jinja", "chat_template.json", "vocab.json",
                             "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model"})
README = """# Pre-tokenised cache (`mimesis_lab/train/token_cache.py`)

`<split>.parquet`: the token rows of one split (int32 list columns input_ids, labels, position_ids,
seq_lens, example_ids, parents: empty for a plain row), keyed (file metadata) by a sha256 of the tokenizer files and chat template, the
split file's bytes, the tokenisation settings (train_role, max_len, overlong, batching, mixture seed)
and the tokenisation code. A file with another key is rebuilt, a corrupt one is rebuilt with a
warning. `sft_run.token_cache: false` turns the cache off (this folder stays: a DVC output).
Deleting this folder is always safe.
"""


class TokenCacheWarning(UserWarning):
    """A token cache that could not be used or written (the job goes on and tokenises)."""


class CacheMiss(LookupError):
    """No cache file for the key (``reason``: ``missing`` or ``stale``: written with another key)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class CacheCorrupt(ValueError):
    """A cache file that cannot be read back intact; the message names the file and the problem."""


# ----------------------------------------------------------------------------- the key
def _sha256(path: Path) -> str:
    from mimesis_lab.tracking import file_sha256

    return file_sha256(path)


def tokenizer_identity(tokenizer: Any, folder: str | Path | None) -> dict[str, Any]:
    """What defines ``tokenizer``'s output: sha256 of the tokenizer files of ``folder`` (:data:`TOKENIZER_FILES`;
    a model folder's weights are left out), its class, vocabulary size and chat template, and the versions
    of transformers and tokenizers."""
    import tokenizers
    import transformers

    files = {}
    if folder is not None and Path(folder).is_dir():
        files = {p.name: _sha256(p) for p in sorted(Path(folder).iterdir())
                 if p.is_file() and p.name in TOKENIZER_FILES}
    return {"files": files, "class": type(tokenizer).__name__, "vocab": len(tokenizer),
            "chat_template": getattr(tokenizer, "chat_template", None),
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def row_settings(cfg: Any, *, train: bool, batching: str) -> dict[str, Any]:
    """The settings of a ``TrainParams`` that :func:`~mimesis_lab.train.data.load_rows` reads (``batching``:
    the resolved mode). The seed only matters to the training split (the mixture expansion)."""
    return {"train_role": cfg.train_role, "max_len": cfg.max_len, "overlong": cfg.overlong,
            "batching": batching, "expand": train, "seed": cfg.seed if train else None,
            "history": getattr(cfg, "history", "full")}


def cache_key(tokenizer: Any, tokenizer_dir: str | Path | None, data_file: str | Path,
              settings: Mapping[str, Any], *, tokenizer_id: Mapping[str, Any] | None = None) -> str:
    """sha256 of the tokenizer (:func:`tokenizer_identity`, or ``tokenizer_id`` when already computed), the
    bytes of ``data_file``, ``settings`` (:func:`row_settings`) and the tokenisation code."""
    from mimesis_lab.code_deps import code_identity

    p = Path(data_file)
    data = {"size": p.stat().st_size, "sha256": _sha256(p)} if p.is_file() else {"missing": str(p)}
    doc = {"format": FORMAT, "tokenizer": dict(tokenizer_id or tokenizer_identity(tokenizer, tokenizer_dir)),
           "data": data, "settings": dict(settings), "code": code_identity("mimesis_lab.train.data")}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


# ----------------------------------------------------------------------------- the file
def _flat(rows: list[PackedRow], column: str) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, values)`` of one list column: int64 offsets from 0, int32 values."""
    lists = [getattr(r, column) or [] for r in rows]      # a plain row's parents (None) is stored empty
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    values = np.array(list(chain.from_iterable(lists)), dtype=np.int32)
    return offsets, values


def _digest(columns: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> str:
    h = hashlib.sha256()
    for name in COLUMNS:
        offsets, values = columns[name]
        h.update(name.encode())
        h.update(np.ascontiguousarray(offsets, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(values, dtype=np.int32).tobytes())
    return h.hexdigest()


def write_rows(path: str | Path, rows: list[PackedRow], stats: Mapping[str, Any], key: str) -> None:
    """Write ``rows`` and ``stats`` under ``key`` to ``path`` (atomically: a temporary file, then a rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    columns = {c: _flat(rows, c) for c in COLUMNS}
    meta = {"format": FORMAT, "key": key, "rows": len(rows), "stats": dict(stats), "digest": _digest(columns)}
    arrays = {c: pa.LargeListArray.from_arrays(pa.array(off), pa.array(val)) for c, (off, val) in columns.items()}
    table = pa.table(arrays).replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _meta(path: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    try:
        raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
        meta = json.loads(raw) if raw is not None else None
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged footer
        raise CacheCorrupt(f"{path}: cannot read the token cache's metadata: {type(e).__name__}: {e}") from None
    if not isinstance(meta, dict) or not {"format", "key", "rows", "stats", "digest"} <= meta.keys():
        raise CacheCorrupt(f"{path}: not a token cache file (no `{META_KEY.decode()}` metadata)")
    return meta


def read_rows(path: str | Path, key: str) -> tuple[list[PackedRow], dict[str, Any]]:
    """The ``(rows, stats)`` cached at ``path`` under ``key``. Raises :class:`CacheMiss` (no file, or a file
    of another key: read only its metadata) or :class:`CacheCorrupt` (unreadable, inconsistent, or the
    buffers do not match the sha256 written with them)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise CacheMiss("missing", f"{path}: no token cache")
    meta = _meta(path)
    if meta["format"] != FORMAT or meta["key"] != key:
        raise CacheMiss("stale", f"{path}: token cache of another key ({str(meta['key'])[:12]}…, this run "
                                 f"{key[:12]}…)")
    try:
        table = pq.read_table(path, columns=list(COLUMNS), page_checksum_verification=True)
        columns = {}
        for c in COLUMNS:
            col = table.column(c).combine_chunks()
            offsets = col.offsets.to_numpy().astype(np.int64)
            columns[c] = (offsets - offsets[0], col.values.to_numpy()[offsets[0]:offsets[-1]])
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for damaged pages
        raise CacheCorrupt(f"{path}: cannot read the token cache: {type(e).__name__}: {e}") from None
    if _digest(columns) != meta["digest"]:
        raise CacheCorrupt(f"{path}: the token cache's contents do not match their sha256")
    lengths = {c: np.diff(columns[c][0]) for c in COLUMNS}
    n = len(lengths["input_ids"])
    seq_total = np.add.reduceat(columns["seq_lens"][1], columns["seq_lens"][0][:-1]) if n else np.zeros(0)
    if (n != meta["rows"] or not (lengths["input_ids"] == lengths["labels"]).all()
            or not (lengths["input_ids"] == lengths["position_ids"]).all()
            or not (lengths["seq_lens"] > 0).all() or not (seq_total == lengths["input_ids"]).all()
            or not ((lengths["parents"] == 0) | (lengths["parents"] == lengths["input_ids"])).all()):
        raise CacheCorrupt(f"{path}: the token cache's rows are inconsistent (row count or lengths)")
    split = {}
    for c in COLUMNS:
        offsets, values = columns[c][0].tolist(), columns[c][1].tolist()
        split[c] = [values[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    rows = [PackedRow(*(split[c][i] for c in COLUMNS)) for i in range(n)]
    for r in rows:
        r.parents = r.parents or None
    return rows, meta["stats"]


def cached_rows(path: str | Path, key: str, build: Callable[[], tuple[list[PackedRow], dict[str, Any]]], *,
                write: bool = True) -> tuple[list[PackedRow], dict[str, Any], str]:
    """``(rows, stats, status)``: read from the cache at ``path`` when it holds ``key`` (status ``hit``), else
    ``build()`` them (status ``missing``, ``stale`` or ``corrupt``, the last with a warning) and, when
    ``write``, write them under ``key``."""
    try:
        rows, stats = read_rows(path, key)
        return rows, stats, "hit"
    except CacheMiss as e:
        status = e.reason
    except CacheCorrupt as e:
        warnings.warn(f"{e}; tokenising again and rewriting it", TokenCacheWarning, stacklevel=2)
        status = "corrupt"
    rows, stats = build()
    if write:
        try:
            write_rows(path, rows, stats, key)
        except OSError as e:
            warnings.warn(f"{path}: cannot write the token cache ({type(e).__name__}: {e}); going on without it",
                          TokenCacheWarning, stacklevel=2)
    return rows, stats, status


def ensure_cache_dir(cache_dir: str | Path) -> Path:
    """Create ``cache_dir`` with its ``README.md`` (a DVC output must exist even with the cache off)."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    readme = cache_dir / "README.md"
    if not readme.is_file() or readme.read_text(encoding="utf-8") != README:
        readme.write_text(README, encoding="utf-8")
    return cache_dir


# ----------------------------------------------------------------------------- in a job
def load_split_rows(splits: Mapping[str, tuple[str, bool]], tokenizer: Any, tokenizer_dir: str | Path | None,
                    cfg: Any, *, batching: str, cache_dir: str | Path, enabled: bool = True, rank: int = 0,
                    world: int = 1, barrier: Callable[[], None] | None = None,
                    ) -> tuple[dict[str, tuple[list[PackedRow], dict[str, Any]]], dict[str, str]]:
    """The rows of every split (``name -> (parquet path, is the training split)``) with the settings of a
    ``TrainParams`` ``cfg``, and each split's cache status (``hit``, ``missing``, ``stale``, ``corrupt``,
    ``off``). Rank 0 reads or builds and writes the cache, then ``barrier()`` (needed when ``world > 1``);
    the other ranks then read it. An error of rank 0 (a bad split) is raised after the barrier, so the
    other ranks are not left waiting: they find no cache, tokenise and meet the same error."""
    cache_dir = Path(cache_dir)
    if rank == 0:
        ensure_cache_dir(cache_dir)

    def build(name: str) -> Callable[[], tuple[list[PackedRow], dict[str, Any]]]:
        path, train = splits[name]
        return lambda: load_rows(path, tokenizer, cfg, train=train, batching=batching)

    if not enabled:
        return {n: build(n)() for n in splits}, dict.fromkeys(splits, "off")
    tok_id = tokenizer_identity(tokenizer, tokenizer_dir)

    def one(name: str, write: bool) -> tuple[list[PackedRow], dict[str, Any], str]:
        path, train = splits[name]
        key = cache_key(tokenizer, tokenizer_dir, path, row_settings(cfg, train=train, batching=batching),
                        tokenizer_id=tok_id)
        return cached_rows(cache_dir / f"{name}.parquet", key, build(name), write=write)

    out: dict[str, tuple[list[PackedRow], dict[str, Any]]] = {}
    status: dict[str, str] = {}
    error: BaseException | None = None
    if rank == 0:
        try:
            for name in splits:
                rows, stats, status[name] = one(name, write=True)
                out[name] = (rows, stats)
        except Exception as e:  # noqa: BLE001 - re-raised after the barrier
            error = e
    if world > 1:
        if barrier is None:
            raise ValueError("load_split_rows: world > 1 needs a barrier")
        barrier()
    if error is not None:
        raise error
    if rank != 0:
        for name in splits:
            rows, stats, status[name] = one(name, write=False)
            if status[name] != "hit":
                warnings.warn(f"rank {rank}: no usable token cache of rank 0 for {name} ({status[name]}) in "
                              f"{cache_dir}; tokenised on this rank", TokenCacheWarning, stacklevel=2)
            out[name] = (rows, stats)
    return out, status
