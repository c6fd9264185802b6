"""FoldGRPO, turn credits and multi-turn GRPO advantages against hand-computed cases (SPEC §2.3, §3.2)."""
import math
import random

import pytest

from mimesis_lab.rl.advantages import fold_grpo, multiturn_grpo, turn_credits

EPS = 1e-6
approx = lambda x: pytest.approx(x, rel=1e-5, abs=1e-6)  # noqa: E731  (eps=1e-6 shifts values slightly)
SQRT2_INV = 1 / math.sqrt(2)  # 0.70710678


# ---------------------------------------------------------------- fold_grpo
def test_fold_grpo_counts_each_rollout_once():
    # group "g": rollout A split into 3 segments, score 1; rollout B one segment, score 0.
    # unique rollouts: [1, 0] -> mean 0.5 (the naive per-segment mean would be 3/4 = 0.75)
    # sample std = sqrt(((1-0.5)^2 + (0-0.5)^2) / (2-1)) = sqrt(0.5) = 0.70711
    # A_A = 0.5 / 0.70711 = +0.70711 ; A_B = -0.70711
    scores = [1.0, 1.0, 1.0, 0.0]
    adv = fold_grpo(scores, ["g"] * 4, ["A", "A", "A", "B"])
    assert adv == approx([SQRT2_INV] * 3 + [-SQRT2_INV])
    # the naive segment-weighted baseline would give a different answer
    naive_mean = sum(scores) / len(scores)
    assert naive_mean == 0.75 and naive_mean != 0.5
    naive_std = math.sqrt(sum((s - naive_mean) ** 2 for s in scores) / 3)  # = 0.5
    naive = [(s - naive_mean) / naive_std for s in scores]  # [0.5, 0.5, 0.5, -1.5]
    assert naive[-1] == pytest.approx(-1.5) and adv[-1] != pytest.approx(naive[-1])


def test_fold_grpo_three_rollouts_interleaved_and_singleton_group():
    # group "g": A=2 (2 segments), B=4 (1), C=0 (3); group "h": D=5 (2 segments, alone)
    # g unique mean = (2+4+0)/3 = 2 (segment-weighted mean would be 8/6 = 1.333)
    # sample std = sqrt((0 + 4 + 4) / 2) = 2 -> A=0, B=+1, C=-1 ; h has one rollout -> 0
    rid = ["C", "A", "D", "B", "C", "A", "D", "C"]
    grp = ["g", "g", "h", "g", "g", "g", "h", "g"]
    sc = {"A": 2.0, "B": 4.0, "C": 0.0, "D": 5.0}
    adv = fold_grpo([sc[r] for r in rid], grp, rid)
    want = {"A": 0.0, "B": 2 / (2 + EPS), "C": -2 / (2 + EPS), "D": 0.0}
    assert adv == approx([want[r] for r in rid])
    assert adv[2] == 0.0 and adv[6] == 0.0


def test_fold_grpo_uses_sample_std_not_population():
    # [1, 0]: population std 0.5 would give +-1.0; the sample std sqrt(0.5) gives +-0.70711
    adv = fold_grpo([1.0, 0.0], [0, 0], [10, 11])
    assert adv == approx([SQRT2_INV, -SQRT2_INV])
    assert adv[0] != pytest.approx(1.0, rel=1e-3)


def test_fold_grpo_equal_scores_and_single_rollout():
    assert fold_grpo([0.3, 0.3, 0.3], ["g"] * 3, [1, 2, 3]) == [0.0, 0.0, 0.0]  # std 0 -> 0/(0+eps)
    assert fold_grpo([0.9, 0.9], ["g", "g"], ["r", "r"]) == [0.0, 0.0]  # one unique rollout
    assert fold_grpo([], [], []) == []


def test_fold_grpo_validation():
    with pytest.raises(ValueError, match="equal lengths"):
        fold_grpo([1.0], ["g", "g"], ["a", "b"])
    with pytest.raises(ValueError, match="rollout 'ro7'.*different scores"):
        fold_grpo([1.0, 0.5, 0.0], ["g"] * 3, ["ro7", "ro7", "x"])
    with pytest.raises(ValueError, match="rollout 'ro7'.*different group"):
        fold_grpo([1.0, 1.0, 0.0], ["g", "h", "g"], ["ro7", "ro7", "x"])
    with pytest.raises(ValueError, match="finite"):
        fold_grpo([float("nan"), 0.0], ["g", "g"], ["a", "b"])
    with pytest.raises(ValueError, match="eps"):
        fold_grpo([1.0, 0.0], ["g", "g"], ["a", "b"], eps=-1.0)


