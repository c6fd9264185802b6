"""The PPO-clip update over one rollout batch (SPEC §3.2), shared by the simulator and agent GRPO
recipes. The CSD recipe (``mimesis_lab.jobs.agent_csd``) writes its own copy with the distillation
term added, so that its loss is visible in one place.

With ``kl_coef > 0`` (not the paper's: SPEC §2.3 has no KL) each micro-chunk adds
``kl_coef * L_KL`` (:func:`mimesis_lab.rl.losses.kl_penalty`) against a frozen copy of the initial
policy (:func:`reference_policy`), whose log-probs of the chunk's trained tokens come from one extra
forward without gradient (:func:`kl_term`).

With ``ptx_coef > 0`` (not the paper's either; InstructGPT's PPO-ptx) each optimizer step also adds
``ptx_coef * L_SFT``: the token-mean cross-entropy of the policy on ``ptx_rows`` conversations drawn
from ``ptx_data`` (:class:`Replay`, :func:`ptx_pass`), the demonstrations the policy was warm-started
on, so what the RL signal does not reach is not forgotten.

Loss = the token mean of :func:`mimesis_lab.rl.losses.ppo_clip_loss` over the minibatch's trained
tokens on *all* ranks: each micro-chunk's loss is weighted ``n_chunk / N * world`` and DeepSpeed
averages gradients over ranks (÷ world), so the gradient is that of the global token mean whatever
the world size or chunking, and whatever a row holds (a simulator segment, a whole simulator
rollout as a prefix-tree row with its 4D mask and position ids, an agent trajectory). The recipe
owns the accumulation boundary (``engine.step()`` once per minibatch; the DeepSpeed JSON sets
``managed_gradient_accumulation: false``). A rank with fewer chunks runs zero-weight passes so the
collectives stay in step.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from mimesis_lab.rl.losses import kl_penalty, ppo_clip_loss, sft_loss
from mimesis_lab.rl.policy import UpdateRow, micro_chunks, minibatch_plan, pad_update_rows, token_logprobs
from mimesis_lab.train.checkpoint import CHECKPOINTS, resume_point, run_fingerprint
from mimesis_lab.train.metrics_log import window_means
from mimesis_lab.train.runtime import (TrainConfigError, all_reduce, dist_init, load_ds_config, make_engine,
                                       require_model_folder, say)

__all__ = ["load_rl_ds_config", "policy_engine", "reference_policy", "PolicyJob", "start_policy_job", "rollout_summary",
           "ppo_update", "kl_weight", "kl_term", "chunk_policy_loss", "PPOStats", "zero_weight_pass", "Replay",
           "load_replay", "ptx_pass"]


class PPOStats:
    """Running sums of the update statistics of one step (this rank), reduced over ranks by :meth:`result`."""

    KEYS = ("loss_sum", "tokens", "clipped", "kl_sum", "mismatch_sum", "mismatch_tokens", "kl_ref_sum",
            "ptx_sum", "ptx_passes")

    def __init__(self, with_ref: bool = False) -> None:
        self.with_ref = with_ref
        self.sums = dict.fromkeys(self.KEYS, 0.0)
        self.opt_steps = 0.0
        self.grad_norm_sum = 0.0
        self.grad_norms = 0.0

    def add(self, loss: torch.Tensor, logp: torch.Tensor, batch: dict[str, torch.Tensor], clip_eps: float,
            first_pass: bool, kl_ref: float | None = None) -> None:
        """One micro-chunk's PPO loss and log-probs; ``kl_ref``: its :func:`kl_term` value (token mean)."""
        with torch.no_grad():
            n_here = float(batch["mask"].sum())
            if kl_ref is not None:
                self.sums["kl_ref_sum"] += kl_ref * n_here
            sel = batch["mask"] != 0
            log_ratio = (logp.detach() - batch["old_logp"])[sel]
            ratio = log_ratio.exp()
            self.sums["loss_sum"] += float(loss.detach()) * n_here
            self.sums["tokens"] += n_here
            self.sums["clipped"] += float(((ratio - 1).abs() > clip_eps).sum())
            self.sums["kl_sum"] += float(((ratio - 1) - log_ratio).sum())
            if first_pass:
                self.sums["mismatch_sum"] += float(log_ratio.abs().sum())
                self.sums["mismatch_tokens"] += n_here

    def optimizer_step(self, engine) -> None:
        engine.step()
        self.opt_steps += 1
        gn = engine.get_global_grad_norm() if engine.zero_optimization_stage() > 0 else None
        if gn is not None and math.isfinite(float(gn)):
            self.grad_norm_sum += float(gn)
            self.grad_norms += 1

    def result(self) -> dict[str, float]:
        loss_sum, tokens, clipped, kl_sum, mm_sum, mm_tok, kl_ref_sum, ptx_sum, ptx_passes = all_reduce(
            [self.sums[k] for k in self.KEYS])
        out = {"update/opt_steps": self.opt_steps, "update/tokens": tokens}
        if tokens:
            out.update({"update/ppo_loss": loss_sum / tokens, "update/clip_frac": clipped / tokens,
                        "update/approx_kl": kl_sum / tokens})
            if self.with_ref:
                out["update/kl_ref"] = kl_ref_sum / tokens   # k3 KL to the initial policy (kl_coef > 0 only)
        if ptx_passes:
            out["update/ptx_loss"] = ptx_sum / ptx_passes   # replay cross-entropy (ptx_coef > 0 only)
        if mm_tok:
            out["update/logp_mismatch"] = mm_sum / mm_tok   # rollout vs trainer log-probs before the first step
        if self.grad_norms:
            out["update/grad_norm"] = self.grad_norm_sum / self.grad_norms
        return out


