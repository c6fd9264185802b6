"""One OpenAI-compatible chat endpoint, as the LLM roles use it (annotator, judge, coach).

:class:`ChatEndpoint` holds the request headers (the API key is read from the environment
variable ``endpoint.api_key_env``, never sent when unset), an owned or caller-given
``httpx.Client`` and the ``{base_url}/chat/completions`` URL; :meth:`ChatEndpoint.message`
sends one request and returns ``choices[0].message``. Every failure is an exception with a
short reason for the caller's retry loop and failure record: :class:`EndpointTimeout` for a
timeout, ``ValueError`` for anything else (transport error, HTTP >= 400, a body that is not a
chat completion, a refusal).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, TypeVar

import httpx

from mimesis_lab.config import OpenAIEndpoint

__all__ = ["ChatEndpoint", "EndpointTimeout", "JsonJudgeClient"]

T = TypeVar("T")


class EndpointTimeout(ValueError):
    """The request timed out (callers that count timeouts apart catch this first)."""


class ChatEndpoint:
    def __init__(self, endpoint: OpenAIEndpoint, client: httpx.Client | None = None):
        self.endpoint = endpoint
        self.headers = {"Content-Type": "application/json"}
        key = os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self._own_client = client is None
        self.client = client or httpx.Client(timeout=endpoint.timeout_s)
        self.url = endpoint.base_url.rstrip("/") + "/chat/completions"

    def close(self) -> None:
        if self._own_client:
            self.client.close()

    def message(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body``; ``choices[0].message`` of the answer (raises on any failure)."""
        try:
            resp = self.client.post(self.url, json=body, headers=self.headers, timeout=self.endpoint.timeout_s)
        except httpx.TimeoutException as e:
            raise EndpointTimeout(f"request timed out after {self.endpoint.timeout_s}s: {type(e).__name__}") from None
        except httpx.HTTPError as e:
            raise ValueError(f"request failed: {type(e).__name__}: {e}") from None
        if resp.status_code >= 400:
            raise ValueError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        try:
            payload = resp.json()
        except ValueError as e:
            raise ValueError(f"response body is not JSON: {e}") from None
        try:
            message = payload["choices"][0]["message"]
        except (KeyError, IndexError, TypeError):
            raise ValueError("response is not a chat completion: no choices[0].message") from None
        if not isinstance(message, dict):
            raise ValueError("choices[0].message is not an object")
        if message.get("refusal"):
            raise ValueError(f"model refused: {str(message['refusal'])[:200]}")
        return message

    def content(self, body: dict[str, Any]) -> str:
        """The answer's ``choices[0].message.content`` (a string, else ``ValueError``)."""
        content = self.message(body).get("content")
        if not isinstance(content, str):
            raise ValueError("choices[0].message.content is not a string")
        return content

    def json_with_retries(self, body: dict[str, Any], parse: Callable[[Any], T], backoff_s: float = 0.0
                          ) -> tuple[T | None, int, list[tuple[str, str]]]:
        """Up to ``max_retries + 1`` attempts of ``parse(json.loads(content))`` (sleeping
        ``backoff_s * attempt`` before a retry). Returns ``(result or None, parse failures, errors)``;
        each error is ``(kind, detail)`` with kind ``timeout``, ``error`` (any other endpoint failure)
        or ``parse`` (an answer that is not JSON or that ``parse`` rejects with ``ValueError``)."""
        errors: list[tuple[str, str]] = []
        parse_failures = 0
        for attempt in range(self.endpoint.max_retries + 1):
            if attempt and backoff_s > 0:
                time.sleep(backoff_s * attempt)
            try:
                content = self.content(body)
            except EndpointTimeout as e:
                errors.append(("timeout", str(e)))
                continue
            except ValueError as e:
                errors.append(("error", str(e)))
                continue
            try:
                return parse(json.loads(content)), parse_failures, errors
            except ValueError as e:   # json.JSONDecodeError is a ValueError
                parse_failures += 1
                errors.append(("parse", f"unparsable answer: {e}"))
        return None, parse_failures, errors


class JsonJudgeClient:
    """Base of an LLM evaluator that asks one endpoint for strict JSON through
    :meth:`ChatEndpoint.json_with_retries`: holds ``endpoint``, ``backoff_s``, the ``chat`` endpoint
    and the ``identity`` recorded with its results (``openai:<model>@<base_url>``)."""

    kind = "openai"

    def __init__(self, endpoint: OpenAIEndpoint, client: httpx.Client | None = None, backoff_s: float = 1.0):
        self.endpoint, self.backoff_s = endpoint, backoff_s
        self.chat = ChatEndpoint(endpoint, client)
        self.identity = f"openai:{endpoint.model}@{endpoint.base_url}"

    def close(self) -> None:
        self.chat.close()
