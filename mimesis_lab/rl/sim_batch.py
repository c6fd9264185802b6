"""From judged simulator rollouts to the PPO update batch, and the per-step metrics (SPEC §2.3, §6).

Pure functions (no torch, no I/O):

- :func:`build_update_rows` — FoldGRPO over the step's rollouts: one advantage per segment,
  group statistics over *unique* rollouts, broadcast onto the segment's generated tokens; the
  segments of a rollout are encoded as one prefix-tree row (``encode="trajectory"``,
  :func:`~mimesis_lab.rl.policy.trajectory_row`: each shared history token once) or one row each
  (``"turn"``, :func:`~mimesis_lab.rl.policy.segment_row`: every turn re-encodes its history) —
  the same trained tokens, log-probs and advantages either way.
  Validity is part of the objective and explicit: with ``invalid_policy="exclude"`` an
  invalid rollout leaves the group statistics and the update (counted per reason); with
  ``"zero"`` (the reference behaviour, for comparison) it scores 0, stays in its group and
  its generated tokens are trained on with that advantage.
- :func:`step_metrics` — what MLflow shows per step: update vs raw reward, reward per task
  and per behaviour, the judge's e/p/n/c means, announced rate, format-failure rate, invalid
  counts by reason, response length, neutral cooperativeness, rule–judge gap.

Accounting invariant (checked): ``rollouts == valid + sum(invalid by reason)``.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Iterable, Sequence

from mimesis_lab.envs.base import INVALID_REASONS
from mimesis_lab.rl.advantages import fold_grpo
from mimesis_lab.rl.policy import UpdateRow, segment_row, trajectory_row
from mimesis_lab.rollout.sim_rollout import Rollout

BEHAVIOR_TASK = "usersim_behavior"

__all__ = ["build_update_rows", "step_metrics", "AccountingError", "mean_present"]


class AccountingError(AssertionError):
    """Rollouts went missing between generation and the update (a bug, never tolerated)."""


def build_update_rows(rollouts: Sequence[Rollout], invalid_policy: str = "exclude", eps: float = 1e-6,
                      encode: str = "trajectory") -> tuple[list[UpdateRow], dict[str, float]]:
    """FoldGRPO rows of one step. Returns ``(rows, stats)``: one row per rollout with a generated
    segment (``encode="trajectory"``) or one per segment (``"turn"``).

    Each included rollout ``j`` contributes its segments with score ``R_j`` = the update reward
    (raw judged score, 0 after a format failure; with ``invalid_policy="zero"`` an invalid
    rollout's ``R_j = 0``). ``A_s = (R_j - mean_g) / (std_g + eps)`` over the group's unique
    rollouts (sample std, a single-rollout group gets 0) — :func:`fold_grpo`. A rollout with no
    generated segment still takes part in its group's statistics under ``"zero"`` (it produced
    nothing to train on, but the reference counts it as a 0).
    """
    if invalid_policy not in ("exclude", "zero"):
        raise ValueError(f"invalid_policy must be 'exclude' or 'zero', got {invalid_policy!r}")
    if encode not in ("trajectory", "turn"):
        raise ValueError(f"encode must be 'trajectory' or 'turn', got {encode!r}")
    scores: list[float] = []
    groups: list[str] = []
    rids: list[str] = []
    owners: list[tuple[int, int] | None] = []      # (rollout index, segment index) or None = placeholder
    included = 0
    for i, r in enumerate(rollouts):
        if r.invalid is not None:
            if invalid_policy == "exclude":
                continue
            score = 0.0
        else:
            score = r.update_reward
            if score is None:  # valid but unscored cannot happen after score_rollouts
                raise AccountingError(f"rollout {r.rollout_id}: valid but has no score")
        included += 1
        segs = [k for k, s in enumerate(r.segments) if s.token_ids]
        for k in segs or [None]:
            scores.append(float(score))
            groups.append(r.group_id)
            rids.append(r.rollout_id)
            owners.append(None if k is None else (i, k))
    adv = fold_grpo(scores, groups, rids, eps=eps) if scores else []
    turns: dict[int, list[UpdateRow]] = defaultdict(list)      # rollout index -> its segment rows, in order
    for a, own in zip(adv, owners):
        if own is None:
            continue
        r = rollouts[own[0]]
        seg = r.segments[own[1]]
        if len(seg.logprobs) != len(seg.token_ids):
            raise AccountingError(f"rollout {r.rollout_id}: {len(seg.token_ids)} tokens but "
                                  f"{len(seg.logprobs)} log-probs")
        turns[own[0]].append(segment_row(seg.prompt_ids, seg.token_ids, seg.logprobs, float(a), r.group_id,
                                         r.rollout_id))
    segments = [t for ts in turns.values() for t in ts]
    rows = segments if encode == "turn" else [trajectory_row(ts) for ts in turns.values()]
    per_group: dict[str, set[float]] = defaultdict(set)
    members: dict[str, set[str]] = defaultdict(set)
    for s, g, rid in zip(scores, groups, rids):
        per_group[g].add(s)
        members[g].add(rid)
    stats = {
        "rollouts_in_update": float(included),
        "segments_in_update": float(len(segments)),
        "rows_in_update": float(len(rows)),
        "tokens_in_update": float(sum(r.n_response for r in rows)),
        "tokens_encoded": float(sum(len(r.input_ids) for r in rows)),
        "groups": float(len(per_group)),
        "groups_single_rollout": float(sum(len(m) == 1 for m in members.values())),
        "groups_zero_variance": float(sum(len(v) == 1 for v in per_group.values())),
        "adv_abs_mean": (sum(abs(t.adv[0]) for t in segments) / len(segments)) if segments else 0.0,
    }
    return rows, stats


def mean_present(xs: Iterable[float | None]) -> float | None:
    """Mean of the values that exist (an unscored rollout has ``raw = None``); ``None`` if none do."""
    xs = [float(x) for x in xs if x is not None]
    return math.fsum(xs) / len(xs) if xs else None


def step_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per-step means and counts (keys are MLflow metric names). Missing slices are omitted, not 0."""
    n = len(rollouts)
    invalid = Counter(r.invalid for r in rollouts if r.invalid is not None)
    unknown = sorted(set(invalid) - set(INVALID_REASONS))
    if unknown:
        raise AccountingError(f"unknown invalid reasons {unknown}; expected one of {INVALID_REASONS}")
    valid = [r for r in rollouts if r.invalid is None]
    if len(valid) + sum(invalid.values()) != n:
        raise AccountingError(f"{n} rollouts but {len(valid)} valid + {sum(invalid.values())} invalid")
    m: dict[str, float | None] = {
        "rollouts": float(n),
        "rollouts_valid": float(len(valid)),
        "invalid_total": float(sum(invalid.values())),
        "invalid_rate": sum(invalid.values()) / n if n else None,
    }
    for reason in INVALID_REASONS:
        m[f"invalid/{reason}"] = float(invalid.get(reason, 0))
    m["reward/update_mean"] = mean_present(r.update_reward for r in valid)
    m["reward/raw_mean"] = mean_present(r.raw for r in valid)
    with_segments = [r for r in rollouts if r.segments]
    m["format_failure_rate"] = (sum(r.format_failures > 0 for r in with_segments) / len(with_segments)
                                if with_segments else None)
    segs = [s for r in rollouts for s in r.segments]
    m["format_failure_turn_rate"] = (sum(not s.format_ok for s in segs) / len(segs)) if segs else None
    m["response_length_mean"] = mean_present(len(s.token_ids) for s in segs)
    m["truncated_turn_rate"] = (sum(s.finish_reason == "length" for s in segs) / len(segs)) if segs else None
    m["turns_per_rollout_mean"] = mean_present(len(r.segments) for r in rollouts)
    by_task: dict[str, list[Rollout]] = defaultdict(list)
    for r in valid:
        by_task[r.data_source].append(r)
    for ds, rs in sorted(by_task.items()):
        m[f"reward/task/{ds}"] = mean_present(r.raw for r in rs)
        m[f"reward/task_update/{ds}"] = mean_present(r.update_reward for r in rs)
    for ds, c in Counter(r.data_source for r in rollouts).items():
        m[f"rollouts/task/{ds}"] = float(c)
    by_beh: dict[str, list[Rollout]] = defaultdict(list)
    for r in valid:
        b = (r.score.labels if r.score else {}).get("behavior")
        if b:
            by_beh[b].append(r)
    for b, rs in sorted(by_beh.items()):
        m[f"reward/behavior/{b}"] = mean_present(r.raw for r in rs)
    comps: dict[str, list[float]] = defaultdict(list)
    for r in valid:
        if r.score is None:
            continue
        for k, v in r.score.components.items():
            if v is None or isinstance(v, str) or not math.isfinite(float(v)):
                continue
            if r.data_source == BEHAVIOR_TASK:   # the judge's decomposition of the behaviour reward
                key = {"announced": "announced_rate", "cooperativeness": "neutral_cooperativeness",
                       "rule_judge_gap": "rule_judge_gap"}.get(k, f"judge/{k}")
            else:
                key = f"task/{r.data_source}/{k}"
            comps[key].append(float(v))
    for key, vs in sorted(comps.items()):
        m[key] = mean_present(vs)
    return {k: float(v) for k, v in m.items() if v is not None}
