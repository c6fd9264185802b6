"""DVC stage ``thoughttrace``: ThoughtTrace JSONL -> reasoning + utterance SFT rows (SPEC §2.2).

Schema check per line (msgspec), one vectorised decode (polars), strict alternation
(others quarantined with the position of the break), no empty user message, no chat-template
token or think tag in a message or in a reason/reaction (they end up inside the ``<think>`` block
of the target; with ``markup: clean`` they are stripped and the cleaned rows counted), then the format of :mod:`mimesis_lab.thoughttrace` applied column-wise.
"""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
import polars as pl
import pyarrow as pa

from mimesis_lab.chat import MARKUP_PATTERN, empty_turn_reason, markup_reason, strip_markup_messages
from mimesis_lab.config import Params, ThoughtTraceParams
from mimesis_lab.io import Quarantine, expand_glob, iter_jsonl_frames
from mimesis_lab.thoughttrace import PROFILE_FIELDS, REACTION_PREFIX, SYSTEM_HEADER
from stages.common import PartWriter, StageResult, main

STAGE = "thoughttrace"
ID_PATTERN = r"^(user[^_]+)_(task[^_]+)_(conversation[^_]+)$"


class TTNote(msgspec.Struct):
    content: str
    label: str | None = None
    timestamp: str | None = None


class TTMessage(msgspec.Struct):
    type: Literal["user", "assistant"]
    content: str
    id: str | int | None = None
    timestamp: str | None = None
    reasons: list[TTNote] | None = None
    reactions: list[TTNote] | None = None


class TTSurvey(msgspec.Struct):
    age: str | None = None
    gender: str | None = None
    education: str | None = None
    occupation: str | None = None
    frequency: str | None = None
    purposes: list[str] | None = None


class TTRecord(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]
    task_summary: str
    messages: Annotated[list[TTMessage], msgspec.Meta(min_length=1)]
    model_name: str | None = None
    task_expectation: str | None = None
    survey_answers: list[TTSurvey] | None = None


_NOTE = pa.list_(pa.struct([("content", pa.string()), ("label", pa.string()), ("timestamp", pa.string())]))
ARROW_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("model_name", pa.string()),
    ("task_summary", pa.string()),
    ("task_expectation", pa.string()),
    ("survey_answers", pa.list_(pa.struct([
        ("age", pa.string()), ("gender", pa.string()), ("education", pa.string()),
        ("occupation", pa.string()), ("frequency", pa.string()), ("purposes", pa.list_(pa.string())),
    ]))),
    ("messages", pa.list_(pa.struct([
        ("type", pa.string()), ("content", pa.string()), ("reasons", _NOTE), ("reactions", _NOTE)]))),
])


def _suspect() -> pl.Expr:
    """Rows Arrow accepted that may still violate :class:`TTRecord` (nulls, enum values, id pattern)."""
    el = pl.element()
    bad_note = el.is_null() | el.struct.field("content").is_null()
    bad_msg = (el.is_null() | el.struct.field("content").is_null()
               | ~el.struct.field("type").is_in(["user", "assistant"]).fill_null(False)
               | el.struct.field("reasons").list.eval(bad_note).list.any().fill_null(False)
               | el.struct.field("reactions").list.eval(bad_note).list.any().fill_null(False))
    msgs = pl.col("messages")
    return (~pl.col("id").str.contains(ID_PATTERN).fill_null(False) | pl.col("task_summary").is_null()
            | msgs.is_null() | (msgs.list.len() == 0) | msgs.list.eval(bad_msg).list.any().fill_null(True)
            | pl.col("survey_answers").list.eval(el.is_null()
                                                 | el.struct.field("purposes").list.eval(pl.element().is_null())
                                                 .list.any().fill_null(False)).list.any().fill_null(False))


OUTPUT_COLUMNS = [
    "conversation_id", "user_id", "task_id", "model_name", "source_file", "row", "system_prompt",
    "messages", "turns", "n_messages", "n_target_turns", "n_turns_without_reasons", "include_reactions",
]


def _clean(expr: pl.Expr) -> pl.Expr:
    s = expr.str.strip_chars()
    return pl.when(s.str.len_chars() > 0).then(s)


