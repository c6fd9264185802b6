"""The privileged shim (SPEC §3.3.1) over real loopback HTTP: think stripping, turn-aligned
per-episode buffers, isolation, upstream failures, bounded memory, the EndpointUser user side,
the tiny-model OpenAI server, and a concurrent load test (``-m slow``)."""
from __future__ import annotations

import gc
import json
import os
import re
import statistics
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from mimesis_lab.config import ModelParams
from mimesis_lab.envs.gyms.base import UserReply, UserSide
from mimesis_lab.models import build_tiny_model
from mimesis_lab.rollout.backends import SamplingParams
from mimesis_lab.rollout.serve import ModelServer
from mimesis_lab.rollout.shim import PrivilegedShim, split_reasoning
from mimesis_lab.rollout.user_side import EndpointUser, episode_base_url

# ----------------------------------------------------------------------------- fake upstream

_TAG = re.compile(r"(EP|T|MODE)=(\S+)")


class _FakeHandler(BaseHTTPRequestHandler):
    """Scripted simulator: the last message ``EP=<id> T=<t> [MODE=<m>]`` decides the reply."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def _send(self, status: int, raw: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        try:
            self.wfile.write(raw)
        except OSError:               # the shim gave up (timeout tests)
            self.close_connection = True

    def do_GET(self):
        self._send(200, b'{"object": "list", "data": [{"id": "fake", "object": "model"}]}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            srv.requests += 1
        tags = dict(_TAG.findall(body["messages"][-1]["content"]))
        ep, t, mode = tags.get("EP", "?"), tags.get("T", "?"), tags.get("MODE", "ok")
        if mode == "error500":
            return self._send(500, b'{"error": {"message": "boom"}}')
        if mode == "badjson":
            return self._send(200, b"this is not json")
        if mode.startswith("sleep"):
            time.sleep(float(mode[5:]))
        msg = {"role": "assistant", "content": {
            "ok": f"<think>secret {ep} turn {t}</think>reply {ep} turn {t}",
            "noreason": f"reply {ep} turn {t}",
            "onlythink": f"<think>secret {ep} turn {t}</think>",
            "rc": f"reply {ep} turn {t}"}.get(mode, f"<think>secret {ep} turn {t}</think>reply {ep} turn {t}")}
        if mode == "rc":
            msg["reasoning_content"] = f"secret {ep} turn {t}"
        choice = {"index": 0, "message": msg, "finish_reason": "stop",
                  "logprobs": {"content": [{"token": "<think>", "logprob": -0.1}]}}
        out = {"id": "x", "object": "chat.completion", "model": "fake", "choices": [choice],
               "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}
        self._send(200, json.dumps(out).encode())


class _FakeServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512          # listen() backlog: set before the constructor binds


class FakeUpstream:
    """A ThreadingHTTPServer on 127.0.0.1 answering scripted ``<think>…</think>…`` replies."""

    def __init__(self, port: int = 0):
        self.httpd = _FakeServer(("127.0.0.1", port), _FakeHandler)
        self.httpd.lock, self.httpd.requests = threading.Lock(), 0
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @property
    def requests(self) -> int:
        return self.httpd.requests

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def chat(client: httpx.Client, base: str, text: str) -> httpx.Response:
    return client.post(f"{base}/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": text}]})


@pytest.fixture(scope="module")
def fake():
    up = FakeUpstream().start()
    yield up
    up.stop()


@pytest.fixture
def shim(fake):
    s = PrivilegedShim(fake.url).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=30, trust_env=False) as c:
        yield c


# ----------------------------------------------------------------------------- shim, exact checks


def test_split_reasoning_cases():
    assert split_reasoning("<think>r</think>u") == ("r", "u", True)
    assert split_reasoning("plain") == ("", "plain", True)
    assert split_reasoning("<think>r</think>") == ("r", "", False)
    assert split_reasoning("<think>r unclosed") == ("r unclosed", "", False)
    assert split_reasoning("r</think>u") == ("r", "u", True)         # template opened <think>
    # malformed: nothing that precedes a </think> or lies inside a think block is published
    assert split_reasoning("<think>a</think>b<think>c</think>d") == ("a\nb\nc", "d", False)
    assert split_reasoning("secret plan</think>hello</think>more") == ("secret plan\nhello", "more", False)
    assert split_reasoning("reasoning</think>utterance</think>") == ("reasoning\nutterance", "", False)
    assert split_reasoning("hi <think>secret unclosed") == ("secret unclosed", "hi", False)
    assert split_reasoning("pre <think>s1</think> mid </think> post <think> tail") == \
        ("pre\ns1\nmid\ntail", "post", False)


def test_strips_think_and_stores_reasoning_in_turn_order(shim, client):
    base = shim.episode_url("ep-a")
    assert base == f"{shim.url}/ep/ep-a/v1" and shim.bound_host == "127.0.0.1"
    for t in range(3):
        r = chat(client, base, f"EP=a T={t}")
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["message"]["content"] == f"reply a turn {t}"
        assert "logprobs" not in choice                      # token logprobs would spell the reasoning
        assert "secret" not in r.text and "<think>" not in r.text
    got = client.get(f"{shim.url}/ep/ep-a/privileged", headers=shim.auth_headers).json()
    assert got == {"episode": "ep-a", "reasoning": [f"secret a turn {t}" for t in range(3)], "turns": 3,
                   "finished": False}
    assert shim.privileged("ep-a") == got["reasoning"]
    assert shim.stats()["turns"] == 3


def test_reply_without_reasoning_keeps_alignment(shim, client):
    base = shim.episode_url("e1")
    for text in ("EP=e1 T=0", "EP=e1 T=1 MODE=noreason", "EP=e1 T=2 MODE=rc", "EP=e1 T=3 MODE=onlythink"):
        assert chat(client, base, text).status_code == 200
    r = chat(client, base, "EP=e1 T=4 MODE=onlythink")
    assert r.json()["choices"][0]["message"]["content"] == ""     # only reasoning: the caller decides
    assert "reasoning_content" not in chat(client, base, "EP=e1 T=5 MODE=rc").text
    assert shim.privileged("e1") == ["secret e1 turn 0", "", "secret e1 turn 2", "secret e1 turn 3",
                                     "secret e1 turn 4", "secret e1 turn 5"]
    assert shim.stats()["format_failures"] == 2


def test_episode_isolation_interleaved(shim, client):
    a, b = "alpha-7f3", "bravo-91c"
    for t in range(3):
        for ep in (a, b):
            assert chat(client, shim.episode_url(ep), f"EP={ep} T={t}").json()["choices"][0]["message"][
                "content"] == f"reply {ep} turn {t}"
    for ep, other in ((a, b), (b, a)):
        reasoning = client.get(f"{shim.url}/ep/{ep}/privileged", headers=shim.auth_headers).json()["reasoning"]
        assert reasoning == [f"secret {ep} turn {t}" for t in range(3)]
        assert not any(other in r for r in reasoning)
    health = json.dumps(client.get(f"{shim.url}/health").json())
    assert a not in health and b not in health                    # stats name no episode


def test_upstream_error_is_502_and_buffer_unchanged(fake, client):
    shim = PrivilegedShim(fake.url, timeout_s=0.5).start()
    try:
        base = shim.episode_url("e")
        assert chat(client, base, "EP=e T=0").status_code == 200
        for mode in ("error500", "badjson", "sleep1.5"):
            r = chat(client, base, f"EP=e T=1 MODE={mode}")
            assert r.status_code == 502, (mode, r.text)
            assert r.json()["error"]["code"] == 502
            assert shim.privileged("e") == ["secret e turn 0"]            # the turn did not happen
        assert "timeout" in r.json()["error"]["message"]
        assert chat(client, base, "EP=e T=1").status_code == 200
        assert shim.privileged("e") == ["secret e turn 0", "secret e turn 1"]
        assert shim.stats()["upstream_errors"] == 3
    finally:
        shim.stop()
    dead = PrivilegedShim("http://127.0.0.1:9/v1", timeout_s=2).start()      # nothing listens on port 9
    try:
        r = chat(client, dead.episode_url("z"), "EP=z T=0")
        assert r.status_code == 502 and "transport" in r.json()["error"]["message"]
        assert dead.privileged("z") == []
    finally:
        dead.stop()


def test_bad_requests(shim, client):
    root = shim.url
    for bad in ("a%2Fb", "x" * 129, "", "a b"):
        r = client.post(f"{root}/ep/{bad}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code in (400, 404), bad
        assert "error" in r.json()
    assert client.get(f"{root}/ep/nobody/privileged", headers=shim.auth_headers).status_code == 404
    assert client.get(f"{root}/nothing").status_code == 404
    r = client.post(f"{root}/ep/ok/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]
    assert client.post(f"{root}/ep/ok/v1/chat/completions", json={"model": "m"}).status_code == 400
    assert client.post(f"{root}/ep/ok/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "EP=ok T=0"}], "stream": True}).status_code == 400
    with pytest.raises(ValueError):
        shim.privileged("../etc")
    assert client.get(f"{root}/ep/ok/v1/models").json()["data"][0]["id"] == "fake"


def test_eviction_bounds_memory(fake, client):
    shim = PrivilegedShim(fake.url, max_episodes=3, max_turns=2).start()
    try:
        for i in range(10):
            assert chat(client, shim.episode_url(f"ep{i}"), f"EP=ep{i} T=0").status_code == 200
            assert shim.stats()["live_episodes"] <= 3
        st = shim.stats()
        assert st["live_episodes"] == 3 and st["evictions"] == 7
        auth = shim.auth_headers
        assert client.get(f"{shim.url}/ep/ep0/privileged", headers=auth).status_code == 410   # evicted, not "unknown"
        assert chat(client, shim.episode_url("ep0"), "EP=ep0 T=1").status_code == 410   # no silent restart
        # finished episodes go first: ep7 is the LRU, but ep8 is finished
        assert client.post(f"{shim.url}/ep/ep8/finish", headers=auth).status_code == 200
        assert chat(client, shim.episode_url("ep8"), "EP=ep8 T=1").status_code == 409
        assert client.get(f"{shim.url}/ep/ep8/privileged", headers=auth).json()["finished"] is True
        assert chat(client, shim.episode_url("new"), "EP=new T=0").status_code == 200
        assert shim.privileged("ep7") == ["secret ep7 turn 0"]
        with pytest.raises(KeyError):
            shim.privileged("ep8")
        # turn cap, then DELETE returns the final buffer and frees the slot
        assert chat(client, shim.episode_url("new"), "EP=new T=1").status_code == 200
        assert chat(client, shim.episode_url("new"), "EP=new T=2").status_code == 409
        r = client.delete(f"{shim.url}/ep/new", headers=auth)
        assert r.json()["reasoning"] == ["secret new turn 0", "secret new turn 1"]
        assert shim.stats()["live_episodes"] == 2
    finally:
        shim.stop()


def test_busy_episodes_are_not_evicted(fake, client):
    shim = PrivilegedShim(fake.url, max_episodes=1).start()
    try:
        t = threading.Thread(target=chat, args=(client, shim.episode_url("slow"), "EP=slow T=0 MODE=sleep0.8"))
        t.start()
        time.sleep(0.3)
        r = chat(client, shim.episode_url("other"), "EP=other T=0")
        assert r.status_code == 503 and shim.stats()["rejected_busy"] == 1
        t.join()
        assert shim.privileged("slow") == ["secret slow turn 0"]
    finally:
        shim.stop()


def test_privileged_routes_need_the_token_and_the_run_namespace(shim, client):
    """Another local client that knows (or guesses) an episode id can neither read, finish nor
    delete its buffer without the shim's token, nor post turns into it without the run nonce."""
    base = shim.episode_url("s0g0r0")                     # a training-style, guessable id
    assert chat(client, base, "EP=s0g0r0 T=0").status_code == 200
    ep_root = f"{shim.url}/ep/s0g0r0"
    for method, url in (("GET", f"{ep_root}/privileged"), ("POST", f"{ep_root}/finish"), ("DELETE", ep_root)):
        assert client.request(method, url).status_code == 401, (method, url)
        assert client.request(method, url, headers={"Authorization": "Bearer guessed"}).status_code == 403
        assert client.request(method, url, headers={"Authorization": f"Basic {shim.token}"}).status_code == 401
    assert client.get(f"{shim.url}/ep/nobody/privileged").status_code == 401      # no existence oracle
    assert shim.stats()["unauthorized"] == 10
    assert shim.privileged("s0g0r0") == ["secret s0g0r0 turn 0"]                  # nothing was finished or deleted
    # chat without the run nonce, or with a guessed one, reaches no episode
    for root in (shim.root, f"{shim.root}/run/{'A' * len(shim.nonce)}"):
        assert chat(client, f"{root}/ep/s0g0r0/v1", "EP=s0g0r0 T=1").status_code == 404
        assert client.get(f"{root}/ep/s0g0r0/privileged", headers=shim.auth_headers).status_code == 404
    assert shim.privileged("s0g0r0") == ["secret s0g0r0 turn 0"]                  # no turn was injected
    # the holder of the token reads, finishes and deletes
    r = client.get(f"{ep_root}/privileged", headers=shim.auth_headers)
    assert r.status_code == 200 and r.json()["reasoning"] == ["secret s0g0r0 turn 0"]
    assert client.post(f"{ep_root}/finish", headers=shim.auth_headers).status_code == 200
    assert client.delete(ep_root, headers=shim.auth_headers).json()["deleted"] is True
    # every run draws its own token and namespace
    other = PrivilegedShim(shim.upstream)
    assert other.token != shim.token and other.nonce != shim.nonce and len(shim.token) >= 32


