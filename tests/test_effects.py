"""The "Does it work?" effects (mimesis_lab/evals/effects.py): worked examples on tiny hand-built inputs."""
from __future__ import annotations

import json

import pytest

from mimesis_lab.evals import effects as eff

KEYS = {"value", "ci", "target", "passed", "missing_reason"}


# ----------------------------------------------------------------------------- statistics
def test_bootstrap_ci_worked_examples_and_determinism():
    # [0, 0, 0, 1]: replicate means take 0/.25/.5/.75/1 with prob .316/.422/.211/.047/.004 -> 2.5%: 0, 97.5%: .75
    assert eff.bootstrap_ci([0, 0, 0, 1]) == [0.0, 0.75]
    assert eff.bootstrap_ci([0, 0, 0, 1]) == eff.bootstrap_ci([0, 0, 0, 1], seed=eff.SEED)   # seeded
    assert eff.bootstrap_ci([2.0, 2.0, 2.0]) == [2.0, 2.0]
    assert eff.bootstrap_ci([1.0]) is None and eff.bootstrap_ci([]) is None                # no honest CI
    # rows + a ratio of column sums: {(1,2),(3,4)} -> 2/4=.5, 6/8=.75, 4/6=.667
    lo, hi = eff.bootstrap_ci([(1, 2), (3, 4)], lambda r: r[:, 0].sum() / r[:, 1].sum())
    assert (lo, hi) == (0.5, 0.75)


def test_wilson_ci_and_paired_differences():
    lo, hi = eff.wilson_ci(0, 64)
    assert lo == 0.0 and hi == pytest.approx(3.8415 / (64 + 3.8415), abs=1e-4)   # p=0: z^2/(n+z^2)
    lo, hi = eff.wilson_ci(5, 10)
    assert lo == pytest.approx(1 - hi) and lo == pytest.approx(0.2366, abs=1e-4)
    assert eff.wilson_ci(0, 0) is None
    d, unpaired = eff.paired_differences({"t1": 1.0, "t2": 0.5, "t3": 0.0}, {"t1": 0.5, "t2": 0.5, "t4": 1.0})
    assert d == [0.5, 0.0] and unpaired == 2            # t3 and t4 have no partner


# ----------------------------------------------------------------------------- Stage I
def test_midtrain_effects():
    e = eff.midtrain_loss_ratio({"initial_val_loss": 10.0, "final_val_loss": 6.0, "unigram_val_loss": 7.0})
    assert e["value"] == 0.6 and e["passed"] and e["ci"] is None and "initial model" in e["ci_note"]
    worse = {"initial_val_loss": 10.0, "final_val_loss": 6.0, "unigram_val_loss": 5.0}
    assert not eff.midtrain_loss_ratio(worse)["passed"]
    assert not eff.midtrain_loss_ratio({"initial_val_loss": 10.0, "final_val_loss": 6.0})["passed"]  # no unigram
    # per conversation [model_nll, unigram_nll, targets]: (9 - 10) / 3; resamples: -1 (ex1 twice), 1 (ex2 twice)
    u = eff.midtrain_vs_unigram({"unigram": {"per_example": [[6, 8, 2], [3, 2, 1]]}})
    assert u["value"] == pytest.approx(-1 / 3) and u["passed"] and u["ci"] == [-1.0, 1.0] and u["n"] == 2
    assert u["model_loss"] == 3.0 and u["unigram_loss"] == pytest.approx(10 / 3)
    for e in (eff.midtrain_loss_ratio(None), eff.midtrain_vs_unigram({"final_val_loss": 1.0})):
        assert e["value"] is None and e["passed"] is False and e["missing_reason"] and KEYS <= set(e)


