"""The privileged shim (SPEC §3.3.1): an OpenAI-compatible proxy that hides the simulator's reasoning.

One shim sits in front of the simulator's server (``upstream``, an OpenAI base URL such as
``http://127.0.0.1:8000/v1``). Its routes live under a per-run namespace ``{shim} =
{root}/run/{nonce}`` (:attr:`PrivilegedShim.url`; ``nonce`` is random, drawn at start) and each
agent episode talks to the simulator through its own base URL ``{shim}/ep/{episode}/v1``:

- ``POST /ep/{episode}/v1/chat/completions`` forwards the body to ``{upstream}/chat/completions``,
  splits every choice's content ``<think>reasoning</think>utterance``, stores choice 0's
  reasoning in the episode's buffer and answers the upstream response with ``content`` = the
  public utterance only. ``reasoning_content``/``reasoning`` fields (vLLM reasoning parsers)
  are moved to the buffer the same way, and token ``logprobs`` are dropped (their tokens
  would spell the reasoning). ``stream=true`` is refused (400).
- ``GET {shim}/ep/{episode}/privileged`` → ``{"episode", "reasoning": [...], "turns", "finished"}``.
- ``POST {shim}/ep/{episode}/finish`` marks the episode finished: the buffer stays readable, takes no
  more turns, and is the first to go under memory pressure. ``DELETE {shim}/ep/{episode}`` removes it
  now and answers its final buffer (a turn still in flight then is lost with it); the id may
  be reused afterwards as a fresh episode. These three are *privileged* (see Access below).
- ``GET {shim}/ep/{episode}/v1/models`` is passed through; ``GET /health`` (at the root or under
  ``{shim}``) gives :meth:`stats`.

**Turn alignment** (SPEC §5 gap: the reference appended only replies that had reasoning).
Every successful turn appends exactly one entry, ``""`` when the reply had no reasoning, so
``privileged[t]`` is the reasoning behind the simulator's t-th reply. The turns of one
episode are serialised (a per-episode lock is held across the upstream call), so entry order
is request order. An upstream failure (transport error, timeout, non-200, a response without
message content) answers HTTP 502 and appends **nothing**: that turn did not happen, and a
retry is safe. If writing the answer back to the client fails, the appended entry is rolled
back (best effort: a client that timed out may not be noticed, so keep the shim's
``timeout_s`` below its clients' timeout). A malformed reply is still a turn: the utterance is
the text with every think block removed (``public_text``) and the reasoning is the text inside
them (counted in ``format_failures``); a reply that is only reasoning answers ``content: ""``
with the reasoning stored — the caller decides what an empty user reply means. With
``format_retries=N`` a malformed reply is first resampled up to N times (the request's ``seed`` + k;
nothing is stored for a discarded sample), counted in ``format_resamples`` and, when a resample is
well-formed, ``format_recovered``: a small simulator's occasional unclosed think block then does not end
the agent's episode. With ``format_resample_batch=B`` > 1 the resamples are sent B at a time, concurrently
(seeds + k … + k + B - 1, one ``X-Request-Group`` header, so a micro-batching upstream generates them in
one call), and the first well-formed one in seed order is kept: the same answer, counters and errors as
one at a time (a failure of a resample after the kept one is ignored, as it would never have been sent),
in fewer upstream round trips; the samples drawn but not needed are counted in ``format_speculative``.

**Isolation.** A buffer is addressed only by its own id (``[A-Za-z0-9_.:-]{1,128}``, else
400); there is no route that lists ids or reads another episode; :meth:`stats` holds counts only.

**Access** (threat model). The shim binds loopback, but every process on the machine can reach
loopback: another user's job, a tool an agent runs, a second pipeline. Episode ids are guessable
(training uses ``s{step}g{group}r{k}``). Without control such a client could read any episode's
reasoning (the data the shim exists to hide), finish or delete a live episode (its turns then fail
or restart at 0), or post turns into it (the buffer no longer lines up with the agent's turns, or
the episode hits ``max_turns``), or fill the table so real episodes are evicted. So:

- the *privileged* routes (``/privileged``, ``/finish``, ``DELETE``) need ``Authorization: Bearer
  <token>``: :attr:`PrivilegedShim.token`, a random per-run secret held by whoever started the shim
  (the trainer; in-process callers use :meth:`~PrivilegedShim.privileged`, :meth:`~PrivilegedShim.finish`,
  :meth:`~PrivilegedShim.delete` and need no HTTP). No header answers 401, a wrong token 403, both
  before the episode is looked up (no existence oracle); the comparison is constant-time;
- the chat routes stay open to the gym's user client (they only ever answer public text), but only
  under the random run namespace: ``/run/{nonce}/ep/...`` with any other nonce, or ``/ep/...`` without
  one, answers 404 like any unknown route. Knowing an episode id is not enough to reach it; the
  nonce travels only inside the episode URLs the trainer hands to its user clients;
- a chat request whose ``Authorization`` is the shim token is forwarded upstream without it (the
  token never leaves the shim).

What it does not defend against: a process that can read the trainer's memory or environment (the
same user), or anyone on the path of a non-loopback ``host`` (plain HTTP).

**Bounded memory.** At most ``max_episodes`` live buffers: a new episode evicts the least
recently used *finished* episode, else the least recently used *idle* one (no request in
flight, idle for ``idle_evict_s``); if every live episode is busy the new one gets 503.
Evicted ids are remembered (bounded) so a late request or read for one answers 410 instead of
silently restarting its turn count at 0. An episode takes at most ``max_turns`` turns (409
after that), each entry keeps at most ``max_reasoning_chars`` characters (``truncated`` counts
the cut ones) and request bodies are limited by the HTTP layer (size, a bounded wait for the
body, bad or too deeply nested JSON → 400); at most ``max_inbound`` client connections are
served at once (default ``max(1024, max_episodes + 256)``: every live episode's user may hold a
keep-alive connection), more get 503.

**Timeouts.** ``timeout_s`` bounds the whole upstream call — waiting for a pooled connection,
connecting, sending and receiving share one deadline (not ``timeout_s`` per phase) — so the
shim answers 502 within about ``timeout_s``; its clients must wait longer
(:meth:`EndpointUser.from_params` waits ``timeout_s +``
:data:`~mimesis_lab.rollout.user_side.SHIM_MARGIN_S`), so that a slow turn is answered 502 with
nothing stored rather than abandoned by the client after the shim stored it.

Binds 127.0.0.1 by default: the buffer holds the simulator's private reasoning.

    python -m mimesis_lab.rollout.shim --upstream http://127.0.0.1:8000/v1 [--host 127.0.0.1] [--port 8100] \
        [--credentials shim.json]

The CLI writes ``{"url": <namespace URL>, "token": <token>}`` to ``--credentials`` (mode 0600;
without it, that JSON is the first line on stdout) for the client that reads the buffers.
"""
from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from mimesis_lab.envs.output_format import CLOSE, OPEN, parse_reply, public_text
from mimesis_lab.rollout.serve import BackgroundHTTPServer, HTTPError

