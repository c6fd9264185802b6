"""The ``sim_rl`` job: joint multi-domain simulator RL with FoldGRPO on DeepSpeed (SPEC §2.3–2.4, §6).

Runs on every rank (``python -m mimesis_lab.train.run --phase sim_rl``, started by
``deepspeed``/``torchrun`` through :mod:`mimesis_lab.train.launch`). One step:

1. **Sample** ``prompts_per_step`` task rows jointly: task ``d ~ p(d)`` (the ``weight`` of
   ``sim_rl.tasks``), then a row of ``d`` uniformly (:func:`sample_groups`; a pure function
   of ``(seed, step)``, so a resumed run samples the same tasks). Rank ``k`` takes groups
   ``k, k+W, …`` (data parallel over whole groups: FoldGRPO needs a whole group).
2. **Roll out** ``rollouts_per_prompt`` episodes per row with the *current* policy
   (colocated: the transformers backend reads the DeepSpeed module's weights in place; the
   vLLM backend is refreshed with them before the step) — :func:`run_episodes`, one batched
   generation call per round over every unfinished episode.
3. **Judge** (:func:`score_rollouts`) and account: invalid rollouts are counted per reason;
   format failures give update reward 0 while the raw score is logged.
4. **FoldGRPO** advantages per segment and the **PPO clip** update: ``ppo_epochs`` passes,
   ``minibatches`` optimizer steps per pass, each the token mean of
   :func:`mimesis_lab.rl.losses.ppo_clip_loss` over the minibatch's generated tokens on all
   ranks (micro-chunks of ``micro_rows`` rows, gradient accumulation owned by the caller:
   the DeepSpeed JSON sets ``managed_gradient_accumulation: false``). ``old_logp`` = the
   rollout policy's log-probs recorded at generation. No KL term (as the paper).
5. **Log** per-step metrics (:func:`mimesis_lab.rl.sim_batch.step_metrics` + update stats)
   to ``metrics.jsonl`` and the MLflow run in ``MLFLOW_RUN_ID``; every episode goes to
   ``rollouts.jsonl`` (public and private logs, score, validity).

Checkpoints and ``resume: auto`` work as for the SFT jobs (same markers and fingerprint rule);
the final weights are exported to ``output_dir/final`` (``zero_to_fp32``).
"""
from __future__ import annotations

import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from mimesis_lab.rl.losses import ppo_clip_loss
from mimesis_lab.rl.policy import micro_chunks, minibatch_indices, pad_update_rows, token_logprobs
from mimesis_lab.rl.sim_batch import AccountingError, build_update_rows, step_metrics
from mimesis_lab.train.loop import (CHECKPOINTS, MARKER, ResumeError, TrainConfigError, _dist_init, _export,
                                    code_identity,
                                    _file_identity, _init_identity, _Log, _param_groups, _say, _write_marker,
                                    list_checkpoints, load_ds_config, resolve_resume, tag_for)
from mimesis_lab.train.schedule import lr_at

__all__ = ["sample_groups", "sim_rl_fingerprint", "policy_state_dict", "run_sim_rl", "OPERATIONAL_KEYS"]

# `steps` is operational: raising it continues a finished run (the lr schedule is constant by default)
OPERATIONAL_KEYS = ("resume", "save_every", "keep_last", "log_every", "launcher", "output_dir", "save_rollouts",
                    "steps")


def sample_groups(task_rows: dict[str, Sequence[dict[str, Any]]], weights: dict[str, float], n: int,
                  rng: random.Random) -> list[dict[str, Any]]:
    """``n`` rows drawn jointly: ``d ~ p(d) = w_d / sum(w)`` over tasks with rows, then a row of ``d`` uniformly."""
    names = [d for d in sorted(weights) if weights[d] > 0 and task_rows.get(d)]
    if not names:
        raise TrainConfigError("sim_rl: no task with a positive weight has any rows")
    w = [float(weights[d]) for d in names]
    out = []
    for _ in range(n):
        d = rng.choices(names, weights=w, k=1)[0]
        out.append(task_rows[d][rng.randrange(len(task_rows[d]))])
    return out


