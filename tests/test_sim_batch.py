"""FoldGRPO batch building, invalid accounting and per-step metrics (SPEC §2.3, §6), hand-computed."""
import math
import random

import pytest
import torch

from mimesis_lab.envs.base import TaskScore
from mimesis_lab.rl.policy import micro_chunks, minibatch_indices, pad_update_rows
from mimesis_lab.rl.sim_batch import AccountingError, build_update_rows, step_metrics
from mimesis_lab.jobs.sim_rl import TaskSampler, sample_groups, stratified_order, weighted_tasks
from mimesis_lab.train.runtime import TrainConfigError
from mimesis_lab.rollout.sim_rollout import Rollout, Segment


def seg(n_prompt=3, n_tok=2, ok=True, base=10):
    return Segment(list(range(1, n_prompt + 1)), list(range(base, base + n_tok)), [-0.5] * n_tok, "stop", ok,
                   None if ok else "missing <think> block")


def roll(rid, group="g", segs=(), raw=None, invalid=None, ds="usersim_behavior", behavior=None, **comps):
    r = Rollout(group, rid, ds, "t")
    r.segments = list(segs)
    if invalid:
        r.invalid, r.invalid_detail = invalid, "because"
    elif raw is not None:
        r.score = TaskScore(raw=raw, components=comps, labels={"behavior": behavior} if behavior else {})
    return r


def batch():
    a = roll("A", segs=[seg(), seg(base=20)], raw=1.0, behavior="B9", exhibit=1.0, announced=0.0)
    b = roll("B", segs=[seg()], raw=0.0, behavior="N", exhibit=0.0, announced=1.0, cooperativeness=0.5)
    c = roll("C", invalid="judge_failure", segs=[seg()])
    d = roll("D", invalid="generation_error")              # failed before generating anything
    return [a, b, c, d]


def test_exclude_policy_hand_computed():
    rows, stats = build_update_rows(batch(), "exclude", encode="turn")
    # unique rollouts A=1, B=0: mean 0.5, sample std sqrt(0.5) -> A = +0.7071, B = -0.7071
    s = math.sqrt(0.5)
    assert [r.rollout_id for r in rows] == ["A", "A", "B"]
    assert [r.adv[0] for r in rows] == pytest.approx([0.5 / (s + 1e-6)] * 2 + [-0.5 / (s + 1e-6)])
    assert stats["rollouts_in_update"] == 2 and stats["segments_in_update"] == 3 and stats["rows_in_update"] == 3
    # one row per rollout: the same segments and advantages, A's two turns in one prefix-tree row
    rows, stats = build_update_rows(batch(), "exclude")
    assert [r.rollout_id for r in rows] == ["A", "B"] and rows[0].adv == pytest.approx([0.5 / (s + 1e-6)] * 4)
    assert stats["segments_in_update"] == 3 and stats["rows_in_update"] == 2 and stats["tokens_in_update"] == 6


def test_segments_do_not_weigh_more():
    # A has 2 segments, B one: with per-segment statistics A would count twice (mean 2/3)
    rows, _ = build_update_rows(batch()[:2], "exclude", encode="turn")
    assert rows[0].adv[0] == pytest.approx(-rows[2].adv[0])


def test_zero_policy_reproduces_reference():
    rows, stats = build_update_rows(batch(), "zero")
    # A=1, B=0, C=0, D=0 (D has no segment but is in the group): mean 0.25, std sqrt(0.25)=0.5
    assert stats["rollouts_in_update"] == 4
    by = {r.rollout_id: r.adv[0] for r in rows}
    assert by["A"] == pytest.approx(0.75 / (0.5 + 1e-6))
    assert by["B"] == pytest.approx(-0.25 / (0.5 + 1e-6)) and by["C"] == pytest.approx(by["B"])
    assert "D" not in by


def test_format_failure_zeroes_update_reward_but_keeps_raw():
    a = roll("A", segs=[seg(), seg(ok=False)], raw=1.0)
    b = roll("B", segs=[seg()], raw=0.0)
    assert a.raw == 1.0 and a.update_reward == 0.0
    rows, stats = build_update_rows([a, b])
    assert all(set(r.adv) == {0.0} for r in rows) and stats["groups_zero_variance"] == 1
    m = step_metrics([a, b])
    assert m["reward/raw_mean"] == 0.5 and m["reward/update_mean"] == 0.0
    assert m["format_failure_rate"] == 0.5 and m["format_failure_turn_rate"] == pytest.approx(1 / 3)


def test_single_rollout_group_gets_zero():
    rows, stats = build_update_rows([roll("A", group="solo", segs=[seg()], raw=0.9)])
    assert set(rows[0].adv) == {0.0} and stats["groups_single_rollout"] == 1


def test_metrics_accounting_and_slices():
    m = step_metrics(batch())
    assert m["rollouts"] == 4 and m["rollouts_valid"] == 2 and m["invalid_total"] == 2
    assert m["invalid/judge_failure"] == 1 and m["invalid/generation_error"] == 1 and m["invalid/refusal"] == 0
    assert m["reward/behavior/B9"] == 1.0 and m["reward/behavior/N"] == 0.0
    assert m["judge/exhibit"] == 0.5 and m["announced_rate"] == 0.5 and m["neutral_cooperativeness"] == 0.5
    assert m["reward/task/usersim_behavior"] == 0.5
    assert m["response_length_mean"] == 2.0


def test_unknown_invalid_reason_is_an_error():
    with pytest.raises(AccountingError, match="unknown invalid"):
        step_metrics([roll("A", invalid="gremlins")])


def test_other_task_components_are_namespaced():
    m = step_metrics([roll("A", ds="usersim_tom", segs=[seg()], raw=0.4, f1=0.4)])
    assert m["task/usersim_tom/f1"] == 0.4 and "judge/f1" not in m