def test_sft_format_rate_sampled_and_missing():
    s = {"format_sampled_samples": 8, "format_sampled_well_formed": 4, "format_sampled_per_prompt": [[3, 4], [1, 4]],
         "format_think_open_close_rate": 1.0}
    e = eff.sft_format_rate(s)
    # prompts resampled: 6/8, 2/8 or 4/8 -> [.25, .75]; Wilson(4, 8) = [.215, .785] is wider: the hull
    assert e["value"] == 0.5 and not e["passed"] and e["ci"] == pytest.approx([0.2152, 0.7848], abs=1e-4)
    assert e["greedy_rate"] == 1.0 and e["prompts"] == 2
    ok = eff.sft_format_rate({"format_sampled_samples": 40, "format_sampled_well_formed": 38})
    assert ok["passed"] and ok["ci_unit"] == "sample (Wilson)" and ok["ci"] == eff.wilson_ci(38, 40)
    zero = eff.sft_format_rate({"format_sampled_samples": 64, "format_sampled_well_formed": 0,
                                "format_sampled_per_prompt": [[0, 32], [0, 32]]})
    assert zero["ci"] == eff.wilson_ci(0, 64) and zero["ci"][1] > 0.05       # not the bootstrap's [0, 0]
    m = eff.sft_format_rate({"format_think_open_close_rate": 0.0})          # greedy only: the target is sampled
    assert m["value"] is None and not m["passed"] and "format_sampled" in m["missing_reason"]
    assert m["greedy_rate"] == 0.0


def _roll(step, raw, source="usersim_behavior", invalid=None, ff=0):
    return {"step": step, "data_source": source, "raw": raw, "invalid": invalid, "format_failures": ff}


SIM_RL = ([_roll(s, r) for s in (1, 2) for r in (0.1, 0.3)] + [_roll(s, r) for s in (3, 4) for r in (0.9, 0.9)]
          + [_roll(s, r, ff=int(s == 6 and r == 0.5)) for s in (5, 6) for r in (0.5, 0.7)]
          + [_roll(6, 1.0, invalid="judge_failure"), _roll(6, 1.0, source="usersim_tom")])


def test_sim_rl_reward_gain_over_windows():
    e = eff.sim_rl_reward_gain(None, SIM_RL)
    # 6 steps -> windows of 2: first {1,2} mean .2, last {5,6} mean .6; the invalid and the ToM rollout are left out
    assert e["first_steps"] == [1, 2] and e["last_steps"] == [5, 6]
    assert e["value"] == pytest.approx(0.4) and e["n"] == 8 and e["passed"]
    assert 0.2 <= e["ci"][0] < 0.4 < e["ci"][1] <= 0.6
    steps = [{"kind": "train", "step": s, "metrics": {"reward/task/usersim_behavior": v}}
             for s, v in ((1, 0.2), (2, 0.2), (3, 0.5), (4, 0.5), (5, 0.6), (6, 0.6))]
    f = eff.sim_rl_reward_gain(steps, None)                   # no rollouts.jsonl: per-step means, no CI, no pass
    assert f["value"] == pytest.approx(0.4) and f["ci"] is None and not f["passed"] and f["ci_note"]
    assert eff.sim_rl_reward_gain(None, [_roll(1, 0.5, source="usersim_tom")])["missing_reason"]


def test_update_reward_gain_counts_the_format_failures_the_judged_score_leaves_out():
    # the update reward (SPEC 2.3: a format failure scores 0) over the same windows, with the rollouts whose
    # format failure left no judged score (raw None); first {1,2}: 0, 0, .2, .4 -> .15; last {5,6}: .6, .8 -> .7
    def u(step, raw, upd, ff=0):
        return {**_roll(step, raw, ff=ff), "update_reward": upd}
    rolls = ([u(1, None, 0.0, ff=1), u(1, 0.3, 0.2), u(2, None, 0.0, ff=1), u(2, 0.4, 0.4)]
             + [u(s, 0.5, 0.5) for s in (3, 4)] + [u(5, 0.6, 0.6), u(6, 0.8, 0.8),
                                                  {**u(6, 1.0, 1.0), "invalid": "judge_failure"}])
    g = eff.update_reward_gain(rolls)["update_reward"]
    assert g["first"] == pytest.approx(0.15) and g["last"] == pytest.approx(0.7) and g["n"] == 6
    assert g["gain"] == pytest.approx(0.55)
    assert 0.2 <= g["ci"][0] < 0.55 < g["ci"][1] <= 0.8           # resamples span .6 - .4 .. .8 - 0
    e = eff.sim_rl_reward_gain(None, rolls)                       # the headline stays the judged score: .35 -> .7
    assert e["value"] == pytest.approx(0.35) and e["update_reward"] == g
    assert eff.update_reward_gain(SIM_RL) == {}                   # rollouts without update_reward: nothing added
    note = eff._behaviour_note({"passed": False, "mix_adjusted": 0.0, "neutral_share": [0.5, 0.5],
                                "behavior_exhibit": [0.1, 0.1], "update_reward": g})
    assert "update reward" in note and "0.150 -> 0.700 (+0.550 [" in note


