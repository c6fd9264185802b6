"""The simulator as a gym's user side, over HTTP (SPEC §3.1/§3.3).

:class:`EndpointUser` implements :class:`~mimesis_lab.envs.gyms.base.UserSide`: ``respond``
sends the user-simulator view of the conversation to ``{base_url}/chat/completions`` through the
shared retry loop (:meth:`mimesis_lab.endpoint.ChatEndpoint.call`) and returns the public reply.

In training the endpoint is the episode's own base URL on the privileged shim
(:mod:`mimesis_lab.rollout.shim`): ``{shim}/ep/{episode}/v1``. Pass either that URL, or the
shim's :attr:`~mimesis_lab.rollout.shim.PrivilegedShim.url` together with ``episode`` (the episode URL
is then built, see :func:`episode_base_url`). Reading the episode's buffer over HTTP
(:meth:`EndpointUser.privileged`, :meth:`EndpointUser.finish`) needs the shim's token
(``privileged_token``); the chat turns do not.
The shim already removes the reasoning; ``respond`` applies
:func:`~mimesis_lab.envs.output_format.public_text` again, so even a direct (unshimmed)
endpoint never passes ``<think>`` text to the agent.

Failures are data: a failed request (timeout, transport error, HTTP error after the retries, no
content, an empty public reply) gives ``UserReply(None, error, transient)``; a timeout's error text
contains ``"timeout"`` so :meth:`Gym.ask_user` classifies it as a timeout.
"""
from __future__ import annotations

from typing import Any

from mimesis_lab.config import OpenAIEndpoint
from mimesis_lab.endpoint import AnswerError, ChatEndpoint, chat_content
from mimesis_lab.envs.gyms.base import UserReply
from mimesis_lab.envs.output_format import public_text
from mimesis_lab.rollout.sim_rollout import is_refusal
from mimesis_lab.rollout.backends import SamplingParams, sampling_body
from mimesis_lab.thoughttrace import simulator_system_prompt

__all__ = ["EndpointUser", "episode_base_url", "SHIM_MARGIN_S"]

SHIM_MARGIN_S = 5.0   # a user's client timeout exceeds its shim's upstream timeout by this much


def episode_base_url(base_url: str, episode: str | None) -> str:
    """``{shim}/ep/{episode}/v1`` from a shim root; a URL that already names the episode is kept."""
    base = base_url.rstrip("/")
    if episode is None or base.endswith(f"/ep/{episode}/v1"):
        return base
    if "/ep/" in base:
        raise ValueError(f"{base_url} is another episode's URL, not episode {episode!r}'s")
    return f"{base}/ep/{episode}/v1"


