"""Reading raw inputs without losing a row.

File-level problems (missing, unreadable, not a file, a JSON document that does not
parse) raise :class:`InputFileError`, whose message names the file (and line).
:func:`read_parquet` is the one parquet reader of the stages and tasks: it raises
:class:`ParquetReadError` (an :class:`InputFileError`) naming the file and what it was
read as, for a missing file, an unreadable/corrupt one, or missing columns.
Row-level problems (malformed JSON line, invalid UTF-8, a field of the wrong type,
an unknown role, an oversize message, …) become quarantine rows with the file, the
1-based row number, the reason and the raw record. Schemas are ``msgspec`` structs,
so validation runs in C and the reason names the JSON path of the bad field
(e.g. ``Invalid enum value 'bot' - at `$.conversation[1].role```).

Parquet record files (e.g. WildChat's published shards) are read batch by batch by
:func:`iter_parquet_frames`, with the same quarantine contract as the JSONL readers (the row
is the 1-based row of the file). JSON documents may be gzip-compressed (``.json.gz``).
"""
from __future__ import annotations

import glob as _glob
import gzip
import io
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

QUARANTINE_SCHEMA = {
    "source_file": pl.Utf8,
    "row": pl.Int64,
    "reason": pl.Utf8,
    "raw": pl.Utf8,
}


class InputFileError(RuntimeError):
    """A whole input file is unusable; the message names the file (and line)."""


class ParquetReadError(InputFileError):
    """A parquet file cannot serve as ``what`` (see :func:`read_parquet`). ``problem`` is ``missing``
    (no such file), ``unreadable`` (a folder, not parquet, corrupt) or ``columns`` (it lacks
    ``missing_columns``); the message names the file and what it was read as."""

    def __init__(self, path: Path, what: str, problem: str, message: str, missing_columns: Sequence[str] = ()):
        super().__init__(f"{path}: {message}")
        self.path, self.what, self.problem, self.missing_columns = Path(path), what, problem, list(missing_columns)


def read_parquet(path: str | Path, what: str, *, columns: Sequence[str] | None = None,
                 required: Sequence[str] = (), hint: str = "") -> pl.DataFrame:
    """The parquet file ``path`` (only ``columns`` if given) as a frame, or :class:`ParquetReadError`.

    ``what`` says what the file is, for the message (``"gym rows"``, ``"dataset 'x'"``); ``hint`` is
    added to the not-found message (``"run `dvc repro gyms`"``). Every name in ``columns`` and
    ``required`` must be a column of the file. Messages::

        data/gyms/train.parquet: gym rows not found (run `dvc repro gyms`)
        data/x.parquet: cannot read dataset 'x' as parquet: ComputeError: …
        data/x.parquet: dataset 'x' lacks column(s) ['user_id'] (columns: ['a', 'b'])
    """
    p = Path(path)
    if not p.exists():
        raise ParquetReadError(p, what, "missing", f"{what} not found" + (f" ({hint})" if hint else ""))
    if p.is_dir():
        raise ParquetReadError(p, what, "unreadable", f"{what} is a directory, expected a parquet file")
    need = list(dict.fromkeys([*(columns or ()), *required]))
    try:
        if need:
            names = list(pl.read_parquet_schema(p))
            absent = [c for c in need if c not in names]
            if absent:
                raise ParquetReadError(p, what, "columns", f"{what} lacks column(s) {absent} (columns: {names})",
                                       absent)
        return pl.read_parquet(p, columns=list(columns) if columns is not None else None)
    except ParquetReadError:
        raise
    except Exception as e:  # noqa: BLE001 - polars and pyarrow raise several types for a bad file
        raise ParquetReadError(p, what, "unreadable", f"cannot read {what} as parquet: {type(e).__name__}: {e}"
                               ) from None


