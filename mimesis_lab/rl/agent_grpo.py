"""The ``agent_grpo`` job: multi-turn GRPO of the agent in the gyms against the frozen simulator (SPEC §3.1–3.2).

Runs on every rank under ``deepspeed``/``torchrun`` (``python -m mimesis_lab.train.run --phase
agent_grpo``) through the shared harness :func:`mimesis_lab.rl.job.run_rl_job`. One step:

1. sample ``prompts_per_step`` rows of the ``gyms`` stage (gym by weight, then a row), rank ``k``
   taking groups ``k, k+W, …``; ``rollouts_per_prompt`` trajectories each;
2. the **user side** is the frozen simulator behind the **privileged shim**: kind ``simulator``
   serves ``user.model_path`` in-process (:class:`~mimesis_lab.rollout.serve.ModelServer`),
   kind ``openai`` uses an external server; either way every episode talks to
   ``{shim}/ep/{episode}/v1`` (:class:`~mimesis_lab.rollout.user_side.EndpointUser`), so the
   agent only ever sees public utterances while the reasoning is kept per episode (for CSD);
3. :func:`~mimesis_lab.rollout.agent_rollout.run_agent_episodes` (batched, appended token streams,
   per-turn rewards, failures as invalid), then a privacy guard: no reasoning string of the
   simulator may appear in any agent input (a hit stops the job — it would be a shim bug);
4. :func:`~mimesis_lab.rl.agent_batch.build_agent_rows` (R2G credit, group-normalised score,
   credits rescaled to ``A_i``) and the PPO-clip update of the harness.
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from mimesis_lab.rl.job import Job, gather, make_rollout_backend, policy_state_dict, ppo_update, run_rl_job, \
    window_means
from mimesis_lab.train.loop import TrainConfigError, _file_identity, _init_identity, code_identity

__all__ = ["run_agent_grpo", "run_agent_csd", "agent_grpo_fingerprint", "load_gym_rows", "PrivacyError"]

OPERATIONAL_KEYS = ("resume", "save_every", "keep_last", "log_every", "launcher", "output_dir", "save_rollouts",
                    "steps")
SUMMARY_KEYS = ("reward/mean", "invalid_rate", "tool_call_error_rate", "turns_mean", "csd/loss", "csd/gate_mean",
                "csd/coached_turn_share")
MIN_LEAK_CHARS = 24     # reasoning fragments shorter than this are too generic to count as a leak


class PrivacyError(RuntimeError):
    """The simulator's private reasoning reached an agent input."""