__all__ = ["EPISODE_ID_RE", "InvalidEpisodeId", "PrivilegedShim", "split_reasoning", "main"]

log = logging.getLogger(__name__)
EPISODE_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_ROUTE_RE = re.compile(r"^/run/([^/]*)/ep/([^/]*)(/.*)?$")
_BLOCK_RE = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


def split_reasoning(content: str) -> tuple[str, str, bool]:
    """``(reasoning, utterance, well_formed)`` of a simulator reply (thinking optional).

    Well-formed replies are split by :func:`parse_reply`; ``reasoning</think>utterance`` with no
    opening tag (a chat template that opens ``<think>`` in the generation prompt) is split at the tag.
    A malformed reply publishes only what is safe: nothing that precedes a ``</think>`` tag and
    nothing inside a think block, closed or not — i.e. the text after the *last* ``</think>`` (or,
    with no closing tag, the text before the first ``<think>``), with any block opened there
    removed. Everything withheld is returned as the reasoning (so the buffer, and the job's leak
    check, see every withheld span) and the reply is a format failure.
    """
    body = content.strip()
    if OPEN not in body and body.count(CLOSE) == 1:   # the chat template opened <think> itself (Qwen3 style)
        return split_reasoning(OPEN + body)
    parsed = parse_reply(content, require_think=False)
    if parsed.ok:
        return parsed.reasoning, parsed.utterance, True
    if parsed.error == "empty utterance" and OPEN not in content and CLOSE not in content:
        return "", "", True                       # an empty reply: no reasoning either
    if CLOSE in content:
        cut = content.rindex(CLOSE)
        withheld, rest = content[:cut], content[cut + len(CLOSE):]
    else:
        cut = content.index(OPEN) if OPEN in content else len(content)
        withheld, rest = content[cut:], content[:cut]
    utterance = public_text(rest).replace(CLOSE, "").replace(OPEN, "").strip()
    tail = rest[len(rest.split(OPEN, 1)[0]):] if OPEN in rest else ""     # a block opened after the cut
    spans = [x.replace(OPEN, "\n").replace(CLOSE, "\n").strip() for x in (withheld, tail)]
    reasoning = "\n".join(line.strip() for x in spans for line in x.split("\n") if line.strip())
    return reasoning, utterance, False


