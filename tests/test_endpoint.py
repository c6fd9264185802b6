"""The one retry loop of every endpoint client (:meth:`mimesis_lab.endpoint.ChatEndpoint.call`) and the
gyms' user side on it (:class:`mimesis_lab.rollout.user_side.EndpointUser`), against a real fault-injecting
OpenAI-compatible server on 127.0.0.1 (:mod:`tests.fake_openai`): retries, transient vs final failures,
the API key header, the timeout."""
from __future__ import annotations

import json
import time

import pytest

import mimesis_lab.endpoint as endpoint_mod
from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.endpoint import ChatEndpoint, json_answer
from mimesis_lab.envs.gyms.base import UserReply
from mimesis_lab.rollout.backends import SamplingParams
from mimesis_lab.rollout.user_side import EndpointUser
from mimesis_lab.thoughttrace import SYSTEM_HEADER

from .fake_openai import FakeOpenAI, answer, drop, raw, refuse, slow, status

KEY_ENV = "MIMESIS_TEST_ENDPOINT_KEY"


def chat_for(server: FakeOpenAI, max_retries: int = 2, timeout_s: float = 5.0) -> ChatEndpoint:
    return ChatEndpoint(OpenAIEndpoint(base_url=server.base_url, model="m", api_key_env=KEY_ENV,
                                       timeout_s=timeout_s, max_retries=max_retries))


def body() -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


# ----------------------------------------------------------------------------- the shared loop
def test_transient_failures_are_retried_and_the_recovery_is_counted():
    # 500, then 429, then an answer: 3 attempts, 2 of them failed and were recovered.
    with FakeOpenAI([status(500), status(429, "slow down"), answer("hello")]) as server:
        res = chat_for(server).call(body())
    assert res.ok and res.value == "hello"
    assert (res.attempts, res.recovered_retries) == (3, 2)
    assert [(e.kind, e.status, e.transient) for e in res.errors] == [("http", 500, True), ("http", 429, True)]
    assert len(server.requests) == 3 and server.requests[0]["path"] == "/v1/chat/completions"


def test_transient_failure_after_the_retries_is_marked_transient():
    with FakeOpenAI([status(503, "overloaded")]) as server:
        res = chat_for(server, max_retries=2).call(body())
    f = res.failure
    assert not res.ok and res.value is None and res.recovered_retries == 0
    assert (f.reason, f.transient, f.attempts) == ("http", True, 3)
    assert f.detail == "failed after 3 attempts: HTTP 503: overloaded"
    assert len(server.requests) == 3


@pytest.mark.parametrize("fault, reason", [(status(400, "bad request"), "http"), (status(404), "http"),
                                           (refuse("no"), "refusal")])
def test_final_failures_are_not_retried(fault, reason):
    # the same request would get the same 4xx / refusal: one attempt, final
    with FakeOpenAI([fault]) as server:
        res = chat_for(server, max_retries=3).call(body())
    assert (res.failure.reason, res.failure.transient, res.attempts) == (reason, False, 1)
    assert len(server.requests) == 1


def test_invalid_answers_are_retried_then_final_and_counted():
    # strict JSON wanted: "not json" twice -> 2 invalid answers, final (retrying will not fix the model)
    def validate(obj):
        if obj != {"ok": True}:
            raise ValueError(f"unexpected {obj!r}")
        return obj

    with FakeOpenAI([answer("not json"), answer('{"ok": false}'), answer('{"ok": true}')]) as server:
        res = chat_for(server, max_retries=1).call(body(), json_answer(validate))
        assert (res.failure.reason, res.failure.transient, res.count("invalid")) == ("invalid", False, 2)
        assert "answer is not valid JSON" in res.errors[0].detail and res.errors[1].detail.startswith("schema:")
        res = chat_for(server, max_retries=1).call(body(), json_answer(validate))
    assert res.ok and res.value == {"ok": True} and res.recovered_retries == 0


@pytest.mark.parametrize("fault, kind, needle", [
    (raw("<html>not json</html>"), "malformed", "response body is not JSON"),
    (raw(json.dumps({"choices": []})), "malformed", "no choices[0].message"),
    (drop(), "transport", "request failed"),
])
def test_broken_answers_and_transport_errors(fault, kind, needle):
    with FakeOpenAI([fault]) as server:
        res = chat_for(server, max_retries=1).call(body())
    assert res.failure.reason == kind and needle in res.failure.detail and len(server.requests) == 2
    assert res.failure.transient is (kind == "transport")