def test_pad_update_rows_shifted_grid():
    rows, _ = build_update_rows(batch()[:2], encode="turn")
    b = pad_update_rows(rows, pad_id=0)
    assert b["input_ids"].shape == (3, 5) and b["mask"].shape == (3, 4)
    # prompt of 3 tokens: response tokens at positions 3, 4 are predicted at 2, 3
    assert b["mask"][0].tolist() == [0, 0, 1, 1]
    assert b["old_logp"][0].tolist() == [0, 0, -0.5, -0.5]
    # one advantage per segment, on its response tokens only (zero on the prompt)
    assert b["adv"][0].tolist() == pytest.approx([0, 0, rows[0].adv[0], rows[0].adv[0]])
    assert all(len(set(r.adv)) == 1 and len(r.adv) == r.n_response for r in rows)


def test_minibatches_and_chunks():
    parts = minibatch_indices(7, 3, random.Random(0))
    assert sorted(i for p in parts for i in p) == list(range(7)) and [len(p) for p in parts] == [3, 2, 2]
    assert minibatch_indices(2, 5, random.Random(0)) and len(minibatch_indices(2, 5, random.Random(0))) == 2
    assert micro_chunks([5, 6, 7], 2) == [[5, 6], [7]]


def test_sample_groups_follows_weights():
    rows = {"a": [{"id": 1}], "b": [{"id": 2}], "c": [{"id": 3}]}
    got = sample_groups(rows, {"a": 3.0, "b": 1.0, "c": 0.0}, 4000, random.Random(1))
    share_a = sum(g["id"] == 1 for g in got) / len(got)
    assert abs(share_a - 0.75) < 0.03 and not any(g["id"] == 3 for g in got)
    assert sample_groups(rows, {"a": 1.0}, 5, random.Random(2)) == sample_groups(rows, {"a": 1.0}, 5, random.Random(2))


def _beh_rows():
    """The behaviour task's shape: 26 neutral rows of 82, the rest 4 to 5 rows of each of 13 behaviours."""
    rows = [{"id": f"n{i}", "behavior_ids": "[]"} for i in range(26)]
    rows += [{"id": f"b{i}", "behavior_ids": f'["B{1 + i % 13}"]'} for i in range(56)]
    return rows


def test_stratified_order_spreads_every_behaviour_evenly():
    rows = _beh_rows()
    order = stratified_order(rows, "7:usersim_behavior:epoch0")
    assert sorted(order) == list(range(len(rows)))                      # one pass: every row once
    assert order == stratified_order(rows, "7:usersim_behavior:epoch0")  # a pure function of the seed
    assert order != stratified_order(rows, "7:usersim_behavior:epoch1")
    for w in (10, 20, 40):                  # any run of w draws holds the neutral rows' share up to about a row
        for s in range(len(rows) - w + 1):
            n = sum(rows[i]["behavior_ids"] == "[]" for i in order[s:s + w])
            assert abs(n - w * 26 / 82) <= 1.5, (w, s, n)
    rows3 = [{"id": i} for i in range(5)]                                # no strata: a plain shuffle
    assert sorted(stratified_order(rows3, "x")) == list(range(5))


def test_task_sampler_stratified_windows_and_resume():
    rows = {"usersim_behavior": _beh_rows(), "other": [{"id": "o1"}, {"id": "o2"}]}
    w = {"usersim_behavior": 0.75, "other": 0.25}
    strat = TaskSampler(rows, w, 4, seed=3, row_order="stratified")
    seq = [strat.groups(s) for s in range(40)]
    assert TaskSampler(rows, w, 4, seed=3, row_order="stratified").groups(17) == seq[17]   # resumed at step 17
    assert strat.groups(5) == seq[5]                                     # asked again for an earlier step
    beh = [g["id"] for step in seq for g in step if "behavior_ids" in g]
    assert sorted(beh[:82]) == sorted(r["id"] for r in rows["usersim_behavior"])   # the first pass: each row once

    def worst_window(groups):               # the largest miss of the neutral share over 13-step windows
        out = 0.0
        for s in range(0, 40 - 13 + 1):
            b = [g for step in groups[s:s + 13] for g in step if "behavior_ids" in g]
            out = max(out, abs(sum(g["behavior_ids"] == "[]" for g in b) - len(b) * 26 / 82))
        return out
    uni = TaskSampler(rows, w, 4, seed=3, row_order="uniform")
    assert [uni.groups(s) for s in range(3)] == [sample_groups(rows, w, 4, random.Random(f"3:{s}")) for s in range(3)]
    assert worst_window(seq) <= 1.5
    assert max(worst_window([TaskSampler(rows, w, 4, seed=k, row_order="uniform").groups(s) for s in range(40)])
               for k in range(5)) > 3          # uniform draws with replacement: the share left to chance
    with pytest.raises(TrainConfigError, match="row_order"):
        TaskSampler(rows, w, 4, seed=3, row_order="sorted")


def test_weighted_tasks_keeps_weighted_tasks_with_rows():
    rows = {"b": [{"id": 1}], "a": [{"id": 2}], "empty": [], "off": [{"id": 3}]}
    assert weighted_tasks(rows, {"b": 2, "a": 0.5, "empty": 1.0, "off": 0.0, "missing": 1.0}) == (["a", "b"],
                                                                                                [0.5, 2.0])
    for sampler in (lambda: sample_groups(rows, {"off": 0.0, "empty": 3.0}, 2, random.Random(0)),
                    lambda: TaskSampler(rows, {"off": 0.0, "empty": 3.0}, 2, seed=0, row_order="stratified")):
        with pytest.raises(TrainConfigError, match="no task with a positive weight has any rows"):
            sampler()
