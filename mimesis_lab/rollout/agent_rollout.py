"""Multi-turn agent rollouts in the gyms (SPEC §3.1–3.2): one token stream per trajectory.

The agent acts with one tool, ``interact_with_env(choice ∈ {action, answer, search}, content)``.
A reply may call it the Qwen way (``<tool_call>{"name": "interact_with_env", "arguments":
{"choice": …, "content": …}}</tool_call>``) or with the reference's prefixes (``[action] …``,
``[answer] …``, ``[search] …``); a reply with neither gets feedback saying so (a wasted turn,
reward 0 — the agent's own mistake, not an invalid episode).

**Tokens are appended, never re-tokenised.** A trajectory is ``prompt_ids`` followed, per turn,
by the agent's sampled ids (response mask 1, with their rollout log-probs) and the ids of the
environment's reply (mask 0): the tool message ``<|im_start|>tool\\n{feedback}<|im_end|>`` plus
the next generation prompt, tokenised on its own. The sanity check :func:`check_drift` decodes the
stream and compares it with the chat template's rendering of the same messages; a mismatch
(a template that renders differently from what the stream holds) marks the trajectory invalid
``tokenization_drift`` instead of training on a context the model never saw.

**A round's gym steps run concurrently** (a thread pool of up to ``step_workers`` threads): the
steps that ask the user reach the user side together, so a batching simulator server
(:class:`~mimesis_lab.rollout.serve.ModelServer`) generates a round's user turns in one batch
instead of one after another. The results are applied in episode order once all steps of the
round have returned, so the outcome does not depend on which step finished first.

Failures are data: a user-side failure (the simulator endpoint/shim erred, timed out or refused)
or an exception inside the gym ends the episode *invalid* with its reason; a gym step slower
than ``step_timeout_s`` (measured from its own start, not from its wait for a free thread) is
``timeout``. Per-turn rewards are kept for R2G credit.
"""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mimesis_lab.envs.gyms.base import CHOICES, Gym, StepResult, UserSideError
from mimesis_lab.rollout.backends import SamplingParams

__all__ = ["TOOL_SCHEMA", "parse_tool_call", "AgentTurn", "Trajectory", "run_agent_episodes", "check_drift",
           "AGENT_INVALID_REASONS"]

AGENT_INVALID_REASONS = ("user_error", "timeout", "refusal", "env_error", "generation_error", "context_overflow",
                         "tokenization_drift")

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "interact_with_env",
        "description": "Interact with the environment: ask or act (`action`), query (`search`) or give the final "
                       "answer (`answer`).",
        "parameters": {"type": "object", "properties": {
            "choice": {"type": "string", "enum": list(CHOICES)}, "content": {"type": "string"}},
            "required": ["choice", "content"]},
    },
}

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
_PREFIX = re.compile(r"\[(action|answer|search)\]\s*(.*)", re.DOTALL | re.IGNORECASE)
_END = ("<|im_end|>", "<|endoftext|>")


def parse_tool_call(text: str) -> tuple[str, str] | str:
    """``(choice, content)`` of the reply's tool call, or an error message (a string)."""
    body = text
    for t in _END:
        body = body.replace(t, "")
    body = re.sub(r"<think>.*?</think>", "", body, flags=re.DOTALL)
    m = _TOOL_CALL.search(body)
    if m:
        try:
            call = json.loads(m.group(1))
        except ValueError as e:
            return f"tool call is not valid JSON ({e})"
        args = call.get("arguments") if isinstance(call, dict) else None
        if not isinstance(call, dict) or call.get("name") != "interact_with_env" or not isinstance(args, dict):
            return "the only tool is interact_with_env(choice, content)"
        choice, content = args.get("choice"), args.get("content")
        if choice not in CHOICES or not isinstance(content, str):
            return f"choice must be one of {list(CHOICES)} and content a string"
        return choice, content.strip()
    m = _PREFIX.search(body)
    if m:
        return m.group(1).lower(), m.group(2).strip()
    return "no tool call: call interact_with_env with choice action, answer or search"


