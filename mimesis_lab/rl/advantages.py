"""Advantage estimators: FoldGRPO (simulator RL) and multi-turn GRPO with R2G credit (agent RL).

Pure functions over plain Python sequences (anything ``float()``/``len()`` accept, so lists,
numpy arrays and 1-D tensors work); they return lists of floats. No I/O, no torch.

Shared convention: a group's statistics use the *sample* standard deviation (``n - 1``
denominator); a group with a single member has no spread, and its advantage is defined as 0
(rather than dividing by ``0 + eps`` or by an undefined std).
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

__all__ = ["fold_grpo", "turn_credits", "multiturn_grpo", "TURN_CREDIT_METHODS", "ZERO_CREDIT_MODES"]

TURN_CREDIT_METHODS = ("r2g", "equalized", "mean")
ZERO_CREDIT_MODES = ("uniform", "zero")

# Relative tolerance under which the mean of non-zero token credits counts as 0 (credits of
# both signs cancelling): A_i / mean would explode, so the zero-credit policy applies instead.
_CANCEL_RTOL = 1e-9


def _finite(x: object, what: str) -> float:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be a real number, got {x!r}") from exc
    if not math.isfinite(v):
        raise ValueError(f"{what} must be finite, got {v}")
    return v


def _mean_sample_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)


def _group_normalise(scores: Sequence[float], groups: Sequence[Hashable], eps: float) -> list[float]:
    """``(s - mean_g) / (std_g + eps)`` per item, sample std; a group of one gets 0."""
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(scores)
    for idx in members.values():
        if len(idx) < 2:
            continue  # single member: advantage 0 (already set)
        mean, std = _mean_sample_std([scores[i] for i in idx])
        for i in idx:
            out[i] = (scores[i] - mean) / (std + eps)
    return out


def _check_eps(eps: float) -> float:
    eps = _finite(eps, "eps")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return eps


def fold_grpo(
    scores: Sequence[float],
    group_ids: Sequence[Hashable],
    rollout_ids: Sequence[Hashable],
    eps: float = 1e-6,
) -> list[float]:
    """FoldGRPO advantage, one value per segment (SPEC §2.3).

    A rollout ``j`` (the reference's ``gen_uid``) may be split into several segments, one per
    simulator turn; every segment carries its rollout's score ``r_j`` and prompt group ``g``.
    With ``U_g`` the set of *unique* rollouts of group ``g``::

        mean_g = (1/|U_g|) * sum_{j in U_g} r_j
        std_g  = sqrt( (1/(|U_g| - 1)) * sum_{j in U_g} (r_j - mean_g)^2 )     (sample std)
        A_s    = (r_{j(s)} - mean_g) / (std_g + eps)      for every segment s of rollout j

    Each rollout counts once whatever its number of segments, so a conversation split into more
    pieces does not weigh more in the group baseline. ``|U_g| == 1`` → ``A_s = 0``. The caller
    broadcasts ``A_s`` onto the generated-token mask of segment ``s``.

    Args:
        scores: per-segment score (all segments of a rollout must carry the same value).
        group_ids: per-segment prompt-group id (constant within a rollout).
        rollout_ids: per-segment rollout id; rollout ids are global (a rollout id names one
            rollout, so it cannot appear in two groups).
        eps: added to the std in the denominator.

    Raises:
        ValueError: unequal lengths, a non-finite score, or a rollout whose segments disagree
            on score or group (the message names the rollout).
    """
    n = len(scores)
    if len(group_ids) != n or len(rollout_ids) != n:
        raise ValueError(
            f"scores, group_ids and rollout_ids must have equal lengths, got "
            f"{n}, {len(group_ids)}, {len(rollout_ids)}"
        )
    eps = _check_eps(eps)
    vals = [_finite(s, f"scores[{i}]") for i, s in enumerate(scores)]

    # one (score, group) per unique rollout, in first-seen order
    rollout: dict[Hashable, tuple[float, Hashable]] = {}
    for i, (s, g, r) in enumerate(zip(vals, group_ids, rollout_ids)):
        if r not in rollout:
            rollout[r] = (s, g)
            continue
        s0, g0 = rollout[r]
        if s != s0:
            raise ValueError(
                f"rollout {r!r}: segments carry different scores ({s0} and {s} at segment {i})"
            )
        if g != g0:
            raise ValueError(
                f"rollout {r!r}: segments carry different group ids ({g0!r} and {g!r} at segment {i})"
            )

    keys = list(rollout)
    adv_by_rollout = dict(
        zip(keys, _group_normalise([rollout[k][0] for k in keys], [rollout[k][1] for k in keys], eps))
    )
    return [adv_by_rollout[r] for r in rollout_ids]


def turn_credits(turn_rewards: Sequence[float], gamma: float, method: str = "r2g") -> list[float]:
    """Per-turn credit ``c_1..c_T`` from per-turn rewards ``r_1..r_T`` (SPEC §3.2).

    - ``"r2g"`` (reward-to-go, the reference default)::

          c_t = G_t = sum_{k >= t} gamma^(k - t) * r_k,   i.e.  c_T = r_T,  c_t = r_t + gamma * c_{t+1}

      and ``G_1`` is the trajectory score.
    - ``"equalized"``: ``c_t = 1`` for every turn.
    - ``"mean"``: ``c_t = (1/T) * sum_k r_k`` for every turn — what the reference calls
      ``"Sum"`` (its code averages; the name is a trap, so it is not reused here).

    ``gamma`` must be finite and in ``[0, 1]`` (checked for every method; only ``"r2g"`` uses it).
    An empty reward list gives an empty credit list.

    Raises:
        ValueError: unknown ``method``, ``gamma`` outside ``[0, 1]``, a non-finite reward.
    """
    if method not in TURN_CREDIT_METHODS:
        raise ValueError(f"unknown turn credit method {method!r}; expected one of {TURN_CREDIT_METHODS}")
    gamma = _finite(gamma, "gamma")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    r = [_finite(x, f"turn_rewards[{t}]") for t, x in enumerate(turn_rewards)]
    if not r:
        return []
    if method == "equalized":
        return [1.0] * len(r)
    if method == "mean":
        return [math.fsum(r) / len(r)] * len(r)
    out = [0.0] * len(r)
    acc = 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out


def multiturn_grpo(
    turn_rewards: Sequence[Sequence[float]],
    turn_lengths: Sequence[Sequence[int]],
    group_ids: Sequence[Hashable],
    gamma: float = 0.8,
    eps: float = 1e-6,
    zero_credit: str = "uniform",
) -> list[list[float]]:
    """Multi-turn GRPO token advantages with R2G turn credit (SPEC §3.2).

    For trajectory ``i`` with turn rewards ``r_1..r_T`` and ``L_t = turn_lengths[i][t]`` generated
    (agent) tokens in turn ``t`` (user/tool tokens are context and are not listed):

    1. Turn credit (reward-to-go) ``c_t = G_t = r_t + gamma * G_{t+1}``; trajectory score ``G_1``.
    2. Group normalisation over the trajectories of the same prompt group::

           A_i = (G_1^i - mean_g) / (std_g + eps)     (sample std; a group of one → A_i = 0)

    3. Token credit: each of the ``L_t`` tokens of turn ``t`` gets ``c_t``; then, with ``NZ`` the
       tokens whose credit is non-zero and ``m_i = mean_{k in NZ} c_k`` (token-weighted)::

           a_k = c_k * A_i / m_i          (so mean_{k in NZ} a_k = A_i; zero-credit tokens stay 0)

    4. Degenerate credit — every token credit is 0 (e.g. all rewards 0, or no token in the
       turns that carry credit), or the non-zero credits cancel (``|m_i|`` ≤ 1e-9·max|c_k|):
       ``zero_credit="uniform"`` gives every token ``A_i`` (a failed trajectory keeps its
       negative signal); ``zero_credit="zero"`` gives every token 0 (the reference, which
       loses the signal of trajectories that earned no reward at all).

    Sign: the rescaling multiplies credits by ``A_i / m_i``, so
    ``sign(a_k) = sign(c_k) * sign(A_i) * sign(m_i)``. With non-negative rewards every credit is
    ≥ 0, ``m_i > 0`` and each token's sign is ``sign(A_i)``. With all-negative credits
    (penalties only) ``m_i < 0`` and the division restores ``sign(a_k) = sign(A_i)``. With credits
    of **mixed** sign, the minority-sign turns get the *opposite* sign of ``A_i`` (e.g. credits
    ``[1, -1, 1]`` and ``A_i = 1`` → ``[3, -3, 3]``): only the non-zero-token mean is pinned to
    ``A_i``, and when the credits nearly cancel, ``|A_i / m_i|`` grows large.

    Args:
        turn_rewards: per trajectory, its per-turn rewards (at least one turn each).
        turn_lengths: per trajectory, the number of generated tokens of each turn (ints ≥ 0,
            same number of turns as ``turn_rewards``).
        group_ids: per trajectory, its prompt-group id.
        gamma: R2G discount in ``[0, 1]``.
        eps: added to the group std.
        zero_credit: ``"uniform"`` or ``"zero"`` (step 4).

    Returns:
        Per trajectory, a list of ``sum_t L_t`` token advantages, turn by turn.

    Raises:
        ValueError: mismatched lengths, a trajectory with no turns, a negative or non-integer
            turn length, non-finite rewards, bad ``gamma``/``eps``/``zero_credit``.
    """
    if zero_credit not in ZERO_CREDIT_MODES:
        raise ValueError(f"unknown zero_credit mode {zero_credit!r}; expected one of {ZERO_CREDIT_MODES}")
    n = len(turn_rewards)
    if len(turn_lengths) != n or len(group_ids) != n:
        raise ValueError(
            f"turn_rewards, turn_lengths and group_ids must have equal lengths, got "
            f"{n}, {len(turn_lengths)}, {len(group_ids)}"
        )
    eps = _check_eps(eps)

    credits: list[list[float]] = []
    lengths: list[list[int]] = []
    for i in range(n):
        if len(turn_rewards[i]) == 0:
            raise ValueError(f"trajectory {i} has no turns")
        if len(turn_lengths[i]) != len(turn_rewards[i]):
            raise ValueError(
                f"trajectory {i}: {len(turn_rewards[i])} turn rewards but {len(turn_lengths[i])} turn lengths"
            )
        ls = []
        for t, L in enumerate(turn_lengths[i]):
            if isinstance(L, float) and not L.is_integer():
                raise ValueError(f"turn_lengths[{i}][{t}] must be an integer, got {L!r}")
            try:
                Li = int(L)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"turn_lengths[{i}][{t}] must be an integer, got {L!r}") from exc
            if Li < 0:
                raise ValueError(f"turn_lengths[{i}][{t}] must be >= 0, got {Li}")
            ls.append(Li)
        lengths.append(ls)
        credits.append(turn_credits(turn_rewards[i], gamma, method="r2g"))

    adv = _group_normalise([c[0] for c in credits], list(group_ids), eps)

    out: list[list[float]] = []
    for c, ls, a in zip(credits, lengths, adv):
        tok = [ct for ct, L in zip(c, ls) for _ in range(L)]
        nonzero = [x for x in tok if x != 0.0]
        m = math.fsum(nonzero) / len(nonzero) if nonzero else 0.0
        cancelled = bool(nonzero) and abs(m) <= _CANCEL_RTOL * max(abs(x) for x in nonzero)
        if not nonzero or cancelled:
            fill = a if zero_credit == "uniform" else 0.0
            out.append([fill] * len(tok))
            continue
        scale = a / m
        out.append([x * scale + 0.0 if x != 0.0 else 0.0 for x in tok])  # + 0.0: no -0.0
    return out
