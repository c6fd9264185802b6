"""The agent's environment, as training and evaluation both use it (SPEC §3.1, §3.3 item 1):
gym rows, the user side behind the privileged shim, one step's batch of episodes, and the
privacy check that no simulator reasoning reaches an agent input.

- :func:`load_gym_rows` — the ``gyms`` stage's UserRL rows, JSON columns decoded.
- :func:`start_user_side` — the frozen simulator served in-process (kind ``simulator``) or an
  external OpenAI-compatible server (kind ``openai``), always behind a :class:`PrivilegedShim`.
- :func:`collect_episodes` — one RL step's rollouts: groups sampled by gym weight, one
  :class:`EndpointUser` per episode on ``{shim}/ep/{episode}/v1``, the batched episodes, then each
  episode's private reasoning and public replies read from the shim (and the episode freed).
- :func:`privacy_leaks` / :func:`leaked_spans` — trajectories whose agent-visible stream contains a reasoning
  string of their own episode that the agent had no public way to see; any hit is a shim bug and stops the job
  (:class:`PrivacyError`, naming the trajectory and the span).
"""
from __future__ import annotations

import json
import random
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["PrivacyError", "MIN_LEAK_CHARS", "load_gym_rows", "start_user_side", "privacy_leaks", "leaked_spans",
           "leak_message", "EpisodeBatch", "collect_episodes"]

#: shim counters reported per step (``user/<key>``)
USER_STAT_KEYS = ("format_failures", "format_resamples", "format_recovered", "format_speculative")
#: in-process simulator server counters reported per step with ``user.think_format`` (``user/<key>``)
SERVER_STAT_KEYS = ("guided_requests", "guided_replies", "guided_tokens", "guided_forced_close")
#: The in-process server's batching counters, reported per step: a batch that stopped waiting for a round's
#: slow step (``round_wait_capped``) has another composition than an uncapped run's, and a reply sampled in
#: another batch can differ by float noise (README, reproducibility)
BATCH_STAT_KEYS = ("batches", "round_batches", "round_wait_capped")
MIN_LEAK_CHARS = 24     # reasoning fragments shorter than this are too generic to count as a leak


class PrivacyError(RuntimeError):
    """The simulator's private reasoning reached an agent input. Deterministic for seeded rollouts, so a job
    stops with the clear-error status and is not retried (:func:`mimesis_lab.train.runtime.job_main`)."""

    clear_job_error = True