def _lab(step, b, raw, ex, g):
    return {**_roll(step, raw), "labels": {"behavior": b}, "components": {"exhibit": ex}, "group_id": g}


def test_sim_rl_gain_breakdown_separates_task_mix_from_learning():
    # first window {1,2}: one N (0.9) and three B5 (0.2, exhibit 0); last {5,6}: three N, two B5 (0.3/0.5, 0.2/0)
    rolls = ([_lab(1, "N", 0.9, 1.0, "a"), _lab(1, "B5", 0.2, 0.0, "b"), _lab(2, "B5", 0.2, 0.0, "c"),
              _lab(2, "B5", 0.2, 0.0, "c")] + [_lab(s, "N", 0.5, 1.0, f"m{s}") for s in (3, 4)]
             + [_lab(5, "N", 0.9, 1.0, "d"), _lab(5, "N", 0.9, 1.0, "d"), _lab(6, "N", 0.9, 1.0, "e"),
                _lab(6, "B5", 0.3, 0.5, "f"), _lab(6, "B5", 0.2, 0.0, "f")])
    e = eff.sim_rl_reward_gain(None, rolls)
    # raw windows: (0.9 + 0.6) / 4 = 0.375 -> 3.2 / 5 = 0.64, mostly because the last window drew more N tasks
    assert e["value"] == pytest.approx(0.265)
    # at the first window's mix (N 1, B5 3): (1 * 0 + 3 * (0.25 - 0.2)) / 4
    assert e["mix_adjusted"] == pytest.approx(0.0375) and e["mix_adjusted_labels"] == 2
    # the first window holds one N rollout: that cell cannot be resampled, so no interval
    assert e["mix_adjusted_ci"] is None
    # with two N rollouts in the first window every cell can be resampled; N's cells are constant (0.9), so the
    # interval comes from B5 alone: (3/5) * (last mean in {0.2, 0.25, 0.3} - first 0.2) spans [0, 0.06]
    e2 = eff.sim_rl_reward_gain(None, rolls + [_lab(1, "N", 0.9, 1.0, "a")])
    assert e2["mix_adjusted"] == pytest.approx(3 / 5 * 0.05)
    lo, hi = e2["mix_adjusted_ci"]
    assert lo == pytest.approx(0.0) and hi == pytest.approx(0.06)
    assert e["neutral_share"] == pytest.approx([0.25, 0.6]) and e["behavior_exhibit"] == pytest.approx([0.0, 0.25])
    # B groups with more than one rollout: (2, c) all 0, (6, f) 0.5 vs 0 -> half can teach the behaviour
    assert e["groups_with_exhibit_variance"] == pytest.approx(0.5) and e["behavior_groups"] == 2
    note = eff._behaviour_note({**e, "passed": False})
    assert "+0.037" in note and "0.250 -> 0.600" in note and "0.000 -> 0.250" in note and "50% of their 2 groups" in note
    assert eff._behaviour_note(e | {"passed": True}) is None
    assert "mix_adjusted" not in eff.sim_rl_reward_gain(None, SIM_RL)         # no labels: no breakdown


def test_sim_rl_format_failure_end():
    e = eff.sim_rl_format_failure_end(None, SIM_RL)
    # last window {5, 6}: 4 behaviour + 1 ToM valid rollouts, one with a format failure
    assert e["value"] == pytest.approx(1 / 5) and e["passed"] and e["ci"] == eff.wilson_ci(1, 5) and e["n"] == 5
    # per task (the share depends on the mix): behaviour 0 of 4 first, 1 of 4 last; ToM only in the last window
    assert e["by_task"] == {"usersim_behavior": {"first": 0.0, "n_first": 4, "last": 0.25, "n_last": 4},
                            "usersim_tom": {"first": None, "n_first": 0, "last": 0.0, "n_last": 1}}
    assert e["diagnosis"] == "by task, first -> last window (rollouts): usersim_behavior 0.00 -> 0.25 (4/4)"
    bad = eff.sim_rl_format_failure_end(None, [_roll(1, 0.0, ff=1), _roll(2, 0.0, ff=2)])
    assert bad["value"] == 1.0 and not bad["passed"]
    assert eff.sim_rl_format_failure_end(None, None)["value"] is None