def zero_weight_pass(engine) -> torch.Tensor:
    """A 1x2 dummy forward whose loss is 0: a rank with fewer chunks still takes part in the collectives."""
    dummy = torch.zeros((1, 2), dtype=torch.long, device=engine.device)
    return token_logprobs(engine, dummy, torch.ones_like(dummy))


def kl_term(ref: Any, batch: dict[str, torch.Tensor], logp: torch.Tensor) -> torch.Tensor:
    """``L_KL`` (:func:`~mimesis_lab.rl.losses.kl_penalty`, token mean over ``batch["mask"]``) of the policy's
    ``logp`` against the frozen reference ``ref`` on the same padded chunk (one forward, no gradient)."""
    with torch.no_grad():
        ref_logp = token_logprobs(ref, batch["input_ids"], batch["attention_mask"], batch.get("position_ids"),
                                  need=batch["mask"])
    return kl_penalty(logp, ref_logp, batch["mask"])


def kl_weight(cfg: Any, ref: Any) -> float:
    """``cfg.kl_coef`` (0 for a section without one), checked: a positive weight needs the reference policy."""
    kl_coef = float(getattr(cfg, "kl_coef", 0.0))
    if kl_coef > 0 and ref is None:
        raise ValueError("kl_coef > 0 needs the reference policy (reference_policy(cfg))")
    return kl_coef


def chunk_policy_loss(logp: torch.Tensor, batch: dict[str, torch.Tensor], cfg: Any, stats: PPOStats,
                      first_pass: bool, ref: Any = None, kl_coef: float = 0.0) -> torch.Tensor:
    """One micro-chunk's ``L_PPO`` (:func:`~mimesis_lab.rl.losses.ppo_clip_loss`, recorded in ``stats`` with the
    chunk's KL), plus ``kl_coef * L_KL`` (:func:`kl_term`) where ``kl_coef > 0``: the policy part of the loss that
    GRPO and CSD share."""
    loss = ppo_clip_loss(logp, batch["old_logp"], batch["adv"], batch["mask"], cfg.clip_eps)
    kl = kl_term(ref, batch, logp) if kl_coef > 0 else None
    stats.add(loss, logp, batch, cfg.clip_eps, first_pass, None if kl is None else float(kl.detach()))
    return loss if kl is None else loss + kl_coef * kl


@dataclass
class Replay:
    """The demonstrations of the ptx term (:func:`load_replay`): one :class:`UpdateRow` per conversation, its
    trained tokens the ``assistant`` turns' (SFT's loss mask), no log-probs or advantages."""

    rows: list[UpdateRow]
    coef: float
    per_step: int
    #: Conversations left out, by reason (``tokenize_error``, ``too_long``, ``no_target``).
    skipped: dict[str, int]


def load_replay(cfg: Any, tokenizer: Any) -> Replay | None:
    """The :class:`Replay` of ``cfg.ptx_data`` when ``cfg.ptx_coef > 0`` (else ``None``): each conversation
    tokenised as the SFT phases do (:func:`mimesis_lab.chat.tokenize_many`, ``assistant`` trained); one longer
    than the rollout's ``max_total_tokens`` (where the section has one) is left out and counted. An unreadable or
    empty file, or one where nothing is left, raises :class:`TrainConfigError` naming it."""
    coef = float(getattr(cfg, "ptx_coef", 0.0))
    if coef <= 0:
        return None
    from mimesis_lab.chat import tokenize_many
    from mimesis_lab.train.data import DataError, read_conversations

    try:
        convs = read_conversations(cfg.ptx_data, expand=False, seed=cfg.seed)
    except DataError as e:
        raise TrainConfigError(f"ptx_data: {e}") from None
    limit = getattr(getattr(cfg, "rollout", None), "max_total_tokens", None)
    skipped = {"tokenize_error": 0, "too_long": 0, "no_target": 0}
    rows: list[UpdateRow] = []
    for i, res in enumerate(tokenize_many(tokenizer, convs, "assistant", errors="return")):
        if isinstance(res, Exception):
            skipped["tokenize_error"] += 1
            continue
        ids, mask = res
        positions = tuple(t for t, m in enumerate(mask) if m and t > 0)
        if limit is not None and len(ids) > limit:
            skipped["too_long"] += 1
        elif not positions:
            skipped["no_target"] += 1
        else:
            rows.append(UpdateRow(tuple(ids), positions, (0.0,) * len(positions), (0.0,) * len(positions),
                                  "ptx", f"ptx-{i}"))
    if not rows:
        raise TrainConfigError(f"{cfg.ptx_data}: no conversation to replay is left of {len(convs)} "
                               f"(left out: {skipped})")
    return Replay(rows, coef, int(cfg.ptx_rows), skipped)