@dataclass
class AgentTurn:
    """One agent turn: sampled ids (mask 1) + their log-probs, then the environment's ids (mask 0)."""

    token_ids: list[int]
    logprobs: list[float]
    env_ids: list[int]
    text: str
    reward: float = 0.0
    choice: str | None = None
    content: str | None = None
    feedback: str = ""
    parse_error: str | None = None
    user_replies: int = 0     # the user side's public replies so far, after this turn (CSD alignment)


@dataclass
class Trajectory:
    group_id: str
    traj_id: str
    data_source: str
    task_id: str
    prompt_ids: list[int]
    messages: list[dict[str, str]]
    turns: list[AgentTurn] = field(default_factory=list)
    done: bool = False
    invalid: str | None = None
    invalid_detail: str | None = None
    invalid_transient: bool = False   # the failure may not recur (timeout, transport, 5xx): a rerun retries it
    wall_s: float = 0.0

    @property
    def ids(self) -> list[int]:
        out = list(self.prompt_ids)
        for t in self.turns:
            out += t.token_ids + t.env_ids
        return out

    @property
    def turn_rewards(self) -> list[float]:
        return [t.reward for t in self.turns]

    @property
    def turn_lengths(self) -> list[int]:
        return [len(t.token_ids) for t in self.turns]

    @property
    def total_reward(self) -> float:
        return sum(self.turn_rewards)

    def response_positions(self) -> list[int]:
        """Indices in :attr:`ids` of the agent-generated tokens (response mask 1)."""
        pos, at = [], len(self.prompt_ids)
        for t in self.turns:
            pos += range(at, at + len(t.token_ids))
            at += len(t.token_ids) + len(t.env_ids)
        return pos

    def to_json(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "traj_id": self.traj_id, "data_source": self.data_source,
                "task_id": self.task_id, "invalid": self.invalid, "invalid_detail": self.invalid_detail,
                "invalid_transient": self.invalid_transient,
                "turn_rewards": self.turn_rewards, "total_reward": self.total_reward, "n_turns": len(self.turns),
                "response_tokens": sum(self.turn_lengths), "messages": self.messages,
                "choices": [t.choice for t in self.turns], "parse_errors": [t.parse_error for t in self.turns],
                "wall_s": round(self.wall_s, 4)}