@dataclass
class Quarantine:
    """Accumulates quarantined rows: ``source_file``, ``row`` (1-based), ``reason``, ``raw``."""

    source_file: list[str] = field(default_factory=list)
    row: list[int] = field(default_factory=list)
    reason: list[str] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)

    def add(self, source_file: str, row: int, reason: str, raw: str | bytes) -> None:
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", errors="backslashreplace")
        self.source_file.append(str(source_file))
        self.row.append(int(row))
        self.reason.append(reason)
        self.raw.append(raw)

    def extend_frame(self, df: pl.DataFrame) -> None:
        """Append a frame that already has the quarantine columns."""
        for col in QUARANTINE_SCHEMA:
            getattr(self, col).extend(df.get_column(col).to_list())

    def __len__(self) -> int:
        return len(self.row)

    def to_frame(self) -> pl.DataFrame:
        return pl.DataFrame(
            {"source_file": self.source_file, "row": self.row, "reason": self.reason, "raw": self.raw},
            schema=QUARANTINE_SCHEMA,
        )


def expand_glob(pattern: str, root: Path | None = None, *, folder_suffixes: Sequence[str] = ()) -> list[Path]:
    """Sorted files matching ``pattern`` (relative to ``root``); an empty match is a file-level error.

    With ``folder_suffixes`` (``(".jsonl", ".parquet")``), a pattern that names a folder stands for
    the files under it (recursively) whose name ends with one of them; a folder without any is a
    file-level error."""
    base = Path(root) if root else Path.cwd()
    full = pattern if Path(pattern).is_absolute() else str(base / pattern)
    matches = sorted(Path(p) for p in _glob.glob(full, recursive=True))
    if not matches:
        raise InputFileError(f"{pattern}: no input file matches this pattern")
    if folder_suffixes:
        out: list[Path] = []
        for m in matches:
            if not m.is_dir():
                out.append(m)
                continue
            out.extend(p for p in m.rglob("*") if p.name.endswith(tuple(folder_suffixes)) and not p.is_dir())
        if not out:
            kinds = " or ".join("*" + x for x in folder_suffixes)
            if len(matches) == 1:
                raise InputFileError(f"{matches[0]}: is a directory without any {kinds} file")
            raise InputFileError(f"{pattern}: no {kinds} input file matches this pattern")
        matches = sorted(dict.fromkeys(out))
    return matches


def read_bytes(path: Path) -> bytes:
    """Read a whole file or raise :class:`InputFileError` naming it."""
    path = Path(path)
    if path.is_dir():
        raise InputFileError(f"{path}: is a directory, expected a file")
    try:
        return path.read_bytes()
    except OSError as e:
        raise InputFileError(f"{path}: cannot read input file: {e.strerror or e}") from None


@dataclass
class JsonlBatch:
    """Lines of one JSONL file (or chunk) that passed schema validation."""

    path: Path
    lines: list[bytes]          # the valid raw lines, in file order
    line_numbers: list[int]     # their 1-based line numbers
    rows_in: int                # non-blank lines read


def validate_lines(path: Path, data: bytes, schema: type, quarantine: Quarantine,
                   first_line: int = 1) -> JsonlBatch:
    """Validate every non-blank line of ``data`` (lines of ``path`` starting at ``first_line``).

    Valid lines are returned raw; invalid ones are quarantined with the reason
    (malformed JSON, invalid UTF-8, missing or mistyped field with its JSON path).
    Blank lines are not records and are not counted.
    """
    decoder = msgspec.json.Decoder(schema)
    lines: list[bytes] = []
    numbers: list[int] = []
    rows_in = 0
    src = str(path)
    for lineno, line in enumerate(data.split(b"\n"), first_line):
        if not line.strip():
            continue
        rows_in += 1
        try:
            decoder.decode(line)
        except msgspec.ValidationError as e:
            quarantine.add(src, lineno, f"schema: {e}", line)
            continue
        except msgspec.DecodeError as e:
            msg = str(e)
            if "UTF-8" in msg:
                quarantine.add(src, lineno, f"invalid UTF-8: {msg}{_utf8_where(line)}", line)
            else:
                quarantine.add(src, lineno, f"malformed JSON: {msg}", line)
            continue
        lines.append(line)
        numbers.append(lineno)
    return JsonlBatch(path=path, lines=lines, line_numbers=numbers, rows_in=rows_in)


def _utf8_where(data: bytes) -> str:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f" (byte {e.start} of the line: {data[max(0, e.start - 20):e.start + 4]!r})"
    return ""


