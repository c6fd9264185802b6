"""Learning-rate schedule: linear warm-up, then cosine decay to ``peak * min_lr_ratio``.

A pure function of the optimizer step, so a resumed run recomputes exactly the lr the
uninterrupted run used (no scheduler state in the checkpoint).

With ``T = total`` optimizer steps (steps are numbered ``0 … T-1``; ``lr_at(s)`` is the lr of
the update made by step ``s``), ``W = ceil(warmup_ratio * T)`` warm-up steps and
``m = peak * min_lr_ratio``:

- warm-up, ``s < W``:   ``lr = peak * (s + 1) / W``   (the first update is not wasted at lr 0;
  the last warm-up step reaches ``peak``);
- decay, ``s >= W``:    ``p = (s - W) / max(1, T - 1 - W)``, clamped to ``[0, 1]``,
  ``lr = m + (peak - m) * (1 + cos(pi * p)) / 2``  (the first decay step is at ``peak``, the
  last step ``T - 1`` is exactly at ``m``; steps past the end stay at ``m``).
"""
from __future__ import annotations

import math

__all__ = ["warmup_steps", "lr_at"]


def warmup_steps(total: int, warmup_ratio: float) -> int:
    """``ceil(warmup_ratio * total)`` (at most ``total``)."""
    if total <= 0:
        raise ValueError(f"total must be > 0, got {total}")
    if not 0 <= warmup_ratio < 1:
        raise ValueError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
    # round first so that e.g. 0.05 * 100 = 5.000000000000001 does not become 6
    return min(total, math.ceil(round(warmup_ratio * total, 9)))


def lr_at(step: int, total: int, peak: float, warmup_ratio: float, min_lr_ratio: float) -> float:
    """The lr of optimizer step ``step`` (0-based) of ``total``; see the module docstring."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if peak < 0:
        raise ValueError(f"peak lr must be >= 0, got {peak}")
    if not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    w = warmup_steps(total, warmup_ratio)
    floor = peak * min_lr_ratio
    if step < w:
        return peak * (step + 1) / w
    p = min(1.0, max(0.0, (step - w) / max(1, total - 1 - w)))
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * p))
