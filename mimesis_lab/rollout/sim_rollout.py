"""Batched simulator rollouts over many episodes of many tasks (SPEC §2.3, §6).

:func:`run_episodes` drives a list of :class:`~mimesis_lab.envs.base.SimEpisode` in lock
step: at every round the prompts of all unfinished episodes are rendered with the policy's
chat template and generated in **one** backend call (batched, KV cache), then each reply
goes back to its episode. One simulator turn = one *segment*: the exact prompt ids, the
sampled token ids and their log-probs under the rollout policy (``old_logp`` of the PPO
update) — the response mask is 1 on exactly these generated tokens; partner text only ever
appears in later prompts (mask 0). Segments of one rollout share its ``rollout_id``, so
FoldGRPO can count the rollout once (:func:`mimesis_lab.rl.advantages.fold_grpo`).

What is not a task's business is decided here, and recorded, never hidden:

- a generation error → invalid ``generation_error`` (``timeout`` when the backend says so);
- a prompt longer than ``max_prompt_tokens`` → invalid ``context_overflow``;
- an empty generation → invalid ``empty_reply``; a reply that is only reasoning (an unclosed
  ``<think>``) is the policy's *format failure*: the episode ends there, update reward 0;
- a refusal to play the user (``"As an AI language model…"``) → invalid ``refusal``;
- a reply outside ``<think>…</think>utterance`` (thinking on) → a *format failure*: the
  episode continues on the public text, the rollout's update reward becomes 0 and its raw
  judged score is still logged (:func:`mimesis_lab.envs.output_format.update_reward`);
- an exception inside the task or its partner → invalid ``env_error``;
- a judge failure → invalid with the judge's reason (``judge_failure`` / ``timeout``); a judge call of a
  concurrent batch not finished by the batch deadline → invalid ``timeout`` (:func:`score_rollouts`).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from mimesis_lab.endpoint import Tally, map_with_deadline
from mimesis_lab.envs.base import SimEpisode, TaskScore
from mimesis_lab.envs.output_format import ParsedReply, parse_reply, public_text, strip_end_tokens
from mimesis_lab.judges.verdict import JudgeFailure
from mimesis_lab.rollout.backends import Generation, SamplingParams

__all__ = ["Segment", "Rollout", "is_refusal", "run_episodes", "score_rollouts", "render_prompt"]

_REFUSAL = re.compile(
    r"\b(as an ai( language model)?|i am an ai|i'm an ai|i (cannot|can't|won't) (role-?play|pretend|play the "
    r"(role|user))|i'?m sorry,? but i (cannot|can't) (help|assist|comply|continue))\b", re.IGNORECASE)


def is_refusal(text: str) -> bool:
    """The simulator declines to act as the user (a refusal is *invalid*, not a low score)."""
    return bool(_REFUSAL.search(text or ""))


@dataclass
class Segment:
    """One simulator turn: exact prompt ids + generated ids (mask 1) + their rollout log-probs."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    format_ok: bool
    format_error: str | None = None


@dataclass
class Rollout:
    """One episode's record: segments, logs, validity, raw score and update reward."""

    group_id: str
    rollout_id: str
    data_source: str
    task_id: str
    segments: list[Segment] = field(default_factory=list)
    public_log: list[dict[str, str]] = field(default_factory=list)
    private_log: list[dict[str, str]] = field(default_factory=list)
    invalid: str | None = None
    invalid_detail: str | None = None
    score: TaskScore | None = None
    wall_s: float = 0.0
    ended_by_format_failure: bool = False

    @property
    def format_failures(self) -> int:
        return sum(not s.format_ok for s in self.segments)

    @property
    def raw(self) -> float | None:
        return None if self.score is None or self.score.raw is None else float(self.score.raw)

    @property
    def update_reward(self) -> float | None:
        """Training reward: the raw score, 0 after any format failure, ``None`` when invalid."""
        if self.invalid is not None:
            return None
        if self.format_failures:
            return 0.0
        return self.raw

    @property
    def response_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)

    def to_json(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id, "rollout_id": self.rollout_id, "data_source": self.data_source,
            "task_id": self.task_id, "invalid": self.invalid, "invalid_detail": self.invalid_detail,
            "raw": self.raw, "update_reward": self.update_reward, "format_failures": self.format_failures,
            "ended_by_format_failure": self.ended_by_format_failure,
            "format_errors": [s.format_error for s in self.segments if s.format_error],
            "n_segments": len(self.segments), "response_tokens": self.response_tokens,
            "components": dict(self.score.components) if self.score else {},
            "labels": dict(self.score.labels) if self.score else {},
            "public_log": self.public_log, "private_log": self.private_log, "wall_s": round(self.wall_s, 4),
        }