def read_jsonl(path: Path, schema: type, quarantine: Quarantine) -> JsonlBatch:
    """:func:`validate_lines` over a whole file."""
    return validate_lines(path, read_bytes(path), schema, quarantine)


def iter_line_chunks(path: Path, chunk_bytes: int) -> Iterator[bytes]:
    """Yield chunks of whole lines of about ``chunk_bytes`` (a longer line makes a longer chunk).

    The partial line at the end of a block is not copied around: the file position is
    moved back so the next block starts with it.
    """
    path = Path(path)
    if path.is_dir():
        raise InputFileError(f"{path}: is a directory, expected a file")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputFileError(f"{path}: cannot read input file: {e.strerror or e}") from None
    with f:
        size = chunk_bytes
        while True:
            try:
                block = f.read(size)
            except OSError as e:
                raise InputFileError(f"{path}: cannot read input file: {e.strerror or e}") from None
            if not block:
                return
            if len(block) < size:           # end of file
                yield block
                return
            cut = block.rfind(b"\n")
            if cut < 0:                      # one line longer than the block: read more of it
                f.seek(-len(block), 1)
                size *= 2
                continue
            f.seek(cut + 1 - len(block), 1)
            size = chunk_bytes
            yield block[: cut + 1] if cut + 1 < len(block) else block


_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True


def line_spans(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised ``(starts, ends, line_index)`` of the non-blank lines of ``data`` (0-based index).

    ``data`` is treated as ``data.split(b"\\n")``: its line ``i`` is file line ``first + i``.

    A line whose first byte is not whitespace is non-blank; only the (rare) lines that
    start with whitespace are checked one by one.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(buf)]))
    nonempty = ends > starts
    first = np.zeros(len(starts), dtype=np.uint8)
    first[nonempty] = buf[starts[nonempty]]
    keep = nonempty & ~_WHITESPACE[first]
    for k in np.flatnonzero(nonempty & _WHITESPACE[first]):
        keep[k] = bool(data[starts[k]:ends[k]].strip())
    return starts[keep], ends[keep], np.flatnonzero(keep)


def _arrow_read(data: bytes, arrow_schema: pa.Schema, max_line: int) -> pa.Table:
    opts = pa_json.ParseOptions(explicit_schema=arrow_schema, unexpected_field_behavior="ignore")
    block = max(4 << 20, 2 * max_line + 1)  # a record may not straddle two blocks
    return pa_json.read_json(io.BytesIO(data), read_options=pa_json.ReadOptions(block_size=block),
                             parse_options=opts)


def frame_from_jsonl(path: Path, data: bytes, schema: type, arrow_schema: pa.Schema, suspect: pl.Expr,
                     quarantine: Quarantine, first_line: int = 1) -> tuple[pl.DataFrame, int]:
    """Decode JSONL ``data`` (lines of ``path`` from ``first_line``) into a frame with a ``row`` column.

    Fast path: one multi-threaded, type-strict Arrow JSON read (a field of the wrong
    type, malformed JSON or invalid UTF-8 anywhere makes it fail); rows flagged by the
    cheap vectorised ``suspect`` expression (nulls in required fields, unknown enum
    values, …: a superset of the schema violations Arrow lets through) are re-checked
    with the msgspec ``schema`` and quarantined with its precise reason. Slow path,
    taken only when the Arrow read fails: every line is validated with msgspec
    (:func:`validate_lines`) and only the valid ones are decoded. The msgspec schema is
    the single source of truth for reasons in both paths. Returns the frame and the
    number of records read (non-blank lines).
    """
    starts, ends, index = line_spans(data)
    numbers = index + first_line
    max_line = int((ends - starts).max()) if len(starts) else 0
    try:
        table = _arrow_read(data, arrow_schema, max_line)
        if table.num_rows != len(numbers):
            raise ValueError("row count differs from the number of non-blank lines")
        # Arrow's JSON reader passes invalid UTF-8 inside strings through; polars would only fail
        # later (ComputeError writing or reading the output). A full validation finds it here.
        table.validate(full=True)
    except (pa.ArrowInvalid, UnicodeDecodeError, ValueError):
        batch = validate_lines(path, data, schema, quarantine, first_line)
        table = _arrow_read(b"\n".join(batch.lines), arrow_schema, max_line)
        if table.num_rows != len(batch.line_numbers):  # pragma: no cover - would be a bug
            raise InputFileError(f"{path}: validated lines did not decode one row per line")
        df = pl.from_arrow(table).with_columns(pl.Series("row", batch.line_numbers, dtype=pl.Int64))
        return df, batch.rows_in
    df = pl.from_arrow(table).with_columns(pl.Series("row", numbers, dtype=pl.Int64))
    flagged = df.with_row_index("_k").filter(suspect).get_column("_k").to_list()
    if flagged:
        decoder = msgspec.json.Decoder(schema)
        bad = []
        for k in flagged:
            line = data[starts[k]:ends[k]]
            try:
                decoder.decode(line)
            except (msgspec.ValidationError, msgspec.DecodeError) as e:
                quarantine.add(str(path), int(numbers[k]), f"schema: {e}", line)
                bad.append(int(numbers[k]))
        if bad:
            df = df.filter(~pl.col("row").is_in(bad))
    return df, len(numbers)


