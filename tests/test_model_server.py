"""The in-process simulator server (mimesis_lab/rollout/serve.py) over real loopback sockets:
micro-batched generation (a request's tokens do not depend on which requests shared its batch:
greedy and seeded sampling, batched == alone), per-request sampling settings, and the hardened
HTTP layer shared with the shim (malformed JSON of any depth is 400, a bounded wait for the body,
a cap on concurrent connections, the shim's upstream deadline)."""
from __future__ import annotations

import json
from urllib.parse import urlsplit
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mimesis_lab.config import ModelParams
from mimesis_lab.models import build_tiny_model
from mimesis_lab.rollout.backends import SamplingParams, TransformersBackend
from mimesis_lab.rollout.serve import MAX_JSON_DEPTH, BackgroundHTTPServer, ModelServer
from mimesis_lab.rollout.shim import PrivilegedShim, _Deadline
from mimesis_lab.rollout.user_side import SHIM_MARGIN_S, EndpointUser
from tests.test_shim import FakeUpstream

CFG = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256)

PROMPTS = ["hello", "I want a refund for my shipping.", "how can I help you with your order today?",
           "refund", "hello world, how can I help", "my order", "shipping today please, I want it", "hi"]


@pytest.fixture(scope="module")
def tok():
    from mimesis_lab.tokenizer import train_tokenizer

    return train_tokenizer(["hello world, how can I help you with your order today?",
                            "<think>I want a refund</think>I want a refund for my shipping."] * 20,
                           vocab_size=300, min_frequency=1)


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(CFG, len(tok), tok.pad_token_id, tok.eos_token_id).eval()


@pytest.fixture(scope="module")
def server(model, tok):
    # a wide window: the concurrent requests of a test land in one batch even on a loaded machine
    srv = ModelServer(model, tok, model_name="tiny", max_batch=8, batch_wait_ms=100,
                      max_batch_wait_ms=1000).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60, trust_env=False) as c:
        yield c


def _body(text: str, **kw) -> dict:
    return {"messages": [{"role": "system", "content": "You are a customer."}, {"role": "user", "content": text}],
            "stop_token_ids": [], "logprobs": True, "return_tokens_as_token_ids": True, **kw}


def _concurrently(url: str, bodies: list[dict]) -> list[dict]:
    """POST every body at once (a barrier releases them together), one client per request."""
    gate = threading.Barrier(len(bodies))

    def one(b):
        with httpx.Client(timeout=60, trust_env=False) as c:
            gate.wait()
            r = c.post(f"{url}/chat/completions", json=b)
            assert r.status_code == 200, r.text
            return r.json()

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def _tokens(resp: dict) -> list[str]:
    return [e["token"] for e in resp["choices"][0]["logprobs"]["content"]]


def _logprobs(resp: dict) -> list[float]:
    return [e["logprob"] for e in resp["choices"][0]["logprobs"]["content"]]


# ----------------------------------------------------------------------------- batching


def _batched_vs_alone(server, client, bodies):
    alone = []
    for b in bodies:          # one at a time: every request is a batch of its own
        before = server.stats()["batches"]
        alone.append(client.post(f"{server.url}/chat/completions", json=b).json())
        assert server.stats()["batches"] == before + 1
    before = server.stats()
    together = _concurrently(server.url, bodies)
    after = server.stats()
    calls = after["batches"] - before["batches"]
    assert calls < len(bodies) and after["max_batch_seen"] >= 2, (calls, after)    # they were batched
    for a, t in zip(alone, together):
        assert _tokens(a) == _tokens(t)
        assert _logprobs(a) == pytest.approx(_logprobs(t), abs=1e-4)
        assert a["choices"][0]["message"]["content"] == t["choices"][0]["message"]["content"]
    return alone


def test_greedy_batched_equals_alone(server, client):
    bodies = [_body(p, max_tokens=8, temperature=0) for p in PROMPTS]
    _batched_vs_alone(server, client, bodies)


def test_seeded_sampling_batched_equals_alone(server, client):
    """Each request samples with its own seed (not seed + its row in the batch): equal seeds on
    different prompts, different seeds on one prompt, and duplicates all give the alone result."""
    seeds = [7, 7, 7, 8, 9, 10, 7, 123456789]
    prompts = PROMPTS[:3] + [PROMPTS[0]] * 3 + [PROMPTS[0], PROMPTS[4]]
    bodies = [_body(p, max_tokens=10, temperature=1.0, top_p=0.95, seed=s) for p, s in zip(prompts, seeds)]
    alone = _batched_vs_alone(server, client, bodies)
    assert _tokens(alone[3]) != _tokens(alone[4])        # the seed matters (seed 8 vs 9, same prompt)
    assert _tokens(alone[0]) == _tokens(alone[6])        # same prompt, same seed: same sample