class EndpointUser:
    """A :class:`UserSide` backed by an OpenAI-compatible endpoint (normally the privileged shim).

    ``sampling`` sets max tokens/temperature/top_p/seed of every request. ``timeout_s`` is the
    per-request HTTP timeout; keep it above the shim's own upstream timeout so the shim answers
    (502, nothing stored) before the client gives up. ``max_retries`` retries timeouts, transport
    errors, HTTP 429 and 5xx (safe through the shim: a 502 stores nothing), waiting
    ``backoff_s * 2 ** (k - 1)`` before retry ``k``; an answer the shim accepted is never retried
    (the shim stored that turn's reasoning), so a reply without content fails at once. With
    ``thoughttrace_layout`` (default) the gym's user system prompt is sent in the layout the simulator was
    trained on (:func:`~mimesis_lab.thoughttrace.simulator_system_prompt`: the ThoughtTrace header, then
    ``Task: <the gym's instructions>``); a tiny simulator answers a prompt it has never seen with a think
    block it does not close. The API key is
    read from the environment variable ``api_key_env`` (none is sent when it is unset or not given).
    ``privileged_token`` is the shim's :attr:`~mimesis_lab.rollout.shim.PrivilegedShim.token`, sent only
    by :meth:`privileged` and :meth:`finish` (without it the shim answers 401 and they raise).
    ``calls``/``errors`` count requests and failed replies; ``recovered_retries`` the failed tries
    that a later try of the same reply recovered.
    """

    def __init__(self, base_url: str, model: str, episode: str | None = None,
                 sampling: SamplingParams | None = None, timeout_s: float = 120, max_retries: int = 2,
                 api_key_env: str | None = None, backoff_s: float = 0.5, privileged_token: str | None = None,
                 thoughttrace_layout: bool = True):
        self.episode = episode
        self.thoughttrace_layout = thoughttrace_layout
        self.privileged_token = privileged_token
        self.base_url = episode_base_url(base_url, episode)
        self.model = model
        self.sampling = sampling or SamplingParams(max_new_tokens=256, temperature=0.7)
        self.timeout_s = timeout_s
        self.chat = ChatEndpoint(OpenAIEndpoint(base_url=self.base_url, model=model, api_key_env=api_key_env or "",
                                                timeout_s=float(timeout_s), max_retries=max_retries),
                                 backoff_s=backoff_s, backoff="exponential")
        self.calls = 0
        self.errors = 0
        self.recovered_retries = 0
        self.replies: list[str] = []   # public replies in order (CSD aligns them with the agent's turns)

    @classmethod
    def from_params(cls, ucfg: Any, shim_url: str, model: str, episode: str,
                    sampling: SamplingParams) -> "EndpointUser":
        """One episode's user as the params of a user side configure it (``agent_grpo.user`` /
        ``agent_csd.user``, or an ``agent_eval`` user: anything with ``kind``, ``openai``, ``timeout_s``),
        behind a shim started with ``timeout_s=ucfg.timeout_s``: the client waits
        :data:`SHIM_MARGIN_S` longer than the shim (so the shim answers 502 first, storing nothing);
        kind ``openai`` sends ``openai.api_key_env``'s key (the shim forwards it upstream) and retries
        ``openai.max_retries`` times; a local simulator needs no key and gets no retries."""
        ext = ucfg.openai if ucfg.kind == "openai" else None
        return cls(shim_url, model, episode=episode, sampling=sampling, timeout_s=ucfg.timeout_s + SHIM_MARGIN_S,
                   max_retries=ext.max_retries if ext else 0, api_key_env=ext.api_key_env if ext else None)

    def respond(self, messages: list[dict[str, str]]) -> UserReply:
        self.calls += 1
        msgs = [dict(m) for m in messages]
        if self.thoughttrace_layout and msgs and msgs[0].get("role") == "system":
            msgs[0]["content"] = simulator_system_prompt(msgs[0]["content"])
        body = sampling_body(self.model, self.sampling) | {"messages": msgs}
        res = self.chat.call(body, _user_content)
        if not res.ok:
            self.errors += 1
            f = res.failure
            kind = "timeout" if f.reason == "timeout" or "timeout" in f.detail.lower() else "error"
            if f.reason == "refusal":
                return UserReply(None, f"user endpoint refusal: {f.detail}", reason="refusal")
            return UserReply(None, f"user endpoint {kind}: {f.detail}", transient=f.transient,
                             reason="timeout" if kind == "timeout" else "user_error")
        self.recovered_retries += res.recovered_retries
        text = public_text(res.value)
        if not text:
            self.errors += 1
            return UserReply(None, "user endpoint returned an empty public reply", reason="user_error")
        if is_refusal(text):         # the model declined to play the user: invalid, never a reply to score
            self.errors += 1
            return UserReply(None, f"user endpoint refusal: the model declined the user role: {text[:160]!r}",
                             reason="refusal")
        self.replies.append(text)
        return UserReply(text)

    # -- the shim's side routes (only meaningful for an episode URL on the shim)
    def _episode_root(self) -> str:
        if self.episode is None or not self.base_url.endswith("/v1"):
            raise ValueError("this EndpointUser is not bound to a shim episode")
        return self.base_url[: -len("/v1")]

    def _privileged_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.privileged_token}"} if self.privileged_token else {}

    def privileged(self) -> list[str]:
        """This episode's reasoning entries from the shim (``GET {shim}/ep/{episode}/privileged``,
        with the shim token)."""
        resp = self.chat.client.get(f"{self._episode_root()}/privileged", headers=self._privileged_headers())
        resp.raise_for_status()
        return list(resp.json()["reasoning"])

    def finish(self) -> None:
        """Mark the episode finished on the shim (its buffer stays readable until evicted; needs the token)."""
        self.chat.client.post(f"{self._episode_root()}/finish", headers=self._privileged_headers()).raise_for_status()

    def close(self) -> None:
        self.chat.close()

    def __enter__(self) -> "EndpointUser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _user_content(payload: dict[str, Any]) -> str:
    """The reply's content; a reply without content is final at once (the shim already stored the turn)."""
    try:
        return chat_content(payload)
    except AnswerError as e:
        e.retry = False
        raise
