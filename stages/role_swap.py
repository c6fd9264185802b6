"""DVC stage ``role_swap``: WildChat-style chat logs -> user-side mid-training rows (SPEC §2.1).

Sources are the ``mixture`` entries (:func:`source_files`: a file is named by its stem; a glob or
folder, whose shards form one source, by its last path component without a wildcard): WildChat-style
JSONL, or WildChat's published parquet shards (a glob over ``*.parquet``, or a folder: its
``*.jsonl``/``*.parquet`` files), read in batches of about ``chunk_mb`` (only the columns used;
a message's ``role``/``content``/``hashed_ip``). Each conversation is schema-checked (msgspec,
per line or flagged row), decoded in one vectorised pass (polars), checked (user id, oversize,
empty human turn, chat-template tokens or think tags in any turn (quarantined, or stripped and
counted with ``markup: clean``), a turn of the trained role,
duplicates), routed to the swap or no-swap processor by source, and given its seeded mixture
``copies``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa

from mimesis_lab.chat import ROLES, empty_turn_reason, markup_reason, role_swap_frame, strip_markup_messages
from mimesis_lab.config import Params, RoleSwapParams
from mimesis_lab.io import InputFileError, Quarantine, expand_glob, iter_jsonl_frames, iter_parquet_frames
from mimesis_lab.mixture import mixture_copies, source_rng
from stages.common import PartWriter, StageError, StageResult, main

STAGE = "role_swap"


class WildChatMessage(msgspec.Struct):
    role: Literal["system", "user", "assistant"]
    content: str
    hashed_ip: str | None = None


class WildChatRecord(msgspec.Struct):
    """The fields of a WildChat-1M record this stage relies on (others are ignored)."""

    conversation_hash: str
    conversation: Annotated[list[WildChatMessage], msgspec.Meta(min_length=1)]
    hashed_ip: str | None = None
    model: str | None = None
    language: str | None = None


ARROW_SCHEMA = pa.schema([
    ("conversation_hash", pa.string()),
    ("model", pa.string()),
    ("language", pa.string()),
    ("hashed_ip", pa.string()),
    ("conversation", pa.list_(pa.struct([
        ("role", pa.string()), ("content", pa.string()), ("hashed_ip", pa.string())]))),
])


def _suspect() -> pl.Expr:
    """Rows Arrow accepted that may still violate :class:`WildChatRecord` (nulls, unknown roles)."""
    conv = pl.col("conversation")
    msg = pl.element()
    bad_msg = (msg.is_null() | msg.struct.field("content").is_null()
               | ~msg.struct.field("role").is_in(list(ROLES)).fill_null(False))
    return (pl.col("conversation_hash").is_null() | conv.is_null() | (conv.list.len() == 0)
            | conv.list.eval(bad_msg).list.any().fill_null(True))


OUTPUT_COLUMNS = [
    "conversation_id", "user_id", "source", "source_file", "row", "swap", "copies",
    "messages", "n_messages", "n_target_turns", "model", "language",
]


SUFFIXES = (".jsonl", ".parquet")


_WILDCARD = re.compile(r"[*?\[]")
#: Folder names of dataset layouts that say nothing of the dataset (``WildChat-1M/data/train-*.parquet``):
#: skipped when naming a source, unless nothing else is left.
GENERIC_FOLDERS = frozenset({"data", "default", "train", "test", "validation", "parquet", "shards"})


def source_name(glob: str) -> str | None:
    """The source name of a mixture entry that may stand for several files (a glob, or a folder):
    the last component of its path without a wildcard, its suffix dropped, and skipping the
    :data:`GENERIC_FOLDERS` of dataset layouts (``data/wildchat/train-*.parquet`` -> ``wildchat``,
    ``WildChat-1M/data/train-*.parquet`` -> ``WildChat-1M``, ``data/wildchat`` -> ``wildchat``); ``None``
    for the path of one file (its source name is the file stem)."""
    path = Path(glob)
    if not _WILDCARD.search(glob) and not path.is_dir():
        return None
    fixed = [p for p in path.parts if not _WILDCARD.search(p) and p not in ("/", ".", "..")]
    if not fixed:
        return glob
    name = next((p for p in reversed(fixed) if p.lower() not in GENERIC_FOLDERS), fixed[-1])
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def source_files(cfg: RoleSwapParams) -> list[tuple[Path, float, str]]:
    """``(file, ratio, source name)`` for every file matched by the mixture globs, in params order.
    A mixture entry is one source: the shards a glob or folder matches (WildChat's
    ``train-000NN-of-000MM.parquet``) share the entry's name (:func:`source_name`), their rows are
    sampled together at the entry's ratio; the path of one file is named by its stem."""
    seen: dict[Path, str] = {}
    names: dict[str, str] = {}     # source name -> the mixture entry that has it
    out: list[tuple[Path, float, str]] = []
    for glob, ratio in cfg.mixture.items():
        shared = source_name(glob)
        for path in expand_glob(glob, folder_suffixes=SUFFIXES):
            if path in seen:
                raise InputFileError(f"{path}: matched by two mixture globs ({seen[path]!r} and {glob!r})")
            name = shared or path.stem
            if names.setdefault(name, glob) != glob:
                raise InputFileError(f"{path}: source name {name!r} (of mixture entry {glob!r}) is also the name "
                                     f"of mixture entry {names[name]!r}; a glob or folder is named by its last "
                                     "path component without a wildcard, a file by its stem: rename one")
            seen[path] = glob
            out.append((path, ratio, name))
    unknown = sorted(set(cfg.no_swap_sources) - set(names))
    if unknown:
        raise StageError(f"params role_swap.no_swap_sources names unknown source(s) {unknown}; known: {sorted(names)}")
    return out


