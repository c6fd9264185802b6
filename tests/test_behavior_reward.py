"""Behaviour-task reward r = clip((2e + 1.5p + 1n + 0.5c)/5, 0, 1), halved when announced (SPEC §2.4)."""
import itertools
import math

import numpy as np
import pytest

from mimesis_lab.envs.behavior import behavior_reward


def test_behavior_reward_examples():
    assert behavior_reward(1, 1, 1, 1, False) == 1.0  # (2 + 1.5 + 1 + 0.5)/5 = 5/5
    assert behavior_reward(1, 1, 1, 1, True) == 0.5  # announced halves
    assert behavior_reward(0, 0, 0, 0, False) == 0.0
    # one component at a time: its weight / 5
    assert behavior_reward(1, 0, 0, 0, False) == pytest.approx(0.4)  # 2/5
    assert behavior_reward(0, 1, 0, 0, False) == pytest.approx(0.3)  # 1.5/5
    assert behavior_reward(0, 0, 1, 0, False) == pytest.approx(0.2)  # 1/5
    assert behavior_reward(0, 0, 0, 1, False) == pytest.approx(0.1)  # 0.5/5
    # (2*0.8 + 1.5*0.6 + 0.9 + 0.5*1)/5 = (1.6 + 0.9 + 0.9 + 0.5)/5 = 3.9/5 = 0.78 ; announced 0.39
    assert behavior_reward(0.8, 0.6, 0.9, 1.0, False) == pytest.approx(0.78)
    assert behavior_reward(0.8, 0.6, 0.9, 1.0, True) == pytest.approx(0.39)
    assert behavior_reward(0.5, 0.5, 0.5, 0.5, np.bool_(True)) == pytest.approx(0.25)
    assert isinstance(behavior_reward(np.float32(0.5), 0.5, 0.5, 0.5, 0), float)


def test_behavior_reward_stays_clipped_to_unit_interval():
    # the weights sum to 5, so the clip is a guard: no valid input leaves [0, 1]
    grid = [0.0, 0.1, 1 / 3, 0.7, 0.999999999, 1.0]
    for e, p, n, c in itertools.product(grid, repeat=4):
        for ann in (False, True):
            r = behavior_reward(e, p, n, c, ann)
            assert 0.0 <= r <= (0.5 if ann else 1.0)
            assert r == pytest.approx((2 * e + 1.5 * p + n + 0.5 * c) / 5 / (2 if ann else 1))


@pytest.mark.parametrize("idx,name", [(0, "exhibit"), (1, "placement"), (2, "naturalness"), (3, "on_task")])
@pytest.mark.parametrize("bad", [1.01, -0.01, math.nan, math.inf, None, "0.5"])
def test_behavior_reward_rejects_bad_scores(idx, name, bad):
    args = [0.5, 0.5, 0.5, 0.5]
    args[idx] = bad
    with pytest.raises(ValueError, match=name):
        behavior_reward(*args, False)


@pytest.mark.parametrize("bad", ["yes", 0.5, None, math.nan, 2])
def test_behavior_reward_rejects_bad_announced(bad):
    with pytest.raises(ValueError, match="announced"):
        behavior_reward(1, 1, 1, 1, bad)
