"""A batch of judge calls (:func:`mimesis_lab.rollout.sim_rollout.score_rollouts`) against the fault-injecting
OpenAI-compatible server on 127.0.0.1 (:mod:`tests.fake_openai`): the LLM judge's calls run concurrently under
one deadline, every injected fault is counted by its reason, retries that later succeed are summed, a dead
endpoint costs the deadline and not ``calls * attempts * timeout_s``; the rule judge stays sequential."""
from __future__ import annotations

import json
import random
import re
import threading
import time

from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.judges.behavior_judge import RuleJudge
from mimesis_lab.judges.openai_judge import OpenAIJudge
from mimesis_lab.rollout.sim_rollout import Rollout, score_rollouts

from .fake_openai import FakeOpenAI, answer, drop, raw, refuse, slow, status
from .test_behavior_task import ABCD, row, say

VERDICT = {"exhibit": 0.8, "placement": 0.5, "naturalness": 0.9, "on_task": 0.7, "announced": False,
           "rationale": "urgent throughout"}
GOOD = answer(json.dumps(VERDICT))
N = 40
# 12 of the 40 conversations (30 %) meet a fault on every attempt; 4 more fail once, then succeed
FAULTY = {"http": [0, 10, 20], "transport": [1, 11], "malformed": [2, 12], "refusal": [3, 13], "invalid": [4],
          "timeout": [5, 15]}
RECOVER = [6, 16, 26, 36]
FAULT_OF = {"http": status(500), "transport": drop(), "malformed": raw("<html>busy</html>"), "refusal": refuse(),
            "invalid": answer('{"exhibit": 2}'), "timeout": slow(6.0, GOOD)}


def conversation_of(request: dict) -> int:
    return int(re.search(r"customer #(\d+)", request["body"]["messages"][1]["content"]).group(1))


def faults(request: dict, attempt: int):
    i = conversation_of(request)
    kind = next((k for k, idx in FAULTY.items() if i in idx), None)
    if kind:
        return FAULT_OF[kind]
    return status(503, "overloaded") if i in RECOVER and attempt == 0 else GOOD


def episodes(n: int):
    from mimesis_lab.envs.base import TaskContext
    from mimesis_lab.envs.behavior_task import BehaviorEpisode

    ctx = TaskContext(kb=json.loads((ABCD / "kb.json").read_text()),
                      guidelines=json.loads((ABCD / "guidelines.json").read_text()))
    eps = []
    for i in range(n):
        ep = BehaviorEpisode(row(), ctx, random.Random(i))
        say(ep, f"I am customer #{i}, I forgot my username and I'm about to board a flight, hurry!")
        eps.append(ep)
    return eps, [Rollout(f"g{i}", f"r{i}", "usersim_behavior", ep.task_id) for i, ep in enumerate(eps)]


def judge_for(server: FakeOpenAI, *, timeout_s: float, max_retries: int, deadline_s: float) -> OpenAIJudge:
    return OpenAIJudge(OpenAIEndpoint(base_url=server.base_url, model="judge", api_key_env="", timeout_s=timeout_s,
                                      max_retries=max_retries), backoff_s=0.0, workers=8, deadline_s=deadline_s)


def test_every_injected_fault_is_counted_by_reason_and_recoveries_are_summed():
    eps, rolls = episodes(N)
    with FakeOpenAI(choose=faults) as server:
        judge = judge_for(server, timeout_s=2.0, max_retries=1, deadline_s=60)
        t0 = time.perf_counter()
        m = score_rollouts(rolls, eps, judge)
        wall = time.perf_counter() - t0
        judge.close()
    # per reason: injected == counted (a refusal is final at once; every other fault is retried once)
    counted = {k.removeprefix("judge/failures/"): int(v) for k, v in m.items() if k.startswith("judge/failures/")}
    assert counted == {k: len(v) for k, v in FAULTY.items()}
    assert m["judge/calls"] == N and m["judge/ok"] == N - 12 and m["judge/failures"] == 12
    assert m["judge/failures_transient"] == 3 + 2 + 2          # 5xx, transport and timeout ran out of retries
    assert m["judge/recovered_retries"] == len(RECOVER)         # the 503s a retry recovered leave a trace
    # the rollouts: a timeout is invalid `timeout`, any other failure `judge_failure`, never a silent 0
    invalid = {i: r.invalid for i, r in enumerate(rolls) if r.invalid}
    assert invalid == {i: "timeout" if k == "timeout" else "judge_failure" for k, idx in FAULTY.items() for i in idx}
    assert all(r.raw is not None and r.raw > 0 for r in rolls if r.invalid is None)
    assert "HTTP 500" in rolls[0].invalid_detail and "refused" in rolls[3].invalid_detail
    # requests: 2 attempts per faulty conversation but 1 per refusal, 2 per recovered one, 1 per clean one
    assert len(server.requests) == 2 * (12 - 2) + 2 + 2 * len(RECOVER) + (N - 12 - len(RECOVER))
    # concurrency: the two timed-out conversations cost 2 x 2 s each, side by side (one after the other: >= 8 s)
    assert wall < 8, wall


def test_a_dead_endpoint_finishes_within_the_deadline():
    """A server that never answers: 12 calls x 3 attempts x 60 s would be 36 minutes one after another;
    the batch ends at its 2 s deadline and every rollout is invalid `timeout`, with the reason."""
    eps, rolls = episodes(12)
    with FakeOpenAI([slow(30.0)]) as server:
        judge = judge_for(server, timeout_s=60, max_retries=2, deadline_s=2.0)
        done: dict = {}
        t = threading.Thread(target=lambda: done.update(m=score_rollouts(rolls, eps, judge)), daemon=True)
        t0 = time.perf_counter()
        t.start()
        t.join(timeout=20)
        wall = time.perf_counter() - t0
        assert "m" in done, "score_rollouts did not return within 20 s"
    m = done["m"]
    assert wall < 2.0 + 2.0 + 1.0, wall                              # deadline + grace + slack
    assert [r.invalid for r in rolls] == ["timeout"] * 12
    assert m["judge/failures"] == 12 and m["judge/ok"] == 0
    reasons = {k: v for k, v in m.items() if k.startswith("judge/failures/")}
    assert sum(reasons.values()) == 12 and set(reasons) <= {"judge/failures/timeout", "judge/failures/deadline",
                                                            "judge/failures/late"}
    assert all("timed out" in r.invalid_detail or "deadline" in r.invalid_detail for r in rolls)
    assert len(server.requests) <= 12                                 # no retry started after the deadline


def test_the_rule_judge_stays_sequential_and_deterministic():
    eps, rolls = episodes(6)
    threads = []

    class Watched(RuleJudge):
        def judge(self, req):
            threads.append(threading.get_ident())
            return super().judge(req)

    m = score_rollouts(rolls, eps, Watched())
    again_eps, again = episodes(6)
    score_rollouts(again, again_eps, RuleJudge())
    assert set(threads) == {threading.get_ident()} and len(threads) == 6     # in order, in the caller's thread
    assert [r.raw for r in rolls] == [r.raw for r in again] and all(r.invalid is None for r in rolls)
    assert m["judge/calls"] == 6 and m["judge/failures"] == 0 and m["judge/recovered_retries"] == 0
