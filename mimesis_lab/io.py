"""Reading raw inputs without losing a row.

File-level problems (missing, unreadable, not a file, a JSON document that does not
parse) raise :class:`InputFileError`, whose message names the file (and line).
Row-level problems (malformed JSON line, invalid UTF-8, a field of the wrong type,
an unknown role, an oversize message, …) become quarantine rows with the file, the
1-based row number, the reason and the raw record. Schemas are ``msgspec`` structs,
so validation runs in C and the reason names the JSON path of the bad field
(e.g. ``Invalid enum value 'bot' - at `$.conversation[1].role```).
"""
from __future__ import annotations

import glob as _glob
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

QUARANTINE_SCHEMA = {
    "source_file": pl.Utf8,
    "row": pl.Int64,
    "reason": pl.Utf8,
    "raw": pl.Utf8,
}


class InputFileError(RuntimeError):
    """A whole input file is unusable; the message names the file (and line)."""


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


def expand_glob(pattern: str, root: Path | None = None) -> list[Path]:
    """Sorted files matching ``pattern`` (relative to ``root``); an empty match is a file-level error."""
    base = Path(root) if root else Path.cwd()
    full = pattern if Path(pattern).is_absolute() else str(base / pattern)
    matches = sorted(Path(p) for p in _glob.glob(full, recursive=True))
    if not matches:
        raise InputFileError(f"{pattern}: no input file matches this pattern")
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
    """Lines of one JSONL file that passed schema validation."""

    path: Path
    lines: list[bytes]          # the valid raw lines, in file order
    line_numbers: list[int]     # their 1-based line numbers
    rows_in: int                # non-blank lines read


def read_jsonl(path: Path, schema: type, quarantine: Quarantine) -> JsonlBatch:
    """Validate every non-blank line of ``path`` against the msgspec ``schema``.

    Valid lines are returned raw (for a vectorised polars decode); invalid ones are
    quarantined with the reason (malformed JSON, invalid UTF-8, missing or mistyped
    field with its JSON path). Blank lines are not records and are not counted.
    """
    data = read_bytes(path)
    decoder = msgspec.json.Decoder(schema)
    lines: list[bytes] = []
    numbers: list[int] = []
    rows_in = 0
    src = str(path)
    for lineno, line in enumerate(data.split(b"\n"), 1):
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
            kind = "invalid UTF-8" if "UTF-8" in msg else "malformed JSON"
            quarantine.add(src, lineno, f"{kind}: {msg}", line)
            continue
        lines.append(line)
        numbers.append(lineno)
    return JsonlBatch(path=path, lines=lines, line_numbers=numbers, rows_in=rows_in)


def decode_lines(lines: list[bytes], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Vectorised decode of already-validated JSON lines into a frame with ``schema``."""
    if not lines:
        return pl.DataFrame(schema=schema)
    buf = b"\n".join(lines)
    return pl.read_ndjson(io.BytesIO(buf), schema=schema)


def load_json_document(path: Path) -> Any:
    """Parse a whole JSON document; a parse failure is a file-level error naming file and line."""
    data = read_bytes(path)
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