def test_connection_refused_is_transient():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    chat = ChatEndpoint(OpenAIEndpoint(base_url=f"http://127.0.0.1:{port}/v1", timeout_s=2.0, max_retries=1))
    res = chat.call(body())
    assert (res.failure.reason, res.failure.transient, res.attempts) == ("transport", True, 2)
    assert "request failed: ConnectError" in res.failure.detail


def test_timeout_is_honoured_and_transient():
    # the server answers after 1.5 s; the client gives up after 0.2 s, twice (1 retry)
    with FakeOpenAI([slow(1.5)]) as server:
        t0 = time.perf_counter()
        res = chat_for(server, max_retries=1, timeout_s=0.2).call(body())
        elapsed = time.perf_counter() - t0
    assert (res.failure.reason, res.failure.transient, res.attempts) == ("timeout", True, 2)
    assert "timed out after 0.2s" in res.failure.detail
    assert elapsed < 1.4                                  # 2 x 0.2 s (+ slack), not 2 x 1.5 s


def test_a_deadline_stops_the_retries():
    """A server that never answers in time: 3 attempts x 5 s would be 15 s; the deadline 1 s from now cuts
    the first attempt's timeout to what is left and starts no retry (reason `deadline`, transient)."""
    with FakeOpenAI([slow(10.0)]) as server:
        t0 = time.monotonic()
        res = chat_for(server, max_retries=2, timeout_s=5.0).call(body(), deadline=t0 + 1.0)
        wall = time.monotonic() - t0
        assert len(server.requests) == 1
        late = chat_for(server).call(body(), deadline=time.monotonic() - 1)      # already past: no request
        assert len(server.requests) == 1
    assert wall < 3.0 and not res.ok
    assert (res.failure.reason, res.failure.transient, res.attempts) == ("deadline", True, 1)
    assert [e.kind for e in res.errors] == ["timeout", "deadline"]
    cut = float(res.errors[0].detail.split("timed out after ")[1].split("s:")[0])
    assert 0 < cut <= 1.0                                           # not the configured 5 s
    assert (late.failure.reason, late.attempts) == ("deadline", 0)


def test_api_key_header_is_sent_only_when_the_variable_is_set(monkeypatch):
    with FakeOpenAI([answer("x")]) as server:
        monkeypatch.setenv(KEY_ENV, "sk-test")
        assert chat_for(server).call(body()).ok
        monkeypatch.delenv(KEY_ENV)
        assert chat_for(server).call(body()).ok
    assert server.requests[0]["headers"]["authorization"] == "Bearer sk-test"
    assert "authorization" not in server.requests[1]["headers"]


def test_backoff_schedules(monkeypatch):
    # linear: k * 0.5 before retry k; exponential: 0.5 * 2 ** (k - 1)
    waits: list[float] = []
    monkeypatch.setattr(endpoint_mod.time, "sleep", waits.append)
    ep = OpenAIEndpoint(base_url="http://127.0.0.1:9/v1", max_retries=3)
    lin = ChatEndpoint(ep, backoff_s=0.5)
    exp = ChatEndpoint(ep, backoff_s=0.5, backoff="exponential")
    assert [lin.wait_s(k) for k in (1, 2, 3)] == [0.5, 1.0, 1.5]
    assert [exp.wait_s(k) for k in (1, 2, 3)] == [0.5, 1.0, 2.0]
    with FakeOpenAI([status(500)]) as server:
        ChatEndpoint(ep.model_copy(update={"base_url": server.base_url}), backoff_s=0.5,
                     backoff="exponential").call(body())
    assert waits == [0.5, 1.0, 2.0]


# ----------------------------------------------------------------------------- EndpointUser

VIEW = [{"role": "system", "content": "You are a customer."}, {"role": "user", "content": "How can I help?"}]


def user_for(server: FakeOpenAI, **kw) -> EndpointUser:
    kw.setdefault("backoff_s", 0.0)
    return EndpointUser(server.base_url, "sim", sampling=SamplingParams(max_new_tokens=16, temperature=0.5, seed=3),
                        **kw)


