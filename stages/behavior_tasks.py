"""DVC stage ``behavior_tasks``: grounded ABCD behaviour-task rows for simulator RL (SPEC §2.4).

ABCD is read as plain JSON or as released (``abcd_v1.1.json.gz``). A scenario whose subflow is not
in the kb (``unknown subflow: …``), or for which the scripted support agent cannot start
(``agent: …``), is quarantined. Every other valid ABCD conversation gives one candidate task row (a seeded neutral share, the 13
behaviours balanced); each is checked by the independent grounding check (withheld information is
available to the user, an infeasible request really conflicts with policy), failures are
quarantined (``grounding: …``). Malformed ABCD records are quarantined too.

Accounting: rows_in = ABCD records; rows_out = task rows written.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from mimesis_lab.abcd import (
    AbcdRecord, build_task_rows, check_grounding, kb_reason, load_abcd, load_guidelines, load_kb, record_raw,
)
from mimesis_lab.behaviors import ALL_CODES
from mimesis_lab.config import Params
from mimesis_lab.io import Quarantine, to_raw
from mimesis_lab.judges.abcd_agent import ABCDSupportAgent
from stages.common import StageResult
from stages.common import main as stage_main

STAGE = "behavior_tasks"

TASK_SCHEMA = {
    "task_id": pl.Utf8, "conversation_id": pl.Utf8, "user_id": pl.Utf8, "scenario_key": pl.Utf8,
    "scenario": pl.Utf8, "behavior_ids": pl.Utf8, "kwargs": pl.Utf8, "flow": pl.Utf8, "subflow": pl.Utf8,
    "turn_budget": pl.Int64, "data_source": pl.Utf8, "needs_trace": pl.Boolean, "abcd_split": pl.Utf8,
}


def playable(records: list[AbcdRecord], kb: dict[str, list[str]], guidelines: dict[str, Any],
             quarantine: Quarantine) -> tuple[list[AbcdRecord], dict[str, int]]:
    """The records the scripted support agent can play; the others quarantined with the reason
    (``unknown subflow``: not in the kb; ``agent``: the agent fails to start on the scenario)."""
    kept: list[AbcdRecord] = []
    rejected: dict[str, int] = {}
    for rec in records:
        reason = kb_reason(rec, kb)
        if reason is None:
            sc = rec.scenario
            try:
                ABCDSupportAgent(sc, kb, guidelines, str(sc.get("flow")), str(sc.get("subflow"))).opening()
            except Exception as e:  # noqa: BLE001 - any failure of the partner makes the scenario unplayable
                reason = f"agent: the support agent cannot start on convo_id {rec.convo_id}: {type(e).__name__}: {e}"
        if reason is None:
            kept.append(rec)
        else:
            kind = reason.split(":", 1)[0]
            rejected[kind] = rejected.get(kind, 0) + 1
            quarantine.add(rec.source_file, rec.row, reason, record_raw(rec))
    return kept, rejected


def build(params: Params) -> StageResult:
    cfg = params.behavior_tasks
    quarantine = Quarantine()
    abcd_path, kb_path, gl_path = Path(cfg.abcd_input), Path(cfg.kb), Path(cfg.guidelines)
    kb, guidelines = load_kb(kb_path), load_guidelines(gl_path)
    records, abcd_in = load_abcd(abcd_path, quarantine)
    records, unplayable = playable(records, kb, guidelines, quarantine)
    candidates = build_task_rows(records, kb, guidelines, cfg)
    kept: list[dict[str, Any]] = []
    rejected: dict[str, int] = {}
    for rec, row in zip(records, candidates):
        reason = check_grounding(row, kb, guidelines)
        if reason is None:
            kept.append(row)
            continue
        b = (row["task_id"].rsplit("-", 1)[-1])
        rejected[b] = rejected.get(b, 0) + 1
        quarantine.add(rec.source_file, rec.row, f"grounding: {reason}", to_raw(row))
    tasks = pl.DataFrame(kept, schema=TASK_SCHEMA)
    by_behavior = {b: 0 for b in ALL_CODES}
    for row in kept:
        by_behavior[row["task_id"].rsplit("-", 1)[-1]] += 1
    extra = {
        "abcd_records": abcd_in,
        "unplayable_by_reason": unplayable,
        "task_candidates": len(candidates),
        "tasks_written": tasks.height,
        "tasks_by_behavior": by_behavior,
        "grounding_rejected_by_behavior": rejected,
        "neutral_share_written": (by_behavior["N"] / tasks.height) if tasks.height else 0.0,
    }
    return StageResult(
        outputs={cfg.output: tasks},
        rows_in=abcd_in,
        rows_out=tasks.height,
        quarantine=quarantine,
        inputs=[abcd_path, kb_path, gl_path],
        extra=extra,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m stages.behavior_tasks [--params params.yaml] [--no-track]``."""
    return stage_main(STAGE, build, lambda p: p.behavior_tasks, argv)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