def check_rows(df: pl.DataFrame, cfg: RoleSwapParams, seen: pl.DataFrame | None = None) -> pl.DataFrame:
    """Add ``user_id``, ``swap`` and a ``reason`` (null = valid) to decoded rows (vectorised). With
    ``markup: clean`` the chat-template tokens and think tags are stripped first (``_cleaned`` marks
    the rows that held one).

    ``seen`` (``conversation_hash``, ``_first_loc``) holds the ids accepted from earlier
    chunks; a row repeating one of them, or an earlier valid row of this chunk, is a
    duplicate (the first occurrence wins).
    """
    conv = pl.col("conversation")
    role = pl.element().struct.field("role")
    if cfg.markup == "clean":   # strip the tokens before the checks: a human turn left empty is still caught
        df = df.with_columns(markup_reason("conversation").is_not_null().alias("_cleaned"))
        df = df.with_columns(strip_markup_messages("conversation"))
    df = df.with_columns(
        pl.coalesce(
            pl.col("hashed_ip"),
            conv.list.eval(pl.element().filter(role == "user").struct.field("hashed_ip").drop_nulls()).list.first(),
        ).alias("user_id"),
        pl.col("source").is_in(list(cfg.no_swap_sources)).not_().alias("swap"),
        conv.list.eval(pl.element().struct.field("content").str.len_chars()).alias("_lens"),
        conv.list.eval((role == "user").cast(pl.Int64)).list.sum().alias("_n_user"),
        conv.list.eval((role == "assistant").cast(pl.Int64)).list.sum().alias("_n_assistant"),
    ).with_columns(
        pl.col("_lens").list.max().alias("_max_len"),
        pl.col("_lens").list.arg_max().alias("_argmax_len"),
        pl.when(pl.col("swap")).then(pl.col("_n_user")).otherwise(pl.col("_n_assistant")).alias("n_target_turns"),
    )
    reason = (
        pl.when(pl.col("user_id").is_null())
        .then(pl.lit("missing user id: neither `hashed_ip` nor a user turn's `hashed_ip` is set"))
        .when(pl.col("_max_len") > cfg.max_message_chars)
        .then(pl.format("oversize: `conversation[{}].content` has {} chars > max_message_chars={}",
                        pl.col("_argmax_len"), pl.col("_max_len"), pl.lit(cfg.max_message_chars)))
        .when(empty_turn_reason("conversation").is_not_null())
        .then(empty_turn_reason("conversation"))
        .when(markup_reason("conversation").is_not_null())
        .then(markup_reason("conversation"))
        .when(pl.col("n_target_turns") == 0)
        .then(pl.format("no target turn: no `{}` message to train on (swap={})",
                        pl.when(pl.col("swap")).then(pl.lit("user")).otherwise(pl.lit("assistant")), pl.col("swap")))
    )
    df = df.with_columns(reason.alias("reason"))
    # Duplicates among otherwise-valid rows, in input order: the first occurrence wins.
    valid = pl.col("reason").is_null()
    df = df.with_columns(pl.int_range(pl.len()).alias("_i"))
    first = df.filter(valid).group_by("conversation_hash").agg(
        pl.col("_i").min().alias("_first_i"),
        pl.format("{}:{}", pl.col("source_file").first(), pl.col("row").first()).alias("_first_loc"),
    )
    if seen is not None and seen.height:
        first = first.join(seen.rename({"_first_loc": "_prev_loc"}), on="conversation_hash", how="left")
        first = first.with_columns(
            pl.when(pl.col("_prev_loc").is_not_null()).then(pl.lit(-1)).otherwise(pl.col("_first_i")).alias("_first_i"),
            pl.coalesce("_prev_loc", "_first_loc").alias("_first_loc"),
        ).drop("_prev_loc")
    df = df.join(first, on="conversation_hash", how="left", maintain_order="left").with_columns(
        pl.when(valid & (pl.col("_i") != pl.col("_first_i")))
        .then(pl.format("duplicate: conversation_hash {} first seen at {}",
                        pl.col("conversation_hash"), pl.col("_first_loc")))
        .otherwise(pl.col("reason"))
        .alias("reason")
    )
    return df


