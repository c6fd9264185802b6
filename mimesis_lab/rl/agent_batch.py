"""From gym trajectories to the multi-turn GRPO update rows, and per-step agent metrics (SPEC §3.2, §6).

:func:`build_agent_rows` applies :func:`mimesis_lab.rl.advantages.multiturn_grpo` (R2G turn
credit, group-normalised trajectory score, credits rescaled so their non-zero mean is ``A_i``)
and lays each trajectory's token advantages onto its agent-generated positions
(:class:`mimesis_lab.rl.policy.UpdateRow`). Invalid trajectories (user side failed, env
exception, timeout, drift…) leave the group statistics and the update with
``invalid_policy="exclude"``; ``"zero"`` reproduces the reference (reward 0, kept).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence

from mimesis_lab.rl.advantages import multiturn_grpo
from mimesis_lab.rl.policy import UpdateRow
from mimesis_lab.rl.sim_batch import mean_present
from mimesis_lab.rollout.agent_rollout import AGENT_INVALID_REASONS, Trajectory

__all__ = ["build_agent_rows", "agent_step_metrics"]


def build_agent_rows(trajs: Sequence[Trajectory], gamma: float = 0.8, eps: float = 1e-6,
                     zero_credit: str = "uniform", invalid_policy: str = "exclude"
                     ) -> tuple[list[UpdateRow], dict[str, float]]:
    if invalid_policy not in ("exclude", "zero"):
        raise ValueError(f"invalid_policy must be 'exclude' or 'zero', got {invalid_policy!r}")
    use = []
    for t in trajs:
        if not t.turns:
            continue                                  # nothing generated, nothing to train on
        if t.invalid is not None and invalid_policy == "exclude":
            continue
        use.append(t)
    rewards = [[0.0] * len(t.turns) if t.invalid is not None else t.turn_rewards for t in use]
    adv = multiturn_grpo(rewards, [t.turn_lengths for t in use], [t.group_id for t in use], gamma=gamma, eps=eps,
                         zero_credit=zero_credit) if use else []
    rows = []
    for t, a in zip(use, adv):
        pos = t.response_positions()
        lp = [x for turn in t.turns for x in turn.logprobs]
        if not (len(pos) == len(lp) == len(a)):
            raise AssertionError(f"trajectory {t.traj_id}: {len(pos)} positions, {len(lp)} log-probs, {len(a)} adv")
        if pos:
            rows.append(UpdateRow(tuple(t.ids), tuple(pos), tuple(lp), tuple(a), t.group_id, t.traj_id))
    members: dict[str, int] = Counter(t.group_id for t in use)
    stats = {"trajectories_in_update": float(len(use)), "rows_in_update": float(len(rows)),
             "tokens_in_update": float(sum(r.n_response for r in rows)),
             "groups_single": float(sum(v == 1 for v in members.values()))}
    return rows, stats


def agent_step_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Per-step means and counts; ``rollouts == valid + sum(invalid by reason)`` is checked."""
    n = len(trajs)
    inv = Counter(t.invalid for t in trajs if t.invalid is not None)
    unknown = set(inv) - set(AGENT_INVALID_REASONS)
    if unknown:
        raise AssertionError(f"unknown invalid reasons {sorted(unknown)}")
    valid = [t for t in trajs if t.invalid is None]
    m: dict[str, float | None] = {"rollouts": float(n), "rollouts_valid": float(len(valid)),
                                  "invalid_total": float(sum(inv.values()))}
    for r in AGENT_INVALID_REASONS:
        m[f"invalid/{r}"] = float(inv.get(r, 0))
    m["reward/mean"] = mean_present(t.total_reward for t in valid)
    m["turns_mean"] = mean_present(len(t.turns) for t in trajs)
    turns = [x for t in trajs for x in t.turns]
    m["tool_call_error_rate"] = (sum(x.parse_error is not None for x in turns) / len(turns)) if turns else None
    m["response_length_mean"] = mean_present(len(x.token_ids) for x in turns)
    by: dict[str, list[Trajectory]] = defaultdict(list)
    for t in valid:
        by[t.data_source].append(t)
    for ds, ts in sorted(by.items()):
        m[f"reward/gym/{ds.removeprefix('interact_')}"] = mean_present(t.total_reward for t in ts)
    for choice in ("action", "answer", "search"):
        m[f"choice_rate/{choice}"] = (sum(x.choice == choice for x in turns) / len(turns)) if turns else None
    return {k: float(v) for k, v in m.items() if v is not None}