def ptx_pass(engine, replay: Replay | None, rng: random.Random, pad_id: int, stats: PPOStats) -> None:
    """One optimizer step's replay term: ``replay.coef * L_SFT`` backpropagated, ``L_SFT`` the token-mean
    cross-entropy of ``replay.per_step`` conversations drawn from ``rng`` (without replacement within the
    draw), on this rank (DeepSpeed averages the ranks' gradients). Nothing happens without a replay."""
    if replay is None:
        return
    pick = rng.sample(range(len(replay.rows)), min(replay.per_step, len(replay.rows)))
    b = pad_update_rows([replay.rows[i] for i in pick], pad_id, engine.device)
    logp = token_logprobs(engine, b["input_ids"], b["attention_mask"], b.get("position_ids"), need=b["mask"])
    ce = sft_loss(logp, b["mask"])
    engine.backward(ce * replay.coef, scale_wrt_gas=False)
    stats.sums["ptx_sum"] += float(ce.detach())
    stats.sums["ptx_passes"] += 1.0


def ppo_update(engine, rows: Sequence[UpdateRow], cfg: Any, rng: random.Random, pad_id: int, world: int,
               ref: Any = None, replay: Replay | None = None) -> dict[str, float]:
    """``cfg.ppo_epochs`` passes over this rank's rows, ``cfg.minibatches`` optimizer steps each;
    every rank runs the same number of backward/step calls. Returns the ``update/*`` metrics.
    ``ref`` (:func:`reference_policy`, given when ``cfg.kl_coef > 0``): the loss per chunk is
    ``L_PPO + kl_coef * L_KL`` (:func:`kl_term`), and ``update/kl_ref`` is logged. ``replay``
    (:func:`load_replay`, given when ``cfg.ptx_coef > 0``): each optimizer step adds ``ptx_coef * L_SFT``
    (:func:`ptx_pass`), logged as ``update/ptx_loss``."""
    kl_coef = kl_weight(cfg, ref)
    stats = PPOStats(with_ref=kl_coef > 0)
    first = True
    for _ in range(cfg.ppo_epochs):
        for part in minibatch_plan(len(rows), cfg.minibatches, rng):
            chunks = micro_chunks(part, cfg.micro_rows) if part else []
            n_tok, _ = all_reduce([float(sum(rows[i].n_response for i in part)), 0.0])
            n_micro = int(all_reduce([float(len(chunks))], "max")[0])
            if n_tok == 0:
                continue
            for k in range(n_micro):
                if k < len(chunks):
                    b = pad_update_rows([rows[i] for i in chunks[k]], pad_id, engine.device)
                    logp = token_logprobs(engine, b["input_ids"], b["attention_mask"], b.get("position_ids"),
                                          need=b["mask"])
                    loss = chunk_policy_loss(logp, b, cfg, stats, first, ref, kl_coef)
                    engine.backward(loss * (float(b["mask"].sum()) / n_tok) * world, scale_wrt_gas=False)
                else:
                    engine.backward(zero_weight_pass(engine).sum() * 0.0, scale_wrt_gas=False)
            first = False
            ptx_pass(engine, replay, rng, pad_id, stats)
            stats.optimizer_step(engine)
    return stats.result()


def load_rl_ds_config(phase: str, cfg: Any) -> dict[str, Any]:
    """The DeepSpeed JSON of an RL phase: the recipe owns the accumulation boundary (the number of
    segments varies per step), so the JSON must say ``"managed_gradient_accumulation": false``."""
    ds_config = load_ds_config(cfg.deepspeed_config)
    if ds_config.get("managed_gradient_accumulation", True):
        raise TrainConfigError(f"{cfg.deepspeed_config}: {phase} owns the accumulation boundary (variable segment "
                               "counts per step); set \"managed_gradient_accumulation\": false")
    return ds_config