def test_shim_token_is_not_forwarded_upstream():
    """The chat route forwards the client's upstream key, never the shim token."""
    from tests.fake_openai import FakeOpenAI, answer

    with FakeOpenAI([answer("<think>s</think>hi")]) as up:
        shim = PrivilegedShim(up.base_url).start()
        try:
            with httpx.Client(timeout=10, trust_env=False) as c:
                for auth in ("Bearer sk-upstream", f"Bearer {shim.token}"):
                    r = c.post(f"{shim.episode_url('e')}/chat/completions", headers={"Authorization": auth},
                               json={"messages": [{"role": "user", "content": "hi"}]})
                    assert r.json()["choices"][0]["message"]["content"] == "hi"
        finally:
            shim.stop()
    assert [q["headers"].get("authorization") for q in up.requests] == ["Bearer sk-upstream", None]


def test_format_retries_resample_a_malformed_reply_before_it_becomes_the_turn():
    """format_retries=2: unclosed think, then two think blocks, then well-formed -> the third sample is the turn
    (its reasoning stored once, seeds 7, 8, 9); with retries spent the last malformed sample is kept and counted."""
    from tests.fake_openai import FakeOpenAI, answer

    script = [answer("<think>i want it cheap"), answer("<think>a</think>x<think>b</think>y"),
              answer("<think>under $90</think>cheap please"),
              answer("<think>unclosed"), answer("<think>still unclosed"), answer("<think>never closed")]
    with FakeOpenAI(script) as up:
        shim = PrivilegedShim(up.base_url, format_retries=2).start()
        try:
            with httpx.Client(timeout=10, trust_env=False) as c:
                r = c.post(f"{shim.episode_url('e')}/chat/completions",
                           json={"messages": [{"role": "user", "content": "budget?"}], "seed": 7})
                assert r.json()["choices"][0]["message"]["content"] == "cheap please"
                assert shim.privileged("e") == ["under $90"]
                assert shim.stats()["format_resamples"] == 2 and shim.stats()["format_recovered"] == 1
                assert shim.stats()["format_failures"] == 0
                r = c.post(f"{shim.episode_url('e')}/chat/completions",
                           json={"messages": [{"role": "user", "content": "area?"}], "seed": 7})
                assert r.json()["choices"][0]["message"]["content"] == ""
        finally:
            shim.stop()
    assert [q["body"].get("seed") for q in up.requests] == [7, 8, 9, 7, 8, 9]
    st = shim.stats()
    assert st["format_resamples"] == 4 and st["format_recovered"] == 1 and st["format_failures"] == 1
    assert st["turns"] == 2 and len(shim.privileged("e")) == 2
    with pytest.raises(ValueError, match="format_retries"):
        PrivilegedShim(up.base_url, format_retries=-1)