def system_prompt_expr() -> pl.Expr:
    """Vectorised :func:`mimesis_lab.thoughttrace.build_system_prompt`."""
    survey = pl.col("survey_answers").list.first()
    parts = []
    for f in PROFILE_FIELDS:
        field = survey.struct.field(f)
        if f == "purposes":
            field = field.list.eval(_clean(pl.element()).drop_nulls()).list.join(", ")
        v = _clean(field)
        parts.append(pl.when(v.is_not_null()).then(pl.format(f"{f}: {{}}", v)))
    profile = pl.concat_str(parts, separator="; ", ignore_nulls=True)
    profile = pl.when(profile.str.len_chars() > 0).then(profile)
    lines = [
        pl.lit(SYSTEM_HEADER),
        pl.format("Task: {}", _clean(pl.col("task_summary"))),
        pl.format("Expectations: {}", _clean(pl.col("task_expectation"))),
        pl.format("User profile: {}", profile),
    ]
    return pl.concat_str(lines, separator="\n", ignore_nulls=True)


def alternation_reason() -> pl.Expr:
    """Null when messages strictly alternate and hold a user message (the AI may open:
    :func:`mimesis_lab.thoughttrace.is_alternating`), else the reason."""
    types = pl.col("messages").list.eval(pl.element().struct.field("type"))
    repeat_at = types.list.eval((pl.element() == pl.element().shift(1)).fill_null(False).arg_max())
    has_repeat = types.list.eval(pl.element() == pl.element().shift(1)).list.any()
    pos = repeat_at.list.first()
    return (
        pl.when(has_repeat)
        .then(pl.format("non-alternating: messages {} and {} are both '{}'", pos - 1, pos, types.list.get(pos)))
        .when(~types.list.contains("user"))
        .then(pl.lit("no user message (an AI opening alone has no target)"))
    )


def format_frame(df: pl.DataFrame, include_reactions: bool) -> pl.DataFrame:
    """Build ``messages``/``turns`` for alternating rows (vectorised)."""
    notes = lambda col: pl.col(col).fill_null([]).list.eval(  # noqa: E731
        _clean(pl.element().struct.field("content")).drop_nulls())
    flat = (
        df.select("_i", "messages").explode("messages").unnest("messages")
        .with_columns(reasons=notes("reasons"), reactions=notes("reactions"))
    )
    prev_reactions = pl.col("reactions").shift(1).over("_i").fill_null([])
    think_lines = pl.col("reasons")
    if include_reactions:
        think_lines = pl.concat_list(
            prev_reactions.list.eval(pl.lit(REACTION_PREFIX) + pl.element()), pl.col("reasons"))
    is_user = pl.col("type") == "user"
    flat = flat.with_columns(
        role=pl.when(is_user).then(pl.lit("assistant")).otherwise(pl.lit("user")),
        text=pl.when(is_user)
        .then(pl.concat_str(pl.lit("<think>"), think_lines.list.join("\n"), pl.lit("</think>"), pl.col("content")))
        .otherwise(pl.col("content")),
        no_reason=(is_user & (pl.col("reasons").list.len() == 0)).cast(pl.Int64),
    )
    agg = flat.group_by("_i", maintain_order=True).agg(
        chat=pl.struct(pl.col("role"), pl.col("text").alias("content")),
        turns=pl.struct(pl.col("type").alias("role"), "content", "reasons", "reactions"),
        n_turns_without_reasons=pl.col("no_reason").sum(),
        n_target_turns=is_user.sum().cast(pl.Int64),
    )
    out = df.drop("messages").join(agg, on="_i", how="left", maintain_order="left")
    system = pl.struct(pl.lit("system").alias("role"), pl.col("system_prompt").alias("content"))
    return out.with_columns(
        messages=pl.concat_list(pl.concat_list(system), pl.col("chat")),
    ).with_columns(
        n_messages=pl.col("messages").list.len().cast(pl.Int64),
        include_reactions=pl.lit(include_reactions),
    )


def notes_markup_reason(field: str) -> pl.Expr:
    """Null, or the reason naming the first message whose ``field`` notes hold a chat-template token or
    think tag (the notes are written inside the target's ``<think>`` block)."""
    hit = pl.col("messages").list.eval(pl.element().struct.field(field).list.eval(
        pl.element().struct.field("content").str.contains(MARKUP_PATTERN).fill_null(False)).list.any().fill_null(False))
    at = hit.list.arg_max()
    notes = pl.col("messages").list.get(at, null_on_oob=True).struct.field(field)
    token = notes.list.eval(pl.element().struct.field("content").str.extract(f"({MARKUP_PATTERN})", 1)
                            ).list.drop_nulls().list.first()
    return pl.when(hit.list.any().fill_null(False)).then(pl.format(
        "markup: `messages[{}].{}` contains the chat-template token or think tag '{}'", at, pl.lit(field), token))