def test_backend_row_seeds_do_not_depend_on_the_batch(model, tok):
    """``seeds=`` gives every row its own generator: a row's sample is the same alone, in any batch
    order and for any batch size."""
    b = TransformersBackend(model, tok, batch_size=8)
    ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in PROMPTS]
    ids = [list(x["input_ids"] if hasattr(x, "keys") else x) for x in ids]
    p = SamplingParams(max_new_tokens=8, temperature=1.0, seed=0, stop_token_ids=[])
    seeds = [11, 12, 11, 40, 5, 6, 7, 8]
    together = b.generate_ids(ids, p, seeds=seeds)
    alone = [b.generate_ids([x], p, seeds=[s])[0] for x, s in zip(ids, seeds)]
    rev = b.generate_ids(ids[::-1], p, seeds=seeds[::-1])[::-1]
    small = TransformersBackend(model, tok, batch_size=3).generate_ids(ids, p, seeds=seeds)
    for t, a, r, s in zip(together, alone, rev, small):
        assert t.token_ids == a.token_ids == r.token_ids == s.token_ids
    # without seeds= the old contract holds: seed + index within the call
    assert [g.token_ids for g in b.generate_ids(ids[:2], p)] == \
        [g.token_ids for g in b.generate_ids(ids[:2], p, seeds=[0, 1])]
    with pytest.raises(ValueError, match="seeds"):
        b.generate_ids(ids, p, seeds=[1])


def test_mixed_settings_are_honoured_per_request(server, client):
    """Requests with different sampling settings may arrive together: each gets its own settings."""
    bodies = [_body(PROMPTS[i], max_tokens=3 + i, temperature=0 if i % 2 else 0.8, seed=i) for i in range(6)]
    out = _concurrently(server.url, bodies)
    for i, r in enumerate(out):
        assert r["usage"]["completion_tokens"] == 3 + i and r["choices"][0]["finish_reason"] == "length"
    for i in (1, 3, 5):       # the greedy ones equal their alone result
        alone = client.post(f"{server.url}/chat/completions", json=bodies[i]).json()
        assert _tokens(alone) == _tokens(out[i])
    r = client.post(f"{server.url}/completions", json={"prompt": [1, 5, 7], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_max_batch_one_is_serial(model, tok):
    srv = ModelServer(model, tok, max_batch=1, batch_wait_ms=50).start()
    try:
        out = _concurrently(srv.url, [_body(p, max_tokens=4, temperature=0) for p in PROMPTS[:4]])
        st = srv.stats()
        assert len(out) == 4 and st["batches"] == 4 and st["max_batch_seen"] == 1
    finally:
        srv.stop()
    with pytest.raises(ValueError):
        ModelServer(model, tok, max_batch=0)


def test_prefix_cache_reuses_an_episodes_earlier_turn(model, tok, server, client):
    """With ``prefix_cache_tokens`` an episode's next user turn (its prompt extends the last one)
    reuses the cached KV, and answers what the server without the cache answers."""
    srv = ModelServer(model, tok, max_batch=4, prefix_cache_tokens=100_000).start()
    try:
        history = [{"role": "system", "content": "You are a customer. " * 6}, {"role": "user", "content": "hello"}]
        for turn in range(3):
            body = {"messages": history, "max_tokens": 6, "temperature": 0, "stop_token_ids": []}
            cached = client.post(f"{srv.url}/chat/completions", json=body).json()
            plain = client.post(f"{server.url}/chat/completions", json=body).json()
            reply = cached["choices"][0]["message"]["content"]
            assert reply == plain["choices"][0]["message"]["content"]
            history += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"and {turn}?"}]
        assert srv.backend.prefix_cache.hits >= 2
    finally:
        srv.stop()


def test_stop_answers_queued_requests(model, tok):
    srv = ModelServer(model, tok, max_batch=4, batch_wait_ms=0).start()
    url = srv.url
    with ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(httpx.post, f"{url}/chat/completions", json=_body(p, max_tokens=16, temperature=0),
                            timeout=60, trust_env=False) for p in PROMPTS[:4]]
        time.sleep(0.2)
        srv.stop()
        codes = []
        for f in futs:
            try:
                codes.append(f.result(timeout=60).status_code)
            except httpx.HTTPError:
                codes.append("closed")
    assert all(c in (200, 503, "closed") for c in codes), codes   # every waiter got an answer, none hung