# ----------------------------------------------------------------------------- tiny model server + EndpointUser

CFG = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256)


@pytest.fixture(scope="module")
def model_server():
    from mimesis_lab.tokenizer import train_tokenizer

    tok = train_tokenizer(["hello world, how can I help you with your order today?",
                           "<think>I want a refund</think>I want a refund for my shipping."] * 20,
                          vocab_size=300, min_frequency=1)
    model = build_tiny_model(CFG, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    srv = ModelServer(model, tok, model_name="tiny").start()
    yield srv
    srv.stop()


def test_model_server_api(model_server, client):
    url = model_server.url
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert client.get(f"{url}/models").json()["data"][0]["id"] == "tiny"
    assert client.get(f"{model_server.root}/health").json()["status"] == "ok"
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6, "temperature": 0,
            "stop_token_ids": [], "logprobs": True}
    a, b = client.post(f"{url}/chat/completions", json=body).json(), client.post(f"{url}/chat/completions", json=body).json()
    assert a["object"] == "chat.completion" and a["choices"][0]["message"]["role"] == "assistant"
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]      # greedy
    assert a["choices"][0]["finish_reason"] == "length" and a["usage"]["completion_tokens"] == 6
    assert len(a["choices"][0]["logprobs"]["content"]) == 6
    assert client.post(f"{url}/chat/completions", content=b"nope").status_code == 400
    assert client.post(f"{url}/chat/completions", json={"max_tokens": 3}).status_code == 400
    assert client.post(f"{url}/chat/completions", json=body | {"temperature": -1}).status_code == 400
    r = client.post(f"{url}/completions", json={"prompt": [1, 5, 7], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_endpoint_user_round_trip_through_shim(model_server, client):
    shim = PrivilegedShim(model_server.url).start()
    try:
        params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=[])
        user = EndpointUser(shim.url, "tiny", episode="run1:ep-0", sampling=params, timeout_s=30,
                            privileged_token=shim.token)
        assert isinstance(user, UserSide) and user.base_url == f"{shim.url}/ep/run1:ep-0/v1"
        assert episode_base_url(user.base_url, "run1:ep-0") == user.base_url
        view = [{"role": "system", "content": "You are a customer."}, {"role": "user", "content": "How can I help?"}]
        replies = [user.respond(view[: 2 + i]) for i in range(2)]
        direct = client.post(f"{model_server.url}/chat/completions",
                             json={"messages": view, "max_tokens": 8, "temperature": 0, "stop_token_ids": []}).json()
        reasoning, utterance, _ = split_reasoning(direct["choices"][0]["message"]["content"])
        for rep in replies:
            assert isinstance(rep, UserReply)
            if rep.text is None:                        # a random model may emit only reasoning
                assert utterance == "" and rep.error
            else:
                assert rep.text == utterance and "<think>" not in rep.text
        assert user.privileged() == [reasoning, reasoning]          # one entry per turn, "" included
        with pytest.raises(httpx.HTTPStatusError, match="401"):     # the gym's user client has no token
            EndpointUser(shim.url, "tiny", episode="run1:ep-0").privileged()
        user.finish()
        user.close()
        # failures are replies: an upstream timeout says "timeout"
        slow = PrivilegedShim(FakeUpstream().start().url, timeout_s=0.2).start()
        try:
            u = EndpointUser(slow.url, "fake", episode="t", max_retries=0, timeout_s=10)
            rep = u.respond([{"role": "user", "content": "EP=t T=0 MODE=sleep0.6"}])
            assert rep.text is None and "timeout" in rep.error.lower()
            assert EndpointUser(slow.url, "fake", episode="t2").respond(
                [{"role": "user", "content": "EP=t2 T=0"}]) == UserReply("reply t2 turn 0")
        finally:
            slow.stop()
    finally:
        shim.stop()


# ----------------------------------------------------------------------------- load


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def run_load(base_of, episodes: int, turns: int, workers: int, client: httpx.Client, check_url=None,
             finish=None, tag: str = "L", check_headers=None) -> tuple[list[float], float, list[str]]:
    """``episodes`` episodes of ``turns`` turns on ``workers`` threads; returns (latencies, wall, failures).
    ``check_url(ep)`` is read back with ``check_headers`` (the shim token)."""
    lat: list[float] = []
    fails: list[str] = []
    lock = threading.Lock()

    def episode(i: int) -> None:
        ep = f"{tag}{i}-{os.urandom(3).hex()}"
        mine = []
        for t in range(turns):
            t0 = time.perf_counter()
            r = chat(client, base_of(ep), f"EP={ep} T={t}")
            mine.append(time.perf_counter() - t0)
            if r.status_code != 200 or r.json()["choices"][0]["message"]["content"] != f"reply {ep} turn {t}":
                fails.append(f"{ep} t{t}: {r.status_code} {r.text[:120]}")
        if check_url is not None:
            got = client.get(check_url(ep), headers=check_headers).json().get("reasoning")
            if got != [f"secret {ep} turn {t}" for t in range(turns)]:
                fails.append(f"{ep} privileged: {got}")
        if finish is not None:
            finish(ep)
        with lock:
            lat.extend(mine)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(episode, range(episodes)))
    return lat, time.perf_counter() - t0, fails


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] if len(xs) > 1 else xs[0]


