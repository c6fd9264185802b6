"""DVC stage ``agent_traces``: successful oracle traces of the training gyms, for the agent's SFT warm start.

The paper starts agent RL from an SFT checkpoint on *successful* traces (SPEC §3.2). For every
``train``/``val`` row of the ``gyms`` stage, the gym's oracle (:mod:`mimesis_lab.envs.gyms.experts`)
plays the task through the real gym, which scores every step; a trace is kept only when the gym
rewarded it. The traces use the rollout interface exactly (``[choice] content`` replies; tool
feedback with ``Reward: r`` when ``show_reward``), so SFT teaches what GRPO then optimises.

Nothing is lost: a row whose gym has no oracle (Persuade needs the user's replies), whose oracle
trace earned no reward, or whose episode raised is quarantined with its reason
(``no_oracle:``, ``unrewarded:``, ``error:``), and ``rows_in == rows_out + rows_quarantined``.

Each output is checked with its great-expectations suite (:func:`mimesis_lab.expectations.agent_traces_spec`)
before it is written; a failing suite fails the stage with the failed expectations named.
Writes ``<output_dir>/{train,val}.parquet``: ``data_source, gym, task_id, split, messages,
turn_rewards, total_reward, n_turns``.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

from mimesis_lab import expectations as X
from mimesis_lab.config import Params
from mimesis_lab.envs.gyms import experts
from mimesis_lab.envs.gyms.registry import load_tasks
from mimesis_lab.io import InputFileError, Quarantine, read_parquet
from stages.common import StageError, StageResult, main

STAGE = "agent_traces"
SPLITS = ("train", "val")
MESSAGES = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
SCHEMA = {"data_source": pl.String, "gym": pl.String, "task_id": pl.String, "split": pl.String, "messages": MESSAGES,
          "turn_rewards": pl.List(pl.Float64), "total_reward": pl.Float64, "n_turns": pl.Int64}


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows = read_parquet(path, "gym rows", hint="run `dvc repro gyms`").to_dicts()
    for i, r in enumerate(rows, 1):
        for k in ("reward_model", "extra_info"):
            if isinstance(r.get(k), str):
                try:
                    r[k] = json.loads(r[k])
                except json.JSONDecodeError as e:
                    raise InputFileError(f"{path}: row {i}: field `{k}` is not JSON: {e}") from None
    return rows


def trace_row(row: dict[str, Any], tasks: dict[str, dict[str, Any]], show_reward: bool, max_steps: int
              ) -> tuple[dict[str, Any] | None, str | None]:
    """``(output row, None)`` for a rewarded oracle trace, else ``(None, quarantine reason)``."""
    gym = str(row.get("gym"))
    tid = str(row.get("task_id"))
    if gym not in experts.ORACLE_GYMS:
        return None, f"no_oracle: gym {gym!r} has no oracle expert (its success depends on the user's replies)"
    try:
        tr = experts.expert_trace(row, tasks, show_reward=show_reward, max_steps=max_steps)
    except Exception as e:  # noqa: BLE001 - an episode that raises is this row's problem
        return None, f"error: {gym} task {tid!r}: {type(e).__name__}: {e}"
    if tr is None:
        return None, f"unrewarded: the {gym} oracle trace for task {tid!r} earned no reward"
    return {"data_source": row["data_source"], "gym": gym, "task_id": tid, "split": row["split"],
            "messages": [{"role": m["role"], "content": m["content"]} for m in tr["messages"]],
            "turn_rewards": [float(x) for x in tr["rewards"]], "total_reward": float(tr["total_reward"]),
            "n_turns": len(tr["rewards"])}, None


def check(params: Params, frames: dict[str, pl.DataFrame]) -> dict[str, Any]:
    """Run each output's great-expectations suite; raise :class:`StageError` naming the failures."""
    from stages.validate import get_runner, run_spec

    runner = get_runner()
    report, bad = {}, []
    for split, df in frames.items():
        spec = X.agent_traces_spec(params, split)
        entry = run_spec(spec, df, {}, Path(params.agent_traces.output_dir) / f"{split}.parquet", runner)
        report[spec.name] = {k: entry[k] for k in ("success", "evaluated", "failed")}
        if not entry["success"]:
            bad += [f"{spec.name}: {f.get('expectation')} on {f.get('column')}: {f.get('doc', '')}"
                    for f in entry["failures"]]
    if bad:
        raise StageError("great-expectations failed:\n  " + "\n  ".join(bad))
    return report


def build(params: Params) -> StageResult:
    cfg = params.agent_traces
    quarantine = Quarantine()
    inputs = [Path(cfg.gyms_dir) / f"{s}.parquet" for s in SPLITS]
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    rows_in = 0
    per_gym: dict[str, Counter] = {}
    tasks_cache: dict[str, dict[str, Any]] = {}
    for split, path in zip(SPLITS, inputs):
        rows = read_rows(path)
        rows_in += len(rows)
        for i, row in enumerate(rows, 1):
            gym = str(row.get("gym"))
            if gym not in tasks_cache and gym in experts.ORACLE_GYMS:
                tasks_cache[gym] = load_tasks(gym, params.gyms.tasks.get(gym))
            rec, reason = trace_row(row, tasks_cache, cfg.show_reward, cfg.max_steps)
            c = per_gym.setdefault(gym, Counter())
            if rec is None:
                quarantine.add(str(path), i, reason, json.dumps({k: row.get(k) for k in ("gym", "task_id", "split")}))
                c[f"quarantined_{reason.split(':')[0]}"] += 1
            else:
                out[split].append(rec)
                c[split] += 1
    frames = {s: pl.DataFrame(out[s], schema=SCHEMA) for s in SPLITS}
    if frames["train"].height == 0:
        raise StageError(f"no successful oracle trace in {inputs[0]}: nothing to fine-tune the agent on")
    validation = check(params, frames)
    outputs = {str(Path(cfg.output_dir) / f"{s}.parquet"): frames[s] for s in SPLITS}
    extra = {"sizes": {s: frames[s].height for s in SPLITS}, "per_gym": {g: dict(c) for g, c in per_gym.items()},
             "mean_total_reward": {s: (frames[s].get_column("total_reward").mean() if frames[s].height else None)
                                   for s in SPLITS},
             "validation": validation}
    return StageResult(outputs=outputs, rows_in=rows_in, rows_out=sum(f.height for f in frames.values()),
                       quarantine=quarantine, inputs=inputs, extra=extra)


if __name__ == "__main__":
    sys.exit(main(STAGE, build, lambda p: p.agent_traces))