class _Deadline(dict):
    """An httpx ``timeout`` extension whose every phase gets what is left of one deadline.

    httpcore reads a phase's timeout (``pool``, ``connect``, ``write``, ``read``) from this mapping
    when the phase starts, so the phases together take at most ``seconds`` (the read of an upstream
    that trickles its answer byte by byte is the exception: each receive gets what is left)."""

    PHASES = ("connect", "read", "write", "pool")

    def __init__(self, seconds: float):
        super().__init__(dict.fromkeys(self.PHASES, seconds))
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.001, self.deadline - time.monotonic())

    def get(self, key, default=None):
        return self.left() if key in self.PHASES else super().get(key, default)

    def __getitem__(self, key):
        return self.left() if key in self.PHASES else super().__getitem__(key)


class InvalidEpisodeId(HTTPError, ValueError):
    """An episode id outside ``[A-Za-z0-9_.:-]{1,128}`` (HTTP 400)."""

    def __init__(self, episode: Any):
        HTTPError.__init__(self, 400, f"invalid episode id {str(episode)[:40]!r} (expected [A-Za-z0-9_.:-]{{1,128}})")


@dataclass
class _Episode:
    lock: threading.Lock = field(default_factory=threading.Lock)   # serialises the episode's turns
    reasoning: list[str] = field(default_factory=list)
    inflight: int = 0
    finished: bool = False
    removed: bool = False
    last_used: float = field(default_factory=time.monotonic)


