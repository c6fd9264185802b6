"""The DeepSpeed harness shared by the RL jobs (``sim_rl``, ``agent_grpo``): one place for
distributed setup, the caller-owned accumulation boundary, the PPO-clip update, checkpoints,
``resume: auto`` (same markers and fingerprint rule as the SFT jobs), per-step logging to
``metrics.jsonl`` + MLflow, the episode log and the final ``zero_to_fp32`` export.

A phase plugs in with three callables (see :func:`run_rl_job`): ``setup(job)`` once the engine
exists, ``step(job, step)`` for one rollout batch + update (returns rank 0's metrics and episode
records), and ``summary(history)`` for the final summary fields.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from mimesis_lab.progress import Progress
from mimesis_lab.rl.losses import ppo_clip_loss
from mimesis_lab.rl.policy import micro_chunks, minibatch_indices, pad_update_rows, token_logprobs
from mimesis_lab.train.loop import (CHECKPOINTS, MARKER, ResumeError, TrainConfigError, _dist_init, _export, _Log,
                                    _param_groups, _say, clear_outputs, drop_checkpoints_after, load_ds_config,
                                    load_resume_checkpoint, resolve_resume, save_checkpoint, tag_for, truncate_jsonl)
from mimesis_lab.train.schedule import lr_at

__all__ = ["Job", "run_rl_job", "all_reduce", "gather", "ppo_update", "policy_state_dict", "make_rollout_backend",
           "window_means"]


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def gather(obj: Any) -> list[Any]:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def make_rollout_backend(cfg: Any, engine, tokenizer):
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


AUX_KEYS = ("loss_sum", "tokens", "gate_sum", "delta_sum", "placebo_tokens", "teacher_minus_student_sum")


def token_logprobs_and_cache(model, input_ids: torch.Tensor, attention_mask: torch.Tensor
                             ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """:func:`token_logprobs` plus the forward's detached KV cache (CSD reuses the history's keys
    and values for its teacher rows instead of recomputing them)."""
    from mimesis_lab.rl.agent_csd import cache_layers

    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True)
    logits = out.logits[:, :-1, :].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logp, cache_layers(out.past_key_values)


def ppo_update(engine, rows, cfg, rng: random.Random, pad_id: int, world: int, aux: Any = None) -> dict[str, float]:
    """PPO clip passes over this rank's rows; every rank runs the same number of backward/step calls.

    ``aux`` (optional, e.g. :class:`mimesis_lab.rl.agent_csd.CSD`) adds ``aux.alpha * L_aux`` with
    ``L_aux`` a token mean over the minibatch's ``aux.tokens(row)`` tokens: per micro-chunk
    ``aux.loss(engine, chunk_rows, batch, logp)`` returns the chunk's token mean, its token count
    and stat sums (:data:`AUX_KEYS`), reported as ``csd/loss``, ``csd/gate_mean``, ``csd/delta_mean``…
    """
    device = engine.device
    stats = {"loss_sum": 0.0, "tokens": 0.0, "clipped": 0.0, "kl_sum": 0.0, "mismatch_sum": 0.0,
             "mismatch_tokens": 0.0, "opt_steps": 0.0, "grad_norm_sum": 0.0, "grad_norms": 0.0}
    aux_stats = dict.fromkeys(AUX_KEYS, 0.0)
    use_aux = aux is not None and aux.alpha > 0
    first = True
    for _ in range(cfg.ppo_epochs):
        parts = minibatch_indices(len(rows), cfg.minibatches, rng) if rows else []
        parts += [[] for _ in range(cfg.minibatches - len(parts))]
        for part in parts:
            n_tok_local = float(sum(rows[i].n_response for i in part))
            n_aux_local = float(sum(aux.tokens(rows[i]) for i in part)) if use_aux else 0.0
            chunks = micro_chunks(part, cfg.micro_rows) if part else []
            n_tok, n_aux = all_reduce([n_tok_local, n_aux_local])
            n_micro = int(all_reduce([float(len(chunks))], "max")[0])
            if n_tok == 0:
                continue
            for k in range(n_micro):
                if k < len(chunks):
                    chunk_rows = [rows[i] for i in chunks[k]]
                    b = pad_update_rows(chunk_rows, pad_id, device)
                    if use_aux and getattr(aux, "needs_cache", False):
                        logp, b["kv"] = token_logprobs_and_cache(engine, b["input_ids"], b["attention_mask"])
                    else:
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
                    total = loss * (n_here / n_tok) * world
                    if use_aux:
                        a_loss, a_n, a_stats = aux.loss(engine, chunk_rows, b, logp)
                        if a_n and n_aux:
                            total = total + aux.alpha * a_loss * (a_n / n_aux) * world
                        for key in AUX_KEYS:
                            aux_stats[key] += a_stats.get(key, 0.0)
                    engine.backward(total, scale_wrt_gas=False)
                else:   # this rank has fewer chunks: a zero-weight pass keeps the collectives in step
                    dummy = torch.zeros((1, 2), dtype=torch.long, device=device)
                    logp = token_logprobs(engine, dummy, torch.ones_like(dummy))
                    if use_aux:
                        aux.loss(engine, [], {"input_ids": dummy}, logp[:, :0])
                    engine.backward(logp.sum() * 0.0, scale_wrt_gas=False)
            first = False
            engine.step()
            stats["opt_steps"] += 1
            gn = engine.get_global_grad_norm() if engine.zero_optimization_stage() > 0 else None
            if gn is not None and math.isfinite(float(gn)):
                stats["grad_norm_sum"] += float(gn)
                stats["grad_norms"] += 1
    tot = all_reduce([stats[k] for k in ("loss_sum", "tokens", "clipped", "kl_sum", "mismatch_sum",
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
    if use_aux:
        a = dict(zip(AUX_KEYS, all_reduce([aux_stats[k] for k in AUX_KEYS])))
        out["csd/tokens"] = a["tokens"]
        if a["tokens"]:
            out.update({"csd/loss": a["loss_sum"] / a["tokens"], "csd/gate_mean": a["gate_sum"] / a["tokens"],
                        "csd/delta_mean": a["delta_sum"] / a["tokens"],
                        "csd/teacher_minus_student": a["teacher_minus_student_sum"] / a["tokens"],
                        "csd/placebo_token_share": a["placebo_tokens"] / a["tokens"]})
    return out




def window_means(history: list[dict[str, float]], keys: tuple[str, ...], k: int = 3) -> dict[str, Any]:
    """``first_<key>`` / ``last_<key>``: means over the first and last ``k`` steps (``/`` -> ``_``)."""
    def window(key: str, rows: list[dict[str, float]]) -> float | None:
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else None

    out: dict[str, Any] = {}
    for key in keys:
        name = key.replace("/", "_")
        out[f"first_{name}"] = window(key, history[:k])
        out[f"last_{name}"] = window(key, history[-k:])
    return out


@dataclass
class Job:
    """What a phase's ``setup``/``step`` callables see."""

    phase: str
    cfg: Any
    rank: int
    world: int
    engine: Any
    optimizer: Any
    tokenizer: Any
    pad_id: int
    zero_stage: int
    out_dir: Path
    state: dict[str, Any] = field(default_factory=dict)

    def set_lr(self, step: int) -> float:
        lr = lr_at(step, self.cfg.steps, self.cfg.lr, self.cfg.warmup_ratio, self.cfg.min_lr_ratio)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        return lr