# ----------------------------------------------------------------------------- simulators
def _beh(task, raw, seed=0, excluded=None):
    return {"type": "rollout", "kind": "behavior", "task_id": task, "raw": raw, "seed": seed, "excluded": excluded}


def _fid(conv, hits):
    dims = ["persona", "style", "technical_competency", "information_flow", "pacing"]
    return {"type": "fidelity_judgement", "conversation_id": conv,
            "matches": {d: int(i < hits) for i, d in enumerate(dims)}}


RECORDS = {
    "mimesis": [_beh("a", 0.5, 0), _beh("a", 0.7, 1), _beh("b", 0.4), _beh("b", 1.0, excluded="judge_failure"),
                _fid("c1", 2), _fid("c2", 5)],
    "sft": [_beh("a", 0.5), _beh("b", 0.2), _beh("c", 0.9), _fid("c1", 0), {"type": "fidelity_judgement",
                                                                            "conversation_id": "c2", "failure": "x"}],
}


def test_sim_eval_paired_over_tasks_and_conversations():
    b = eff.sim_eval_vs(RECORDS, "mimesis", "sft", "behavior")
    # a: mean(.5,.7) - .5 = .1; b: .4 - .2 = .2 (the excluded rollout left out); c has no partner
    assert b["value"] == pytest.approx(0.15) and b["n"] == 2 and b["unpaired"] == 1 and b["passed"]
    assert b["ci"] == pytest.approx([0.1, 0.2])
    f = eff.sim_eval_vs(RECORDS, "mimesis", "sft", "fi")      # c1: 40 - 0; c2 has no judged partner
    assert f["value"] == 40.0 and f["n"] == 1 and f["ci"] is None and f["passed"]
    same = eff.sim_eval_vs(RECORDS, "mimesis", "sft", "behavior", same_as="sft")
    assert same["value"] == pytest.approx(0.15) and not same["passed"] and same["identical_to"] == "sft"
    assert "same final weights" in same["missing_reason"]
    assert eff.sim_eval_vs(RECORDS, "mimesis", "base", "fi")["missing_reason"]
    assert eff.sim_eval_vs(None, "mimesis", "sft", "fi")["value"] is None


# ----------------------------------------------------------------------------- agents
def _ar(agent, user, gym, task, reward, invalid=None):
    return {"agent": agent, "user": user, "gym": gym, "task_id": task, "attempt": 0, "total_reward": reward,
            "invalid": invalid, "n_turns": 1}


AGENT_ROLLOUTS = [
    _ar("base", "u1", "travel", "t1", 0.0), _ar("grpo", "u1", "travel", "t1", 0.5),
    _ar("csd", "u1", "travel", "t1", 0.5),
    _ar("base", "u2", "travel", "t1", 0.2), _ar("grpo", "u2", "travel", "t1", 0.2),
    _ar("csd", "u2", "travel", "t1", 0.0),
    _ar("base", "u1", "search", "s1", 0.0), _ar("grpo", "u1", "search", "s1", 0.0),
    _ar("csd", "u1", "search", "s1", 0.0),
    _ar("base", "u2", "search", "s1", 0.0), _ar("grpo", "u2", "search", "s1", 1.0, invalid="refusal"),
    _ar("csd", "u2", "search", "s1", 0.0),
]


