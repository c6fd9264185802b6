"""One OpenAI-compatible endpoint and the one retry loop every remote client goes through.

Its clients: the behaviour annotator (:mod:`mimesis_lab.annotators`), the behaviour judge
(:mod:`mimesis_lab.judges.openai_judge`), the CSD coach (:mod:`mimesis_lab.judges.coach`), the fidelity
judge and the discriminator of ``sim_eval`` (both :class:`JsonJudgeClient`), the fixed assistant of
``sim_eval`` (:class:`mimesis_lab.evals.sim_eval.OpenAIAssistant`), the remote generation backend
(:class:`mimesis_lab.rollout.backends.OpenAIBackend`) and the gyms' user side
(:class:`mimesis_lab.rollout.user_side.EndpointUser`, which the evaluation users also use).

:class:`ChatEndpoint` holds the configured values of one endpoint (an
:class:`~mimesis_lab.config.OpenAIEndpoint`: base URL, model, API key from the environment variable
``api_key_env`` — never sent when unset —, per-request ``timeout_s``, ``max_retries``), the backoff
between attempts, and an owned or caller-given ``httpx.Client``. :meth:`ChatEndpoint.call` is the
loop: POST ``{base_url}{path}``, turn the answer into a value with the caller's ``parse``, and on a
failure classify it, wait, and try again, at most ``max_retries + 1`` attempts. It never raises for
an endpoint problem: it returns an :class:`EndpointResult` holding either the value or an
:class:`EndpointFailure`.

How a failed attempt is classified (:class:`AttemptError`):

=============  ==========================================================  ====================
``kind``       what happened                                               class
=============  ==========================================================  ====================
``timeout``    the request timed out (``timeout_s``)                        transient, retried
``transport``  connection refused or reset, DNS, protocol error             transient, retried
``http``       HTTP 429 or 5xx                                              transient, retried
``http``       any other HTTP status >= 400 (the same request gets the      final, not retried
               same answer)
``malformed``  the body is not JSON, not a (chat) completion, or has an     retried; final once
               unexpected shape                                             the retries are spent
``invalid``    ``parse`` rejected the answer (not JSON, schema, empty…)     retried; final once
                                                                            the retries are spent
``refusal``    the model refused (``message.refusal``)                      final, not retried
``deadline``   the caller's deadline passed before the call (or its next    transient
               retry) could start
=============  ==========================================================  ====================

A ``parse`` function raises :class:`AnswerError` (or any ``ValueError``) for an ``invalid`` answer;
``AnswerError(..., retry=False)`` makes it final at once (the user side does this: the privileged
shim has already recorded that turn). The failure's ``reason`` is the kind of the last attempt and
``transient`` its class: a transient failure is one whose retries ran out, so a later run may well
succeed (caching must not keep it); a final one would fail again. On success,
``recovered_retries`` counts the failed attempts before the answer that was used.

Backoff before retry ``k`` (1-based): ``linear`` waits ``backoff_s * k``, ``exponential``
``backoff_s * 2 ** (k - 1)``; each client keeps its own configured values.

**Deadlines and batches.** ``call(..., deadline=t)`` (a :func:`time.monotonic` value) starts no
attempt after ``t`` and cuts each attempt's timeout and each backoff wait to the time left, so a
dead endpoint costs at most the time to the deadline, not ``(max_retries + 1) * timeout_s``.
:func:`map_with_deadline` runs one such call per item of a batch on a bounded thread pool under one
overall deadline (the judge's batch, the annotator's conversations); :class:`Tally` counts outcomes
by reason, thread-safely (calls, failures per reason, transient failures, recovered retries).
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Literal, Sequence, TypeVar

import httpx

from mimesis_lab.config import OpenAIEndpoint

__all__ = ["ChatEndpoint", "EndpointResult", "EndpointFailure", "AttemptError", "AnswerError",
           "MalformedResponse", "Refusal", "JsonJudgeClient", "chat_message", "chat_content", "json_answer",
           "Tally", "BatchResult", "map_with_deadline", "DEADLINE_GRACE_S"]

T = TypeVar("T")
Backoff = Literal["linear", "exponential"]
CHAT = "/chat/completions"


class AnswerError(ValueError):
    """The server answered, but not with something usable: an ``invalid`` answer, retried unless
    ``retry`` is false (then final at once)."""

    kind = "invalid"

    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.retry = retry


class MalformedResponse(AnswerError):
    """The body is not a (chat) completion: not JSON, no ``choices[0].message``, an odd shape."""

    kind = "malformed"


class Refusal(AnswerError):
    """The model refused to answer (``choices[0].message.refusal``): final, never retried."""

    kind = "refusal"

    def __init__(self, message: str):
        super().__init__(message, retry=False)


@dataclass(frozen=True)
class AttemptError:
    """One failed attempt: ``kind`` (module docstring), ``detail``, its class and the HTTP status if any."""

    kind: str
    detail: str
    transient: bool
    status: int | None = None


@dataclass
class EndpointFailure:
    """No usable answer after the attempts: ``reason`` is the last attempt's kind, ``transient`` its class,
    ``detail`` reads ``failed after N attempts: <last detail>``."""

    reason: str
    transient: bool
    detail: str
    attempts: int
    errors: list[AttemptError]


@dataclass
class EndpointResult(Generic[T]):
    """The outcome of :meth:`ChatEndpoint.call`: ``value`` or ``failure``, never both."""

    value: T | None
    failure: EndpointFailure | None
    attempts: int
    recovered_retries: int = 0            # failed attempts before the answer that was used
    errors: list[AttemptError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def count(self, kind: str) -> int:
        """How many attempts failed with ``kind`` (``invalid`` = answers ``parse`` rejected)."""
        return sum(e.kind == kind for e in self.errors)


# ----------------------------------------------------------------------------------- parse helpers
def chat_message(payload: dict[str, Any]) -> dict[str, Any]:
    """``choices[0].message`` of a chat completion (:class:`MalformedResponse`, :class:`Refusal`)."""
    try:
        message = payload["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise MalformedResponse("response is not a chat completion: no choices[0].message") from None
    if not isinstance(message, dict):
        raise MalformedResponse("choices[0].message is not an object")
    if message.get("refusal"):
        raise Refusal(f"model refused: {str(message['refusal'])[:200]}")
    return message


def chat_content(payload: dict[str, Any]) -> str:
    """``choices[0].message.content``, a string (possibly empty), else :class:`MalformedResponse`."""
    content = chat_message(payload).get("content")
    if not isinstance(content, str):
        raise MalformedResponse("choices[0].message.content is not a string")
    return content


def json_answer(validate: Callable[[Any], T]) -> Callable[[dict[str, Any]], T]:
    """A ``parse`` for strict-JSON answers: the content must be JSON (``answer is not valid JSON: …``)
    that ``validate`` accepts (its ``ValueError`` becomes ``schema: …``)."""

    def parse(payload: dict[str, Any]) -> T:
        content = chat_content(payload)
        try:
            obj = json.loads(content)
        except ValueError as e:
            raise AnswerError(f"answer is not valid JSON: {e}") from None
        try:
            return validate(obj)
        except ValueError as e:
            raise AnswerError(f"schema: {e}") from None

    return parse


# ----------------------------------------------------------------------------------- the loop
class ChatEndpoint:
    """One OpenAI-compatible endpoint with its retry policy (module docstring)."""

    def __init__(self, endpoint: OpenAIEndpoint, client: httpx.Client | None = None, *, backoff_s: float = 0.0,
                 backoff: Backoff = "linear"):
        if backoff not in ("linear", "exponential"):
            raise ValueError(f"backoff must be 'linear' or 'exponential', got {backoff!r}")
        self.endpoint, self.backoff_s, self.backoff = endpoint, backoff_s, backoff
        self.base_url = endpoint.base_url.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        key = os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self._own_client = client is None
        self.client = client or httpx.Client(timeout=endpoint.timeout_s)

    def close(self) -> None:
        if self._own_client:
            self.client.close()

    def wait_s(self, retry: int) -> float:
        """Seconds to wait before retry ``retry`` (1-based)."""
        if self.backoff == "exponential":
            return self.backoff_s * 2 ** (retry - 1)
        return self.backoff_s * retry

    def call(self, body: dict[str, Any], parse: Callable[[dict[str, Any]], T] = chat_content,
             path: str = CHAT, *, deadline: float | None = None) -> EndpointResult[T]:
        """POST ``body`` to ``{base_url}{path}`` up to ``max_retries + 1`` times; ``parse(payload)`` of the
        first usable answer, or the failure (never raises for an endpoint problem). ``deadline``: a
        :func:`time.monotonic` value after which no attempt starts (module docstring)."""
        errors: list[AttemptError] = []
        for attempt in range(self.endpoint.max_retries + 1):
            if attempt and self.backoff_s > 0:
                pause = self.wait_s(attempt)
                time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                n = len(errors)
                last = f": {errors[-1].detail}" if errors else ""
                errors.append(AttemptError("deadline", f"the deadline passed after {n} attempt{'s' if n != 1 else ''}"
                                                       f"{last}", True))
                return EndpointResult(None, EndpointFailure("deadline", True, errors[-1].detail, n, errors), n, 0,
                                      errors)
            value, error, retry = self._attempt(body, parse, path, self.endpoint.timeout_s if left is None
                                                else min(self.endpoint.timeout_s, left))
            if error is None:
                return EndpointResult(value, None, attempt + 1, attempt, errors)
            errors.append(error)
            if not retry:
                break
        n, last = len(errors), errors[-1]
        failure = EndpointFailure(last.kind, last.transient, f"failed after {n} attempt{'s' if n != 1 else ''}: "
                                  f"{last.detail}", n, errors)
        return EndpointResult(None, failure, n, 0, errors)

    def _attempt(self, body: dict[str, Any], parse: Callable[[dict[str, Any]], T], path: str, timeout: float
                 ) -> tuple[T | None, AttemptError | None, bool]:
        """One POST with ``timeout`` seconds: ``(value, None, _)`` or ``(None, error, retry?)``."""
        try:
            resp = self.client.post(self.base_url + path, json=body, headers=self.headers, timeout=timeout)
        except httpx.TimeoutException as e:
            return None, AttemptError("timeout", f"request timed out after {timeout:g}s: {type(e).__name__}", True), True
        except httpx.HTTPError as e:
            return None, AttemptError("transport", f"request failed: {type(e).__name__}: {e} (transport error)",
                                      True), True
        if resp.status_code >= 400:
            transient = resp.status_code == 429 or resp.status_code >= 500
            return None, AttemptError("http", f"HTTP {resp.status_code}: {resp.text[:200]}", transient,
                                      resp.status_code), transient
        try:
            payload = resp.json()
        except ValueError as e:
            return None, AttemptError("malformed", f"response body is not JSON (malformed JSON): {e}", False), True
        if not isinstance(payload, dict):
            return None, AttemptError("malformed", "response body is not a JSON object", False), True
        try:
            return parse(payload), None, False
        except AnswerError as e:
            return None, AttemptError(e.kind, str(e), False), e.retry
        except ValueError as e:
            return None, AttemptError("invalid", str(e), False), True
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            return None, AttemptError("malformed", f"unexpected response shape: {type(e).__name__}: {e}", False), True


class JsonJudgeClient:
    """Base of an LLM evaluator that asks one endpoint for strict JSON (:func:`json_answer`): holds
    ``endpoint``, the ``chat`` endpoint (linear backoff ``backoff_s``) and the ``identity`` recorded with
    its results (``openai:<model>@<base_url>``)."""

    kind = "openai"

    def __init__(self, endpoint: OpenAIEndpoint, client: httpx.Client | None = None, backoff_s: float = 1.0):
        self.endpoint, self.backoff_s = endpoint, backoff_s
        self.chat = ChatEndpoint(endpoint, client, backoff_s=backoff_s)
        self.identity = f"openai:{endpoint.model}@{endpoint.base_url}"

    def close(self) -> None:
        self.chat.close()


# ----------------------------------------------------------------------------------- batches
class Tally:
    """Thread-safe counts of a client's outcomes: ``calls``, ``ok``, ``failures``, ``failures/<reason>``
    (the :class:`EndpointFailure` reason, or the caller's own, e.g. ``deadline``), ``failures_transient``
    and ``recovered_retries`` (failed attempts that a later attempt of the same call recovered)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._c: Counter[str] = Counter()

    def record(self, *, ok: bool, reason: str | None = None, transient: bool = False,
               recovered_retries: int = 0) -> None:
        with self._lock:
            self._c["calls"] += 1
            self._c["recovered_retries"] += int(recovered_retries)
            if ok:
                self._c["ok"] += 1
            else:
                self._c["failures"] += 1
                self._c[f"failures/{reason or 'unknown'}"] += 1
                self._c["failures_transient"] += bool(transient)

    def counts(self, reset: bool = False) -> dict[str, int]:
        """The counts so far (``calls``, ``ok``, ``failures``, ``failures_transient``, ``recovered_retries``
        always present); ``reset`` starts a new tally (e.g. per training step)."""
        with self._lock:
            out = {k: 0 for k in ("calls", "ok", "failures", "failures_transient", "recovered_retries")}
            out.update(self._c)
            if reset:
                self._c.clear()
            return out


#: How long :func:`map_with_deadline` waits past the deadline for calls to notice it (an attempt's
#: timeout is cut to the time left, but a connect, a write and a read may each take that long).
DEADLINE_GRACE_S = 2.0


@dataclass
class BatchResult(Generic[T]):
    """``results[i]``: ``fn(items[i], deadline)``, or ``None`` for an index in ``late`` (not finished by
    the deadline: never started, or still running — its result, if any, is dropped)."""

    results: list[T | None]
    late: list[int]
    wall_s: float


def map_with_deadline(fn: Callable[[Any, float], T], items: Sequence[Any], *, workers: int,
                      deadline_s: float, grace_s: float = DEADLINE_GRACE_S) -> BatchResult[T]:
    """``fn(item, deadline)`` for every item on at most ``workers`` threads, under one overall deadline
    (``deadline = time.monotonic() + deadline_s``, handed to every call so that its endpoint stops by
    then). Returns after every call finished, or at ``deadline + grace_s``; the unfinished are ``late``.
    Results are collected here, in the caller's thread, in item order; an exception in ``fn`` propagates."""
    t0 = time.monotonic()
    deadline = t0 + deadline_s
    results: list[T | None] = [None] * len(items)
    if not items:
        return BatchResult(results, [], 0.0)
    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(items))), thread_name_prefix="endpoint-batch")
    try:
        futures = [pool.submit(fn, item, deadline) for item in items]
        wait(futures, timeout=max(0.0, deadline + grace_s - time.monotonic()))
        late = [i for i, f in enumerate(futures) if not f.done() or f.cancelled()]
        for i in sorted(set(range(len(items))) - set(late)):
            results[i] = futures[i].result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)   # a straggler ends at its own (cut) timeout
    return BatchResult(results, late, time.monotonic() - t0)
