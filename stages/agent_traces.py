"""DVC stage ``agent_traces``: rewarded expert traces of the training gyms, for the agent's SFT warm start.

The paper starts agent RL from an SFT checkpoint on *successful* traces (SPEC §3.2). For every
``train``/``val`` row of the ``gyms`` stage, the gym's expert (:mod:`mimesis_lab.envs.gyms.experts`)
plays the task through the real gym, which scores every step; a trace is kept only when the gym
rewarded it. The expert sees only what the agent sees (the prompt and the observations); where the
reward depends on what only the user knows it asks the user, here the scripted
:class:`~mimesis_lab.envs.gyms.offline_user.OfflineUser` (in RL the simulator). The traces use the
rollout interface exactly (``[choice] content`` replies; tool feedback with ``Reward: r`` when
``show_reward``), so SFT teaches what GRPO then optimises.

Each kept row gives one ``oracle`` trace (the expert's best play). Besides, ``explore_share`` of
the output traces are ``exploratory``: the expert's play with seeded deviations (another question
order, an extra question, an earlier answer), rewarded but often less, so RL has choices to weigh.
They are drawn per split from the rows with an oracle trace (seeded shuffle, ``seed``), up to
``EXPLORE_TRIES`` seeds per row; one that is unrewarded, or repeats a trace already kept, is not
kept (counted in ``metrics``' ``explore``). ``explore_share`` and ``seed`` come from
``params.agent_traces`` when it has them, else from the keyword defaults.

Besides, up to ``coached_share`` × the traces are ``coached`` copies, in pairs (:func:`coached_rows`): where
the expert's best play and an exploratory play of the same task part ways after the same history, each
trace is cut after its turn with the template coach's note recommending that turn
(:func:`~mimesis_lab.judges.coach.action_note`: ``unmet`` for a question to the user, ``ready`` for the
final answer) as a ``user`` message before it, the layout of CSD's teacher rows. Only the note tells the two
apart, so the warm start learns to read the coach's notes, which CSD's teacher (the agent itself,
conditioned on a note) needs; the source traces stay as they are. Counts in ``metrics``' ``coached``.

Rows may be UserRL's as published: ``gym``/``task_id`` are derived from ``data_source`` and
``create_kwargs`` where the file lacks them (:func:`~mimesis_lab.envs.gyms.registry.normalise_row`),
the split is the file's, and the traces carry our ``data_source`` (``interact_<gym>``). Nothing is lost: a row that names
no gym or task (``unknown_data_source:``, ``no_task_id:``, ``bad_split:``), whose gym has no
expert, whose oracle trace earned no reward, or whose episode raised is quarantined with its
reason (``no_oracle:``, ``unrewarded:``, ``error:``; a task missing from the gym's task file is an
``error:`` naming the id and the file), and
``rows_in == rows_out + rows_quarantined`` (``rows_out`` counts the input rows with an oracle
trace; the outputs also hold the exploratory traces).

Each output is checked with its great-expectations suite (:func:`mimesis_lab.expectations.agent_traces_spec`)
before it is written; a failing suite fails the stage with the failed expectations named.
Writes ``<output_dir>/{train,val}.parquet``: ``data_source, gym, task_id, split, kind, seed, messages,
turn_rewards, total_reward, n_turns, user_turns`` (``user_turns``: agent turns addressed to the user); a
``coached`` copy has its source's ``seed`` (0: the oracle's) and counts only its own turns.
"""
from __future__ import annotations

import json
import random
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

from mimesis_lab import expectations as X
from mimesis_lab.config import CSDParams, Params
from mimesis_lab.envs.gyms import experts
from mimesis_lab.envs.gyms.registry import RowError, TaskLookupError, load_tasks_or_unreadable, normalise_row
from mimesis_lab.io import InputFileError, Quarantine, read_parquet
from mimesis_lab.judges.coach import NOTES, action_note
from stages.common import StageError, StageResult, main