def test_agent_comparisons_paired_over_tasks_and_users():
    tr = eff.agent_vs(AGENT_ROLLOUTS, "grpo", "base", ["travel"])
    # (u1,t1): .5 - 0, (u2,t1): .2 - .2 -> .25; resamples .5 / .25 / 0 -> CI [0, .5] includes 0: FAIL
    assert tr["value"] == pytest.approx(0.25) and tr["n"] == 2 and tr["ci"] == [0.0, 0.5] and not tr["passed"]
    held = eff.agent_vs(AGENT_ROLLOUTS, "grpo", "base", ["search"])   # the refused rollout is invalid, not 0
    assert held["value"] == 0.0 and held["n"] == 1 and held["unpaired"] == 1 and held["ci"] is None
    csd = eff.agent_vs(AGENT_ROLLOUTS, "csd", "grpo", None, target=">= 0", need_ci=False)
    assert csd["value"] == pytest.approx(-0.2 / 3) and not csd["passed"] and csd["n"] == 3
    tie = eff.agent_vs(AGENT_ROLLOUTS, "grpo", "grpo", None, target=">= 0", need_ci=False, same_as="agent_grpo")
    assert tie["value"] == 0.0 and not tie["passed"] and tie["identical_to"] == "agent_grpo"
    assert eff.agent_vs(None, "grpo", "base", None)["missing_reason"]


def test_agent_comparison_says_which_gyms_it_rests_on():
    csd = eff.agent_vs(AGENT_ROLLOUTS, "csd", "grpo", None, target=">= 0", need_ci=False)
    # travel: (u1) .5 vs .5, (u2) 0 vs .2 -> means .25 vs .35, diff -.1; search: only u1 pairs (u2's grpo rollout
    # is invalid), 0 vs 0: no gym signal
    assert csd["by_gym"] == {"travel": {"n": 2, "a": 0.25, "b": pytest.approx(0.35), "diff": pytest.approx(-0.1),
                                        "zero": False, "turns": [1.0, 1.0]},
                             "search": {"n": 1, "a": 0.0, "b": 0.0, "diff": 0.0, "zero": True, "turns": [1.0, 1.0]}}
    assert csd["diagnosis"] == ("by gym, csd - grpo: travel -0.100 (0.25 vs 0.35, n 2); every rollout scored 0 on "
                                "search")
    assert eff.agent_vs(AGENT_ROLLOUTS, "grpo", "base", ["search"])["diagnosis"] == \
        "by gym, grpo - base: no gym scores above 0; every rollout scored 0 on search"
    # a gym that charges a step pays an agent that stops sooner: the note names the episode lengths when they
    # differ by half a turn or more (here grpo answers at once, the warm start asks 4 times first)
    short = [{**_ar("grpo", "u1", "intention", t, -0.05), "n_turns": 1} for t in ("t1", "t2")]
    long = [{**_ar("base", "u1", "intention", t, -0.25), "n_turns": 5} for t in ("t1", "t2")]
    e = eff.agent_vs(short + long, "grpo", "base", ["intention"])
    assert e["by_gym"]["intention"]["turns"] == [1.0, 5.0]
    assert e["diagnosis"] == "by gym, grpo - base: intention +0.200 (-0.05 vs -0.25, n 2; 1.0 vs 5.0 turns)"


def test_user_matters():
    e = eff.user_matters(AGENT_ROLLOUTS, "grpo")
    # grpo: u1 {travel .5, search 0}; u2 {travel .2}; shared: travel/t1 -> means u1 .5, u2 .2, pair (u1, u2): .3
    assert e["pair"] == ["u1", "u2"] and e["users"] == {"u1": 0.5, "u2": 0.2}
    assert e["value"] == pytest.approx(0.3) and e["n"] == 1 and e["ci"] is None and not e["passed"]
    # users with different task counts (agent_eval.users.<u>.tasks_per_gym) are compared on the tasks both played:
    # u1 plays t1..t3 (1, 0, 0: mean 1/3 over its own), u2 only t1 (0.5). Over their own tasks u2 would look the
    # higher (.5 > .33) and the spread come out negative (.5 - 1); on the shared t1, u1 is the higher: +0.5.
    uneven = [_ar("a", "u1", "travel", t, r) for t, r in (("t1", 1.0), ("t2", 0.0), ("t3", 0.0))]
    uneven.append(_ar("a", "u2", "travel", "t1", 0.5))
    un = eff.user_matters(uneven, "a")
    assert un["pair"] == ["u1", "u2"] and un["value"] == 0.5 and un["users"] == {"u1": 1.0, "u2": 0.5}
    apart = [_ar("a", "u1", "travel", "t1", 1.0), _ar("a", "u2", "travel", "t2", 0.0)]
    assert "share no task" in eff.user_matters(apart, "a")["missing_reason"]
    same = [_ar("a", u, "travel", t, 1.0) for u in ("u1", "u2") for t in ("t1", "t2")]
    flat = eff.user_matters(same, "a")
    assert flat["value"] == 0.0 and flat["ci"] == [0.0, 0.0] and not flat["passed"]
    diff = [_ar("a", u, "travel", t, float(u == "u1")) for u in ("u1", "u2") for t in ("t1", "t2")]
    yes = eff.user_matters(diff, "a")
    assert yes["value"] == 1.0 and yes["ci"] == [1.0, 1.0] and yes["passed"]
    assert eff.user_matters([_ar("a", "u1", "travel", "t1", 1.0)], "a")["missing_reason"]


