"""The lr schedule: linear warm-up to the peak, cosine down to peak * min_lr_ratio (hand-computed values)."""
from __future__ import annotations

import math

import pytest

from mimesis_lab.train.schedule import lr_at, warmup_steps


def test_warmup_steps_is_ceil_without_float_noise():
    assert warmup_steps(100, 0.05) == 5          # 0.05 * 100 = 5.000000000000001 in floats
    assert warmup_steps(10, 0.2) == 2
    assert warmup_steps(10, 0.15) == 2           # ceil(1.5)
    assert warmup_steps(7, 0.0) == 0
    assert warmup_steps(1, 0.05) == 1


def test_hand_computed_values_with_warmup():
    # T = 10, W = ceil(0.2 * 10) = 2, peak 1.0, floor 0.1; decay over steps 2..9 (7 intervals)
    lr = [lr_at(s, 10, 1.0, 0.2, 0.1) for s in range(10)]
    assert lr[0] == pytest.approx(0.5)           # (0 + 1) / 2
    assert lr[1] == pytest.approx(1.0)           # (1 + 1) / 2: end of warm-up at the peak
    assert lr[2] == pytest.approx(1.0)           # first decay step, p = 0
    # s = 5: p = 3/7, cos(3*pi/7) = 0.2225209340; 0.1 + 0.45 * 1.2225209340 = 0.6501344203
    assert lr[5] == pytest.approx(0.6501344203, abs=1e-9)
    assert lr[9] == pytest.approx(0.1)           # last step exactly at the floor
    assert all(a >= b for a, b in zip(lr[1:], lr[2:]))


def test_hand_computed_values_without_warmup():
    # T = 9, W = 0, p = s / 8, peak 2.0, floor 0.2
    assert lr_at(0, 9, 2.0, 0.0, 0.1) == pytest.approx(2.0)
    # s = 2: p = 1/4, cos(pi/4) = 0.7071067812; 0.2 + 0.9 * 1.7071067812 = 1.7363961031
    assert lr_at(2, 9, 2.0, 0.0, 0.1) == pytest.approx(1.7363961031, abs=1e-9)
    assert lr_at(4, 9, 2.0, 0.0, 0.1) == pytest.approx(1.1)          # p = 1/2: the midpoint
    assert lr_at(8, 9, 2.0, 0.0, 0.1) == pytest.approx(0.2)
    assert lr_at(50, 9, 2.0, 0.0, 0.1) == pytest.approx(0.2)         # past the end: stays at the floor
    assert lr_at(3, 9, 2.0, 0.0, 0.0) == pytest.approx(1.0 + math.cos(math.pi * 3 / 8))


def test_edge_cases_and_errors():
    assert lr_at(0, 1, 3e-5, 0.05, 0.1) == pytest.approx(3e-5)       # a 1-step run uses the peak
    assert lr_at(1, 2, 1.0, 0.0, 0.5) == pytest.approx(0.5)
    assert lr_at(3, 5, 1.0, 0.0, 1.0) == pytest.approx(1.0)          # min_lr_ratio 1: constant
    for bad in (dict(step=-1), dict(total=0), dict(warmup_ratio=1.0), dict(min_lr_ratio=1.5), dict(peak=-1.0)):
        kw = dict(step=0, total=10, peak=1.0, warmup_ratio=0.1, min_lr_ratio=0.1) | bad
        with pytest.raises(ValueError):
            lr_at(**kw)