def run_rl_job(phase: str, cfg: Any, fingerprint_fn: Callable[[dict[str, Any]], str],
               setup: Callable[[Job], dict[str, Any]], step_fn: Callable[[Job, int], tuple[dict | None, list[dict]]],
               summary_fn: Callable[[list[dict[str, float]]], dict[str, Any]]) -> dict[str, Any] | None:
    """Run ``cfg.steps`` RL steps of ``phase`` on this rank; rank 0 returns the summary.

    ``setup(job)`` returns start-info fields (logged); ``step_fn(job, step)`` does one step (``step``
    counts from 0) and returns rank 0's metrics dict and episode records (other ranks: ``None, []``).
    """
    import torch.distributed as dist
    import deepspeed

    from mimesis_lab.models import assert_no_dropout, disable_dropout, load_model
    from mimesis_lab.tokenizer import load_tokenizer

    rank, world = _dist_init()
    if world != cfg.world_size:
        raise TrainConfigError(f"{phase}.world_size is {cfg.world_size} but {world} processes were launched")
    out_dir = Path(cfg.output_dir)
    ckpt_root = out_dir / CHECKPOINTS
    ds_config = load_ds_config(cfg.deepspeed_config)
    if ds_config.get("managed_gradient_accumulation", True):
        raise TrainConfigError(f"{cfg.deepspeed_config}: {phase} owns the accumulation boundary (variable segment "
                               "counts per step); set \"managed_gradient_accumulation\": false")
    fingerprint = fingerprint_fn(ds_config)
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
    torch.manual_seed(cfg.seed)
    model = disable_dropout(load_model(cfg.init_from))
    assert_no_dropout(model)
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    zero_stage = engine.zero_optimization_stage()
    if zero_stage >= 3 and cfg.rollout.backend == "transformers":
        raise TrainConfigError("ZeRO-3 partitions the weights: colocated transformers rollouts need ZeRO <= 2 "
                               "(use the vllm backend with ZeRO-3)")
    job = Job(phase, cfg, rank, world, engine, optimizer, tokenizer, pad_id, zero_stage, out_dir)
    info = setup(job)
    total = cfg.steps

    log = _Log(out_dir, rank == 0)
    episodes_path = out_dir / "rollouts.jsonl"
    ok = False
    try:
        step = 0
        if resume is not None:
            root, tag = resume
            client = load_resume_checkpoint(engine, root, tag)
            step = int(client["step"])
            if step > total:
                raise ResumeError(f"{root / tag}: checkpoint is at step {step}, past this run's {total} steps")
            if rank == 0:
                drop_checkpoints_after(ckpt_root, step)
                log.truncate_after(step)
                truncate_jsonl(episodes_path, step)
            _say(rank, f"resumed from {root / tag} at step {step}")
        elif rank == 0:
            clear_outputs(out_dir, ckpt_root, ("metrics.jsonl", "rollouts.jsonl"))
        log.write({"kind": "start", "step": step, "phase": phase, "world_size": world, "zero_stage": zero_stage,
                   "total_steps": total, "resumed": resume is not None, **info})
        _say(rank, f"{phase}: {info}, steps {step}->{total}, ZeRO-{zero_stage}")

        history: list[dict[str, float]] = []
        if rank == 0 and resume is not None and log.path.is_file():
            history = [json.loads(ln)["metrics"] for ln in log.path.read_text().splitlines()
                       if ln.strip() and json.loads(ln).get("kind") == "train"]

        def save_now(at: int) -> None:
            client = {"step": at, "phase": phase, "fingerprint": fingerprint, "world_size": world,
                      "total_steps": total}
            save_checkpoint(engine, ckpt_root, at, client, log, cfg.keep_last, rank, world)

        engine.train()
        prog = Progress(total, phase, unit="step", initial=step, mode="off")   # rate + ETA for the step lines
        while step < total:
            t0 = time.perf_counter()
            metrics, records = step_fn(job, step)
            step += 1
            prog.update(1)
            if rank == 0 and metrics is not None:
                metrics["step_time_s"] = time.perf_counter() - t0
                history.append(metrics)
                if getattr(cfg, "save_rollouts", True) and records:
                    with open(episodes_path, "a", encoding="utf-8") as f:
                        for r in records:
                            f.write(json.dumps({"step": step, **r}, default=str) + "\n")
                if step % cfg.log_every == 0 or step == total:
                    log.write({"kind": "train", "step": step, "metrics": metrics}, metrics)
                    shown = {k: round(v, 4) for k, v in metrics.items() if k in job.state.get("show", ())}
                    _say(rank, prog.line({**shown, "step_s": round(metrics["step_time_s"], 2)}))
            if step % cfg.save_every == 0 or step == total:
                save_now(step)
        if not (ckpt_root / tag_for(total) / MARKER).is_file():
            save_now(total)
        summary = None
        if rank == 0:
            final = out_dir / "final"
            _export(engine, tokenizer, ckpt_root, tag_for(total), zero_stage, final)
            summary = {"phase": phase, "steps": total, "world_size": world, "zero_stage": zero_stage, **info,
                       **summary_fn(history), "checkpoint": str((ckpt_root / tag_for(total)).resolve()),
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