def policy_engine(phase: str, cfg: Any, ds_config: dict[str, Any]):
    """``(tokenizer, engine, optimizer)`` of the policy at ``cfg.init_from``, dropout off (the
    rollout's and the update's log-probs must agree)."""
    from mimesis_lab.models import assert_no_dropout, disable_dropout, load_model
    from mimesis_lab.tokenizer import load_tokenizer

    require_model_folder(f"{phase}.init_from", cfg.init_from)
    if getattr(getattr(cfg, "user", None), "kind", None) == "simulator":
        require_model_folder(f"{phase}.user.model_path", cfg.user.model_path)
    tokenizer = load_tokenizer(cfg.init_from)
    torch.manual_seed(cfg.seed)
    model = disable_dropout(load_model(cfg.init_from))
    assert_no_dropout(model)
    engine, optimizer = make_engine(model, cfg, ds_config)
    if engine.zero_optimization_stage() >= 3 and cfg.rollout.backend == "transformers":
        raise TrainConfigError("ZeRO-3 partitions the weights: colocated transformers rollouts need ZeRO <= 2 "
                               "(use the vllm backend with ZeRO-3)")
    return tokenizer, engine, optimizer


def reference_policy(cfg: Any, device: Any = None):
    """The frozen reference of the KL term: the initial policy (``cfg.init_from``), dropout off, no gradients;
    ``None`` when ``cfg.kl_coef`` is 0 (the paper's recipes: nothing is loaded)."""
    if float(getattr(cfg, "kl_coef", 0.0)) <= 0:
        return None
    from mimesis_lab.models import disable_dropout, load_model

    ref = disable_dropout(load_model(cfg.init_from)).eval().requires_grad_(False)
    return ref.to(device) if device is not None else ref


@dataclass
class PolicyJob:
    """What an RL recipe has once its job is open (:func:`start_policy_job`)."""

    rank: int
    world: int
    fingerprint: str
    resume: tuple[Path, str] | None
    tokenizer: Any
    engine: Any
    optimizer: Any
    pad_id: int
    #: When the job's own work began (after the process group, the fingerprint and the resume check; the same
    #: point as the SFT job's): the start of its ``wall_time_s``, model and engine loading included.
    t_start: float
    #: The frozen initial policy of the KL term (:func:`reference_policy`); None when ``kl_coef`` is 0.
    ref: Any = None
    #: The demonstrations of the ptx term (:func:`load_replay`); None when ``ptx_coef`` is 0.
    replay: Replay | None = None

    def info(self) -> dict[str, Any]:
        """What the run's info records of the optional terms: the replayed conversations and those left out."""
        if self.replay is None:
            return {}
        return {"ptx_conversations": len(self.replay.rows), "ptx_skipped": dict(self.replay.skipped)}


def start_policy_job(phase: str, cfg: Any, inputs: dict[str, str | None], job_module: str,
                     extra: dict[str, Any] | None = None) -> PolicyJob:
    """The opening every RL recipe shares: the process group (checked against ``cfg.world_size``), the RL
    DeepSpeed JSON, the run fingerprint (:func:`~mimesis_lab.train.checkpoint.run_fingerprint` over ``inputs``
    and ``ptx_data`` where replayed, ``extra`` and ``job_module``'s code), where to resume (fails fast, before any
    heavy work), the policy engine with dropout off, the KL reference and the ptx replay (when switched on)."""
    rank, world = dist_init()
    if float(getattr(cfg, "ptx_coef", 0.0)) > 0:      # the replayed file is part of the run's identity
        inputs = {**inputs, "ptx_data": cfg.ptx_data}
    if world != cfg.world_size:
        raise TrainConfigError(f"{phase}.world_size is {cfg.world_size} but {world} processes were launched")
    ds_config = load_rl_ds_config(phase, cfg)
    fingerprint = run_fingerprint(phase, cfg, ds_config, inputs, job_module=job_module, extra=extra)
    ckpt_root = Path(cfg.output_dir) / CHECKPOINTS
    resume = resume_point(cfg.resume, ckpt_root, world, fingerprint, lambda m: say(rank, m))
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    tokenizer, engine, optimizer = policy_engine(phase, cfg, ds_config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return PolicyJob(rank, world, fingerprint, resume, tokenizer, engine, optimizer, pad_id, t_start,
                     reference_policy(cfg, engine.device), load_replay(cfg, tokenizer))


def rollout_summary(history: list[dict[str, float]], keys: tuple[str, ...], keep_missing: bool = True
                    ) -> dict[str, Any]:
    """The summary of an RL run: first/last-window means of ``keys`` (``keep_missing=False`` leaves out
    the keys a run never logged) and the total of rollouts and of invalid rollouts."""
    windows = window_means(history, keys)
    return {**{k: v for k, v in windows.items() if keep_missing or v is not None},
            "invalid_rollouts_total": sum(r.get("invalid_total", 0.0) for r in history),
            "rollouts_total": sum(r.get("rollouts", 0.0) for r in history)}