def render_prompt(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The policy's view of ``messages`` with the generation prompt (the ids the segment starts with)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys") and "input_ids" in ids:
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def _set_invalid(r: Rollout, reason: str, detail: str | None) -> None:
    if r.invalid is None:
        r.invalid, r.invalid_detail = reason, detail


def _gen_invalid(g: Generation) -> tuple[str, str]:
    err = g.error or "generation failed"
    return ("timeout" if "timeout" in err.lower() or "timed out" in err.lower() else "generation_error"), err


def run_episodes(
    episodes: Sequence[SimEpisode],
    ids: Sequence[tuple[str, str]],
    backend: Any,
    tokenizer: Any,
    sampling: SamplingParams,
    *,
    require_think: bool = True,
    max_prompt_tokens: int = 1536,
    max_rounds: int = 64,
) -> list[Rollout]:
    """Roll out ``episodes`` (``ids[i] = (group_id, rollout_id)``) with one batched call per round.

    ``sampling.seed`` (if set) is advanced per round so that rounds draw different noise while
    the whole batch stays reproducible. Returns one :class:`Rollout` per episode, in order, with
    ``score`` still unset (see :func:`score_rollouts`).
    """
    if len(ids) != len(episodes):
        raise ValueError(f"{len(episodes)} episodes but {len(ids)} ids")
    t0 = time.perf_counter()
    if hasattr(backend, "reset_prefix_cache"):
        backend.reset_prefix_cache()   # cached KV belongs to the weights of an earlier call
    out = [Rollout(g, r, type(e).data_source, e.task_id) for e, (g, r) in zip(episodes, ids)]
    active = [i for i, e in enumerate(episodes) if not e.done]
    for rnd in range(max_rounds):
        if not active:
            break
        prompts: list[list[int]] = []
        live: list[int] = []
        for i in active:
            try:
                p = render_prompt(tokenizer, episodes[i].messages())
            except Exception as e:  # a task that cannot build its prompt is an env failure
                _set_invalid(out[i], "env_error", f"prompt: {type(e).__name__}: {e}")
                continue
            if len(p) > max_prompt_tokens:
                _set_invalid(out[i], "context_overflow", f"prompt of {len(p)} tokens > max_prompt_tokens "
                             f"{max_prompt_tokens} at simulator turn {episodes[i].n_sim_turns + 1}")
                continue
            prompts.append(p)
            live.append(i)
        params = sampling if sampling.seed is None else SamplingParams(
            max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            seed=sampling.seed + 7919 * rnd, stop_token_ids=sampling.stop_token_ids)
        gens = backend.generate_ids(prompts, params) if prompts else []
        still: list[int] = []
        for i, g in zip(live, gens):
            r, ep = out[i], episodes[i]
            if not g.ok:
                _set_invalid(r, *_gen_invalid(g))
                continue
            # a reply cut at max_new_tokens is judged on what it says (finish_reason "length" is logged as
            # the truncation rate); cut inside the think block it fails the format check anyway
            parsed: ParsedReply = parse_reply(g.text, require_think=require_think)
            public = parsed.utterance if parsed.ok else public_text(g.text)
            r.segments.append(Segment(list(g.prompt_ids), list(g.token_ids), list(g.logprobs), g.finish_reason,
                                      parsed.ok, parsed.error))
            if not public.strip():
                if parsed.ok or not strip_end_tokens(g.text):
                    # nothing at all was said: an empty reply is invalid (not the policy's format)
                    _set_invalid(r, "empty_reply", f"simulator turn {ep.n_sim_turns + 1}: {parsed.error or 'empty'}")
                else:
                    # only reasoning (e.g. an unclosed <think>): a *format failure* of the policy -- the
                    # episode ends here (the partner has nothing to answer) and its update reward is 0;
                    # excluding it instead would hide the policy's most common failure from the update
                    r.ended_by_format_failure = True
                continue
            if is_refusal(public):
                _set_invalid(r, "refusal", f"simulator turn {ep.n_sim_turns + 1}: {public[:120]!r}")
                continue
            try:
                done = ep.observe(parsed, public)
            except Exception as e:
                _set_invalid(r, "env_error", f"observe: {type(e).__name__}: {e}")
                continue
            if not done:
                still.append(i)
        active = still
    for i in active:  # the round cap is a protocol bug guard, not a silent truncation
        _set_invalid(out[i], "env_error", f"episode did not finish within {max_rounds} rounds")
    wall = time.perf_counter() - t0
    for r, e in zip(out, episodes):
        r.public_log, r.private_log = list(e.public_log), list(e.private_log)
        r.wall_s = wall / max(len(out), 1)
    return out


class _RecordingJudge:
    """The judge as one episode sees it: forwards ``judge(req)`` (with the batch ``deadline``, when there
    is one) and records every outcome in ``tally`` (failure reason, recovered retries)."""

    def __init__(self, judge: Any, tally: Tally, deadline: float | None):
        self.inner, self.tally, self.deadline = judge, tally, deadline

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def judge(self, req: Any) -> Any:
        try:
            out = self.inner.judge(req) if self.deadline is None else self.inner.judge(req, deadline=self.deadline)
        except Exception:
            self.tally.record(ok=False, reason="exception")
            raise
        if isinstance(out, JudgeFailure):
            self.tally.record(ok=False, reason=out.kind or out.reason, transient=out.transient)
        else:
            self.tally.record(ok=True, recovered_retries=int(getattr(out, "recovered_retries", 0) or 0))
        return out


def _score_one(ep: SimEpisode, judge: Any, tally: Tally, deadline: float | None) -> TaskScore:
    try:
        return ep.score(_RecordingJudge(judge, tally, deadline) if hasattr(judge, "judge") else judge)
    except Exception as e:
        return TaskScore.failed("env_error", f"score: {type(e).__name__}: {e}")


def score_rollouts(rollouts: Sequence[Rollout], episodes: Sequence[SimEpisode], judge: Any, *,
                   workers: int | None = None, deadline_s: float | None = None) -> dict[str, float]:
    """Judge every valid finished rollout in place; judge failures make it invalid with their reason.

    A rollout that ended on a format failure before any public turn has nothing to judge: it stays
    valid, unscored (``raw`` is ``None``) with update reward 0.

    A remote judge (``workers`` > 1: the LLM judge, default ``judge.workers`` and ``judge.deadline_s``)
    is called for the whole batch at once on ``workers`` threads, under one overall deadline of
    ``deadline_s`` seconds that each call's retries honour; a rollout whose judging is not finished by
    then is invalid ``timeout`` ("the batch deadline … passed"), never 0. Any other judge (the offline
    rule judge) runs sequentially in rollout order, deterministic.

    Returns the batch's judge metrics (MLflow names, counts summable across ranks): ``judge/calls``,
    ``judge/ok``, ``judge/failures`` and ``judge/failures/<reason>`` (the endpoint's reason: ``http``,
    ``transport``, ``timeout``, ``deadline``, ``malformed``, ``invalid``, ``refusal``; ``late`` for a call
    unfinished at the deadline), ``judge/failures_transient``, ``judge/recovered_retries`` (failed
    attempts that a retry recovered) and ``judge/wall_s``.
    """
    todo = [(r, ep) for r, ep in zip(rollouts, episodes)
            if r.invalid is None and not (r.ended_by_format_failure and ep.n_sim_turns == 0)]
    tally = Tally()
    workers = getattr(judge, "workers", 1) if workers is None else workers
    t0 = time.perf_counter()
    if workers > 1 and len(todo) > 1:
        deadline_s = getattr(judge, "deadline_s", None) if deadline_s is None else deadline_s
        if deadline_s is None:
            raise ValueError("a concurrent judge batch needs deadline_s")
        batch = map_with_deadline(lambda item, deadline: _score_one(item[1], judge, tally, deadline), todo,
                                  workers=workers, deadline_s=deadline_s)
        scores = batch.results
        for i in batch.late:
            tally.record(ok=False, reason="late", transient=True)
            scores[i] = TaskScore.failed("timeout", f"the judge batch deadline of {deadline_s:g}s passed before this "
                                                    f"rollout was judged ({len(batch.late)} of {len(todo)} late)")
    else:
        scores = [_score_one(ep, judge, tally, None) for _, ep in todo]
    for (r, _), s in zip(todo, scores):
        r.score = s
        if s.invalid is not None:
            _set_invalid(r, s.invalid, s.detail)
    metrics = {f"judge/{k}": float(v) for k, v in tally.counts().items()}
    metrics["judge/wall_s"] = time.perf_counter() - t0
    return metrics