def transform(checked: pl.DataFrame) -> pl.DataFrame:
    """Valid rows -> output rows (without ``copies``): role swap per routing, derived counts."""
    good = checked.filter(pl.col("reason").is_null())
    good = role_swap_frame(good.with_columns(pl.col("conversation").list.eval(
        pl.struct(pl.element().struct.field("role"), pl.element().struct.field("content"))).alias("messages")))
    return good.with_columns(
        pl.col("conversation_hash").alias("conversation_id"),
        pl.col("messages").list.len().cast(pl.Int64).alias("n_messages"),
        pl.col("n_target_turns").cast(pl.Int64),
    ).select([c for c in OUTPUT_COLUMNS if c != "copies"])


def quarantine_rows(checked: pl.DataFrame, quarantine: Quarantine) -> None:
    bad = checked.filter(pl.col("reason").is_not_null())
    if bad.height:
        quarantine.extend_frame(bad.select(
            "source_file", "row", "reason",
            pl.struct("conversation_hash", "hashed_ip", "model", "language", "conversation")
            .struct.json_encode().alias("raw")))


def read_source(path: Path, cfg: RoleSwapParams, quarantine: Quarantine):
    """``(frame, records read)`` chunks of one source: JSONL by chunks of whole lines, parquet
    (WildChat's shards) by record batches; both of about ``chunk_mb``."""
    chunk = max(1, int(cfg.chunk_mb * 2**20))
    if path.suffix == ".parquet":
        return iter_parquet_frames(path, WildChatRecord, ARROW_SCHEMA, _suspect(), quarantine, chunk,
                                   what="WildChat conversations")
    return iter_jsonl_frames(path, WildChatRecord, ARROW_SCHEMA, _suspect(), quarantine, chunk)


def run_role_swap(cfg: RoleSwapParams) -> StageResult:
    """Stream every source in chunks of ``chunk_mb``: check, quarantine, swap, spill to parts;
    then draw the seeded mixture ``copies`` per source and stream the parts into the output."""
    quarantine = Quarantine()
    files = source_files(cfg)
    writer = PartWriter(cfg.output)
    seen = pl.DataFrame(schema={"conversation_hash": pl.Utf8, "_first_loc": pl.Utf8})
    users: set[str] = set()
    per_source: dict[str, dict] = {}
    rows_in = cleaned = 0
    try:
        for path, ratio, name in files:
            src = per_source.setdefault(name, {"rows_in": 0, "rows_out": 0, "ratio": ratio, "files": 0,
                                               "swap": name not in cfg.no_swap_sources})
            src["files"] += 1
            for df, n in read_source(path, cfg, quarantine):
                rows_in += n
                src["rows_in"] += n
                checked = check_rows(df.with_columns(
                    pl.lit(name).alias("source"), pl.lit(str(path)).alias("source_file")), cfg, seen)
                quarantine_rows(checked, quarantine)
                if "_cleaned" in checked.columns:
                    cleaned += int(checked.filter(pl.col("reason").is_null()).get_column("_cleaned").sum())
                out = transform(checked)
                writer.write(out)
                seen = pl.concat([seen, out.select(
                    "conversation_id", pl.format("{}:{}", "source_file", "row").alias("_first_loc"),
                ).rename({"conversation_id": "conversation_hash"})])
                users.update(out.get_column("user_id").unique().to_list())
                src["rows_out"] += out.height
        copies = []
        for name, src in per_source.items():  # parts hold each source's rows contiguously, in this order
            c = mixture_copies(src["rows_out"], src["ratio"], source_rng(cfg.seed, name))
            src["samples"] = int(c.sum())
            copies.append(c)
        writer.add_column("copies", np.concatenate(copies).astype(np.int64), pl.Int64)
        writer.select(OUTPUT_COLUMNS)
    except BaseException:
        writer.cleanup()
        raise
    swapped = sum(s["rows_out"] for s in per_source.values() if s["swap"])
    extra = {
        "samples_out": sum(s["samples"] for s in per_source.values()),
        "rows_swapped": swapped,
        "rows_no_swap": writer.rows - swapped,
        "sources": {k: {"rows_in": v["rows_in"], "rows_out": v["rows_out"], "samples": v["samples"],
                        "swap": v["swap"], "files": v["files"]}
                    for k, v in per_source.items()},
        "users": len(users),
        "markup": cfg.markup,
        "markup_cleaned": cleaned,
    }
    return StageResult(outputs={cfg.output: writer}, rows_in=rows_in, rows_out=writer.rows,
                       quarantine=quarantine, inputs=[p for p, _, _ in files], extra=extra,
                       cleanup=[writer.cleanup])


def build(params: Params) -> StageResult:
    return run_role_swap(params.role_swap)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main(STAGE, build, lambda p: p.role_swap))