def load_gym_rows(path: str | Path, skipped: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Rows of the ``gyms`` stage — or UserRL's rows as published — with ``reward_model``/``extra_info``
    decoded (JSON strings or structs) and ``gym``/``task_id``/``split`` derived where the file lacks them
    (:func:`mimesis_lab.envs.gyms.registry.normalise_row`). A row that names no gym or task, or whose
    JSON fields do not parse, is left out and counted under its reason in ``skipped`` (when given)."""
    from mimesis_lab.envs.gyms.registry import RowError, normalise_row
    from mimesis_lab.io import read_parquet

    out = []
    for r in read_parquet(path, "gym rows", hint="run `dvc repro gyms`").to_dicts():
        try:
            for k in ("reward_model", "extra_info"):
                if isinstance(r.get(k), str):
                    try:
                        r[k] = json.loads(r[k])
                    except json.JSONDecodeError:
                        raise RowError("malformed_row", f"field {k} is not JSON") from None
            out.append(normalise_row(r))
        except RowError as e:
            if skipped is not None:
                skipped[e.reason] = skipped.get(e.reason, 0) + 1
    return out


def start_user_side(user_cfg: Any, max_episodes: int):
    """``(model_server or None, shim, model name)``: the user side every episode talks to."""
    from mimesis_lab.rollout.shim import PrivilegedShim

    server = None
    if user_cfg.kind == "simulator":
        from mimesis_lab.models import load_model
        from mimesis_lab.rollout.serve import ModelServer
        from mimesis_lab.tokenizer import load_tokenizer

        server = ModelServer(load_model(user_cfg.model_path).eval(), load_tokenizer(user_cfg.model_path))
        server.start()
        upstream, model = server.url, "local"
    else:
        upstream, model = user_cfg.openai.base_url, user_cfg.openai.model
    shim = PrivilegedShim(upstream, timeout_s=user_cfg.timeout_s, max_episodes=max(1024, max_episodes),
                          format_retries=user_cfg.format_retries,
                          format_resample_batch=user_cfg.format_resample_batch)
    shim.start()
    return server, shim, model


def leaked_spans(tokenizer, trajs: Sequence[Any], privileged: dict[str, list[str]],
                 public: dict[str, list[str]] | None = None) -> list[tuple[str, str]]:
    """``(trajectory id, span)`` of every trajectory whose agent-visible stream contains a withheld span of its
    episode (the first such span): every line of every privileged entry (the shim stores each reply's withheld
    text — the reasoning, and in a malformed reply everything before its last ``</think>`` — one span per line)
    of at least :data:`MIN_LEAK_CHARS` characters.

    A span is public, not leaked, when the agent had it by a public way:

    - ``public`` (trajectory id -> the user's public replies, as the agent received them): a span that the user
      also *said*. A simulator that copies well writes the same sentence in its reasoning and in its utterance
      ("my stance is 6 because i take the bus every day"), and the agent then legitimately reads it;
    - the agent's own prompt (``prompt_ids``, when the trajectory has them): a span the agent was shown before
      the user said anything. The user's task and the agent's prompt share public text (TurtleGym's surface
      story, a Travel request), and a simulator whose reasoning repeats that text reveals nothing.

    Where the trajectory has its turns, only what the environment fed the agent (each turn's ``env_ids``,
    decoded one observation at a time) is searched, not the agent's own tokens: a span the agent *wrote*
    reached no agent input (two tiny models that both loop on "a big empty need a big empty …" matched
    there). A bare stream (``ids`` only) is searched whole. The leak this check exists for is withheld
    text that reaches the agent by any other way."""
    out = []
    for t in trajs:
        said = " \n ".join((public or {}).get(t.traj_id, []))
        lines = (line.strip() for s in privileged.get(t.traj_id, []) for line in s.split("\n"))
        secrets = [x for x in lines if len(x) >= MIN_LEAK_CHARS and x not in said]
        prompt_ids = getattr(t, "prompt_ids", None)
        if secrets and prompt_ids:      # the prompt is decoded only when something is left to look for
            shown = tokenizer.decode(prompt_ids, skip_special_tokens=False)
            secrets = [x for x in secrets if x not in shown]
        if secrets:
            turns = getattr(t, "turns", None)
            seen = (tokenizer.decode(t.ids, skip_special_tokens=False) if turns is None else
                    "\n".join(tokenizer.decode(x.env_ids, skip_special_tokens=False) for x in turns))
            hit = next((s for s in secrets if s in seen), None)
            if hit is not None:
                out.append((t.traj_id, hit))
    return out


def privacy_leaks(tokenizer, trajs: Sequence[Any], privileged: dict[str, list[str]],
                  public: dict[str, list[str]] | None = None) -> int:
    """The number of trajectories whose agent-visible stream contains a withheld span of their episode
    (:func:`leaked_spans`, which says what counts as public)."""
    return len(leaked_spans(tokenizer, trajs, privileged, public))


def leak_message(leaks: list[tuple[str, str]]) -> str:
    """What a :class:`PrivacyError` says: how many, and the first trajectory with the start of its span."""
    tid, span = leaks[0]
    return f"simulator reasoning found in {len(leaks)} agent input(s); first: {tid}: {span[:80]!r}"


@dataclass
class EpisodeBatch:
    """One step's episodes on this rank: trajectories, and per trajectory id the user's private
    reasoning and public replies (aligned, one entry per user reply)."""

    trajs: list[Any]
    privileged: dict[str, list[str]]
    replies: dict[str, list[str]]
    rollout_time_s: float
    #: this rank's shim counters over the step: ``format_failures`` (replies kept malformed),
    #: ``format_resamples`` and ``format_recovered`` (``user.format_retries``); with ``user.think_format`` the
    #: in-process server's ``guided_*`` counters (:data:`SERVER_STAT_KEYS`); with an in-process server its
    #: batching counters (:data:`BATCH_STAT_KEYS`)
    user_stats: dict[str, float] = field(default_factory=dict)


def collect_episodes(cfg: Any, step: int, rank: int, world: int, rows_by_gym: dict[str, list[dict[str, Any]]],
                     tasks: dict[str, Any], shim: Any, user_model: str, backend: Any, tokenizer: Any,
                     before_rollout: Any = None, user_server: Any = None) -> EpisodeBatch:
    """Roll out one RL step of an agent section ``cfg`` (``agent_grpo``/``agent_csd``).

    ``prompts_per_step`` rows are drawn (gym by weight, then a row; a pure function of
    ``(seed, step)``), rank ``k`` taking groups ``k, k+W, …``, ``rollouts_per_prompt`` episodes each.
    ``before_rollout()`` runs after the gyms are built and before generation (e.g. refreshing a
    vLLM engine's weights). ``user_server``: the in-process simulator server of :func:`start_user_side`
    (or None); each round's user turns are announced to it (:meth:`ModelServer.round`). Raises
    :class:`PrivacyError` if any reasoning reached an agent input.
    """
    from mimesis_lab.envs.gyms.registry import gym_for_row
    from mimesis_lab.rollout.agent_rollout import run_agent_episodes
    from mimesis_lab.rollout.backends import SamplingParams
    from mimesis_lab.rollout.user_side import EndpointUser

    t0 = time.perf_counter()
    before = shim.stats()
    server_before = user_server.stats() if user_server is not None else {}
    rng = random.Random(f"{cfg.seed}:{step}")
    names = sorted(rows_by_gym)
    groups = []
    for _ in range(cfg.prompts_per_step):
        g = rng.choices(names, weights=[cfg.gyms[n] for n in names], k=1)[0]
        groups.append(rows_by_gym[g][rng.randrange(len(rows_by_gym[g]))])
    rows, gyms, ids, users = [], [], [], []
    for gi in range(rank, len(groups), world):
        gid = f"s{step}g{gi}"
        for k in range(cfg.rollouts_per_prompt):
            tid = f"{gid}r{k}"
            # each episode's user samples with its own seed: group members whose user prompts coincide
            # (before their agents diverge) still meet different replies
            user_sampling = SamplingParams(max_new_tokens=cfg.user.max_new_tokens, temperature=cfg.user.temperature,
                                           seed=zlib.crc32(f"{cfg.seed}:{step}:{tid}".encode()),
                                           think_format=cfg.user.think_format)
            user = EndpointUser.from_params(cfg.user, shim.url, user_model, tid, user_sampling)
            rows.append(groups[gi])
            gyms.append(gym_for_row(groups[gi], tasks, user, random.Random(f"{cfg.seed}:{tid}"),
                                    max_steps=cfg.rollout.max_turns))
            ids.append((gid, tid))
            users.append(user)
    if before_rollout is not None:
        before_rollout()
    sampling = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                              top_p=cfg.rollout.top_p, seed=cfg.seed * 1_000_003 + step * 9973 + rank)
    trajs = run_agent_episodes(rows, gyms, ids, backend, tokenizer, sampling,
                               max_turns=cfg.rollout.max_turns, max_total_tokens=cfg.rollout.max_total_tokens,
                               show_reward=cfg.rollout.show_reward, step_timeout_s=cfg.rollout.step_timeout_s,
                               users=users, user_round=None if user_server is None else user_server.round)
    t_roll = time.perf_counter() - t0
    privileged, replies = {}, {}
    for u, (_, tid) in zip(users, ids):
        replies[tid] = list(u.replies)
        try:
            privileged[tid] = list(shim.privileged(tid))
        except KeyError:      # the user side was never asked (e.g. FunctionGym)
            privileged[tid] = []
        shim.delete(tid)
        u.close()
    leaks = leaked_spans(tokenizer, trajs, privileged, replies)
    if leaks:
        raise PrivacyError(f"step {step + 1}: {leak_message(leaks)}")
    after = shim.stats()
    user_stats = {k: float(after.get(k, 0) - before.get(k, 0)) for k in USER_STAT_KEYS}
    if user_server is not None:
        server_after = user_server.stats()
        keys = BATCH_STAT_KEYS + (SERVER_STAT_KEYS if cfg.user.think_format else ())
        user_stats |= {k: float(server_after.get(k, 0) - server_before.get(k, 0)) for k in keys}
    return EpisodeBatch(trajs, privileged, replies, t_roll, user_stats)