def test_fold_grpo_property_zero_mean_unit_std_over_unique_rollouts():
    rng = random.Random(1234)
    for _ in range(200):
        scores, groups, rids = [], [], []
        truth = {}
        for g in range(rng.randint(1, 4)):
            for j in range(rng.randint(1, 6)):
                r = f"{g}-{j}"
                truth[r] = (g, rng.choice([0.0, 1.0, rng.random(), rng.uniform(-3, 3)]))
                for _ in range(rng.randint(1, 5)):  # segments
                    scores.append(truth[r][1]); groups.append(g); rids.append(r)
        order = list(range(len(scores)))
        rng.shuffle(order)
        scores = [scores[i] for i in order]; groups = [groups[i] for i in order]; rids = [rids[i] for i in order]
        adv = fold_grpo(scores, groups, rids)
        per_rollout = {}
        for a, r in zip(adv, rids):
            assert per_rollout.setdefault(r, a) == a  # segments of one rollout share it
        for g in set(groups):
            vals = [per_rollout[r] for r, (gg, _) in truth.items() if gg == g]
            assert abs(sum(vals) / len(vals)) < 1e-9
            raw = [s for r, (gg, s) in truth.items() if gg == g]
            spread = max(raw) - min(raw)
            if len(vals) > 1 and spread > 1e-3:
                std = math.sqrt(sum(v * v for v in vals) / (len(vals) - 1))
                assert std == pytest.approx(1.0, rel=1e-3)
            if len(vals) == 1:
                assert vals == [0.0]


# ---------------------------------------------------------------- turn_credits
def test_turn_credits_r2g():
    # c3 = 1 ; c2 = 0 + 0.8*1 = 0.8 ; c1 = 0 + 0.8*0.8 = 0.64
    assert turn_credits([0, 0, 1], 0.8) == approx([0.64, 0.8, 1.0])
    # [1, 0, 0.5]: c3 = 0.5 ; c2 = 0 + 0.4 = 0.4 ; c1 = 1 + 0.32 = 1.32
    assert turn_credits([1, 0, 0.5], 0.8, method="r2g") == approx([1.32, 0.4, 0.5])
    assert turn_credits([1, 2, 3], 0.0) == [1.0, 2.0, 3.0]  # gamma 0: own reward
    assert turn_credits([1, 2, 3], 1.0) == [6.0, 5.0, 3.0]  # gamma 1: suffix sums
    assert turn_credits([], 0.8) == []


def test_turn_credits_equalized_and_mean():
    assert turn_credits([0.2, 0.0, 7.0], 0.8, method="equalized") == [1.0, 1.0, 1.0]
    # the reference's "Sum" averages: (1 + 0 + 0.5) / 3 = 0.5 for every turn
    assert turn_credits([1, 0, 0.5], 0.8, method="mean") == approx([0.5] * 3)


def test_turn_credits_validation():
    with pytest.raises(ValueError, match="unknown turn credit method"):
        turn_credits([1.0], 0.8, method="Sum")
    with pytest.raises(ValueError, match="gamma"):
        turn_credits([1.0], 1.5)
    with pytest.raises(ValueError, match="finite"):
        turn_credits([float("inf")], 0.8)