def test_csd_coach_note_rate():
    steps = [{"kind": "start"},
             {"kind": "train", "step": 1, "metrics": {"csd/coach_ok": 1.0, "csd/turns_selected": 4.0}},
             {"kind": "train", "step": 2, "metrics": {"csd/coach_ok": 2.0, "csd/turns_selected": 4.0}}]
    e = eff.csd_coach_note_rate(steps)
    # steps resampled: 2/8, 4/8 or 3/8 -> [.25, .5]; Wilson(3, 8) = [.137, .694]: the hull
    assert e["value"] == 3 / 8 and e["passed"] and e["n"] == 8 and e["ci"] == eff.wilson_ci(3, 8)
    assert eff.proportion_ci(3, 8, [(1, 4), (2, 4)]) == eff.wilson_ci(3, 8)
    assert eff.proportion_ci(3, 8, [(0, 4), (3, 4)]) == [0.0, 0.75]     # clusters 0/8 and 6/8 beat Wilson
    none = eff.csd_coach_note_rate([{"kind": "train", "step": 1, "metrics": {"csd/turns_selected": 0.0}}])
    assert none["value"] is None and not none["passed"]


def test_csd_note_use():
    # token-weighted over steps: delta (30*0.1 + 10*(-0.1))/40 = 0.05, gate (30*.6 + 10*.4)/40 = 0.55,
    # teacher - student (30*(-0.2) + 10*(-0.6))/40 = -0.3, placebo share (30*1 + 10*0.5)/40 = 87.5%
    steps = [{"kind": "start"},
             {"kind": "train", "step": 1, "metrics": {"csd/tokens": 30.0, "csd/placebo_token_share": 1.0,
                                                       "csd/delta_mean": 0.1, "csd/gate_mean": 0.6,
                                                       "csd/teacher_minus_student": -0.2}},
             {"kind": "train", "step": 2, "metrics": {"csd/tokens": 10.0, "csd/placebo_token_share": 0.5,
                                                       "csd/delta_mean": -0.1, "csd/gate_mean": 0.4,
                                                       "csd/teacher_minus_student": -0.6}},
             {"kind": "train", "step": 3, "metrics": {"csd/tokens": 0.0}},              # nothing coached
             {"kind": "train", "step": 4, "metrics": {"csd/tokens": 5.0, "csd/placebo_token_share": 0.0,
                                                       "csd/delta_mean": 9.0, "csd/gate_mean": 1.0,
                                                       "csd/teacher_minus_student": 9.0}}]  # no placebo: not read
    note = eff.csd_note_use(steps)
    assert "40 coached tokens (88% with a placebo row)" in note
    assert "placebo note is +0.050 a token (gate 0.55;" in note and "-0.300 a token against the student" in note
    assert note.startswith("the coach's notes steer the agent:")           # gate 0.55: not within 0.05 of 1/2
    near = [{"kind": "train", "metrics": {"csd/tokens": 10.0, "csd/placebo_token_share": 1.0, "csd/delta_mean": 0.01,
                                          "csd/gate_mean": 0.51, "csd/teacher_minus_student": -0.2}}]
    assert eff.csd_note_use(near).startswith("the coach's notes barely steer the agent:")
    assert eff.csd_note_use(near).endswith("(agent_csd)")                  # no split by kind logged
    assert eff.csd_note_use(steps[-2:]) is None and eff.csd_note_use(None) is None
    # by kind, token-weighted over steps: unmet_followed (20*0.2 + 5*0.0)/25 = +0.160, negative -0.100 over 10 tokens
    steps[1]["metrics"].update({"csd/placebo_tokens/unmet_followed": 20.0, "csd/placebo_delta_mean/unmet_followed": 0.2,
                                "csd/placebo_tokens/negative": 10.0, "csd/placebo_delta_mean/negative": -0.1})
    steps[2]["metrics"].update({"csd/placebo_tokens/unmet_followed": 5.0, "csd/placebo_delta_mean/unmet_followed": 0.0})
    # the verdict reads the kinds: (|25 * 0.16| + |10 * -0.1|) / 35 = 0.143 >= 0.04
    assert eff.csd_note_use(steps).endswith(
        "(agent_csd); real − placebo by the note's kind (tokens): unmet_followed +0.160 (25), negative -0.100 (10); "
        "|real − placebo| weighted over the kinds 0.143 a token")
    # kinds that cancel in the overall mean still steer; kinds near 0 barely do, whatever the gate says
    near[0]["metrics"].update({"csd/placebo_tokens/negative": 6.0, "csd/placebo_delta_mean/negative": -0.1,
                               "csd/placebo_tokens/ready_followed": 4.0, "csd/placebo_delta_mean/ready_followed": 0.175})
    assert eff.csd_note_use(near).startswith("the coach's notes steer the agent:")        # (0.6 + 0.7) / 10 = 0.13
    steps[1]["metrics"].update({"csd/placebo_delta_mean/unmet_followed": 0.01, "csd/placebo_delta_mean/negative": 0.0})
    steps[2]["metrics"]["csd/placebo_delta_mean/unmet_followed"] = -0.01
    assert eff.csd_note_use(steps).startswith("the coach's notes barely steer the agent:")  # gate 0.55, kinds 0.15 / 35 = 0.004


