"""DVC stage ``behaviors``: behaviour annotation of ThoughtTrace (SPEC §2.4, taxonomy building).

Every ThoughtTrace conversation (``data/processed/thoughttrace.parquet``, column ``turns``) is
annotated by the ``rule`` annotator (in order) or the ``openai`` one (concurrently, under one overall
deadline: :meth:`~mimesis_lab.annotators.OpenAIAnnotator.annotate_all`); an annotator failure
quarantines the conversation (``annotator: …``) and is counted by reason in the metrics
(``annotator_calls``: calls, failures per reason, recovered retries). Frequencies are in-sample
counts, not sampling probabilities.
The ABCD behaviour-task rows are the separate stage ``behavior_tasks``.

Accounting: rows_in = ThoughtTrace conversations; rows_out = annotated conversations.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from mimesis_lab.annotators import OpenAIAnnotator
from mimesis_lab.behaviors import ALL_CODES, TAXONOMY, rule_annotate
from mimesis_lab.config import Params
from mimesis_lab.io import Quarantine, read_parquet, to_raw
from stages.common import StageResult
from stages.common import main as stage_main

STAGE = "behaviors"

ANNOTATION_SCHEMA = {
    "conversation_id": pl.Utf8, "user_id": pl.Utf8, "behavior": pl.Utf8, "turns": pl.List(pl.Int64),
    "quote": pl.Utf8, "severity": pl.Int64, "rationale": pl.Utf8, "annotator": pl.Utf8,
}
FREQUENCY_SCHEMA = {"behavior": pl.Utf8, "name": pl.Utf8, "count": pl.Int64, "share": pl.Float64}
REQUIRED_TT_COLUMNS = ("conversation_id", "user_id", "turns")


def read_thoughttrace(path: Path) -> pl.DataFrame:
    return read_parquet(path, "ThoughtTrace parquet", required=REQUIRED_TT_COLUMNS,
                        hint="run the `thoughttrace` stage first")


def annotate_conversations(df: pl.DataFrame, params: Params, source: Path, quarantine: Quarantine,
                           counts: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Annotation rows of every conversation; failures are quarantined. ``counts`` receives the
    ``openai`` annotator's outcome counts (:class:`~mimesis_lab.endpoint.Tally`)."""
    cfg = params.behaviors
    annotator = OpenAIAnnotator(cfg.openai) if cfg.annotator == "openai" else None
    rows: list[dict[str, Any]] = []
    has_src = "source_file" in df.columns and "row" in df.columns
    records = list(df.iter_rows(named=True))
    try:
        results = annotator.annotate_all([rec["turns"] or [] for rec in records]) if annotator is not None else None
        for k, rec in enumerate(records):
            turns = rec["turns"] or []
            if results is None:
                found, error = rule_annotate(turns), None
            else:
                found, error = results[k].annotations, results[k].error
            if found is None:
                src, row = (rec["source_file"], rec["row"]) if has_src else (str(source), k + 1)
                quarantine.add(str(src), int(row), f"annotator: {error}",
                               to_raw({"conversation_id": rec["conversation_id"], "turns": turns}))
                continue
            for a in found:
                rows.append({"conversation_id": rec["conversation_id"], "user_id": rec["user_id"], **a,
                             "annotator": cfg.annotator})
    finally:
        if annotator is not None:
            annotator.close()
            if counts is not None:
                counts.update(annotator.tally.counts())
    return rows


def frequencies(annotations: pl.DataFrame, n_conversations: int) -> pl.DataFrame:
    counts = dict(annotations.group_by("behavior").len().iter_rows()) if annotations.height else {}
    return pl.DataFrame(
        [{"behavior": b, "name": TAXONOMY[b].name, "count": int(counts.get(b, 0)),
          "share": (counts.get(b, 0) / n_conversations) if n_conversations else 0.0} for b in ALL_CODES],
        schema=FREQUENCY_SCHEMA,
    )


def build(params: Params) -> StageResult:
    cfg = params.behaviors
    quarantine = Quarantine()
    tt_path = Path(params.thoughttrace.output)
    tt = read_thoughttrace(tt_path)
    calls: dict[str, int] = {}
    ann = pl.DataFrame(annotate_conversations(tt, params, tt_path, quarantine, calls), schema=ANNOTATION_SCHEMA)
    n_annotated = ann.get_column("conversation_id").n_unique() if ann.height else 0
    freq = frequencies(ann, n_annotated)
    extra = {
        "annotator": cfg.annotator,
        "conversations_annotated": n_annotated,
        "annotation_rows": ann.height,
        "behavior_frequencies": {r["behavior"]: r["count"] for r in freq.iter_rows(named=True)},
    }
    if calls:
        extra["annotator_calls"] = calls
    return StageResult(
        outputs={cfg.annotations_output: ann, cfg.frequencies_output: freq},
        rows_in=tt.height,
        rows_out=n_annotated,
        quarantine=quarantine,
        inputs=[tt_path],
        extra=extra,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m stages.behaviors [--params params.yaml] [--no-track]``."""
    return stage_main(STAGE, build, lambda p: p.behaviors, argv)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