class PrivilegedShim(BackgroundHTTPServer):
    """The privileged proxy (module docstring). ``url`` is the shim root; episode base URLs are
    :meth:`episode_url`. ``privileged(episode)`` reads a buffer in-process.

    ``max_connections``: connections to the upstream (pooled); ``max_inbound``: client connections
    served at once (``None``: ``max(1024, max_episodes + 256)``; the attribute ``max_connections``
    of a started shim is this inbound cap, as for every :class:`BackgroundHTTPServer`);
    ``body_timeout_s``: see :class:`~mimesis_lab.rollout.serve.BackgroundHTTPServer`."""

    def __init__(self, upstream_base_url: str, host: str = "127.0.0.1", port: int = 0, max_episodes: int = 1024,
                 timeout_s: float = 60, max_turns: int = 512, max_reasoning_chars: int = 65536,
                 idle_evict_s: float = 0.0, max_connections: int = 256, token: str | None = None,
                 max_inbound: int | None = None, body_timeout_s: float = 30.0, format_retries: int = 0,
                 format_resample_batch: int = 1):
        super().__init__(host, port, body_timeout_s=body_timeout_s,
                         max_connections=max_inbound if max_inbound is not None else max(1024, max_episodes + 256))
        self.token = token or secrets.token_urlsafe(32)      # the privileged routes' bearer token
        self.nonce = secrets.token_urlsafe(16)               # the run namespace of every episode URL
        if max_episodes < 1 or max_turns < 1:
            raise ValueError("max_episodes and max_turns must be >= 1")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if format_retries < 0:
            raise ValueError(f"format_retries must be >= 0, got {format_retries}")
        if format_resample_batch < 1:
            raise ValueError(f"format_resample_batch must be >= 1, got {format_resample_batch}")
        self.format_retries, self.format_resample_batch = format_retries, format_resample_batch
        self._resampler: ThreadPoolExecutor | None = None     # the concurrent resamples (created on first use)
        self.upstream = upstream_base_url.rstrip("/")
        self.max_episodes, self.max_turns = max_episodes, max_turns
        self.max_reasoning_chars, self.idle_evict_s = max_reasoning_chars, idle_evict_s
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s, trust_env=False,
                                    limits=httpx.Limits(max_connections=max_connections,
                                                        max_keepalive_connections=max_connections))
        self._lock = threading.Lock()     # guards _episodes, _tombstones, _stats and every buffer list
        self._episodes: OrderedDict[str, _Episode] = OrderedDict()
        self._tombstones: OrderedDict[str, None] = OrderedDict()
        self._tombstone_cap = max(4096, 4 * max_episodes)
        self._stats = dict.fromkeys(("requests", "turns", "upstream_errors", "bad_requests", "evictions",
                                     "rejected_busy", "rejected_gone", "format_failures", "truncated",
                                     "rolled_back", "deleted", "unauthorized", "format_resamples",
                                     "format_recovered", "format_speculative"), 0)

    # -- public API
    @property
    def url(self) -> str:
        """The run namespace ``{root}/run/{nonce}``: episode base URLs are ``{url}/ep/{episode}/v1``."""
        return f"{self.root}/run/{self.nonce}"

    @property
    def auth_headers(self) -> dict[str, str]:
        """The header the privileged HTTP routes need."""
        return {"Authorization": f"Bearer {self.token}"}

    def episode_url(self, episode: str) -> str:
        """The OpenAI base URL of one episode: ``{shim}/ep/{episode}/v1``."""
        return f"{self.url}/ep/{self._check_id(episode)}/v1"

    def privileged(self, episode: str) -> list[str]:
        """The episode's reasoning entries in turn order (``KeyError`` if unknown or evicted)."""
        with self._lock:
            ep = self._episodes.get(self._check_id(episode))
            if ep is None:
                raise KeyError(episode)
            return list(ep.reasoning)

    def finish(self, episode: str) -> None:
        with self._lock:
            ep = self._episodes.get(self._check_id(episode))
            if ep is None:
                raise KeyError(episode)
            ep.finished = True

    def delete(self, episode: str) -> list[str] | None:
        with self._lock:
            ep = self._episodes.pop(self._check_id(episode), None)
            if ep is None:
                return None
            ep.removed = True
            self._stats["deleted"] += 1
        return list(ep.reasoning)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._stats, live_episodes=len(self._episodes), max_episodes=self.max_episodes)

    def stop(self) -> None:
        super().stop()
        if self._resampler is not None:
            self._resampler.shutdown(wait=True)
            self._resampler = None
        self._client.close()

    # -- internals
    @staticmethod
    def _check_id(episode: str) -> str:
        if not isinstance(episode, str) or not EPISODE_ID_RE.fullmatch(episode):
            raise InvalidEpisodeId(episode)
        return episode

    def _authorize(self, handler) -> None:
        """401 without a bearer token, 403 with a wrong one (constant-time comparison)."""
        got = handler.headers.get("Authorization") or ""
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            self._count("unauthorized")
            raise HTTPError(401, "this route needs 'Authorization: Bearer <shim token>'", "unauthorized")
        if not hmac.compare_digest(value.strip().encode(), self.token.encode()):
            self._count("unauthorized")
            raise HTTPError(403, "wrong shim token", "forbidden")

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def _evict_one(self) -> bool:
        """Evict the LRU finished episode, else the LRU idle one (caller holds ``_lock``)."""
        now = time.monotonic()
        victim = next((k for k, e in self._episodes.items() if e.finished and e.inflight == 0), None)
        if victim is None:
            victim = next((k for k, e in self._episodes.items()
                           if e.inflight == 0 and now - e.last_used >= self.idle_evict_s), None)
        if victim is None:
            return False
        self._episodes.pop(victim).removed = True
        self._tombstones[victim] = None
        while len(self._tombstones) > self._tombstone_cap:
            self._tombstones.popitem(last=False)
        self._stats["evictions"] += 1
        return True

    def _acquire(self, episode: str) -> _Episode:
        """Get or create the episode and mark a request in flight (raises 409/410/503)."""
        with self._lock:
            ep = self._episodes.get(episode)
            if ep is None:
                if episode in self._tombstones:
                    self._stats["rejected_gone"] += 1
                    raise HTTPError(410, f"episode {episode} was evicted (its buffer is gone); use a new id",
                                    "episode_gone")
                while len(self._episodes) >= self.max_episodes:
                    if not self._evict_one():
                        self._stats["rejected_busy"] += 1
                        raise HTTPError(503, f"all {self.max_episodes} live episodes are busy; retry later",
                                        "overloaded")
                ep = self._episodes[episode] = _Episode()
            elif ep.finished:
                raise HTTPError(409, f"episode {episode} is finished", "episode_finished")
            self._episodes.move_to_end(episode)
            ep.inflight += 1
            ep.last_used = time.monotonic()
            return ep

    def _release(self, ep: _Episode) -> None:
        with self._lock:
            ep.inflight -= 1
            ep.last_used = time.monotonic()

    def _forward(self, handler, body: dict, group: str | None = None) -> dict:
        """POST upstream; a 502 :class:`HTTPError` on any failure (nothing is stored then)."""
        headers = {"Content-Type": "application/json"}
        if group:
            headers["X-Request-Group"] = group
        auth = handler.headers.get("Authorization")
        if auth and not hmac.compare_digest(auth.partition(" ")[2].strip().encode(), self.token.encode()):
            headers["Authorization"] = auth          # the upstream's key; the shim token never leaves
        try:
            resp = self._client.post(f"{self.upstream}/chat/completions", json=body, headers=headers,
                                     extensions={"timeout": _Deadline(self.timeout_s)})
        except httpx.TimeoutException as e:
            raise HTTPError(502, f"upstream timeout after {self.timeout_s}s: {type(e).__name__}", "upstream_error")
        except httpx.HTTPError as e:
            raise HTTPError(502, f"upstream transport error: {type(e).__name__}: {e}", "upstream_error")
        if resp.status_code != 200:
            raise HTTPError(502, f"upstream HTTP {resp.status_code}: {resp.text[:300]}", "upstream_error")
        try:
            data = resp.json()
            choices = data["choices"]
            if not isinstance(choices, list) or not choices:
                raise ValueError("no choices")
            for c in choices:
                if not isinstance(c.get("message", {}).get("content"), str):
                    raise ValueError("a choice has no message content")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise HTTPError(502, f"malformed upstream response: {type(e).__name__}: {e}", "upstream_error")
        return data

    def _forward_well_formed(self, handler, body: dict) -> dict:
        """:meth:`_forward`, resampling up to ``format_retries`` times (seed + k, nothing stored in between)
        while choice 0 is not a well-formed ``<think>…</think>utterance``; the last answer is kept either
        way (a malformed one is then a counted format failure). ``format_resamples`` counts the resamples up
        to the kept answer, ``format_recovered`` the turns a resample made well-formed. Resamples go
        ``format_resample_batch`` at a time (module docstring); the result does not depend on it."""
        def forward(k: int, group: str | None = None) -> dict:
            return self._forward(handler, body if k == 0 else {**body, "seed": int(body.get("seed") or 0) + k}, group)

        def well_formed(data: dict) -> bool:
            return split_reasoning(data["choices"][0]["message"]["content"])[2]

        try:
            data = forward(0)
        except HTTPError:
            self._count("upstream_errors")
            raise
        if well_formed(data) or self.format_retries == 0:
            return data
        k = 1
        while k <= self.format_retries:
            wave = list(range(k, min(self.format_retries, k + self.format_resample_batch - 1) + 1))
            if len(wave) == 1:
                outcomes = [self._attempt(forward, wave[0], None)]
            else:
                group = secrets.token_hex(8)
                outcomes = list(self._resample_pool().map(lambda j: self._attempt(forward, j, group), wave))
            for i, (j, (data, err)) in enumerate(zip(wave, outcomes)):
                if err is not None:        # sent in this order one at a time, this error would have ended it
                    self._count("upstream_errors")
                    self._count("format_speculative", i)
                    raise err
                ok = well_formed(data)
                if ok or j == self.format_retries:
                    self._count("format_resamples", j)
                    self._count("format_recovered", int(ok))
                    self._count("format_speculative", len(wave) - 1 - i)
                    return data
            k = wave[-1] + 1
        raise AssertionError("unreachable")

    @staticmethod
    def _attempt(forward, k: int, group: str | None) -> tuple[dict | None, HTTPError | None]:
        try:
            return forward(k, group), None
        except HTTPError as e:
            return None, e

    def _resample_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._resampler is None:
                self._resampler = ThreadPoolExecutor(max_workers=64, thread_name_prefix="shim-resample")
            return self._resampler

    def _scrub(self, data: dict) -> str:
        """Replace every choice's content by its public utterance; return choice 0's reasoning."""
        first = ""
        for i, choice in enumerate(data["choices"]):
            msg = choice["message"]
            extra = [msg.pop(k) for k in ("reasoning_content", "reasoning") if k in msg]
            reasoning, utterance, ok = split_reasoning(msg["content"])
            reasoning = "\n".join(x.strip() for x in [*extra, reasoning] if isinstance(x, str) and x.strip())
            msg["content"] = utterance
            choice.pop("logprobs", None)
            if i == 0:
                first = reasoning
                if not ok:
                    self._count("format_failures")
        if len(first) > self.max_reasoning_chars:
            first = first[: self.max_reasoning_chars]
            self._count("truncated")
        return first

    def _chat(self, handler, episode: str) -> None:
        self._count("requests")
        body = handler.read_json()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise HTTPError(400, "request body must be a JSON object with a non-empty 'messages' list")
        if body.get("stream"):
            raise HTTPError(400, "stream=true is not supported by the privileged shim")
        ep = self._acquire(episode)
        try:
            with ep.lock:                                 # one turn at a time per episode
                if ep.removed:
                    raise HTTPError(410, f"episode {episode} was removed while waiting", "episode_gone")
                if len(ep.reasoning) >= self.max_turns:
                    raise HTTPError(409, f"episode {episode} reached max_turns={self.max_turns}", "too_many_turns")
                data = self._forward_well_formed(handler, body)
                reasoning = self._scrub(data)
                with self._lock:                          # counted before the reply: a client that reads
                    ep.reasoning.append(reasoning)        # stats after its answer sees its turn
                    self._stats["turns"] += 1
                try:
                    handler.send_json(200, data)
                except OSError:                           # the client never got this turn
                    with self._lock:
                        ep.reasoning.pop()
                        self._stats["turns"] -= 1
                        self._stats["rolled_back"] += 1
                    handler.close_connection = True
        finally:
            self._release(ep)

    def handle(self, handler, method: str, path: str):
        if method == "GET" and path in ("/health", f"/run/{self.nonce}/health"):
            return 200, {"status": "ok", **self.stats()}
        m = _ROUTE_RE.match(path)
        if m is None or not hmac.compare_digest(m.group(1).encode(), self.nonce.encode()):
            raise HTTPError(404, f"no route for {method} {path}", "not_found")
        episode, rest = m.group(2), m.group(3) or ""
        try:
            self._check_id(episode)
        except HTTPError:
            self._count("bad_requests")
            raise
        if method == "POST" and rest == "/v1/chat/completions":
            self._chat(handler, episode)
            return None, None
        if (method, rest) in (("GET", "/privileged"), ("POST", "/finish"), ("DELETE", ""), ("DELETE", "/")):
            self._authorize(handler)
        if method == "GET" and rest == "/privileged":
            with self._lock:
                ep, gone = self._episodes.get(episode), episode in self._tombstones
                if ep is not None:
                    return 200, {"episode": episode, "reasoning": list(ep.reasoning), "turns": len(ep.reasoning),
                                 "finished": ep.finished}
            raise (HTTPError(410, f"episode {episode} was evicted", "episode_gone") if gone
                   else HTTPError(404, f"unknown episode {episode}", "not_found"))
        if method == "POST" and rest == "/finish":
            try:
                self.finish(episode)
            except KeyError:
                raise HTTPError(404, f"unknown episode {episode}", "not_found") from None
            return 200, {"episode": episode, "finished": True}
        if method == "DELETE" and rest in ("", "/"):
            final = self.delete(episode)
            if final is None:
                raise HTTPError(404, f"unknown episode {episode}", "not_found")
            return 200, {"episode": episode, "deleted": True, "reasoning": final}
        if method == "GET" and rest == "/v1/models":
            try:
                resp = self._client.get(f"{self.upstream}/models")
                return resp.status_code, resp.json()
            except (httpx.HTTPError, ValueError) as e:
                raise HTTPError(502, f"upstream /models failed: {type(e).__name__}: {e}", "upstream_error")
        raise HTTPError(404, f"no route for {method} {path}", "not_found")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mimesis_lab.rollout.shim", description=__doc__.split("\n")[0])
    p.add_argument("--upstream", required=True, help="the simulator's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--max-episodes", type=int, default=1024)
    p.add_argument("--max-turns", type=int, default=512)
    p.add_argument("--timeout-s", type=float, default=60)
    p.add_argument("--credentials", default=None,
                   help="write {url, token} here (mode 0600); default: print it as the first stdout line")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)      # no line per forwarded request
    shim = PrivilegedShim(args.upstream, host=args.host, port=args.port, max_episodes=args.max_episodes,
                          timeout_s=args.timeout_s, max_turns=args.max_turns).start()
    creds = json.dumps({"url": shim.url, "token": shim.token})
    if args.credentials:
        fd = os.open(args.credentials, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(creds + "\n")
    else:
        print(creds, flush=True)
    log.info("privileged shim at %s -> %s (episode base URL: <url>/ep/<id>/v1; url and token: %s)", shim.root,
             shim.upstream, args.credentials or "stdout")
    shim.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