def load_gym_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of the ``gyms`` stage with ``reward_model``/``extra_info`` decoded from their JSON strings."""
    import polars as pl

    p = Path(path)
    if not p.is_file():
        raise TrainConfigError(f"{p}: gym rows not found (run `dvc repro gyms`)")
    rows = pl.read_parquet(p).to_dicts()
    for r in rows:
        for k in ("reward_model", "extra_info"):
            if isinstance(r.get(k), str):
                r[k] = json.loads(r[k])
    return rows


def agent_grpo_fingerprint(cfg: Any, ds_config: dict[str, Any], phase: str = "agent_grpo") -> str:
    import hashlib

    section = {k: v for k, v in cfg.model_dump().items() if k not in OPERATIONAL_KEYS}
    user = _init_identity(cfg.user.model_path) if cfg.user.kind == "simulator" else cfg.user.openai.model_dump()
    doc = {"phase": phase, "section": section, "ds_config": ds_config, "init_from": _init_identity(cfg.init_from),
           "data": _file_identity(cfg.data), "user": user, "code": code_identity()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _start_user_side(cfg: Any):
    from mimesis_lab.rollout.shim import PrivilegedShim

    server = None
    if cfg.user.kind == "simulator":
        from mimesis_lab.models import load_model
        from mimesis_lab.rollout.serve import ModelServer
        from mimesis_lab.tokenizer import load_tokenizer

        server = ModelServer(load_model(cfg.user.model_path).eval(), load_tokenizer(cfg.user.model_path))
        server.start()
        upstream, model = server.url, "local"
    else:
        upstream, model = cfg.user.openai.base_url, cfg.user.openai.model
    shim = PrivilegedShim(upstream, timeout_s=cfg.user.timeout_s,
                          max_episodes=max(1024, 4 * cfg.prompts_per_step * cfg.rollouts_per_prompt))
    shim.start()
    return server, shim, model


def _setup(job: Job) -> dict[str, Any]:
    from mimesis_lab.envs.gyms.registry import load_tasks

    cfg = job.cfg
    rows = [r for r in load_gym_rows(cfg.data) if r["gym"] in cfg.gyms and cfg.gyms[r["gym"]] > 0]
    if not rows:
        raise TrainConfigError(f"{cfg.data}: no rows of the gyms {sorted(cfg.gyms)}")
    by_gym: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_gym.setdefault(r["gym"], []).append(r)
    tasks = {g: load_tasks(g) for g in by_gym}
    csd = None
    if getattr(cfg, "csd", None) is not None:
        from mimesis_lab.models import assert_no_dropout
        from mimesis_lab.rl.agent_csd import CSD

        assert_no_dropout(job.engine.module)   # teacher and student forwards must not differ by dropout noise
        forbidden = [cfg.user.openai.base_url] if cfg.user.kind == "openai" else []
        csd = CSD(cfg, job.tokenizer, tasks, job.pad_id, forbidden_urls=forbidden)
    server, shim, model = _start_user_side(cfg)
    if csd is not None and cfg.csd.coach.kind == "openai":
        from mimesis_lab.judges.coach import check_coach_endpoint

        check_coach_endpoint(cfg.csd.coach.openai.base_url, [shim.url] + ([server.url] if server else []))
    show = ("reward/mean", "invalid_total", "tool_call_error_rate", "update/ppo_loss")
    job.state.update(by_gym=by_gym, tasks=tasks, server=server, shim=shim, csd=csd,
                     user_model=model, backend=make_rollout_backend(cfg, job.engine, job.tokenizer),
                     show=show + (("csd/loss", "csd/coached_turn_share") if csd is not None else ()))
    info = {"gym_rows": {g: len(v) for g, v in by_gym.items()}, "user": cfg.user.kind,
            "invalid_policy": cfg.invalid_policy, "zero_credit": cfg.zero_credit}
    if csd is not None:
        info.update(csd_alpha=cfg.csd.alpha, csd_beta=cfg.csd.beta, coach=cfg.csd.coach.kind,
                    coach_style=cfg.csd.coach.style, placebo=cfg.csd.placebo)
    return info


def _privacy_leaks(tokenizer, trajs, privileged: dict[str, list[str]]) -> int:
    """Trajectories whose agent-visible stream contains a reasoning string of their episode."""
    leaks = 0
    for t in trajs:
        secrets = [s.strip() for s in privileged.get(t.traj_id, []) if len(s.strip()) >= MIN_LEAK_CHARS]
        if secrets:
            seen = tokenizer.decode(t.ids, skip_special_tokens=False)
            leaks += any(s in seen for s in secrets)
    return leaks


def _step(job: Job, step: int) -> tuple[dict[str, float] | None, list[dict[str, Any]]]:
    from mimesis_lab.envs.gyms.registry import gym_for_row
    from mimesis_lab.rl.agent_batch import agent_step_metrics, build_agent_rows
    from mimesis_lab.rollout.agent_rollout import run_agent_episodes
    from mimesis_lab.rollout.backends import SamplingParams
    from mimesis_lab.rollout.user_side import EndpointUser

    cfg, st, rank, world = job.cfg, job.state, job.rank, job.world
    t0 = time.perf_counter()
    rng = random.Random(f"{cfg.seed}:{step}")
    lr = job.set_lr(step)
    names = sorted(st["by_gym"])
    groups = []
    for _ in range(cfg.prompts_per_step):
        g = rng.choices(names, weights=[cfg.gyms[n] for n in names], k=1)[0]
        groups.append(st["by_gym"][g][rng.randrange(len(st["by_gym"][g]))])
    user_sampling = SamplingParams(max_new_tokens=cfg.user.max_new_tokens, temperature=cfg.user.temperature,
                                   seed=cfg.seed + step)
    rows, gyms, ids, users = [], [], [], []
    for gi in range(rank, len(groups), world):
        gid = f"s{step}g{gi}"
        for k in range(cfg.rollouts_per_prompt):
            tid = f"{gid}r{k}"
            user = EndpointUser(st["shim"].url, st["user_model"], episode=tid, sampling=user_sampling,
                                timeout_s=cfg.user.timeout_s, max_retries=0)
            rows.append(groups[gi])
            gyms.append(gym_for_row(groups[gi], st["tasks"], user, random.Random(f"{cfg.seed}:{tid}"),
                                    max_steps=cfg.rollout.max_turns))
            ids.append((gid, tid))
            users.append(user)
    if cfg.rollout.backend == "vllm":
        st["backend"].update_weights(policy_state_dict(job.engine))
    sampling = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                              top_p=cfg.rollout.top_p, seed=cfg.seed * 1_000_003 + step * 9973 + rank)
    trajs = run_agent_episodes(rows, gyms, ids, st["backend"], job.tokenizer, sampling,
                               max_turns=cfg.rollout.max_turns, max_total_tokens=cfg.rollout.max_total_tokens,
                               show_reward=cfg.rollout.show_reward, step_timeout_s=cfg.rollout.step_timeout_s,
                               users=users)
    t_roll = time.perf_counter() - t0
    privileged, replies = {}, {}
    for u, (_, tid) in zip(users, ids):
        replies[tid] = list(u.replies)
        try:
            privileged[tid] = list(st["shim"].privileged(tid))
        except KeyError:      # the user side was never asked (e.g. FunctionGym)
            privileged[tid] = []
        st["shim"].delete(tid)
        u.close()
    leaks = _privacy_leaks(job.tokenizer, trajs, privileged)
    if leaks:
        raise PrivacyError(f"step {step + 1}: simulator reasoning found in {leaks} agent input(s)")
    rows_u, bstats = build_agent_rows(trajs, cfg.gamma, cfg.adv_eps, cfg.zero_credit, cfg.invalid_policy)
    csd = st.get("csd")
    t_csd = time.perf_counter()
    if csd is not None:
        csd.prepare(trajs, {r.rollout_id for r in rows_u}, privileged, replies,
                    random.Random(f"{cfg.seed}:{step}:{rank}:csd"))
    t_post = time.perf_counter() - t_csd
    upd = ppo_update(job.engine, rows_u, cfg, random.Random(f"{cfg.seed}:{step}:update"), job.pad_id, world,
                     aux=csd)
    csd_counts = gather(csd.metrics()) if csd is not None else []
    all_trajs = [t for part in gather(trajs) for t in part]
    all_priv = {k: v for part in gather(privileged) for k, v in part.items()}
    bsum = {k: sum(s[k] for s in gather(bstats)) for k in bstats}
    if rank != 0:
        return None, []
    m = agent_step_metrics(all_trajs)
    m["invalid_rate"] = m["invalid_total"] / max(m["rollouts"], 1.0)
    m.update({f"batch/{k}": v for k, v in bsum.items()})
    m.update(upd)
    if csd_counts:
        summed = {k: sum(c[k] for c in csd_counts) for k in csd_counts[0]}
        summed["csd/coached_turn_share"] = summed["csd/rows"] / summed["csd/turns"] if summed["csd/turns"] else 0.0
        m.update(summed)
        m["csd/post_pass_time_s"] = t_post
    m.update({"lr": lr, "rollout_time_s": t_roll, "episodes_per_s": len(all_trajs) / max(t_roll, 1e-9),
              "privileged_turns": float(sum(len(v) for v in all_priv.values())), "privacy_leaks": 0.0})
    records = [{**t.to_json(), "privileged": all_priv.get(t.traj_id, [])} for t in all_trajs]
    return m, records


def _summary(history: list[dict[str, float]]) -> dict[str, Any]:
    out = {k: v for k, v in window_means(history, SUMMARY_KEYS).items() if v is not None}  # no csd/* in GRPO
    out["invalid_rollouts_total"] = sum(r.get("invalid_total", 0.0) for r in history)
    out["rollouts_total"] = sum(r.get("rollouts", 0.0) for r in history)
    return out


def _run(phase: str, cfg: Any) -> dict[str, Any] | None:
    if cfg is None:
        raise TrainConfigError(f"params has no `{phase}` section")
    job_state: dict[str, Any] = {}

    def setup(job: Job) -> dict[str, Any]:
        try:
            return _setup(job)
        finally:
            job_state.update(job.state)

    try:
        return run_rl_job(phase, cfg, lambda ds: agent_grpo_fingerprint(cfg, ds, phase), setup, _step, _summary)
    finally:
        for key in ("shim", "server", "csd"):
            if job_state.get(key) is not None:
                getattr(job_state[key], "stop", getattr(job_state[key], "close", None))()


def run_agent_grpo(params: Any) -> dict[str, Any] | None:
    """Train ``params.agent_grpo`` on this rank; rank 0 returns the summary."""
    return _run("agent_grpo", params.agent_grpo)


def run_agent_csd(params: Any) -> dict[str, Any] | None:
    """Train ``params.agent_csd`` (GRPO + CSD) on this rank; rank 0 returns the summary."""
    return _run("agent_csd", params.agent_csd)