STAGE = "agent_traces"
SPLITS = ("train", "val")
MESSAGES = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
SCHEMA = {"data_source": pl.String, "gym": pl.String, "task_id": pl.String, "split": pl.String, "kind": pl.String,
          "seed": pl.Int64, "messages": MESSAGES, "turn_rewards": pl.List(pl.Float64), "total_reward": pl.Float64,
          "n_turns": pl.Int64, "user_turns": pl.Int64}
EXPLORE_SHARE = 0.25   # default share of exploratory traces among the output traces (agent_traces.explore_share)
EXPLORE_TRIES = 3      # exploration seeds tried per row


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


def trace_row(row: dict[str, Any], tasks: dict[str, dict[str, Any]], show_reward: bool, max_steps: int,
              explore: int | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """``(output row, None)`` for a rewarded trace (the oracle's, or the exploratory one of seed
    ``explore``), else ``(None, quarantine reason)``."""
    gym = str(row.get("gym"))
    tid = str(row.get("task_id"))
    if gym not in experts.ORACLE_GYMS:
        return None, f"no_oracle: gym {gym!r} has no expert"
    kind = "oracle" if explore is None else "exploratory"
    try:
        tr = experts.expert_trace(row, tasks, show_reward=show_reward, max_steps=max_steps, explore=explore)
    except TaskLookupError as e:
        return None, f"{e.reason}: {e.args[0] if e.args else e}"
    except Exception as e:  # noqa: BLE001 - an episode that raises is this row's problem
        return None, f"error: {gym} task {tid!r}: {type(e).__name__}: {e}"
    if tr is None:
        return None, f"unrewarded: the {gym} {kind} trace for task {tid!r} earned no reward"
    return {"data_source": f"interact_{gym}", "gym": gym, "task_id": tid, "split": row["split"], "kind": kind,
            "seed": 0 if explore is None else int(explore),
            "messages": [{"role": m["role"], "content": m["content"]} for m in tr["messages"]],
            "turn_rewards": [float(x) for x in tr["rewards"]], "total_reward": float(tr["total_reward"]),
            "n_turns": len(tr["rewards"]), "user_turns": int(tr.get("user_turns", 0))}, None


def exploratory_plays(kept: list[tuple[dict[str, Any], dict[str, Any]]], order: list[int],
                      tasks: dict[str, dict[str, Any]], show_reward: bool, max_steps: int, seed: int,
                      counts: Counter, counter: str, tag: str = ""):
    """Yield ``(index into kept, rewarded exploratory trace, its seed)``: for ``k`` in 1..:data:`EXPLORE_TRIES`,
    each row of ``kept`` (``(input row, oracle trace)`` pairs) in ``order``, played with the exploration seed
    ``crc32("{seed}:{gym}:{task_id}:{tag}{k}")``. ``counts[counter]`` counts the plays, and an unrewarded or
    failing play counts its quarantine reason (``unrewarded``, ``error``…) instead of being yielded. Lazy: a
    consumer that stops early plays no further row."""
    for k in range(1, EXPLORE_TRIES + 1):
        for i in order:
            row, _ = kept[i]
            ex_seed = zlib.crc32(f"{seed}:{row.get('gym')}:{row.get('task_id')}:{tag}{k}".encode())
            counts[counter] += 1
            rec, reason = trace_row(row, tasks, show_reward, max_steps, explore=ex_seed)
            if rec is None:
                counts[str(reason).split(":")[0]] += 1
                continue
            yield i, rec, ex_seed


def explore_rows(kept: list[tuple[dict[str, Any], dict[str, Any]]], tasks: dict[str, dict[str, Any]],
                 show_reward: bool, max_steps: int, share: float, seed: int, counts: Counter
                 ) -> list[dict[str, Any]]:
    """Exploratory traces so that they are ``share`` of all traces: ``round(share / (1 - share) * n)``
    for ``n`` oracle traces ``kept`` (``(input row, oracle trace)`` pairs), drawn from the rows in a
    shuffle seeded by ``seed``, up to :data:`EXPLORE_TRIES` seeds each (:func:`exploratory_plays`).
    ``counts`` gets ``attempts``, ``kept``, ``unrewarded``, ``duplicate`` and ``error``."""
    if not kept or share <= 0:
        return []
    want = round(min(share, 0.95) / (1 - min(share, 0.95)) * len(kept))
    if want <= 0:
        return []
    order = list(range(len(kept)))
    random.Random(seed).shuffle(order)
    seen = {json.dumps(rec["messages"]) for _, rec in kept}
    out: list[dict[str, Any]] = []
    for _, rec, _ in exploratory_plays(kept, order, tasks, show_reward, max_steps, seed, counts, "attempts"):
        key = json.dumps(rec["messages"])
        if key in seen:
            counts["duplicate"] += 1
            continue
        seen.add(key)
        counts["kept"] += 1
        out.append(rec)
        if len(out) >= want:
            break
    return out


def turn_note(messages: list[dict[str, Any]], at: int) -> str | None:
    """The template coach's note recommending the assistant message ``messages[at]``
    (:func:`~mimesis_lab.judges.coach.action_note`), read with the user's reply to it."""
    choice, _, content = messages[at]["content"].partition("] ")
    nxt = messages[at + 1] if at + 1 < len(messages) else None
    reply = nxt["content"].split("\nReward:")[0] if nxt is not None and nxt["role"] == "tool" else ""
    return action_note(choice.lstrip("["), content, reply)


def divergence(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int | None:
    """Index of the first message where traces ``a`` and ``b`` differ, if it is an assistant message in both
    (the same history, two different agent turns), else ``None``."""
    at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
    if at is None or a[at]["role"] != "assistant" or b[at]["role"] != "assistant":
        return None
    return at


def coached_copy(rec: dict[str, Any], at: int, note: str, seed: int) -> dict[str, Any]:
    """Trace ``rec`` cut after its assistant message ``at``, ``note`` inserted as a user message before it."""
    kept = rec["messages"][:at + 1]
    n = sum(1 for m in kept if m["role"] == "assistant")
    rewards = rec["turn_rewards"][:n]
    return {**rec, "kind": "coached", "seed": int(seed),
            "messages": kept[:at] + [{"role": "user", "content": note}] + kept[at:],
            "turn_rewards": rewards, "total_reward": float(sum(rewards)), "n_turns": n,
            "user_turns": experts.user_turns(rec["gym"], kept)}


def coached_rows(kept: list[tuple[dict[str, Any], dict[str, Any]]], tasks: dict[str, dict[str, Any]],
                 show_reward: bool, max_steps: int, want: int, seed: int, skip_gyms: tuple[str, ...],
                 counts: Counter) -> list[dict[str, Any]]:
    """Up to ``want`` coached copies, in pairs: where the expert's best play (the oracle trace of ``kept``'s
    ``(input row, oracle trace)`` pairs) and an exploratory play of the same task part ways after the same
    history, with two different template-coach notes for their two turns (an ``unmet`` question against the
    ``ready`` answer, or questions about different categories), each trace cut after its turn with its own
    note before it. The history is the same and the replies differ, so only the note tells them apart: the
    warm start learns to read it (a copy whose note the history already implies teaches nothing: measured,
    ``scripts/note_probe.py``). Rows are drawn in a shuffle seeded by ``seed`` (coached gyms only: not
    ``skip_gyms``), up to :data:`EXPLORE_TRIES` exploration seeds each (:func:`exploratory_plays`). ``counts``
    gets ``pairs``, ``kept``, ``ready``, ``unmet``, ``tried``, ``no_divergence``, ``same_note``, ``duplicate`` and
    ``unrewarded``."""
    if want < 2:
        return []
    order = [i for i in range(len(kept)) if kept[i][1]["gym"] not in skip_gyms]
    random.Random(seed).shuffle(order)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, rec, ex_seed in exploratory_plays(kept, order, tasks, show_reward, max_steps, seed, counts, "tried",
                                             tag="coached:"):
        oracle = kept[i][1]
        at = divergence(oracle["messages"], rec["messages"])
        if at is None:
            counts["no_divergence"] += 1
            continue
        notes = turn_note(oracle["messages"], at), turn_note(rec["messages"], at)
        if not all(notes) or notes[0] == notes[1]:
            counts["same_note"] += 1
            continue
        pair = [coached_copy(oracle, at, notes[0], 0), coached_copy(rec, at, notes[1], ex_seed)]
        keys = [json.dumps(c["messages"]) for c in pair]
        if any(key in seen for key in keys):
            counts["duplicate"] += 1
            continue
        seen.update(keys)
        counts["pairs"] += 1
        for note in notes:
            counts["kept"] += 1
            counts["ready" if note == NOTES["ready"] else "unmet"] += 1
        out += pair
        if len(out) + 2 > want:
            break
    return out


def gym_summary(frame: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Per gym and kind: traces, mean reward, mean turns, share of traces that asked the user."""
    if frame.height == 0:
        return {}
    agg = frame.group_by("gym", "kind").agg(pl.len().alias("traces"),
                                            pl.col("total_reward").mean().alias("mean_reward"),
                                            pl.col("n_turns").mean().alias("mean_turns"),
                                            (pl.col("user_turns") > 0).mean().alias("asked_user_share"))
    out: dict[str, dict[str, Any]] = {}
    for r in agg.sort("gym", "kind").to_dicts():
        out.setdefault(r["gym"], {})[r["kind"]] = {k: (round(v, 4) if isinstance(v, float) else v)
                                                   for k, v in r.items() if k not in ("gym", "kind")}
    return out


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


def episode_budget(params: Params) -> int:
    """The warm start's episode length: ``agent_traces.max_steps``, or when null the agent's own budget, the
    smaller ``rollout.max_turns`` of ``agent_grpo`` and ``agent_csd`` (16, UserRL's, when neither is configured)."""
    steps = params.agent_traces.max_steps
    if steps is not None:
        return steps
    turns = [rl.rollout.max_turns for rl in (getattr(params, p, None) for p in ("agent_grpo", "agent_csd")) if rl]
    return min(turns, default=16)


def check_episode_budget(params: Params) -> None:
    """``agent_traces.max_steps`` must not exceed the agent rollouts' ``max_turns`` (``agent_grpo`` and
    ``agent_csd``, where configured): the experts plan within ``max_steps`` (their last turn answers), so longer
    traces teach the warm start episodes it may not finish in RL, asking where it must already answer (measured
    at 16 vs 5: the tiny warm start never answered a TravelGym task). Raises :class:`StageError` naming both keys."""
    steps = episode_budget(params)
    for phase in ("agent_grpo", "agent_csd"):
        rl = getattr(params, phase, None)
        if rl is not None and steps > rl.rollout.max_turns:
            raise StageError(f"agent_traces.max_steps ({steps}) exceeds the agent rollouts' max_turns ({phase}: "
                             f"{rl.rollout.max_turns}; written in agent_rl.rollout unless the phase overrides it): "
                             "the warm start would imitate expert episodes longer than the agent may play; set "
                             "agent_traces.max_steps to at most the agent's max_turns (or null: the agent's own)")


def build(params: Params, explore_share: float | None = None, seed: int | None = None,
          coached_share: float | None = None) -> StageResult:
    """The stage; ``explore_share`` / ``seed`` / ``coached_share`` override ``params.agent_traces`` (defaults
    :data:`EXPLORE_SHARE` and 0 where the params have no such key). The experts play within
    ``agent_traces.max_steps`` turns (:func:`episode_budget`), at most the agent's
    (:func:`check_episode_budget`); a task they cannot solve within it is quarantined as ``unrewarded``."""
    check_episode_budget(params)
    cfg = params.agent_traces
    steps = episode_budget(params)
    share = float(explore_share if explore_share is not None else cfg.explore_share)
    seed = int(seed if seed is not None else cfg.seed)
    if not 0 <= share < 1:
        raise StageError(f"agent_traces.explore_share must be in [0, 1), got {share}")
    coached = float(coached_share if coached_share is not None else cfg.coached_share)
    if not 0 <= coached <= 1:
        raise StageError(f"agent_traces.coached_share must be in [0, 1], got {coached}")
    csd = getattr(params, "agent_csd", None)
    skip_gyms = tuple((csd.csd if csd is not None else CSDParams()).skip_gyms)
    coached_counts: Counter = Counter()
    quarantine = Quarantine()
    inputs = [Path(cfg.gyms_dir) / f"{s}.parquet" for s in SPLITS]
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    rows_in = rows_out = 0
    per_gym: dict[str, Counter] = {}
    explore: Counter = Counter()
    tasks_cache: dict[str, dict[str, Any]] = {}
    for split, path in zip(SPLITS, inputs):
        rows = read_rows(path)
        rows_in += len(rows)
        kept: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for i, row in enumerate(rows, 1):
            try:
                row = {**normalise_row(row), "split": split}   # the file's split wins
            except RowError as e:
                quarantine.add(str(path), i, str(e), json.dumps({k: row.get(k) for k in ("data_source", "gym",
                                                                                         "task_id", "split")}))
                per_gym.setdefault("unknown", Counter())[f"quarantined_{e.reason}"] += 1
                continue
            gym = str(row.get("gym"))
            if gym not in tasks_cache and gym in experts.ORACLE_GYMS:
                tasks_cache[gym] = load_tasks_or_unreadable(gym, params.gyms.tasks.get(gym),
                                                            **params.gyms.task_options(gym))
            rec, reason = trace_row(row, tasks_cache, cfg.show_reward, steps)
            c = per_gym.setdefault(gym, Counter())
            if rec is None:
                quarantine.add(str(path), i, reason, json.dumps({k: row.get(k) for k in ("gym", "task_id", "split")}))
                c[f"quarantined_{reason.split(':')[0]}"] += 1
            else:
                kept.append((row, rec))
                c[split] += 1
        rows_out += len(kept)
        extra_rows = explore_rows(kept, tasks_cache, cfg.show_reward, steps, share,
                                  zlib.crc32(f"{seed}:{split}".encode()), explore)
        for rec in extra_rows:
            per_gym[rec["gym"]][f"{split}_exploratory"] += 1
        traces = [rec for _, rec in kept] + extra_rows
        out[split] = traces + coached_rows(kept, tasks_cache, cfg.show_reward, steps, round(coached * len(traces)),
                                           zlib.crc32(f"{seed}:{split}:coached".encode()), skip_gyms,
                                           coached_counts)
    frames = {s: pl.DataFrame(out[s], schema=SCHEMA) for s in SPLITS}
    if not (frames["train"].get_column("kind") == "oracle").any():
        reasons = Counter(r.split(":")[0] for r in quarantine.reason)
        raise StageError(f"no successful oracle trace in {inputs[0]}: nothing to fine-tune the agent on "
                         f"({rows_in} row(s) read; quarantined by reason: {dict(sorted(reasons.items()))})")
    validation = check(params, frames)
    outputs = {str(Path(cfg.output_dir) / f"{s}.parquet"): frames[s] for s in SPLITS}
    total = sum(int((f.get_column("kind") != "coached").sum()) for f in frames.values())
    n_explore = sum(int((f.get_column("kind") == "exploratory").sum()) for f in frames.values())
    extra = {"max_steps": steps, "sizes": {s: frames[s].height for s in SPLITS},
             "per_gym": {g: dict(c) for g, c in per_gym.items()},
             "mean_total_reward": {s: (frames[s].get_column("total_reward").mean() if frames[s].height else None)
                                   for s in SPLITS},
             "summary": {s: gym_summary(frames[s]) for s in SPLITS},
             "explore": {"share_target": share, "share": round(n_explore / total, 4) if total else 0.0, "seed": seed,
                         **dict(explore)},
             "coached": {"share_target": coached, "skip_gyms": list(skip_gyms), **dict(coached_counts)},
             "validation": validation}
    return StageResult(outputs=outputs, rows_in=rows_in, rows_out=rows_out, quarantine=quarantine, inputs=inputs,
                       extra=extra)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main(STAGE, build, lambda p: p.agent_traces))