def sim_rl_fingerprint(cfg: Any, ds_config: dict[str, Any]) -> str:
    """sha256 of what determines the trained weights (see :func:`mimesis_lab.train.loop.run_fingerprint`)."""
    import hashlib

    section = {k: v for k, v in cfg.model_dump().items() if k not in OPERATIONAL_KEYS}
    files = {name: _file_identity(t.data) for name, t in cfg.tasks.items()}
    doc = {"phase": "sim_rl", "section": section, "ds_config": ds_config, "init_from": _init_identity(cfg.init_from),
           "task_files": files, "kb": _file_identity(cfg.kb), "guidelines": _file_identity(cfg.guidelines),
           "code": code_identity()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _all_reduce(values: list[float], op: str = "sum") -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def _gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def _truncate_jsonl(path: Path, step: int) -> None:
    if path.is_file():
        keep = [ln for ln in path.read_text(encoding="utf-8").splitlines()
                if ln.strip() and json.loads(ln).get("step", 0) <= step]
        path.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")


def _make_backend(cfg: Any, engine, tokenizer):
    from mimesis_lab.rollout.backends import TransformersBackend, VLLMBackend

    if cfg.rollout.backend == "vllm":
        return VLLMBackend(cfg.init_from, tokenizer=tokenizer,
                           gpu_memory_utilization=cfg.rollout.gpu_memory_utilization)
    return TransformersBackend(engine.module, tokenizer, batch_size=cfg.rollout.batch_size,
                               prefix_cache_tokens=cfg.rollout.prefix_cache_tokens)


def policy_state_dict(engine) -> dict[str, torch.Tensor]:
    """The policy's full weights for refreshing a separate rollout engine (vLLM) before a step.

    Under ZeRO-3 every rank holds a shard only: the parameters are gathered (all ranks take part)
    and copied out; with ZeRO <= 2 the module's parameters are already whole.
    """
    module = engine.module
    if engine.zero_optimization_stage() >= 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}
    return {k: v.detach() for k, v in module.state_dict().items()}


def _update(engine, rows, cfg, rng: random.Random, pad_id: int, world: int) -> dict[str, float]:
    """PPO clip passes over this rank's rows; every rank runs the same number of backward/step calls."""
    device = engine.device
    stats = {"loss_sum": 0.0, "tokens": 0.0, "clipped": 0.0, "kl_sum": 0.0, "mismatch_sum": 0.0,
             "mismatch_tokens": 0.0, "opt_steps": 0.0, "grad_norm_sum": 0.0, "grad_norms": 0.0}
    first = True
    for _ in range(cfg.ppo_epochs):
        parts = minibatch_indices(len(rows), cfg.minibatches, rng) if rows else []
        parts += [[] for _ in range(cfg.minibatches - len(parts))]
        for part in parts:
            n_tok_local = float(sum(rows[i].n_response for i in part))
            chunks = micro_chunks(part, cfg.micro_rows) if part else []
            n_tok, n_micro = _all_reduce([n_tok_local])[0], int(_all_reduce([float(len(chunks))], "max")[0])
            if n_tok == 0:
                continue
            for k in range(n_micro):
                if k < len(chunks):
                    b = pad_update_rows([rows[i] for i in chunks[k]], pad_id, device)
                    logp = token_logprobs(engine, b["input_ids"], b["attention_mask"])
                    n_here = float(b["mask"].sum())
                    loss = ppo_clip_loss(logp, b["old_logp"], b["adv"], b["mask"], cfg.clip_eps)
                    with torch.no_grad():
                        sel = b["mask"] != 0
                        log_ratio = (logp.detach() - b["old_logp"])[sel]
                        ratio = log_ratio.exp()
                        stats["loss_sum"] += float(loss.detach()) * n_here
                        stats["tokens"] += n_here
                        stats["clipped"] += float(((ratio - 1).abs() > cfg.clip_eps).sum())
                        stats["kl_sum"] += float(((ratio - 1) - log_ratio).sum())
                        if first:
                            stats["mismatch_sum"] += float(log_ratio.abs().sum())
                            stats["mismatch_tokens"] += n_here
                    engine.backward(loss * (n_here / n_tok) * world, scale_wrt_gas=False)
                else:   # this rank has fewer chunks: a zero-weight pass keeps the collectives in step
                    dummy = torch.zeros((1, 2), dtype=torch.long, device=device)
                    logp = token_logprobs(engine, dummy, torch.ones_like(dummy))
                    engine.backward(logp.sum() * 0.0, scale_wrt_gas=False)
            first = False
            engine.step()
            stats["opt_steps"] += 1
            gn = engine.get_global_grad_norm() if engine.zero_optimization_stage() > 0 else None
            if gn is not None and math.isfinite(float(gn)):
                stats["grad_norm_sum"] += float(gn)
                stats["grad_norms"] += 1
    tot = _all_reduce([stats[k] for k in ("loss_sum", "tokens", "clipped", "kl_sum", "mismatch_sum",
                                          "mismatch_tokens")])
    loss_sum, tokens, clipped, kl_sum, mm_sum, mm_tok = tot
    out = {"update/opt_steps": stats["opt_steps"], "update/tokens": tokens}
    if tokens:
        out.update({"update/ppo_loss": loss_sum / tokens, "update/clip_frac": clipped / tokens,
                    "update/approx_kl": kl_sum / tokens})
    if mm_tok:
        out["update/logp_mismatch"] = mm_sum / mm_tok   # rollout vs trainer log-probs before the first step
    if stats["grad_norms"]:
        out["update/grad_norm"] = stats["grad_norm_sum"] / stats["grad_norms"]
    return out


