"""Reward of the ABCD realistic-behaviour task (SPEC §2.4), from the judge's four scores."""
from __future__ import annotations

import math

__all__ = ["behavior_reward", "BEHAVIOR_WEIGHTS"]

#: weights of exhibit, placement, naturalness, on-task consistency (they sum to 5).
BEHAVIOR_WEIGHTS = (2.0, 1.5, 1.0, 0.5)


def _score(x: object, name: str) -> float:
    if isinstance(x, str):
        raise ValueError(f"{name} must be a number in [0, 1], got {x!r}")
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a number in [0, 1], got {x!r}") from exc
    if not math.isfinite(v) or not 0.0 <= v <= 1.0:
        raise ValueError(f"{name} must be a finite number in [0, 1], got {x!r}")
    return v


def behavior_reward(exhibit: float, placement: float, naturalness: float, on_task: float,
                    announced: bool) -> float:
    """Behaviour reward from the judge's scores (SPEC §2.4)::

        r = clip( (2.0*e + 1.5*p + 1.0*n + 0.5*c) / 5.0, 0, 1 ),   r = r / 2  if announced

    ``e`` exhibit (the behaviour is enacted), ``p`` placement (at a fitting point of the
    dialogue), ``n`` naturalness, ``c`` on-task consistency, each in ``[0, 1]``; ``announced``
    = the user *described* the behaviour instead of enacting it. Since the weights sum to 5,
    valid inputs already give ``r`` in ``[0, 1]``; the clip is a guard against rounding.

    This is the score of a *valid* judgement. A judge failure is not a 0 — the caller must
    mark the rollout invalid instead of calling this (SPEC §6).

    Raises:
        ValueError: a score that is not a finite number in ``[0, 1]``, or ``announced`` that is
            not a boolean (``True``/``False``/``0``/``1``); the message names the argument.
    """
    scores = [_score(exhibit, "exhibit"), _score(placement, "placement"),
              _score(naturalness, "naturalness"), _score(on_task, "on_task")]
    if isinstance(announced, str) or announced not in (True, False):
        raise ValueError(f"announced must be a boolean, got {announced!r}")
    r = math.fsum(w * x for w, x in zip(BEHAVIOR_WEIGHTS, scores)) / 5.0
    r = min(1.0, max(0.0, r))
    return r / 2.0 if announced else r