def _cell(score):
    return {"score": score, "status": "ok" if score is not None else "invalid"}


def test_rank_spread():
    summ = {"overall": {"mean_rank": {"a": 1.25, "b": 1.75}},
            "cells": {"a": {"u": {"g1": _cell(1.0), "g2": _cell(0.5), "g3": _cell(0.0)}},
                      "b": {"u": {"g1": _cell(0.0), "g2": _cell(0.5), "g3": _cell(None)}}}}
    e = eff.rank_spread(summ)
    # columns (g3 invalid, left out): g1 ranks a1 b2, g2 tie 1.5/1.5 -> resampled spreads 1, .5, 0
    assert e["value"] == 0.5 and e["passed"] and e["n"] == 2 and e["ci"] == [0.0, 1.0]
    tie = eff.rank_spread({"overall": {"mean_rank": {"a": 2.0, "b": 2.0, "c": 2.0}}})
    assert tie["value"] == 0.0 and not tie["passed"] and tie["ci"] is None
    assert eff.rank_spread({"overall": {"mean_rank": {"a": 1.0}}})["missing_reason"]


# ----------------------------------------------------------------------------- together
def test_compute_effects_all_missing_are_shown_with_the_exact_shape():
    out = eff.compute_effects(eff.EffectInputs())
    assert list(out) == list(eff.PHASE_OF)
    for name, e in out.items():
        assert KEYS <= set(e) and e["value"] is None and e["ci"] is None and e["passed"] is False
        assert e["missing_reason"] and e["phase"] == eff.PHASE_OF[name] and isinstance(e["target"], str)
    json.dumps(out, allow_nan=False)


def test_compute_effects_flags_identical_checkpoints_and_splits_gyms():
    x = eff.EffectInputs(sim_rl_rollouts=SIM_RL, sim_records=RECORDS, agent_rollouts=AGENT_ROLLOUTS,
                         train_gyms=["travel"], identical={"sim_rl": "sft", "agent_csd": "agent_grpo"})
    out = eff.compute_effects(x)
    for name in ("sim_rl_reward_gain", "sim_eval_vs_sft", "sim_eval_vs_sft_fi", "csd_vs_grpo"):
        assert out[name]["passed"] is False and out[name]["identical_to"] and out[name]["value"] is not None, name
    assert out["sim_rl_format_failure_end"]["passed"] and "identical_to" not in out["sim_rl_format_failure_end"]
    assert out["grpo_vs_warm_start_train"]["gyms"] == ["travel"]
    assert out["grpo_vs_warm_start_heldout"]["gyms"] == ["search"]
    assert "identical_to" not in out["grpo_vs_warm_start_train"]