@pytest.mark.slow
@pytest.mark.long
def test_load_concurrent_episodes():
    workers, episodes, turns, max_episodes = 64, 256, 4, 64
    up = FakeUpstream().start()
    shim = PrivilegedShim(up.url, max_episodes=max_episodes).start()
    try:
        with httpx.Client(timeout=30, trust_env=False,
                          limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers)) as c:
            lat, wall, fails = run_load(shim.episode_url, episodes, turns, workers, c,
                                        check_url=lambda ep: f"{shim.url}/ep/{ep}/privileged",
                                        check_headers=shim.auth_headers,
                                        finish=lambda ep: c.post(f"{shim.url}/ep/{ep}/finish",
                                                                 headers=shim.auth_headers))
            st = shim.stats()
            n = episodes * turns
            print(f"\n[shim load] {episodes} episodes x {turns} turns, {workers} concurrent: {n} chat requests in "
                  f"{wall:.2f}s = {n / wall:.0f} req/s; latency p50 {pct(lat, 50) * 1e3:.1f} ms, "
                  f"p95 {pct(lat, 95) * 1e3:.1f} ms; live {st['live_episodes']}, evictions {st['evictions']}")
            assert fails == [], fails[:5]
            assert wall < 30
            assert len(lat) == n and st["requests"] == n and st["turns"] == n and up.requests == n
            assert st["upstream_errors"] == 0 and st["rejected_busy"] == 0 and st["rolled_back"] == 0
            assert st["live_episodes"] <= max_episodes and st["evictions"] >= episodes - max_episodes

            # memory: repeated rounds of finished+deleted episodes leave no growth
            def round_(tag):
                for ep in list(shim._episodes):
                    shim.delete(ep)
                run_load(shim.episode_url, 64, turns, workers, c, tag=tag,
                         finish=lambda ep: c.delete(f"{shim.url}/ep/{ep}", headers=shim.auth_headers))

            tracemalloc.start()
            round_("w")
            gc.collect()
            base_py, base_rss = tracemalloc.get_traced_memory()[0], _rss_bytes()
            for k in range(3):
                round_(f"m{k}")
            gc.collect()
            grow_py, grow_rss = tracemalloc.get_traced_memory()[0] - base_py, _rss_bytes() - base_rss
            tracemalloc.stop()
            print(f"[shim load] after 3x64 more episodes (deleted): traced Python memory {grow_py / 1024:+.0f} KiB, "
                  f"RSS {grow_rss / 2**20:+.1f} MiB; live {shim.stats()['live_episodes']}")
            assert shim.stats()["live_episodes"] == 0
            assert grow_py < 2 * 2**20 and grow_rss < 64 * 2**20
    finally:
        shim.stop()
        up.stop()