def _render(tokenizer, messages, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def check_drift(tokenizer, traj: Trajectory) -> str | None:
    """``None`` if the token stream decodes to the template rendering of the trajectory's messages.

    Mid-episode the stream ends with the generation prompt; an episode that ended on the agent's
    turn ends with the agent's reply (its ``<|im_end|>`` kept, or cut at the length limit).
    """
    stream = tokenizer.decode(traj.ids, skip_special_tokens=False)
    if traj.turns and not traj.turns[-1].env_ids:
        want = _render(tokenizer, traj.messages, add_generation_prompt=False)
        ok = want.startswith(stream) and len(want) - len(stream) <= len("<|im_end|>\n")
    else:
        want = _render(tokenizer, traj.messages, add_generation_prompt=True)
        ok = stream == want
    if ok:
        return None
    k = next((i for i, (a, b) in enumerate(zip(stream, want)) if a != b), min(len(stream), len(want)))
    return (f"token stream differs from the rendered conversation at character {k}: "
            f"{stream[max(0, k - 20):k + 20]!r} vs {want[max(0, k - 20):k + 20]!r}")


_TIMED_OUT = object()


def run_concurrently(pool: ThreadPoolExecutor, calls: Sequence[Callable[[], Any]],
                     timeout_s: float) -> list[tuple[Any, BaseException | None]]:
    """Run ``calls`` on ``pool`` at once; per call ``(result, None)``, ``(None, exception)`` or
    ``(_TIMED_OUT, None)``.

    A call times out once it has *run* for ``timeout_s`` (a call queued behind a full pool is not
    charged for its wait), or if it is still queued after ``timeout_s`` without any call finishing
    (every thread stuck). A timed-out call's thread cannot be stopped: it finishes in the
    background and its result is ignored.
    """
    n = len(calls)
    started: list[float | None] = [None] * n

    def run(k: int):
        started[k] = time.monotonic()
        return calls[k]()

    futs = {pool.submit(run, k): k for k in range(n)}
    out: list[tuple[Any, BaseException | None]] = [(None, None)] * n
    pending = set(futs)
    progress = time.monotonic()        # the last time a call finished (or the submission)
    while pending:
        now = time.monotonic()
        for f in list(pending):
            k = futs[f]
            since = started[k] if started[k] is not None else progress
            if not f.done() and now - since >= timeout_s:
                out[k] = (_TIMED_OUT, None)
                pending.discard(f)
        if not pending:
            break
        left = min((started[futs[f]] if started[futs[f]] is not None else progress) + timeout_s - now
                   for f in pending)
        done, _ = wait(pending, timeout=max(0.001, left), return_when=FIRST_COMPLETED)
        if done:
            progress = time.monotonic()
        for f in done:
            pending.discard(f)
            exc = f.exception()
            out[futs[f]] = (None, exc) if exc is not None else (f.result(), None)
    return out


def run_agent_episodes(
    rows: Sequence[dict[str, Any]],
    gyms: Sequence[Gym],
    ids: Sequence[tuple[str, str]],
    backend: Any,
    tokenizer: Any,
    sampling: SamplingParams,
    *,
    max_turns: int = 16,
    max_total_tokens: int = 4096,
    show_reward: bool = True,
    step_timeout_s: float = 120.0,
    check_every_turn: bool = False,
    users: Sequence[Any] | None = None,
    step_workers: int = 64,
    user_round: Callable[[int], Any] | None = None,
) -> list[Trajectory]:
    """Roll out one trajectory per ``(row, gym)`` with one batched generation call per round.

    The round's gym steps run concurrently on up to ``step_workers`` threads (module docstring).
    ``users`` (optional, one per row): the gyms' user sides; after each turn the number of public
    replies ``len(users[i].replies)`` is recorded in :attr:`AgentTurn.user_replies`, which aligns
    the simulator's reasoning entries with the agent's turns (CSD). ``user_round`` (optional): the
    in-process user server's :meth:`~mimesis_lab.rollout.serve.ModelServer.round`; each round's gym
    steps are announced to it, so their user turns are generated in one call however they arrive."""
    if step_workers < 1:
        raise ValueError(f"step_workers must be >= 1, got {step_workers}")
    t0 = time.perf_counter()
    if hasattr(backend, "reset_prefix_cache"):
        backend.reset_prefix_cache()   # cached KV belongs to the weights of an earlier call
    trajs: list[Trajectory] = []
    for row, gym, (gid, tid) in zip(rows, gyms, ids):
        messages = [dict(m) for m in row["prompt"]]
        try:
            first = gym.reset()
        except Exception as e:
            first = None
            err = f"reset: {type(e).__name__}: {e}"
        if first:
            messages.append({"role": "tool", "content": first})
        prompt_ids = _encode(tokenizer, _render(tokenizer, messages, add_generation_prompt=True))
        tr = Trajectory(gid, tid, str(row.get("data_source")), str((row.get("reward_model") or {}).get("id", "")),
                        prompt_ids, messages)
        if first is None:
            tr.invalid, tr.invalid_detail, tr.done = "env_error", err, True
        trajs.append(tr)
    eos = tokenizer.eos_token_id

    def close_turn(i: int, turn: AgentTurn, g: Any, result: StepResult) -> None:
        tr = trajs[i]
        turn.reward = float(result.reward)
        turn.feedback = result.observation
        tr.done = bool(result.done or len(tr.turns) >= max_turns)
        if tr.done:
            return
        feedback = result.observation + (f"\nReward: {result.reward:g}" if show_reward else "")
        closing = "\n" if g.token_ids and g.token_ids[-1] == eos else "<|im_end|>\n"
        env_text = closing + "<|im_start|>tool\n" + feedback + "<|im_end|>\n<|im_start|>assistant\n"
        turn.env_ids = _encode(tokenizer, env_text)
        tr.messages.append({"role": "tool", "content": feedback})
        if check_every_turn:
            drift = check_drift(tokenizer, tr)
            if drift:
                tr.invalid, tr.invalid_detail, tr.done = "tokenization_drift", drift, True

    with ThreadPoolExecutor(max_workers=max(1, min(step_workers, len(trajs))),
                            thread_name_prefix="gym-step") as pool:
        for _ in range(max_turns):
            active = [i for i, t in enumerate(trajs) if not t.done]
            if not active:
                break
            prompts = []
            live = []
            for i in active:
                ids_i = trajs[i].ids
                if len(ids_i) + sampling.max_new_tokens > max_total_tokens:
                    trajs[i].invalid, trajs[i].done = "context_overflow", True
                    trajs[i].invalid_detail = f"{len(ids_i)} tokens + {sampling.max_new_tokens} new > {max_total_tokens}"
                    continue
                prompts.append(ids_i)
                live.append(i)
            gens = backend.generate_ids(prompts, sampling) if prompts else []
            stepping: list[tuple[int, AgentTurn, Any]] = []      # turns whose tool call goes to the gym
            for i, g in zip(live, gens):
                tr = trajs[i]
                if not g.ok:
                    reason = "timeout" if "time" in (g.error or "").lower() else "generation_error"
                    tr.invalid, tr.invalid_detail, tr.done = reason, g.error, True
                    tr.invalid_transient = reason == "timeout" or bool(getattr(g, "transient", False))
                    continue
                text = tokenizer.decode(g.token_ids, skip_special_tokens=False)
                reply = text[: -len("<|im_end|>")] if text.endswith("<|im_end|>") else text
                turn = AgentTurn(list(g.token_ids), list(g.logprobs), [], reply,
                                 user_replies=tr.turns[-1].user_replies if tr.turns else 0)
                tr.turns.append(turn)
                tr.messages.append({"role": "assistant", "content": reply})
                parsed = parse_tool_call(reply)
                if isinstance(parsed, str):
                    turn.parse_error = parsed
                    close_turn(i, turn, g, StepResult(f"Invalid tool call: {parsed}.", 0.0, False))
                else:
                    turn.choice, turn.content = parsed
                    stepping.append((i, turn, g))
            # every gym step of the round at once: the user turns they ask for reach the user side together
            calls = [lambda gym=gyms[i], t=turn: gym.step(t.choice, t.content) for i, turn, _ in stepping]
            if user_round is not None and calls:
                with user_round(len(calls)) as announced:
                    outcomes = run_concurrently(pool, [announced.wrap(c) for c in calls], step_timeout_s)
            else:
                outcomes = run_concurrently(pool, calls, step_timeout_s)
            for (i, turn, g), (result, exc) in zip(stepping, outcomes):
                tr, gym = trajs[i], gyms[i]
                if users is not None:
                    turn.user_replies = len(getattr(users[i], "replies", ()))
                if result is _TIMED_OUT:
                    tr.invalid, tr.done, tr.invalid_transient = "timeout", True, True
                    tr.invalid_detail = f"{type(gym).__name__}.step took longer than {step_timeout_s}s"
                elif isinstance(exc, UserSideError):
                    tr.invalid, tr.invalid_detail, tr.done = exc.reason, exc.detail, True
                    tr.invalid_transient = exc.transient
                elif exc is not None:
                    tr.invalid, tr.invalid_detail, tr.done = "env_error", f"{type(exc).__name__}: {exc}", True
                else:
                    close_turn(i, turn, g, result)
    wall = time.perf_counter() - t0
    for tr in trajs:
        tr.wall_s = wall / max(len(trajs), 1)
        if tr.invalid is None:
            drift = check_drift(tokenizer, tr)
            if drift:
                tr.invalid, tr.invalid_detail = "tokenization_drift", drift
    return trajs
