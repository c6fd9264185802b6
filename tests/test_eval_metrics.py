"""Hand-computed checks of the evaluation metrics (SPEC §4, DESIGN §4 contracts)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from mimesis_lab.evals.metrics import (
    PT3_DIMENSIONS,
    cluster_bootstrap_ci,
    dice,
    dice_mean,
    ece,
    fidelity_index,
    mean_and_rank,
    mean_and_rank_report,
    mean_and_stderr,
    turing_distance,
    usi5,
)


# ----------------------------------------------------------------- fidelity_index
def test_fidelity_index_two_dims_four_items():
    # persona: 1+1+1+0 = 3 of 4 -> 100/4*3 = 75.0
    # pacing:  1+0+0+0 = 1 of 4 -> 100/4*1 = 25.0
    # FI = (75 + 25) / 2 = 50.0
    per_dim, fi = fidelity_index({"persona": [1, 1, 1, 0], "pacing": [1, 0, 0, 0]})
    assert per_dim == {"persona": 75.0, "pacing": 25.0}
    assert list(per_dim) == ["persona", "pacing"]  # input order kept
    assert fi == 50.0


def test_fidelity_index_accepts_bools_and_five_dims():
    # five PT3 dims x 2 examples; matches per dim: 2,1,0,2,1 of 2 -> 100,50,0,100,50
    # FI = 300 / 5 = 60.0
    rows = [[True, True], [True, False], [False, False], [1, 1], [np.bool_(False), 1.0]]
    per_dim, fi = fidelity_index(dict(zip(PT3_DIMENSIONS, rows)))
    assert list(per_dim.values()) == [100.0, 50.0, 0.0, 100.0, 50.0]
    assert fi == 60.0


@pytest.mark.parametrize("bad", [[1, 2], [1, None], [float("nan")], [0.5], ["1"], []])
def test_fidelity_index_rejects_non_binary_naming_dim(bad):
    with pytest.raises(ValueError, match="'style'"):
        fidelity_index({"persona": [1, 0], "style": bad})


def test_fidelity_index_rejects_unequal_n_and_empty():
    with pytest.raises(ValueError, match="different numbers"):
        fidelity_index({"persona": [1, 0, 1], "style": [1, 0]})
    with pytest.raises(ValueError):
        fidelity_index({})


# ---------------------------------------------------------------------------- dice
def test_dice_hand_values():
    assert dice(3, 1) == 50.0          # 100*2*1/(3+1) = 200/4 = 50
    assert dice(1, 3) == 50.0          # symmetric
    assert dice(0, 0) == 100.0         # both zero -> identical
    assert dice(0, 5) == 0.0           # 100*2*0/5
    assert dice(2.5, 2.5) == 100.0     # 100*2*2.5/5
    assert dice(1, 4) == pytest.approx(40.0)  # 100*2*1/5 = 40


@pytest.mark.parametrize("sim,human", [(-1, 1), (1, -0.1), (float("nan"), 1), (None, 1),
                                       (float("inf"), 1)])
def test_dice_rejects_bad_statistics(sim, human):
    with pytest.raises(ValueError):
        dice(sim, human)


def test_dice_mean_is_feature_mean():
    # features: a dice(3,1)=50, b dice(0,0)=100, c dice(2,2)=100 -> D = 250/3
    d = dice_mean({"a": 3, "b": 0, "c": 2}, {"a": 1, "b": 0, "c": 2})
    assert d == pytest.approx(250 / 3)
    with pytest.raises(ValueError, match="differ"):
        dice_mean({"a": 1}, {"b": 1})


# ----------------------------------------------------------------------------- ece
def test_ece_two_bins_of_different_sizes():
    # bin "easy": 3 tasks, sim [1,1,0] -> 2/3, human [1,0,0] -> 1/3, gap 1/3, weight 3/4
    # bin "hard": 1 task,  sim [0.5]   -> 0.5, human [0]     -> 0,   gap 1/2, weight 1/4
    # ECE = 3/4*1/3 + 1/4*1/2 = 0.25 + 0.125 = 0.375
    # (an unweighted mean over bins would be (1/3+1/2)/2 = 0.4167 -- not this)
    bins = ["easy", "hard", "easy", "easy"]
    sim = [1, 0.5, True, 0]
    human = [1, 0, 0, 0]
    assert ece(sim, human, bins) == pytest.approx(0.375)


def test_ece_gap_sign_cancels_only_across_bins_not_within():
    # one bin with sim [1,0] and human [0,1]: rates 0.5 vs 0.5 -> ECE 0 (per-bin rates compared)
    assert ece([1, 0], [0, 1], ["b", "b"]) == 0.0
    # two bins, same data: gaps |1-0| and |0-1|, weights 1/2 each -> 1.0
    assert ece([1, 0], [0, 1], ["b1", "b2"]) == pytest.approx(1.0)


@pytest.mark.parametrize("sim,human,bins", [
    ([1], [1, 0], ["a", "a"]),        # misaligned
    ([], [], []),                      # empty
    ([None], [1], ["a"]),              # missing outcome is not a failure
    ([1.5], [1], ["a"]),               # out of [0, 1]
])
def test_ece_rejects_bad_inputs(sim, human, bins):
    with pytest.raises(ValueError):
        ece(sim, human, bins)


# ---------------------------------------------------------------------------- usi5
def test_usi5_example():
    # (80 + 70 + 90 + 60 + (1-0.1)*100) / 5 = (300 + 90) / 5 = 78.0
    assert usi5(80, 70, 90, 60, 0.1) == pytest.approx(78.0)
    # all perfect: (4*100 + 100)/5 = 100
    assert usi5(100, 100, 100, 100, 0.0) == 100.0


def test_usi5_rejects_percent_ece_and_out_of_range_d():
    with pytest.raises(ValueError, match="fraction"):
        usi5(80, 70, 90, 60, 6.9)
    with pytest.raises(ValueError, match="d3"):
        usi5(80, 70, 101, 60, 0.1)


# ---------------------------------------------------------------- turing_distance
def test_turing_distance():
    assert turing_distance(88.7) == pytest.approx(38.7)   # |88.7 - 50|
    assert turing_distance(11.3) == pytest.approx(38.7)   # |11.3 - 50|
    assert turing_distance(50) == 0.0
    assert turing_distance(100) == 50.0
    assert turing_distance(0) == 50.0
    for bad in (-0.1, 100.1, float("nan"), None):
        with pytest.raises(ValueError):
            turing_distance(bad)


# ------------------------------------------------------------------ mean_and_rank
def test_mean_and_rank_with_ties():
    # env x: A 5, B 5, C 1 -> A,B tie for places 1,2 -> 1.5 each; C 3
    # env y: A 2, B 3, C 3 -> B,C tie -> 1.5 each; A 3
    # Mean: A (5+2)/2=3.5, B (5+3)/2=4.0, C (1+3)/2=2.0
    # MR:   A (1.5+3)/2=2.25, B (1.5+1.5)/2=1.5, C (3+1.5)/2=2.25
    scores = {"A": {"x": 5, "y": 2}, "B": {"x": 5, "y": 3}, "C": {"x": 1, "y": 3}}
    mean, mr = mean_and_rank(scores)
    assert mean == {"A": 3.5, "B": 4.0, "C": 2.0}
    assert mr == {"A": 2.25, "B": 1.5, "C": 2.25}


def test_mean_and_rank_can_disagree():
    # 3 methods x 4 envs. A wins one env by a lot, B wins three by a little.
    #        e1  e2  e3   e4  | Mean              | ranks       | MR
    #   A     1   1   1  100  | 103/4 = 25.75     | 3 3 3 1     | 10/4 = 2.5
    #   B     5   5   5    0  |  15/4 =  3.75     | 1 1 1 3     |  6/4 = 1.5
    #   C     3   3   3   50  |  59/4 = 14.75     | 2 2 2 2     |  8/4 = 2.0
    # Mean picks A, MR picks B (SPEC §4.2: report both).
    scores = {
        "A": {"e1": 1, "e2": 1, "e3": 1, "e4": 100},
        "B": {"e1": 5, "e2": 5, "e3": 5, "e4": 0},
        "C": {"e1": 3, "e2": 3, "e3": 3, "e4": 50},
    }
    mean, mr = mean_and_rank(scores)
    assert mean == {"A": 25.75, "B": 3.75, "C": 14.75}
    assert mr == {"A": 2.5, "B": 1.5, "C": 2.0}
    assert max(mean, key=mean.get) == "A"
    assert min(mr, key=mr.get) == "B"
    # mean ranks always sum to 1+2+3 = 6 per env -> average 6
    assert sum(mr.values()) == pytest.approx(6.0)


def test_mean_and_rank_invalid_cells_excluded_for_all_methods():
    # persuade: the user simulator refused (None for A, NaN for B) -> excluded for A, B, C.
    # Remaining envs travel, tau:
    #   A: travel 10, tau 30 -> mean 20, ranks 2, 1 -> MR 1.5
    #   B: travel 20, tau 10 -> mean 15, ranks 1, 3 -> MR 2.0
    #   C: travel 0,  tau 20 -> mean 10, ranks 3, 2 -> MR 2.5
    # (reading the invalid cells as 0 would give A mean 40/3 and put C's 90 in the mean.)
    scores = {
        "A": {"travel": 10, "persuade": None, "tau": 30},
        "B": {"travel": 20, "persuade": float("nan"), "tau": 10},
        "C": {"travel": 0, "persuade": 90, "tau": 20},
    }
    rep = mean_and_rank_report(scores)
    assert rep.environments == ["travel", "tau"]
    assert rep.excluded == {"persuade": ["A", "B"]}
    assert rep.mean == {"A": 20.0, "B": 15.0, "C": 10.0}
    assert rep.mean_rank == {"A": 1.5, "B": 2.0, "C": 2.5}
    assert rep.ranks["B"] == {"travel": 1.0, "tau": 3.0}
    with pytest.warns(UserWarning, match="persuade"):
        mean, mr = mean_and_rank(scores)
    assert (mean, mr) == (rep.mean, rep.mean_rank)


def test_mean_and_rank_no_warning_when_all_valid():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, mr = mean_and_rank({"only": {"e": 0.0}})
    assert mean == {"only": 0.0} and mr == {"only": 1.0}


def test_mean_and_rank_errors():
    with pytest.raises(ValueError, match="missing"):
        mean_and_rank({"A": {"e1": 1, "e2": 2}, "B": {"e1": 1}})
    with pytest.raises(ValueError, match="every environment"):
        mean_and_rank_report({"A": {"e1": None}, "B": {"e1": 1}})
    with pytest.raises(ValueError):
        mean_and_rank({})
    with pytest.raises(ValueError):
        mean_and_rank({"A": {"e1": "high"}})
    with pytest.raises(ValueError):
        mean_and_rank({"A": {"e1": float("inf")}})


# --------------------------------------------------------------- bootstrap / stderr
def test_cluster_bootstrap_two_clusters_hand_computed():
    # cluster u1: values [1, 1] (sum 2, n 2); cluster u2: [0] (sum 0, n 1).
    # estimate = mean(1, 1, 0) = 2/3.
    # replicates draw 2 clusters: u1u1 -> 4/4 = 1 (p 1/4), mixed -> 2/3 (p 1/2), u2u2 -> 0 (p 1/4)
    # with 1000 draws ~250 replicates are 0 and ~250 are 1 -> 2.5% quantile 0, 97.5% quantile 1.
    ci = cluster_bootstrap_ci([1, 1, 0], ["u1", "u1", "u2"], n_boot=1000, seed=0)
    assert ci.estimate == pytest.approx(2 / 3)
    assert (ci.low, ci.high) == (0.0, 1.0)
    assert ci.low <= ci.estimate <= ci.high


def test_cluster_bootstrap_deterministic_and_contains_estimate():
    rng = np.random.default_rng(123)
    users = [f"ip{u}" for u in range(30) for _ in range(rng.integers(1, 5))]
    vals = [100.0 * rng.integers(0, 2) for _ in users]
    a = cluster_bootstrap_ci(vals, users, n_boot=500, seed=7)
    b = cluster_bootstrap_ci(vals, users, n_boot=500, seed=7)
    c = cluster_bootstrap_ci(vals, users, n_boot=500, seed=8)
    assert a == b
    assert a != c
    assert a.estimate == pytest.approx(float(np.mean(vals)))
    assert a.low < a.estimate < a.high
    assert a.se > 0


def test_cluster_bootstrap_equal_cluster_means_is_degenerate():
    # every cluster mean is 0.5 -> every pooled replicate is exactly 0.5
    ci = cluster_bootstrap_ci([1, 0, 0.5, 0.25, 0.75], ["a", "a", "b", "c", "c"], n_boot=200)
    assert ci.estimate == ci.low == ci.high == pytest.approx(0.5)
    assert ci.se == pytest.approx(0.0)


def test_cluster_bootstrap_wider_than_iid_when_clusters_correlated():
    # 10 users x 5 identical conversations each: effective n is 10, not 50.
    vals = [float(u % 2) for u in range(10) for _ in range(5)]
    users = [u for u in range(10) for _ in range(5)]
    clustered = cluster_bootstrap_ci(vals, users, n_boot=1000, seed=0)
    iid = cluster_bootstrap_ci(vals, list(range(50)), n_boot=1000, seed=0)
    assert clustered.se > 1.5 * iid.se   # ~ sqrt(5) = 2.24x in expectation


def test_cluster_bootstrap_errors():
    with pytest.raises(ValueError):
        cluster_bootstrap_ci([1, 0], ["u", "u"])           # one cluster
    with pytest.raises(ValueError):
        cluster_bootstrap_ci([1, 0], ["u"])                # misaligned
    with pytest.raises(ValueError):
        cluster_bootstrap_ci([1, None], ["u", "v"])        # missing value
    with pytest.raises(ValueError):
        cluster_bootstrap_ci([1, 0], ["u", "v"], alpha=1.5)


def test_mean_and_stderr():
    # [1, 2, 3]: mean 2; s^2 = (1+0+1)/2 = 1; se = 1/sqrt(3)
    m, se = mean_and_stderr([1, 2, 3])
    assert m == 2.0
    assert se == pytest.approx(1 / math.sqrt(3))
    # [65.5, 65.7, 65.9]: mean 65.7; s^2 = (0.04+0+0.04)/2 = 0.04, s = 0.2; se = 0.2/sqrt(3)
    m, se = mean_and_stderr([65.5, 65.7, 65.9])
    assert m == pytest.approx(65.7) and se == pytest.approx(0.2 / math.sqrt(3))
    for bad in ([1.0], [1.0, float("nan"), 2.0], [1.0, None]):
        with pytest.raises(ValueError):
            mean_and_stderr(bad)