def check_chunk(df: pl.DataFrame, cfg: ThoughtTraceParams, seen: pl.Series) -> pl.DataFrame:
    """Add ``reason`` (null = valid): duplicate id (of this chunk or an earlier one), oversize, empty user
    message, markup (or, with ``markup: clean``, the tokens stripped first and ``_cleaned`` set), alternation."""
    df = df.with_columns(pl.int_range(pl.len()).alias("_i"))
    if cfg.markup == "clean":   # strip the tokens before the checks: a user message left empty is still caught
        df = df.with_columns((markup_reason("messages", role="type").is_not_null()
                              | notes_markup_reason("reasons").is_not_null()
                              | notes_markup_reason("reactions").is_not_null()).alias("_cleaned"))
        df = df.with_columns(strip_markup_messages("messages", notes=("reasons", "reactions")))
    lens = pl.col("messages").list.eval(pl.element().struct.field("content").str.len_chars())
    df = df.with_columns(_max_len=lens.list.max(), _argmax=lens.list.arg_max())
    duplicate = (pl.col("_i") != pl.col("_i").min().over("id")) | pl.col("id").is_in(seen.implode())
    reason = (
        pl.when(duplicate)
        .then(pl.format("duplicate: id {} appears earlier in the input", pl.col("id")))
        .when(pl.col("_max_len") > cfg.max_message_chars)
        .then(pl.format("oversize: `messages[{}].content` has {} chars > max_message_chars={}",
                        pl.col("_argmax"), pl.col("_max_len"), pl.lit(cfg.max_message_chars)))
        .when(empty_turn_reason("messages", role="type").is_not_null())
        .then(empty_turn_reason("messages", role="type"))
        .when(markup_reason("messages", role="type").is_not_null())
        .then(markup_reason("messages", role="type"))
        .when(notes_markup_reason("reasons").is_not_null())
        .then(notes_markup_reason("reasons"))
        .when(pl.lit(cfg.include_reactions) & notes_markup_reason("reactions").is_not_null())
        .then(notes_markup_reason("reactions"))
        .otherwise(alternation_reason())
    )
    return df.with_columns(reason=reason)


def run_thoughttrace(cfg: ThoughtTraceParams) -> StageResult:
    """Stream the input in chunks of ``chunk_mb``: check, quarantine, format, spill to parts."""
    quarantine = Quarantine()
    files, rows_in = [], 0
    writer = PartWriter(cfg.output)
    seen = pl.Series("id", [], dtype=pl.Utf8)
    users: set[str] = set()
    target_turns = without_reasons = cleaned = 0
    try:
        for path in expand_glob(cfg.input):
            files.append(path)
            chunks = iter_jsonl_frames(path, TTRecord, ARROW_SCHEMA, _suspect(), quarantine,
                                       max(1, int(cfg.chunk_mb * 2**20)))
            for df, n in chunks:
                rows_in += n
                df = check_chunk(df.with_columns(pl.lit(str(path)).alias("source_file")), cfg, seen)
                seen = pl.concat([seen, df.get_column("id")])
                bad = df.filter(pl.col("reason").is_not_null())
                if bad.height:
                    quarantine.extend_frame(bad.select(
                        "source_file", "row", "reason",
                        pl.struct("id", "model_name", "task_summary", "task_expectation", "survey_answers",
                                  "messages").struct.json_encode().alias("raw")))
                if "_cleaned" in df.columns:
                    cleaned += int(df.filter(pl.col("reason").is_null()).get_column("_cleaned").sum())
                good = df.filter(pl.col("reason").is_null()).with_columns(
                    conversation_id=pl.col("id"),
                    user_id=pl.col("id").str.extract(ID_PATTERN, 1),
                    task_id=pl.col("id").str.extract(ID_PATTERN, 2),
                    system_prompt=system_prompt_expr(),
                )
                good = format_frame(good, cfg.include_reactions).select(OUTPUT_COLUMNS)
                writer.write(good)
                users.update(good.get_column("user_id").unique().to_list())
                target_turns += int(good.get_column("n_target_turns").sum() or 0)
                without_reasons += int(good.get_column("n_turns_without_reasons").sum() or 0)
        writer.select(OUTPUT_COLUMNS)
    except BaseException:
        writer.cleanup()
        raise
    extra = {
        "users": len(users),
        "target_turns": target_turns,
        "turns_without_reasons": without_reasons,
        "include_reactions": cfg.include_reactions,
        "markup": cfg.markup,
        "markup_cleaned": cleaned,
    }
    return StageResult(outputs={cfg.output: writer}, rows_in=rows_in, rows_out=writer.rows,
                       quarantine=quarantine, inputs=files, extra=extra, cleanup=[writer.cleanup])


def build(params: Params) -> StageResult:
    return run_thoughttrace(params.thoughttrace)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main(STAGE, build, lambda p: p.thoughttrace))
