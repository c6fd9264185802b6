"""Fault injection on the user side (issue 17): the training user — an ``EndpointUser`` behind the
privileged shim, built by ``EndpointUser.from_params`` exactly as agent RL builds it — and an
evaluation user (``EvalUserSide``), each over 40 episodes against an OpenAI-compatible server that
injects a persistent fault into 30% of the conversations. Every fault is counted under its reason
by the gym (``UserSideError``), transient faults are marked transient, and no fault becomes a reply."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from mimesis_lab.config import AgentUserParams, OpenAIEndpoint
from mimesis_lab.envs.gyms import travel
from mimesis_lab.envs.gyms.base import UserSideError
from mimesis_lab.envs.gyms.registry import gym_for_row
from mimesis_lab.rollout.backends import SamplingParams
from mimesis_lab.rollout.shim import PrivilegedShim
from mimesis_lab.rollout.user_side import EndpointUser
from tests.fake_openai import FakeOpenAI, answer, drop, slow, status

N = 40
#: episode index -> (fault, the reason the gym must count, transient?) for 12 of 40 episodes (30%)
FAULTS = {
    **{k: (status(500), "user_error", True) for k in (1, 5, 9)},
    **{k: (drop(), "user_error", True) for k in (13, 17, 21)},
    **{k: (slow(3.0), "timeout", True) for k in (25, 29)},
    **{k: (answer("As an AI language model, I cannot pretend to be a human customer."), "refusal", False)
       for k in (33, 36)},
    **{k: (answer(""), "user_error", False) for k in (38, 39)},
}


def _fault_of(request, n):
    """The episode number travels in the agent's message, so each conversation gets its own fault."""
    text = request["body"]["messages"][-1]["content"]
    k = int(text.rsplit("#", 1)[1])
    return FAULTS[k][0] if k in FAULTS else answer("I'd like something under 100 a night, near the beach.")


def _episodes(make_user):
    tasks = travel.load_tasks()
    row = travel.build_rows(tasks, "train")[0]
    counted: Counter = Counter()
    transient: Counter = Counter()
    for k in range(N):
        gym = gym_for_row(row, {"travel": tasks}, None, random.Random(k))
        gym.user = make_user(f"ep{k}", gym)
        try:
            reply = gym.ask_user(f"What matters most for your stay? #{k}")
            assert "As an AI" not in reply and reply.strip()
            counted["ok"] += 1
        except UserSideError as e:
            counted[e.reason] += 1
            transient[e.reason] += e.transient
    return counted, transient


def _expected():
    want, want_transient = Counter({"ok": N - len(FAULTS)}), Counter()
    for _, reason, trans in FAULTS.values():
        want[reason] += 1
        want_transient[reason] += trans
    return want, want_transient


@pytest.mark.timeout(300)
def test_training_user_counts_every_fault_by_reason(monkeypatch):
    monkeypatch.setenv("SIM_KEY", "secret-123")
    with FakeOpenAI(choose=_fault_of) as server:
        ucfg = AgentUserParams(kind="openai", timeout_s=1.0,
                               openai=OpenAIEndpoint(base_url=server.base_url, model="sim", api_key_env="SIM_KEY",
                                                     max_retries=1))
        shim = PrivilegedShim(ucfg.openai.base_url, timeout_s=ucfg.timeout_s).start()
        try:
            sampling = SamplingParams(max_new_tokens=32, temperature=1.0, seed=0)
            counted, transient = _episodes(
                lambda ep, gym: EndpointUser.from_params(ucfg, shim.url, "sim", ep, sampling))
        finally:
            shim.stop()
        keys = {r["headers"].get("authorization") for r in server.requests}
    want, want_transient = _expected()
    # injected: 3 http 500 + 3 dropped connections + 2 empty replies -> 8 user_error; 2 slow -> timeout;
    # 2 refusals -> refusal; the other 28 are replies
    assert counted == want, counted
    assert transient == want_transient, transient
    assert keys == {"Bearer secret-123"}           # the configured key reached the upstream on every request


@pytest.mark.timeout(300)
def test_evaluation_user_counts_every_fault_by_reason():
    from mimesis_lab.config_eval import EvalUserParams
    from mimesis_lab.evals.eval_users import EvalUserSide

    with FakeOpenAI(choose=_fault_of) as server:
        ucfg = EvalUserParams(kind="openai", timeout_s=1.0,
                              openai=OpenAIEndpoint(base_url=server.base_url, model="u", max_retries=1))
        with EvalUserSide("faulty", ucfg) as side:
            counted, transient = _episodes(lambda ep, gym: side.make(gym, ep, seed=0))
    want, want_transient = _expected()
    assert counted == want, counted
    assert transient == want_transient, transient