def _round_through_shim(srv, tok, name: str, n: int = 6, **rollout_kw):
    """One round of ``n`` guessing episodes whose gyms ask their user (EndpointUser → a shim on ``srv``):
    ``(trajectories, server stats before, after, shim stats)``."""
    from mimesis_lab.rollout.agent_rollout import run_agent_episodes
    from tests.test_agent_rollout import ROW, Guess, Scripted

    shim = PrivilegedShim(srv.url, timeout_s=60).start()
    users = [EndpointUser(shim.url, "tiny", episode=f"{name}-{i}", timeout_s=60 + SHIM_MARGIN_S, max_retries=0,
                          sampling=SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)) for i in range(n)]
    try:
        before = srv.stats()
        out = run_agent_episodes([ROW] * n, [Guess({}, user=u) for u in users], [("g", f"{name}-{i}") for i in range(n)],
                                 Scripted(tok, ["[action] is it red?"] * n + ["[answer] blue"] * n), tok,
                                 SamplingParams(max_new_tokens=8), users=users, **rollout_kw)
        return out, before, srv.stats(), shim.stats()
    finally:
        for u in users:
            u.close()
        shim.stop()


def test_a_rounds_user_turns_reach_the_server_together(server, tok):
    """End to end: ``run_agent_episodes`` steps a round's gyms concurrently, each gym asks its user
    (EndpointUser → the shim, one episode URL each → this server), and the server generates the
    round's user turns in fewer calls than turns — the shim does not serialise episodes."""
    n = 6
    out, before, after, shim_stats = _round_through_shim(server, tok, "round", n)
    assert after["requests"] - before["requests"] == n and shim_stats["requests"] == n
    assert after["batches"] - before["batches"] < n, (before, after)
    assert all(t.invalid in (None, "user_error") for t in out)    # a random model may reply only reasoning


def _post_later(url: str, body: dict, delay_s: float) -> dict:
    time.sleep(delay_s)
    with httpx.Client(timeout=60, trust_env=False) as c:
        r = c.post(f"{url}/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()


def test_an_announced_round_is_one_generation_call_however_its_requests_spread(model, tok):
    """No arrival window at all (0/0 ms): four requests 40 ms apart are four calls; announced as a
    round, the same four are one call, with the same tokens (greedy)."""
    srv = ModelServer(model, tok, max_batch=8, batch_wait_ms=0, max_batch_wait_ms=0, round_wait_ms=5000).start()
    try:
        bodies = [_body(p, max_tokens=6, temperature=0) for p in PROMPTS[:4]]

        def run(announce: bool):
            before = srv.stats()
            with ThreadPoolExecutor(4) as pool:
                if announce:
                    with srv.round(4) as r:
                        out = list(pool.map(lambda kb: r.wrap(lambda: _post_later(srv.url, kb[1], 0.04 * kb[0]))(),
                                            enumerate(bodies)))
                else:
                    out = list(pool.map(lambda kb: _post_later(srv.url, kb[1], 0.04 * kb[0]), enumerate(bodies)))
            after = srv.stats()
            return out, {k: after[k] - before[k] for k in ("batches", "round_batches", "round_wait_capped")}

        spread, st = run(False)
        assert st["batches"] == 4 and st["round_batches"] == 0, st
        together, st = run(True)
        assert st == {"batches": 1, "round_batches": 1, "round_wait_capped": 0}, st
        assert [_tokens(a) for a in spread] == [_tokens(b) for b in together]
    finally:
        srv.stop()


def test_a_round_step_without_a_request_leaves_the_count(model, tok):
    """Of a round of 3, one step returns without asking: the other two are generated together as soon
    as both are queued, not after the round's cap."""
    srv = ModelServer(model, tok, max_batch=8, batch_wait_ms=0, max_batch_wait_ms=0, round_wait_ms=20_000).start()
    try:
        body = _body("hello", max_tokens=4, temperature=0)
        steps = [lambda: _post_later(srv.url, body, 0.0), lambda: _post_later(srv.url, body, 0.15),
                 lambda: time.sleep(0.05)]
        before, t0 = srv.stats(), time.monotonic()
        with ThreadPoolExecutor(3) as pool, srv.round(3) as r:
            list(pool.map(lambda f: r.wrap(f)(), steps))
        wall, after = time.monotonic() - t0, srv.stats()
        assert after["batches"] - before["batches"] == 1 and after["round_wait_capped"] == before["round_wait_capped"]
        assert wall < 10, wall
        assert srv._round_running == 0
    finally:
        srv.stop()


def test_a_round_step_that_never_asks_costs_at_most_the_rounds_cap(model, tok):
    """A step still running without a request holds the batch for ``round_wait_ms`` at most (counted in
    ``round_wait_capped``); leaving the round releases its steps."""
    srv = ModelServer(model, tok, max_batch=8, batch_wait_ms=0, max_batch_wait_ms=0, round_wait_ms=300).start()
    try:
        release = threading.Event()
        with ThreadPoolExecutor(2) as pool, srv.round(2) as r:
            stuck = pool.submit(r.wrap(lambda: release.wait(30)))
            t0 = time.monotonic()
            r.wrap(lambda: _post_later(srv.url, _body("hi", max_tokens=2, temperature=0), 0.0))()
            waited = time.monotonic() - t0
            release.set()
            stuck.result()
        assert 0.25 <= waited < 10, waited
        assert srv.stats()["round_wait_capped"] == 1 and srv._round_running == 0
        with srv.round(5):
            pass
        assert srv._round_running == 0
    finally:
        srv.stop()


def test_agent_rollout_announces_its_rounds(model, tok):
    """``run_agent_episodes(user_round=server.round)``: a round's user turns are one call even with no
    arrival window (the path of the agent jobs and agent_eval)."""
    srv = ModelServer(model, tok, max_batch=8, batch_wait_ms=0, max_batch_wait_ms=0, round_wait_ms=5000).start()
    try:
        n = 6
        _, before, after, _ = _round_through_shim(srv, tok, "ann", n, user_round=srv.round)
        assert after["requests"] - before["requests"] == n
        assert after["batches"] - before["batches"] == 1, (before, after)
        assert srv._round_running == 0
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- hardening: JSON


def _raw(port: int, payload: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                n = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), 0)
                if len(rest) >= n:
                    break
        return out