def test_load_inputs_detects_identical_weights(tmp_path):
    for name, data in (("sft", b"same"), ("sim_rl", b"same"), ("agent_grpo", b"g"), ("agent_csd", b"c")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(data)
        (tmp_path / name / "config.json").write_text(name)            # not weights: ignored
    x, sha = eff.load_inputs(midtrain=tmp_path / "none.json", sft=tmp_path / "none.json", sim_rl_dir=tmp_path / "x",
                             sim_eval_dir=tmp_path / "x", agent_eval_dir=tmp_path / "x",
                             csd_metrics=tmp_path / "x.jsonl",
                             checkpoints={p: tmp_path / p for p in ("sft", "sim_rl", "agent_grpo", "agent_csd",
                                                                    "agent_sft")},
                             sims={"trained": "mimesis", "sft": "sft", "base": "base"}, agents={}, train_gyms=None)
    assert x.identical == {"sim_rl": "sft"} and sha["agent_sft"] is None and sha["sim_rl"] == sha["sft"]
    assert x.midtrain is None and x.sim_rl_rollouts is None and x.sim_records is None


def test_sim_rl_gain_carries_the_sft_copy_diagnosis_when_it_fails():
    fail = [_roll(s, 0.3) for s in (1, 2, 3, 4, 5, 6)]
    out = eff.compute_effects(eff.EffectInputs(sim_rl_rollouts=fail, sft={"copy_induction_acc": 0.0,
                                                                         "copy_induction_chance": 1 / 3996}))
    e = out["sim_rl_reward_gain"]
    assert not e["passed"] and e["sft_copy_induction_acc"] == 0.0
    assert "copy accuracy is 0.00" in e["diagnosis"] and "chance 0.0003" in e["diagnosis"]
    assert "cannot repeat" in e["diagnosis"]
    copies = eff.compute_effects(eff.EffectInputs(sim_rl_rollouts=fail, sft={"copy_induction_acc": 0.98}))
    assert "can copy from its prompt" in copies["sim_rl_reward_gain"]["diagnosis"]   # the probe passes: not the cause
    from mimesis_lab.evals.report import effects_markdown
    assert "copy accuracy is 0.00" in effects_markdown(out)
    ok = eff.compute_effects(eff.EffectInputs(sim_rl_rollouts=SIM_RL, sft={"copy_induction_acc": 0.9}))
    assert ok["sim_rl_reward_gain"]["passed"] and "diagnosis" not in ok["sim_rl_reward_gain"]
    assert "diagnosis" not in eff.compute_effects(eff.EffectInputs(sim_rl_rollouts=fail))["sim_rl_reward_gain"]


def test_agent_effects_say_how_much_the_format_grammar_steered_the_training_user():
    # two steps: 10 + 6 user replies, the grammar overrode the model in 7 + 5 of them and closed 3 + 1 blocks
    steps = [{"kind": "train", "step": 1, "metrics": {"user/guided_requests": 10.0, "user/guided_replies": 7.0,
                                                       "user/guided_forced_close": 3.0}},
             {"kind": "train", "step": 2, "metrics": {"user/guided_requests": 6.0, "user/guided_replies": 5.0,
                                                       "user/guided_forced_close": 1.0}}]
    note = eff.user_guidance(steps)
    assert "12 of 16 replies (75%)" in note and "closed 4 think blocks" in note
    assert eff.user_guidance([{"kind": "train", "metrics": {"reward/mean": 0.1}}]) is None   # a free user
    assert eff.user_guidance(None) is None
    out = eff.compute_effects(eff.EffectInputs(agent_rollouts=AGENT_ROLLOUTS, train_gyms=["travel"], grpo_steps=steps))
    for name in ("grpo_vs_warm_start_train", "grpo_vs_warm_start_heldout", "csd_vs_grpo"):
        assert note in out[name]["diagnosis"], name
    assert "diagnosis" not in out["user_matters"]
    free = eff.compute_effects(eff.EffectInputs(agent_rollouts=AGENT_ROLLOUTS, train_gyms=["travel"]))
    assert "grammar" not in free["grpo_vs_warm_start_train"]["diagnosis"]     # only the per-gym breakdown