# ---------------------------------------------------------------- multiturn_grpo
def test_multiturn_grpo_worked_example_group_of_three():
    # gamma 0.8, one group of three trajectories:
    # T1 rewards [0, 1], lengths [2, 3]: c = [0.8, 1.0], G1 = 0.8
    # T2 rewards [0.5],  lengths [4]:    c = [0.5],      G1 = 0.5
    # T3 rewards [0, 0], lengths [1, 2]: c = [0, 0],     G1 = 0   (all credit zero)
    # mean = 1.3/3 = 13/30 ; deviations 11/30, 2/30, -13/30
    # sample var = (121 + 4 + 169)/900 / 2 = 147/900 -> std = sqrt(147)/30 = 0.40415
    # A1 = 11/sqrt(147) = 0.90726 ; A2 = 2/sqrt(147) = 0.16496 ; A3 = -13/sqrt(147) = -1.07222
    rewards = [[0, 1], [0.5], [0, 0]]
    lengths = [[2, 3], [4], [1, 2]]
    std = math.sqrt(147) / 30
    A1, A2, A3 = (11 / 30) / (std + EPS), (2 / 30) / (std + EPS), (-13 / 30) / (std + EPS)
    assert (A1, A2, A3) == approx((0.907265, 0.164957, -1.072222))
    out = multiturn_grpo(rewards, lengths, ["p", "p", "p"])
    # T1 token credits [0.8, 0.8, 1, 1, 1]; mean over non-zero = (1.6 + 3)/5 = 0.92
    # -> tokens 0.8/0.92*A1 = 0.78893 and 1/0.92*A1 = 0.98616; their mean is A1
    assert out[0] == approx([0.8 / 0.92 * A1] * 2 + [A1 / 0.92] * 3)
    assert sum(out[0]) / 5 == approx(A1)
    assert out[1] == approx([A2] * 4)  # a single turn: every token = A2
    assert out[2] == approx([A3] * 3)  # zero credit, "uniform": the failure keeps its signal
    zero = multiturn_grpo(rewards, lengths, ["p", "p", "p"], zero_credit="zero")
    assert zero[0] == out[0] and zero[1] == out[1]
    assert zero[2] == [0.0, 0.0, 0.0]  # the reference drops the signal


def test_multiturn_grpo_zero_credit_tokens_stay_zero_and_groups_are_separate():
    # X rewards [0, 1, 0] lengths [1, 1, 1]: c3 = 0, c2 = 1, c1 = 0.8 -> tokens [0.8, 1, 0], G1 = 0.8
    # Y rewards [0, 0, 0]: G1 = 0.  Group {X, Y}: mean 0.4, sample std sqrt(2*0.16) = 0.56569
    # A_X = +0.70711, A_Y = -0.70711.  X: mean over non-zero tokens = 0.9
    # -> [0.8/0.9*A_X, 1/0.9*A_X, 0] = [0.62854, 0.78567, 0]
    # Z alone in group "q" -> A_Z = 0 -> all zeros
    out = multiturn_grpo([[0, 1, 0], [0, 0, 0], [1, 1]], [[1, 1, 1], [1, 1, 1], [2, 2]], ["p", "p", "q"])
    a = 0.4 / (math.sqrt(0.32) + EPS)
    assert out[0] == approx([0.8 / 0.9 * a, a / 0.9, 0.0]) and out[0][2] == 0.0
    assert out[1] == approx([-a] * 3)
    assert out[2] == [0.0] * 4
    assert [len(o) for o in out] == [3, 3, 4]


def test_multiturn_grpo_negative_credits_keep_the_sign_of_A():
    # X rewards [-0.1, -0.1] (penalties only): c2 = -0.1, c1 = -0.1 + 0.8*(-0.1) = -0.18, G1 = -0.18
    # Y rewards [0, 1]: c = [0.8, 1], G1 = 0.8.  mean 0.31, deviations -+0.49, std 0.49*sqrt2
    # A_X = -0.70711.  X: m = (-0.18 - 0.1)/2 = -0.14 < 0 -> scale = A_X/m = +5.0508
    # -> tokens [-0.18*5.0508, -0.1*5.0508] = [-0.90914, -0.50508]: both negative like A_X
    out = multiturn_grpo([[-0.1, -0.1], [0, 1]], [[1, 1], [1, 1]], [0, 0])
    a = 0.49 / (0.49 * math.sqrt(2) + EPS)
    assert out[0] == approx([-0.18 / -0.14 * -a, -0.1 / -0.14 * -a])
    assert all(x < 0 for x in out[0]) and sum(out[0]) / 2 == approx(-a)
    # penalty-only group: the less-bad trajectory gets A > 0 and its negative credits turn positive
    # X rewards [0, -1]: c = [-0.8, -1], G1 = -0.8 ; Y rewards [-2]: G1 = -2 -> A_X = +0.70711
    # m = -0.9, scale = A_X/m = -0.78567 -> [0.62854, 0.78567]
    out = multiturn_grpo([[0, -1], [-2]], [[1, 1], [1]], [0, 0])
    a = 0.6 / (math.sqrt(0.72) + EPS)
    assert out[0] == approx([0.8 / 0.9 * a, a / 0.9]) and all(x > 0 for x in out[0])
    assert out[1] == approx([-a])