def _summary(history: list[dict[str, float]], k: int = 3) -> dict[str, Any]:
    def window(key: str, rows: list[dict[str, float]]) -> float | None:
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else None

    out: dict[str, Any] = {}
    for key in ("reward/raw_mean", "reward/update_mean", "format_failure_rate", "invalid_rate",
                "judge/exhibit", "announced_rate", "neutral_cooperativeness"):
        name = key.replace("/", "_")
        out[f"first_{name}"] = window(key, history[:k])
        out[f"last_{name}"] = window(key, history[-k:])
    out["invalid_rollouts_total"] = sum(r.get("invalid_total", 0.0) for r in history)
    out["rollouts_total"] = sum(r.get("rollouts", 0.0) for r in history)
    return out


def run_sim_rl(params: Any) -> dict[str, Any] | None:
    """Train ``params.sim_rl`` on this rank; rank 0 returns the summary (also ``final/training_summary.json``)."""
    import torch.distributed as dist
    import deepspeed

    import mimesis_lab.envs.behavior_task  # noqa: F401  (registers usersim_behavior)
    import mimesis_lab.envs.usersim_tasks  # noqa: F401  (registers the ThoughtTrace tasks)
    from mimesis_lab.abcd import load_guidelines, load_kb
    from mimesis_lab.envs.base import TaskContext, make_episode
    from mimesis_lab.envs.registry import load_task_rows
    from mimesis_lab.judges.behavior_judge import make_judge
    from mimesis_lab.models import assert_no_dropout, disable_dropout, load_model
    from mimesis_lab.rollout.backends import SamplingParams
    from mimesis_lab.rollout.sim_rollout import run_episodes, score_rollouts
    from mimesis_lab.tokenizer import load_tokenizer

    cfg = params.sim_rl
    if cfg is None:
        raise TrainConfigError("params has no `sim_rl` section")
    rank, world = _dist_init()
    if world != cfg.world_size:
        raise TrainConfigError(f"sim_rl.world_size is {cfg.world_size} but {world} processes were launched")
    out_dir = Path(cfg.output_dir)
    ckpt_root = out_dir / CHECKPOINTS
    ds_config = load_ds_config(cfg.deepspeed_config)
    if ds_config.get("managed_gradient_accumulation", True):
        raise TrainConfigError(f"{cfg.deepspeed_config}: sim_rl owns the accumulation boundary (variable segment "
                               "counts per step); set \"managed_gradient_accumulation\": false")
    fingerprint = sim_rl_fingerprint(cfg, ds_config)
    resume = resolve_resume(cfg.resume, ckpt_root, world)
    if resume is not None:
        stored = json.loads((resume[0] / resume[1] / MARKER).read_text())["client_state"].get("fingerprint")
        if stored != fingerprint and cfg.resume == "auto":
            _say(rank, f"resume: auto: {resume[0] / resume[1]} belongs to another run (fingerprint differs); "
                       "starting fresh")
            resume = None
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    tokenizer = load_tokenizer(cfg.init_from)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    task_rows: dict[str, list[dict[str, Any]]] = {}
    skipped: dict[str, int] = {}
    for ds, t in cfg.tasks.items():
        task_rows[ds], skipped[ds] = load_task_rows(ds, t.data, t.max_rows)
    ctx = TaskContext(kb=load_kb(Path(cfg.kb)), guidelines=load_guidelines(Path(cfg.guidelines)),
                      options={ds: {k: v for k, v in t.model_dump().items() if v is not None}
                               for ds, t in cfg.tasks.items()})
    judge = make_judge(cfg.judge.kind, cfg.judge.openai)
    weights = {ds: t.weight for ds, t in cfg.tasks.items()}

    torch.manual_seed(cfg.seed)
    model = disable_dropout(load_model(cfg.init_from))
    assert_no_dropout(model)
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    zero_stage = engine.zero_optimization_stage()
    if zero_stage >= 3 and cfg.rollout.backend == "transformers":
        raise TrainConfigError("ZeRO-3 partitions the weights: colocated transformers rollouts need ZeRO <= 2 "
                               "(use the vllm backend with ZeRO-3)")
    backend = _make_backend(cfg, engine, tokenizer)
    total = cfg.steps

    log = _Log(out_dir, rank == 0)
    rollouts_path = out_dir / "rollouts.jsonl"
    ok = False
    try:
        step = 0
        if resume is not None:
            root, tag = resume
            try:
                path, client = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True,
                                                      load_lr_scheduler_states=False)
            except Exception as e:
                raise ResumeError(f"{root / tag}: cannot load checkpoint ({type(e).__name__}: {e})") from e
            if path is None or client is None:
                raise ResumeError(f"{root / tag}: DeepSpeed found no loadable checkpoint there")
            step = int(client["step"])
            if step > total:
                raise ResumeError(f"{root / tag}: checkpoint is at step {step}, past this run's {total} steps")
            if rank == 0:
                for s, p in list_checkpoints(ckpt_root, complete_only=False):
                    if s > step:
                        shutil.rmtree(p, ignore_errors=True)
                log.truncate_after(step)
                _truncate_jsonl(rollouts_path, step)
            _say(rank, f"resumed from {root / tag} at step {step}")
        elif rank == 0:
            for p in [p for _, p in list_checkpoints(ckpt_root, complete_only=False)] + [out_dir / "final"]:
                shutil.rmtree(p, ignore_errors=True)
            for f in ("metrics.jsonl", "rollouts.jsonl"):
                (out_dir / f).unlink(missing_ok=True)
        log.write({"kind": "start", "step": step, "phase": "sim_rl", "world_size": world, "zero_stage": zero_stage,
                   "total_steps": total, "task_rows": {d: len(r) for d, r in task_rows.items()},
                   "task_rows_skipped": skipped, "resumed": resume is not None})
        _say(rank, f"sim_rl: tasks { {d: len(r) for d, r in task_rows.items()} } (skipped {skipped}), "
                   f"{cfg.prompts_per_step}x{cfg.rollouts_per_prompt} rollouts/step, steps {step}->{total}, "
                   f"ZeRO-{zero_stage}, judge {cfg.judge.kind}, invalid_policy {cfg.invalid_policy}")

        history: list[dict[str, float]] = []
        if rank == 0 and resume is not None and log.path.is_file():
            history = [json.loads(ln)["metrics"] for ln in log.path.read_text().splitlines()
                       if ln.strip() and json.loads(ln).get("kind") == "train"]

        def save_now(at: int) -> None:
            client = {"step": at, "phase": "sim_rl", "fingerprint": fingerprint, "world_size": world,
                      "total_steps": total}
            engine.save_checkpoint(str(ckpt_root), tag=tag_for(at), client_state=client)
            dist.barrier()
            if rank == 0:
                info = _write_marker(ckpt_root / tag_for(at), at, world, client)
                log.checkpoint(at, ckpt_root / tag_for(at), info)
                for _, old in list_checkpoints(ckpt_root)[:-cfg.keep_last]:
                    shutil.rmtree(old, ignore_errors=True)
            dist.barrier()

        engine.train()
        while step < total:
            t0 = time.perf_counter()
            rng = random.Random(f"{cfg.seed}:{step}")
            lr = lr_at(step, total, cfg.lr, cfg.warmup_ratio, cfg.min_lr_ratio)
            for g in optimizer.param_groups:
                g["lr"] = lr
            groups = sample_groups(task_rows, weights, cfg.prompts_per_step, rng)
            episodes, ids = [], []
            for gi in range(rank, len(groups), world):
                gid = f"s{step}g{gi}"
                for k in range(cfg.rollouts_per_prompt):
                    episodes.append(make_episode(groups[gi], ctx, random.Random(f"{cfg.seed}:{gid}:{k}")))
                    ids.append((gid, f"{gid}r{k}"))
            if cfg.rollout.backend == "vllm":
                backend.update_weights(policy_state_dict(engine))
            sampling = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                      top_p=cfg.rollout.top_p, seed=(cfg.seed * 1_000_003 + step * 9973 + rank))
            rollouts = run_episodes(episodes, ids, backend, tokenizer, sampling, require_think=cfg.require_think,
                                    max_prompt_tokens=cfg.rollout.max_prompt_tokens)
            t_roll = time.perf_counter() - t0
            score_rollouts(rollouts, episodes, judge)
            rows, bstats = build_update_rows(rollouts, cfg.invalid_policy, cfg.adv_eps)
            upd = _update(engine, rows, cfg, random.Random(f"{cfg.seed}:{step}:update"), pad_id, world)
            all_rollouts = [r for part in _gather(rollouts) for r in part]
            bsum = {k: sum(s[k] for s in _gather(bstats)) for k in bstats if k != "adv_abs_mean"}
            step += 1
            if rank == 0:
                m = step_metrics(all_rollouts)
                if m["rollouts"] != cfg.prompts_per_step * cfg.rollouts_per_prompt:
                    raise AccountingError(f"step {step}: {m['rollouts']} rollouts, expected "
                                          f"{cfg.prompts_per_step * cfg.rollouts_per_prompt}")
                dt = time.perf_counter() - t0
                m.update({f"batch/{k}": v for k, v in bsum.items()})
                m.update(upd)
                m.update({"lr": lr, "step_time_s": dt, "rollout_time_s": t_roll,
                          "episodes_per_s": len(all_rollouts) / max(t_roll, 1e-9)})
                history.append(m)
                if cfg.save_rollouts:
                    with open(rollouts_path, "a", encoding="utf-8") as f:
                        for r in all_rollouts:
                            f.write(json.dumps({"step": step, **r.to_json()}, default=str) + "\n")
                if step % cfg.log_every == 0 or step == total:
                    log.write({"kind": "train", "step": step, "metrics": m}, m)
                    _say(rank, f"step {step}/{total} raw {m.get('reward/raw_mean', float('nan')):.3f} "
                               f"update {m.get('reward/update_mean', float('nan')):.3f} "
                               f"fmt_fail {m.get('format_failure_rate', float('nan')):.2f} "
                               f"invalid {int(m['invalid_total'])} loss {m.get('update/ppo_loss', float('nan')):.4f} "
                               f"{dt:.2f}s")
            if step % cfg.save_every == 0 or step == total:
                save_now(step)
        if not (ckpt_root / tag_for(total) / MARKER).is_file():
            save_now(total)
        summary = None
        if rank == 0:
            final = out_dir / "final"
            _export(engine, tokenizer, ckpt_root, tag_for(total), zero_stage, final)
            summary = {"phase": "sim_rl", "steps": total, "world_size": world, "zero_stage": zero_stage,
                       "judge": cfg.judge.kind, "invalid_policy": cfg.invalid_policy,
                       "task_rows": {d: len(r) for d, r in task_rows.items()}, "task_rows_skipped": skipped,
                       **_summary(history), "checkpoint": str((ckpt_root / tag_for(total)).resolve()),
                       "wall_time_s_this_run": time.time() - t_start}
            (final / "training_summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
            log.write({"kind": "final", "step": total, "path": str(final.resolve())})
            if log.mlflow is not None:
                log.mlflow.log_dict(summary, "training_summary.json")
            _say(rank, f"exported {final}")
        dist.barrier()
        ok = True
        return summary
    finally:
        log.close(ok)