def test_leak_check_sees_every_withheld_span():
    """A malformed reply's withheld text is stored span by span, and the job's leak check finds any
    one of them in an agent input (not only a whole stored reasoning string)."""
    from types import SimpleNamespace

    from mimesis_lab.rollout.agent_env import privacy_leaks

    reasoning, utterance, ok = split_reasoning("my budget is 80 euros per night</think>cheap please</think>ok")
    assert (utterance, ok) == ("ok", False)

    class Tok:   # the agent-visible stream is the decoded ids; here ids are the text itself
        def decode(self, ids, skip_special_tokens=False):
            return ids

    leaked = SimpleNamespace(traj_id="e1", ids="user: cheap please and my budget is 80 euros per night")
    clean = SimpleNamespace(traj_id="e1", ids="user: ok")
    assert privacy_leaks(Tok(), [leaked], {"e1": [reasoning]}) == 1
    assert privacy_leaks(Tok(), [clean], {"e1": [reasoning]}) == 0
    # a span the user also said aloud is public; one it did not say is still a leak
    said = SimpleNamespace(traj_id="e1", ids="user: my budget is 80 euros per night, ok?")
    assert privacy_leaks(Tok(), [said], {"e1": [reasoning]}, {"e1": ["my budget is 80 euros per night, ok?"]}) == 0
    assert privacy_leaks(Tok(), [leaked], {"e1": [reasoning]}, {"e1": ["cheap please"]}) == 1
    assert privacy_leaks(Tok(), [said], {"e1": [reasoning]}, {"e2": ["my budget is 80 euros per night, ok?"]}) == 1