def _post(port: int, path: str, body: bytes, extra: str = "") -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n").encode()
    return _raw(port, head + body)


DEEP = [b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000, b'{"messages": ' + b"[" * 100_000,
        b'{"messages": [{"role": "user", "content": ' + b"[" * (MAX_JSON_DEPTH + 5) + b"]" * (MAX_JSON_DEPTH + 5)
        + b"}]}"]


@pytest.fixture(scope="module")
def shim_on_fake():
    up = FakeUpstream().start()
    shim = PrivilegedShim(up.url).start()
    yield shim
    shim.stop()
    up.stop()


@pytest.mark.parametrize("body", DEEP, ids=["open", "closed", "objects", "in-messages", "just-over-limit"])
def test_deep_json_is_400_never_500(server, shim_on_fake, body):
    for port, path in ((server.port, "/v1/chat/completions"), (server.port, "/v1/completions"),
                       (shim_on_fake.port, urlsplit(shim_on_fake.url).path + "/ep/deep/v1/chat/completions")):
        resp = _post(port, path, body)
        assert resp.startswith(b"HTTP/1.1 400"), (path, resp[:200])
        assert json.loads(resp.partition(b"\r\n\r\n")[2])["error"]["code"] == 400
    # a sane body still works afterwards
    assert _post(server.port, "/v1/chat/completions", json.dumps(_body("hi", max_tokens=2)).encode()).startswith(
        b"HTTP/1.1 200")


@pytest.mark.parametrize("bad", [b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": Infinity}',
                                 b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
                                 b'{"messages": [{"role": "user", "content": "x"}], "seed": 1e300}',
                                 b'{"messages": [{"role": "user", "content": "x"}], "seed": 100000000000000000000000}',
                                 b'\xff\xfe', b'{"messages": "x"'])
def test_bad_values_are_400(server, bad):
    assert _post(server.port, "/v1/chat/completions", bad).startswith(b"HTTP/1.1 400")


def test_chunked_body_is_refused_and_closed(server):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\n{}{}{\r\n0\r\n\r\n")
    assert _raw(server.port, head).startswith(b"HTTP/1.1 411")


# ----------------------------------------------------------------------------- hardening: body wait, connections


class _Echo(BackgroundHTTPServer):
    def handle(self, handler, method, path):
        if method == "GET":
            return 200, {"ok": True}
        return 200, {"got": handler.read_json()}


def test_body_wait_is_bounded_in_all_not_per_receive():
    with _Echo(body_timeout_s=0.6) as srv:
        for trickle in (False, True):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                s.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\":")
                t0, out = time.monotonic(), b""
                s.settimeout(0.2)
                while b"\r\n\r\n" not in out and time.monotonic() - t0 < 5:
                    if trickle:          # a byte every 0.2 s: each receive is quick, the body never completes
                        try:
                            s.sendall(b" ")
                        except OSError:
                            pass
                    try:
                        out += s.recv(4096)
                    except socket.timeout:
                        continue
                    except OSError:
                        break
                waited = time.monotonic() - t0
                assert out.startswith(b"HTTP/1.1 408"), out[:100]
                assert b"Connection: close" in out and 0.5 <= waited < 2.5, waited
        # a body that arrives in time is fine
        assert httpx.post(f"{srv.root}/x", json={"a": 1}, trust_env=False).json() == {"got": {"a": 1}}
    with pytest.raises(ValueError):
        _Echo(body_timeout_s=0)