def test_endpoint_user_sends_its_api_key_and_sampling(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-user")
    with FakeOpenAI([answer("<think>I want a refund</think>My order is late.")]) as server:
        with user_for(server, api_key_env=KEY_ENV) as user:
            reply = user.respond(VIEW)
        with user_for(server) as anonymous:             # no api_key_env: no header even though one is set
            anonymous.respond(VIEW)
    assert reply == UserReply("My order is late.")     # the reasoning never reaches the agent
    first = server.requests[0]
    assert first["headers"]["authorization"] == "Bearer sk-user"
    assert "authorization" not in server.requests[1]["headers"]
    # the gym's instructions reach the simulator in its ThoughtTrace training layout; the view is not mutated
    sent = [{"role": "system", "content": SYSTEM_HEADER + "\nTask: You are a customer."}, VIEW[1]]
    assert first["body"] == {"model": "sim", "max_tokens": 16, "temperature": 0.5, "top_p": 1.0, "seed": 3,
                             "messages": sent}
    assert VIEW[0]["content"] == "You are a customer."


def test_endpoint_user_layout_off_sends_the_gym_prompt_as_is_and_keeps_a_laid_out_prompt():
    laid_out = [{"role": "system", "content": SYSTEM_HEADER + "\nTask: You are a customer."}, VIEW[1]]
    with FakeOpenAI([answer("a"), answer("b")]) as server:
        with user_for(server, thoughttrace_layout=False) as raw:
            raw.respond(VIEW)
        with user_for(server) as user:
            user.respond(laid_out)                     # already in the layout: not wrapped twice
    assert server.requests[0]["body"]["messages"] == VIEW
    assert server.requests[1]["body"]["messages"] == laid_out


def test_endpoint_user_retries_transient_failures_up_to_max_retries():
    with FakeOpenAI([status(502), drop(), answer("fine")]) as server:
        user = user_for(server, max_retries=2)
        assert user.respond(VIEW) == UserReply("fine")
    assert (user.calls, user.errors, user.recovered_retries, len(server.requests)) == (1, 0, 2, 3)
    with FakeOpenAI([status(502)]) as server:
        user = user_for(server, max_retries=1)
        reply = user.respond(VIEW)
    assert reply.text is None and reply.transient and len(server.requests) == 2
    assert reply.error == "user endpoint error: failed after 2 attempts: HTTP 502: {\"error\": \"boom\"}"
    assert user.errors == 1


def test_endpoint_user_timeout_is_honoured_and_named():
    with FakeOpenAI([slow(1.5)]) as server:
        t0 = time.perf_counter()
        reply = user_for(server, timeout_s=0.2, max_retries=0).respond(VIEW)
        elapsed = time.perf_counter() - t0
    assert reply.text is None and reply.transient and len(server.requests) == 1
    assert reply.error.startswith("user endpoint timeout:")     # Gym.ask_user reads "timeout" from it
    assert elapsed < 1.2


def test_endpoint_user_never_retries_an_accepted_answer():
    # a 200 without content: the shim has already stored this turn's reasoning, a retry would misalign it
    with FakeOpenAI([answer(None), answer("late")]) as server:
        reply = user_for(server, max_retries=3).respond(VIEW)
    assert reply.text is None and not reply.transient and len(server.requests) == 1
    assert "content is not a string" in reply.error


def test_endpoint_user_from_params_takes_key_retries_and_timeout_from_the_config(monkeypatch):
    from mimesis_lab.config import AgentUserParams
    from mimesis_lab.rollout.user_side import SHIM_MARGIN_S

    monkeypatch.setenv(KEY_ENV, "sk-train")
    params = SamplingParams(max_new_tokens=8)
    with FakeOpenAI([status(500), answer("ok")]) as server:
        ext = OpenAIEndpoint(base_url="http://upstream.invalid/v1", model="sim", api_key_env=KEY_ENV, max_retries=1)
        external = EndpointUser.from_params(AgentUserParams(kind="openai", openai=ext, timeout_s=30.0),
                                            server.base_url, "sim", "ep1", params)
        assert external.respond(VIEW) == UserReply("ok")
        local = EndpointUser.from_params(AgentUserParams(timeout_s=30.0), server.base_url, "local", "ep2", params)
    assert external.base_url == f"{server.base_url}/ep/ep1/v1" and external.timeout_s == 30.0 + SHIM_MARGIN_S
    assert [r["headers"].get("authorization") for r in server.requests] == ["Bearer sk-train"] * 2  # 1 retry
    assert local.chat.endpoint.max_retries == 0 and "Authorization" not in local.chat.headers