def iter_jsonl_frames(path: Path, schema: type, arrow_schema: pa.Schema, suspect: pl.Expr,
                      quarantine: Quarantine, chunk_bytes: int = 64 << 20) -> Iterator[tuple[pl.DataFrame, int]]:
    """:func:`frame_from_jsonl` over ``path`` in chunks of whole lines: memory bounded by ``chunk_bytes``."""
    first = 1
    for data in iter_line_chunks(path, chunk_bytes):
        yield frame_from_jsonl(path, data, schema, arrow_schema, suspect, quarantine, first)
        first += data.count(b"\n")


def read_jsonl_frame(path: Path, schema: type, arrow_schema: pa.Schema, suspect: pl.Expr,
                     quarantine: Quarantine) -> tuple[pl.DataFrame, int]:
    """:func:`frame_from_jsonl` over a whole file."""
    return frame_from_jsonl(path, read_bytes(path), schema, arrow_schema, suspect, quarantine)


# ------------------------------------------------------------------------------ parquet record files

def _required_paths(info: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of the required fields of a msgspec struct type (into lists of structs too)."""
    out: list[tuple[str, ...]] = []
    for f in info.fields:
        if not f.required:
            continue
        path = (*prefix, f.name)
        out.append(path)
        t = f.type.type if isinstance(f.type, msgspec.inspect.Metadata) else f.type
        if isinstance(t, msgspec.inspect.ListType):
            item = t.item_type.type if isinstance(t.item_type, msgspec.inspect.Metadata) else t.item_type
            if isinstance(item, msgspec.inspect.StructType):
                out.extend(_required_paths(item, path))
    return out


def _field_of(t: pa.DataType, name: str) -> pa.DataType | None:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if pa.types.is_struct(t) and t.get_field_index(name) >= 0:
        return t.field(name).type
    return None


def _leaf_columns(arrow_schema: pa.Schema, pf: pq.ParquetFile) -> list[str]:
    """Parquet column paths to read: the file's leaves at or under a leaf of ``arrow_schema`` (so of
    a list of structs only the struct fields ``arrow_schema`` names, e.g. a message's ``role`` and
    ``content``, not its header; a leaf nested deeper than expected is read, to be reported)."""
    wanted: set[tuple[str, ...]] = set()

    def walk(t: pa.DataType, path: tuple[str, ...]) -> None:
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            t = t.value_type
        if pa.types.is_struct(t):
            for f in t:
                walk(f.type, (*path, f.name))
        else:
            wanted.add(path)

    for f in arrow_schema:
        walk(f.type, (f.name,))
    out = []
    for i in range(pf.metadata.num_columns):
        col = pf.schema.column(i).path
        names = tuple(n for n in col.split(".") if n not in _LIST_LEVELS)
        if any(names[:len(w)] == w for w in wanted):
            out.append(col)
    return out


_LIST_LEVELS = frozenset(("list", "element", "item", "array", "bag", "array_element"))  # parquet list wrappers


def _conform(arr: pa.Array, target: pa.DataType, where: str) -> pa.Array:
    """``arr`` as ``target``: struct fields by name (absent ones null, extra ones dropped), lists
    element-wise, strings from (large) strings; any other type change raises ``TypeError``."""
    t = arr.type
    if pa.types.is_struct(target):
        if not pa.types.is_struct(t):
            raise TypeError(f"`{where}` is {t}, expected a struct")
        kids = [_conform(arr.field(f.name), f.type, f"{where}.{f.name}") if t.get_field_index(f.name) >= 0
                else pa.nulls(len(arr), f.type) for f in target]
        return pa.StructArray.from_arrays(kids, fields=list(target), mask=arr.is_null() if arr.null_count else None)
    if pa.types.is_list(target):
        if pa.types.is_large_list(t):
            arr = arr.cast(pa.list_(t.value_type))
        elif not pa.types.is_list(t):
            raise TypeError(f"`{where}` is {t}, expected a list")
        values = _conform(arr.values, target.value_type, f"{where}[]")
        return pa.ListArray.from_arrays(arr.offsets, values, mask=arr.is_null() if arr.null_count else None)
    if t == target:
        return arr
    if pa.types.is_null(t) or (pa.types.is_string(target) and (pa.types.is_large_string(t)
                                                               or pa.types.is_string_view(t))):
        return arr.cast(target)
    if pa.types.is_dictionary(t) and t.value_type in (pa.string(), pa.large_string()) and pa.types.is_string(target):
        return arr.cast(target)
    raise TypeError(f"`{where}` is {t}, expected {target}")


def _as_binary(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.binary()
    if pa.types.is_list(t):
        return pa.list_(_as_binary(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _as_binary(f.type)) for f in t])
    return t


def _raw_bytes_row(batch: pa.RecordBatch, k: int) -> str:
    """A row with invalid UTF-8 as JSON (strings read as bytes, decoded with backslash escapes)."""
    one = batch.slice(k, 1)
    rec = {}
    for name, col in zip(one.schema.names, one.columns):
        rec[name] = col.cast(_as_binary(col.type)).to_pylist()[0]

    def dec(v: Any) -> Any:
        if isinstance(v, bytes):
            return v.decode("utf-8", errors="backslashreplace")
        if isinstance(v, list):
            return [dec(x) for x in v]
        if isinstance(v, dict):
            return {a: dec(b) for a, b in v.items()}
        return v
    return to_raw(dec(rec))


def iter_parquet_frames(path: Path, schema: type, arrow_schema: pa.Schema, suspect: pl.Expr,
                        quarantine: Quarantine, batch_bytes: int = 64 << 20, what: str = "records"
                        ) -> Iterator[tuple[pl.DataFrame, int]]:
    """The parquet analogue of :func:`iter_jsonl_frames`: frames of ``arrow_schema`` with a ``row``
    column (1-based row of the file) and the number of records read, in bounded memory.

    Only the columns of ``arrow_schema`` are read, and of a list of structs only the struct fields
    it names (a WildChat message's ``role``/``content``/``hashed_ip``, not its header or the
    moderation columns), in record batches of about ``batch_bytes`` of uncompressed column data
    (row groups are streamed, never the whole file). Optional fields the file lacks are null.
    File-level (:class:`ParquetReadError` naming the file): not parquet or corrupt, a required field
    of the msgspec ``schema`` absent, a column of an incompatible type. Row-level (quarantined): a
    row with invalid UTF-8 in a string read, and rows flagged by ``suspect`` that the msgspec
    ``schema`` rejects (same reasons as the JSONL reader).
    """
    p = Path(path)
    if not p.exists():
        raise ParquetReadError(p, what, "missing", f"{what} not found")
    if p.is_dir():
        raise ParquetReadError(p, what, "unreadable", f"{what} is a directory, expected a parquet file")
    try:
        pf = pq.ParquetFile(p)
        file_schema = pf.schema_arrow
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise ParquetReadError(p, what, "unreadable", f"cannot read {what} as parquet: {type(e).__name__}: {e}"
                               ) from None
    missing = []
    for req in _required_paths(msgspec.inspect.type_info(schema)):
        t: pa.DataType | None = file_schema.field(req[0]).type if req[0] in file_schema.names else None
        for name in req[1:]:
            t = _field_of(t, name) if t is not None else None
        if t is None:
            missing.append(".".join(req))
    if missing:
        raise ParquetReadError(p, what, "columns", f"{what} lacks required field(s) {missing} (columns: "
                               f"{file_schema.names})", missing)
    columns = _leaf_columns(arrow_schema, pf)
    md = pf.metadata
    size = sum(rg.column(j).total_uncompressed_size for rg in (md.row_group(i) for i in range(md.num_row_groups))
               for j in range(rg.num_columns) if rg.column(j).path_in_schema in columns)
    # First guess from the page sizes (dictionary-encoded pages understate the decoded size); then,
    # per row group, from the decoded size of the batches read so far.
    row_bytes = max(1.0, size / max(1, md.num_rows))
    src = str(p)
    first = 1

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal row_bytes
        decoded = rows = 0
        for i in range(md.num_row_groups):
            size_rows = max(1, int(batch_bytes // row_bytes))
            for b in pf.iter_batches(batch_size=size_rows, row_groups=[i], columns=columns, use_threads=False):
                decoded += b.nbytes
                rows += b.num_rows
                yield b
            if rows:
                row_bytes = max(1.0, decoded / rows)

    it = batches()
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001
            raise ParquetReadError(p, what, "unreadable", f"cannot read {what} as parquet (rows from {first}): "
                                   f"{type(e).__name__}: {e}") from None
        n = batch.num_rows
        try:
            cols = [_conform(batch.column(f.name), f.type, f.name) if f.name in batch.schema.names
                    else pa.nulls(n, f.type) for f in arrow_schema]
        except TypeError as e:
            raise ParquetReadError(p, what, "columns", f"{what} has a column of the wrong type: {e}") from None
        table = pa.Table.from_arrays(cols, schema=arrow_schema)
        numbers = np.arange(first, first + n, dtype=np.int64)
        keep = np.ones(n, dtype=bool)
        try:
            table.validate(full=True)
        except pa.ArrowInvalid:
            for k in range(n):
                try:
                    table.slice(k, 1).validate(full=True)
                except pa.ArrowInvalid as e:
                    quarantine.add(src, int(numbers[k]), f"invalid UTF-8: {e}", _raw_bytes_row(batch, k))
                    keep[k] = False
            table = table.filter(pa.array(keep))
        df = pl.from_arrow(table).with_columns(pl.Series("row", numbers[keep], dtype=pl.Int64))
        flagged = df.with_row_index("_k").filter(suspect).get_column("_k").to_list()
        if flagged:
            bad = []
            for k in flagged:
                rec = df.row(k, named=True)
                rec.pop("row")
                rec = {key: v for key, v in rec.items() if v is not None}
                try:
                    msgspec.convert(rec, schema)
                except msgspec.ValidationError as e:
                    quarantine.add(src, int(df["row"][k]), f"schema: {e}", to_raw(rec))
                    bad.append(int(df["row"][k]))
            if bad:
                df = df.filter(~pl.col("row").is_in(bad))
        first += n
        yield df, n


def load_json_document(path: Path) -> Any:
    """Parse a whole JSON document; a parse failure is a file-level error naming file and line.

    A gzip-compressed document (``abcd_v1.1.json.gz``, recognised by its magic bytes) is
    decompressed first; a corrupt or truncated one is a file-level error too."""
    data = read_bytes(path)
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise InputFileError(f"{path}: not a valid gzip file: {e}") from None
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        line = _line_of_error(data, str(e))
        where = f" (line {line})" if line else ""
        raise InputFileError(f"{path}{where}: not valid JSON: {e}") from None


def _line_of_error(data: bytes, msg: str) -> int | None:
    import re

    m = re.search(r"byte (\d+)", msg)
    if not m:
        return None
    return data[: int(m.group(1))].count(b"\n") + 1


def to_raw(obj: Any) -> str:
    """Serialise a record for the quarantine ``raw`` column."""
    try:
        return msgspec.json.encode(obj).decode("utf-8")
    except (TypeError, msgspec.EncodeError):
        return repr(obj)