def test_connections_over_the_cap_get_503():
    with _Echo(max_connections=2) as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port), timeout=5) for _ in range(2)]
        try:
            time.sleep(0.2)            # both accepted: each holds a handler thread (an idle keep-alive)
            r = httpx.post(f"{srv.root}/x", json={"a": 1}, trust_env=False, timeout=10)
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
            assert r.json()["error"]["type"] == "overloaded" and srv.refused_connections == 1
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 5      # the slots come back when the held connections close
        while True:
            r = httpx.post(f"{srv.root}/x", json={"a": 2}, trust_env=False, timeout=10)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.status_code == 200 and r.json() == {"got": {"a": 2}}
        # keep-alive requests on one connection use one slot
        with httpx.Client(trust_env=False, timeout=10) as c:
            assert all(c.get(f"{srv.root}/h").status_code == 200 for _ in range(5))


def test_shim_default_inbound_cap_covers_its_episodes():
    shim = PrivilegedShim("http://127.0.0.1:9/v1", max_episodes=4096)
    assert shim.max_connections == 4096 + 256
    assert PrivilegedShim("http://127.0.0.1:9/v1", max_episodes=64).max_connections == 1024
    assert PrivilegedShim("http://127.0.0.1:9/v1", max_inbound=8).max_connections == 8


# ----------------------------------------------------------------------------- the shim's upstream deadline


def test_deadline_phases_share_one_budget():
    d = _Deadline(1.0)
    time.sleep(0.3)
    assert 0.6 < d.get("read") < 0.75 and 0.6 < d["pool"] < 0.75 and d.get("other", "x") == "x"


def test_shim_answers_within_its_timeout_and_before_its_client():
    """The upstream deadline covers the wait for a pooled connection too: with one upstream
    connection and two slow turns at once, the second turn (0.4 s queued + 0.4 s upstream) is
    answered 502 at the shim's 0.6 s, and the user — waiting timeout_s + SHIM_MARGIN_S — gets that
    answer rather than timing out itself."""
    up = FakeUpstream().start()
    shim = PrivilegedShim(up.url, timeout_s=0.6, max_connections=1).start()
    try:
        def turn(ep):
            u = EndpointUser(shim.url, "fake", episode=ep, timeout_s=0.6 + SHIM_MARGIN_S, max_retries=0)
            t0 = time.monotonic()
            rep = u.respond([{"role": "user", "content": f"EP={ep} T=0 MODE=sleep0.4"}])
            u.close()
            return rep, time.monotonic() - t0

        with ThreadPoolExecutor(2) as pool:
            (a, ta), (b, tb) = pool.map(turn, ["d1", "d2"])
        ok, late = (a, b) if a.text else (b, a)
        t_late = tb if late is b else ta
        assert ok.text == f"reply {'d1' if ok is a else 'd2'} turn 0"
        assert late.text is None and "upstream timeout" in late.error and "502" in late.error
        assert t_late < 0.6 + 0.5 < 0.6 + SHIM_MARGIN_S, t_late
        assert shim.stats()["upstream_errors"] == 1
    finally:
        shim.stop()
        up.stop()


def test_batch_order_is_by_seed_then_prompt_never_by_arrival():
    """A gathered batch is generated in a fixed order, so a seeded run does not depend on which request's thread
    arrived first (mimesis_lab.rollout.serve.batch_order)."""
    from itertools import permutations

    from mimesis_lab.rollout.backends import SamplingParams
    from mimesis_lab.rollout.serve import _Request, batch_order

    reqs = [_Request([3, 4], SamplingParams(seed=5)), _Request([1], SamplingParams(seed=None)),
            _Request([9, 9], SamplingParams(seed=2)), _Request([1, 2], SamplingParams(seed=2)),
            _Request([7], SamplingParams(seed=-3))]
    want = [reqs[4], reqs[3], reqs[2], reqs[0], reqs[1]]          # -3; 2 ([1, 2] < [9, 9]); 5; unseeded last
    for arrival in permutations(reqs):
        assert [id(r) for r in batch_order(list(arrival))] == [id(r) for r in want]