def test_leak_check_searches_only_what_the_environment_fed_the_agent():
    """TurtleGym's surface story is in the agent's prompt and in the user's task: a user whose reasoning repeats
    it reveals nothing. A span the agent wrote itself (two degenerate models looping on the same words) reached
    no agent input; the same span in an observation did. The error names the trajectory and the span."""
    from types import SimpleNamespace

    from mimesis_lab.rollout.agent_env import leak_message, leaked_spans, privacy_leaks

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return ids

    def traj(prompt, *turns):   # turns: (agent text, observation text)
        return SimpleNamespace(traj_id="e1", prompt_ids=prompt,
                               turns=[SimpleNamespace(token_ids=a, env_ids=o) for a, o in turns])

    surface = "jack flew to prague with a big empty suitcase"
    loop = "need a big empty need a big empty need a big empty"
    secret = "he went to buy a suitcase full of beer for his friends"
    # the user's reasoning repeats the prompt, and the user's reply repeats it too: public
    copied = traj(f"surface: {surface}", ("[action] why?", f"host: {surface}"))
    assert privacy_leaks(Tok(), [copied], {"e1": [surface]}) == 0
    # the agent writes the loop the user also thought: not an agent input
    looped = traj("surface: a man", (f"[action] {loop}", "host: no."))
    assert privacy_leaks(Tok(), [looped], {"e1": [loop]}) == 0
    # the same loop arriving in an observation is a leak
    fed = traj("surface: a man", ("[action] why?", f"host: no. {loop}"))
    assert privacy_leaks(Tok(), [fed], {"e1": [loop]}) == 1
    leaks = leaked_spans(Tok(), [traj(f"surface: {surface}", ("[action] why?", f"host: no. {secret}"))],
                         {"e1": [f"{surface}\n{secret}"]})
    assert leaks == [("e1", secret)]
    assert leak_message(leaks) == f"simulator reasoning found in 1 agent input(s); first: e1: {secret!r}"


