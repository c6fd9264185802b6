"""DVC stage ``role_swap``: WildChat-style chat logs -> user-side mid-training rows (SPEC §2.1).

Sources are files matched by the ``mixture`` globs (source name = file stem). Each
conversation is schema-checked (msgspec, per line), decoded in one vectorised pass
(polars), checked (user id, oversize, a turn of the trained role, duplicates), routed
to the swap or no-swap processor by source, and given its seeded mixture ``copies``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import polars as pl
import pyarrow as pa

from mimesis_lab.chat import ROLES, role_swap_frame
from mimesis_lab.config import Params, RoleSwapParams
from mimesis_lab.io import InputFileError, Quarantine, expand_glob, read_jsonl_frame
from mimesis_lab.mixture import mixture_copies, source_rng
from stages.common import StageError, StageResult, main

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


def load_sources(cfg: RoleSwapParams, quarantine: Quarantine) -> tuple[pl.DataFrame, int, list[Path]]:
    """Read every source file; returns (decoded valid-schema rows, rows read, files)."""
    frames: list[pl.DataFrame] = []
    seen: dict[Path, str] = {}
    rows_in = 0
    for glob, ratio in cfg.mixture.items():
        for path in expand_glob(glob):
            if path in seen:
                raise InputFileError(f"{path}: matched by two mixture globs ({seen[path]!r} and {glob!r})")
            seen[path] = glob
            df, n = read_jsonl_frame(path, WildChatRecord, ARROW_SCHEMA, _suspect(), quarantine)
            rows_in += n
            frames.append(df.with_columns(
                pl.lit(path.stem).alias("source"),
                pl.lit(str(path)).alias("source_file"),
                pl.lit(ratio, dtype=pl.Float64).alias("ratio"),
            ))
    sources = {p.stem for p in seen}
    unknown = sorted(set(cfg.no_swap_sources) - sources)
    if unknown:
        raise StageError(f"params role_swap.no_swap_sources names unknown source(s) {unknown}; known: {sorted(sources)}")
    return pl.concat(frames, how="vertical"), rows_in, sorted(seen)


def check_rows(df: pl.DataFrame, cfg: RoleSwapParams) -> pl.DataFrame:
    """Add ``user_id``, ``swap`` and a ``reason`` (null = valid) to decoded rows (vectorised)."""
    conv = pl.col("conversation")
    role = pl.element().struct.field("role")
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
    df = df.join(first, on="conversation_hash", how="left", maintain_order="left").with_columns(
        pl.when(valid & (pl.col("_i") != pl.col("_first_i")))
        .then(pl.format("duplicate: conversation_hash {} first seen at {}",
                        pl.col("conversation_hash"), pl.col("_first_loc")))
        .otherwise(pl.col("reason"))
        .alias("reason")
    )
    return df


def assign_copies(df: pl.DataFrame, seed: int) -> pl.DataFrame:
    """Seeded mixture draws per source (see :mod:`mimesis_lab.mixture`)."""
    parts = []
    for (source,), part in df.group_by("source", maintain_order=True):
        ratio = part.get_column("ratio")[0]
        copies = mixture_copies(part.height, ratio, source_rng(seed, source))
        parts.append(part.with_columns(pl.Series("copies", copies, dtype=pl.Int64)))
    return pl.concat(parts) if parts else df.with_columns(pl.lit(0, dtype=pl.Int64).alias("copies"))


def run_role_swap(cfg: RoleSwapParams) -> StageResult:
    quarantine = Quarantine()
    raw, rows_in, files = load_sources(cfg, quarantine)
    checked = check_rows(raw, cfg)
    bad = checked.filter(pl.col("reason").is_not_null())
    if bad.height:
        quarantine.extend_frame(
            bad.select(
                "source_file", "row", "reason",
                pl.struct("conversation_hash", "hashed_ip", "model", "language", "conversation")
                .struct.json_encode().alias("raw"),
            )
        )
    good = checked.filter(pl.col("reason").is_null())
    good = role_swap_frame(
        good.with_columns(pl.col("conversation").list.eval(
            pl.struct(pl.element().struct.field("role"), pl.element().struct.field("content"))
        ).alias("messages")),
    )
    good = assign_copies(good, cfg.seed).with_columns(
        pl.col("conversation_hash").alias("conversation_id"),
        pl.col("messages").list.len().cast(pl.Int64).alias("n_messages"),
        pl.col("n_target_turns").cast(pl.Int64),
    ).select(OUTPUT_COLUMNS)
    per_source = (
        good.group_by("source", maintain_order=True)
        .agg(rows_out=pl.len(), samples=pl.col("copies").sum(), swap=pl.col("swap").first())
    )
    extra = {
        "samples_out": int(good.get_column("copies").sum() or 0),
        "rows_swapped": int(good.get_column("swap").sum() or 0),
        "rows_no_swap": int((~good.get_column("swap")).sum() or 0),
        "sources": {r["source"]: {"rows_out": r["rows_out"], "samples": r["samples"], "swap": r["swap"]}
                    for r in per_source.iter_rows(named=True)},
        "users": good.get_column("user_id").n_unique(),
    }
    return StageResult(
        outputs={cfg.output: good}, rows_in=rows_in, rows_out=good.height,
        quarantine=quarantine, inputs=files, extra=extra,
    )


def build(params: Params) -> StageResult:
    return run_role_swap(params.role_swap)


if __name__ == "__main__":
    sys.exit(main(STAGE, build, lambda p: p.role_swap))