def test_multiturn_grpo_mixed_sign_credits_flip_minority_turns():
    # gamma 0 -> credits = rewards.  X rewards [1, -1, 1], G1 = 1 ; Y rewards [0, 0, 0], G1 = 0
    # A_X = +0.70711 ; X: m = (1 - 1 + 1)/3 = 1/3 -> scale 3*A_X -> [2.1213, -2.1213, 2.1213]:
    # the middle turn is pushed DOWN although the trajectory is better than its group.
    out = multiturn_grpo([[1, -1, 1], [0, 0, 0]], [[1, 1, 1]] * 2, ["g", "g"], gamma=0.0)
    a = 0.5 / (math.sqrt(0.5) + EPS)
    assert out[0] == approx([3 * a, -3 * a, 3 * a])
    # credits that cancel exactly (m = 0): the rescaling is undefined -> the zero-credit policy
    # X rewards [1, -1], gamma 0: credits [1, -1], m = 0 ; A_X = +0.70711
    out = multiturn_grpo([[1, -1], [0, 0]], [[1, 1]] * 2, ["g", "g"], gamma=0.0)
    assert out[0] == approx([a, a])
    out = multiturn_grpo([[1, -1], [0, 0]], [[1, 1]] * 2, ["g", "g"], gamma=0.0, zero_credit="zero")
    assert out[0] == [0.0, 0.0] and out[1] == [0.0, 0.0]


def test_multiturn_grpo_zero_length_turns_and_token_weighting():
    # X rewards [1, 0.5], lengths [0, 2]: c = [1.4, 0.5]; only turn 2 has tokens -> [A, A]
    # Y rewards [0, 0] lengths [3, 0] -> zero credit -> uniform [-A]*3
    # G1: 1.4 and 0 -> A = 0.70711
    out = multiturn_grpo([[1, 0.5], [0, 0]], [[0, 2], [3, 0]], ["g", "g"])
    a = 0.7 / (math.sqrt(0.98) + EPS)
    assert out[0] == approx([a, a]) and out[1] == approx([-a] * 3)


def test_multiturn_grpo_property_nonzero_mean_equals_A():
    rng = random.Random(7)
    for _ in range(100):
        n = rng.randint(2, 6)
        rewards = [[rng.choice([0.0, 0.0, 1.0, rng.random()]) for _ in range(rng.randint(1, 5))] for _ in range(n)]
        lengths = [[rng.randint(0, 4) for _ in r] for r in rewards]
        groups = [rng.randint(0, 1) for _ in range(n)]
        out = multiturn_grpo(rewards, lengths, groups)
        G = [turn_credits(r, 0.8)[0] for r in rewards]
        for i, toks in enumerate(out):
            assert len(toks) == sum(lengths[i])
            mates = [G[j] for j in range(n) if groups[j] == groups[i]]
            if len(mates) == 1:
                assert all(t == 0.0 for t in toks)
                continue
            m = sum(mates) / len(mates)
            A = (G[i] - m) / (math.sqrt(sum((x - m) ** 2 for x in mates) / (len(mates) - 1)) + EPS)
            nz = [t for t in toks if t != 0.0]
            if nz and abs(A) > 1e-9:
                assert sum(nz) / len(nz) == pytest.approx(A, rel=1e-6, abs=1e-9)
                assert all(t * A > 0 for t in nz)  # non-negative rewards: every sign = sign(A)


def test_multiturn_grpo_validation():
    with pytest.raises(ValueError, match="equal lengths"):
        multiturn_grpo([[1]], [[1], [1]], ["g"])
    with pytest.raises(ValueError, match="no turns"):
        multiturn_grpo([[]], [[]], ["g"])
    with pytest.raises(ValueError, match="turn lengths"):
        multiturn_grpo([[1, 0]], [[1]], ["g"])
    with pytest.raises(ValueError, match=r"turn_lengths\[0\]\[0\]"):
        multiturn_grpo([[1]], [[-1]], ["g"])
    with pytest.raises(ValueError, match=r"turn_lengths\[0\]\[0\]"):
        multiturn_grpo([[1]], [[1.5]], ["g"])
    with pytest.raises(ValueError, match="zero_credit"):
        multiturn_grpo([[1]], [[1]], ["g"], zero_credit="drop")
    with pytest.raises(ValueError, match="gamma"):
        multiturn_grpo([[1]], [[1]], ["g"], gamma=2.0)