class _SeedKeyed(BaseHTTPRequestHandler):
    """Upstream whose reply is a function of the request's seed (``server.replies``; a missing seed is 502),
    recording (seed, X-Request-Group) per request."""

    def log_message(self, *a):
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seed = body.get("seed")
        with self.server.lock:
            self.server.seen.append((seed, self.headers.get("X-Request-Group")))
        content = self.server.replies.get(seed)
        data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
                          if content is not None else {"error": "boom"}).encode()
        self.send_response(200 if content is not None else 500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_format_resample_batch_keeps_the_answer_and_counters_of_one_at_a_time(batch):
    """Seeds 7, 8 malformed, 9 well-formed, 10 well-formed, 11 missing (an upstream failure): whatever the
    batch, the turn is seed 9's, 2 resamples, 1 recovered; samples drawn past it are speculative and a
    failure past the kept sample is ignored. All seeds malformed: the last one is kept. A failure before a
    well-formed sample is a 502, as one at a time."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _SeedKeyed)
    srv.lock, srv.seen = threading.Lock(), []
    srv.replies = {7: "<think>x", 8: "<think>a</think>b<think>c</think>d", 9: "<think>cheap</think>under 90",
                   10: "<think>other</think>no"}
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    shim = PrivilegedShim(f"http://127.0.0.1:{srv.server_address[1]}/v1", format_retries=4,
                          format_resample_batch=batch).start()
    try:
        with httpx.Client(timeout=10, trust_env=False) as c:
            def turn(ep, seed):
                return c.post(f"{shim.episode_url(ep)}/chat/completions",
                              json={"messages": [{"role": "user", "content": "budget?"}], "seed": seed})

            r = turn("a", 7)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "under 90"
            assert shim.privileged("a") == ["cheap"]
            st = shim.stats()
            assert (st["format_resamples"], st["format_recovered"], st["format_failures"]) == (2, 1, 0)
            # one wave of min(4, batch) resamples holds seed 9 (k = 2): the ones after it were not needed
            assert st["format_speculative"] == (min(4, batch) - 2 if batch > 1 else 0), st
            groups = {g for s, g in srv.seen[1:]}
            assert (groups == {None}) == (batch == 1)
            # every seed malformed: retries spent, the last sample (seed 5 + 4) kept and counted
            srv.replies.update({k: "<think>unclosed" for k in range(100, 105)})
            r = turn("b", 100)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == ""
            st2 = shim.stats()
            assert (st2["format_resamples"] - st["format_resamples"], st2["format_failures"]) == (4, 1)
            # a failure at seed 201 (before the well-formed 202) ends the turn: 502, nothing stored
            srv.replies.update({200: "<think>x", 202: "<think>ok</think>fine"})
            turns = shim.stats()["turns"]
            assert turn("c", 200).status_code == 502
            assert shim.stats()["turns"] == turns
    finally:
        shim.stop()
        srv.shutdown()
    with pytest.raises(ValueError, match="format_resample_batch"):
        PrivilegedShim("http://127.0.0.1:9/v1", format_resample_batch=0)
