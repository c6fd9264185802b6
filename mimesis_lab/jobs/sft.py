"""SFT-style training — user-side mid-training, ThoughtTrace SFT, the agent's warm start (SPEC §2.1–2.2, §3.2).

Launch (one process per rank; the training flow does this for ``dvc repro``)::

    deepspeed --num_gpus 1 --module mimesis_lab.jobs.sft --phase midtrain --params params.yaml
    torchrun --nproc_per_node 2 -m mimesis_lab.jobs.sft --phase sft --params params.yaml
    python -m mimesis_lab.jobs.sft --phase agent_sft            # world size 1, no launcher

Three phases share this recipe and differ only in data and settings (``params.yaml``): ``midtrain``
(role-swapped chats; the human turns sit in the trained assistant slot), ``sft`` (ThoughtTrace:
``<think>reasons</think>utterance`` targets) and ``agent_sft`` (rewarded oracle traces in the gyms).

The recipe, top to bottom: tokenise the splits (:mod:`mimesis_lab.train.data`), or read them from the
token cache (:mod:`mimesis_lab.train.token_cache`: rank 0 builds it, the other ranks read it), build or load the
model, ``deepspeed.initialize`` with the phase's JSON and our own ``torch.optim.AdamW`` (the JSON
names no optimizer or scheduler; the lr of every step comes from :func:`~mimesis_lab.train.schedule.lr_at`),
resume or start fresh, then the loop. Loss = global token mean: for one optimizer step with ``N``
scored tokens over all ranks and micro-steps, micro-step loss = ``ce_sum_micro * world / N`` and
``engine.backward(..., scale_wrt_gas=False)``: DeepSpeed averages gradients over ranks (÷ world)
and we turn off its ÷ gradient_accumulation_steps, so the gradient is that of
``sum(ce over all scored tokens) / N`` whatever the world size and accumulation split. ``N`` is known
on every rank from the data plan (no communication). Exact resume: the data order is a pure function
of ``(seed, step)`` (:class:`~mimesis_lab.train.data.DataPlan`), the lr a pure function of the step, and
torch's RNG is reseeded from ``(seed, step, rank)`` at every step; a killed and rerun job ends with
weights equal to an uninterrupted one (tested bit-exact). Checkpoints, the fingerprint and the export:
:mod:`mimesis_lab.train.checkpoint`; what runs on CPU: ``docs/cpu-notes.md``.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from mimesis_lab.models import supports_logits_to_keep
from mimesis_lab.packing import IGNORE_INDEX, collate, masked_token_ce_sum
from mimesis_lab.progress import Progress
from mimesis_lab.train.checkpoint import (CHECKPOINTS, MARKER, ResumeError, checkpoint_at, clear_outputs,
                                          drop_checkpoints_after, export_final, final_checkpoint,
                                          load_resume_checkpoint, resume_point, run_fingerprint, save_checkpoint)
from mimesis_lab.train.data import (DataPlan, batch_efficiency, batch_units, eval_batches, resolve_batching,
                                    target_count)
from mimesis_lab.train.metrics_log import MetricsLog, PhaseClock
from mimesis_lab.train.runtime import (TrainConfigError, all_reduce, dist_init, job_main, load_ds_config,
                                       make_engine, require_model_folder, say, set_lr)
from mimesis_lab.train.schedule import lr_at
from mimesis_lab.train.token_cache import CACHE_DIR, load_split_rows

__all__ = ["PHASES", "train_sft", "main"]

PHASES = ("midtrain", "sft", "agent_sft")
LONG_ROWS = 8192              # above this max_len, packed attention via position_ids (no O(L^2) mask)


def after_close_mask(input_ids: torch.Tensor, labels: torch.Tensor, close_id: int) -> torch.Tensor:
    """``[B, T]`` bool: target positions (label set) at or after a ``close_id`` token of the same run of
    targets (one turn's reply), i.e. where the reply is past its ``</think>`` and a think tag is wrong."""
    target = labels != IGNORE_INDEX
    start = target & ~torch.nn.functional.pad(target, (1, 0))[:, :-1]        # first position of each run
    run = torch.cumsum(start.long(), dim=1) * target.long()                  # run number, 0 outside runs
    close = ((input_ids == close_id) & target).long()
    seen = torch.zeros_like(close)
    for r in range(1, int(run.max()) + 1 if run.numel() else 1):             # runs per row are few (turns)
        inside = run == r
        seen = torch.where(inside, torch.cumsum(close * inside.long(), dim=1), seen)
    return target & (seen > 0)


def forward_ce(engine, rows, max_len: int, pad_id: int, mask_mode: str, dtype,
               unlikely: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of token cross-entropies over the target tokens, their count)`` of a micro-batch.
    ``mask_mode="padding"`` (grouped batching) pads only to the longest row of the micro-batch.
    ``unlikely`` = ``(close_id, *ids)``: also the format unlikelihood term (Welleck et al., 2020),
    ``-sum log(1 - p(id))`` over ``ids`` at every target position past the reply's ``close_id``
    (:func:`after_close_mask`), returned as a third value."""
    width = max(len(r) for r in rows) if mask_mode == "padding" else max_len
    batch = collate(rows, width, pad_id, mask=mask_mode, dtype=dtype)
    labels = batch.pop("labels").to(engine.device)
    batch = {k: v.to(engine.device) for k, v in batch.items()}
    target = labels != IGNORE_INDEX
    kept = supports_logits_to_keep(engine)
    if kept:   # the LM head on the target positions only: logits [n_targets, vocab]
        logits = engine(**batch, use_cache=False, logits_to_keep=target).logits
    else:
        logits = engine(**batch, use_cache=False).logits
    s, c = masked_token_ce_sum(logits, labels[target] if kept else labels)
    if unlikely is None:
        return s, c
    where = after_close_mask(batch["input_ids"], labels, unlikely[0])
    where = where[target] if kept else where
    probs = torch.softmax(logits[where].float(), dim=-1)[:, list(unlikely[1:])]
    ul = -torch.log1p(-probs.clamp(max=1 - 1e-6)).sum()
    return s, c, ul


def rehearsal_loss(engine, cfg, step: int, rank: int, world: int, vocab: int) -> tuple[torch.Tensor, float]:
    """This rank's share of one rehearsal batch of the induction task (:func:`~mimesis_lab.models.induction_batch`,
    spans 8-40, gaps 0-32, ``cfg.induction_rehearsal_batch`` rows): the batch is drawn from a generator seeded by
    (seed, step) alone and rank ``r`` takes rows ``r, r + world, …``, so a resumed run draws the same batches and
    every world size trains on the same ones. Returns ``(term, share)``: ``term`` is scaled so that the gradient
    DeepSpeed averages over the ranks is that of the whole batch's mean loss; ``share`` is this rank's part of
    that mean (all-reduce the shares for the batch's loss). A rank with no row of its own runs one at weight 0
    (ZeRO-3 needs every rank in every forward)."""
    from mimesis_lab.models import induction_batch, induction_loss

    g = torch.Generator().manual_seed((cfg.seed + 17) * 1_000_003 + step * 7919)
    n = cfg.induction_rehearsal_batch
    seq, start = induction_batch(g, vocab, n, low=min(100, vocab // 4))
    mine = seq[rank::world]
    weight = mine.shape[0] / n
    if mine.shape[0] == 0:
        mine = seq[:1]
    loss = induction_loss(engine, mine.to(engine.device), start)
    return loss * (weight * world), float(loss.detach()) * weight


def evaluate(engine, rows, units, micro: int, world: int, rank: int, max_len: int, pad_id: int, mask_mode: str,
             dtype) -> float:
    """Validation loss: token mean over every target token of ``rows`` (all ranks); ``units`` and
    ``micro`` (units per micro-batch) as from :func:`~mimesis_lab.train.data.batch_units`."""
    engine.eval()
    total, count = 0.0, 0.0
    with torch.no_grad():
        for idx in eval_batches(len(units), micro, world, rank):
            batch_rows = [rows[i] for u in (idx or [0]) for i in units[u]]
            s, c = forward_ce(engine, batch_rows, max_len, pad_id, mask_mode, dtype)
            if idx:
                total, count = total + float(s), count + float(c)
    engine.train()
    total, count = all_reduce([total, count])
    return total / max(count, 1.0)


def train_sft(phase: str, params: Any) -> dict[str, Any] | None:
    """Train ``params.<phase>`` on this rank; rank 0 returns the training summary."""
    import torch.distributed as dist

    from mimesis_lab.models import build_or_load, load_model
    from mimesis_lab.tokenizer import load_tokenizer
    from mimesis_lab.tracking import process_age_s

    clock = PhaseClock(process_age_s())          # start-up: interpreter, imports, params
    cfg = getattr(params, phase)
    from_scratch = cfg.init_from == "model"
    if not from_scratch:      # fail before any heavy work, naming the key
        require_model_folder(f"{phase}.init_from", cfg.init_from)
    rank, world = dist_init()
    clock.lap("dist_init")
    if world != cfg.world_size:
        raise TrainConfigError(f"{phase}.world_size is {cfg.world_size} but {world} processes were launched")
    out_dir = Path(cfg.output_dir)
    ckpt_root = out_dir / CHECKPOINTS
    ds_config = load_ds_config(cfg.deepspeed_config)
    batching = resolve_batching(cfg.batching, "cuda" if torch.cuda.is_available() else "cpu")
    fingerprint = run_fingerprint(
        phase, cfg, ds_config, {"train": cfg.train, "val": cfg.val, "init_from": None if from_scratch else cfg.init_from},
        job_module=__name__ if __name__ != "__main__" else "mimesis_lab.jobs.sft",
        extra={"model": params.model.model_dump() if from_scratch else None, "batching": batching})
    resume = resume_point(cfg.resume, ckpt_root, world, fingerprint, lambda m: say(rank, m))   # fails fast
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
    clock.lap("fingerprint")
    t_start = time.time()

    # -- data and model ----------------------------------------------------------------------------
    tokenizer_dir = cfg.init_from if not from_scratch else params.tokenizer.pretrained or params.tokenizer.output_dir
    tokenizer = load_tokenizer(tokenizer_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # rank 0 reads or builds the token cache, then a barrier; the other ranks read it
    splits, cache_status = load_split_rows({"train": (cfg.train, True), "val": (cfg.val, False)}, tokenizer,
                                           tokenizer_dir, cfg, batching=batching, cache_dir=out_dir / CACHE_DIR,
                                           enabled=cfg.token_cache, rank=rank, world=world, barrier=dist.barrier)
    (train_rows, train_stats), (val_rows, val_stats) = splits["train"], splits["val"]
    say(rank, f"token cache {out_dir / CACHE_DIR}: " + ", ".join(f"{k} {v}" for k, v in cache_status.items()))
    clock.lap("data")

    torch.manual_seed(cfg.seed)
    model = build_or_load(params.model, tokenizer) if from_scratch else load_model(cfg.init_from)
    clock.lap("model")
    vocab = int(model.get_input_embeddings().weight.shape[0])   # before ZeRO-3 partitions the weights (then 0)
    engine, optimizer = make_engine(model, cfg, ds_config)
    unlikely = None
    if cfg.format_unlikelihood > 0:     # </think> closes the reply's reasoning; after it no think tag is right
        tags = [tokenizer.convert_tokens_to_ids(t) for t in ("</think>", "<think>")]
        if any(not isinstance(t, int) or t < 0 or t == tokenizer.unk_token_id for t in tags):
            raise TrainConfigError(f"{phase}.format_unlikelihood needs <think> and </think> tokens in the tokenizer")
        unlikely = (tags[0], tags[0], tags[1])
    clock.lap("engine")
    zero_stage = engine.zero_optimization_stage()
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float16 if engine.fp16_enabled() else torch.float32
    mask_mode = "padding" if batching == "grouped" else "4d" if cfg.max_len <= LONG_ROWS else "position_ids"
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    # units: rows (packed, padded) or length groups of rows (grouped), what the plan shuffles
    units, unit_micro = batch_units(train_rows, batching, micro, cfg.max_len, cfg.seed)
    val_units, _ = batch_units(val_rows, batching, micro, cfg.max_len, cfg.seed)
    efficiency = batch_efficiency(train_rows, units, batching, cfg.max_len)
    plan = DataPlan(len(units), unit_micro, gas, world, cfg.seed)
    total = plan.total_steps(cfg.epochs, cfg.max_steps)
    unit_len = [sum(len(train_rows[i]) for i in u) for u in units]
    unit_tgt = [sum(target_count(train_rows[i]) for i in u) for u in units]

    log = MetricsLog(out_dir, rank == 0)
    ok = False
    try:
        # -- resume or start fresh -----------------------------------------------------------------
        state: dict[str, Any] = {"step": 0, "tokens_seen": 0, "target_tokens_seen": 0,
                                 "initial_val_loss": None, "last_val_loss": None, "last_val_step": None}
        if resume is not None:
            root, tag = resume
            client = load_resume_checkpoint(engine, root, tag)
            if client.get("global_batch") != plan.global_batch:
                raise ResumeError(f"{root / tag}: written with global batch {client.get('global_batch')} units/step, "
                                  f"this run has {plan.global_batch}; the data position would not carry over")
            state.update({k: client[k] for k in state if k in client})
            if state["step"] > total:
                raise ResumeError(f"{root / tag}: checkpoint is at step {state['step']}, past this run's last step "
                                  f"{total} (epochs/max_steps were lowered); use resume: never to start over")
            if client.get("total_steps") not in (None, total):
                say(rank, f"note: the checkpoint's run had {client['total_steps']} steps, this one has {total}: "
                          "the lr schedule of the remaining steps follows the new total")
            if rank == 0:
                drop_checkpoints_after(ckpt_root, state["step"])
                log.truncate_after(state["step"])
            say(rank, f"resumed from {root / tag} at step {state['step']} (epoch {plan.epoch_at(state['step']):.3f})")
        elif rank == 0:
            # a fresh start owns the output folder: leftovers of an earlier run (checkpoints that
            # were not resumed, their metrics, an old export) would mix with this run's
            stale = clear_outputs(out_dir, ckpt_root, ("metrics.jsonl",))
            if stale:
                say(rank, f"fresh start (resume: {cfg.resume}): removed {stale} old checkpoint folder(s)")
        log.write({"kind": "start", "step": state["step"], "phase": phase, "world_size": world,
                   "zero_stage": zero_stage, "micro_batch": micro, "grad_accum": gas,
                   "global_batch": plan.global_batch, "total_steps": total, "train_rows": len(train_rows),
                   "val_rows": len(val_rows), "batching": batching, "train_units": len(units),
                   "resumed": resume is not None, "token_cache": cache_status})
        say(rank, f"{phase}: {len(train_rows)} train rows, {batching} batching ({len(units)} units, "
                  f"{efficiency:.3f} of the fed tokens real), {len(val_rows)} val rows, "
                  f"global batch {plan.global_batch} = {unit_micro}x{gas}x{world} units, "
                  f"steps {state['step']}->{total}, ZeRO-{zero_stage}, {dtype}")
        clock.lap("plan_and_resume")

        def evaluate_now(step: int) -> None:
            val = evaluate(engine, val_rows, val_units, unit_micro, world, rank, cfg.max_len, pad_id, mask_mode,
                           dtype)
            if step == 0:
                state["initial_val_loss"] = val
            state["last_val_loss"], state["last_val_step"] = val, step
            log.write({"kind": "eval", "step": step, "val_loss": val}, {"val_loss": val})
            say(rank, f"step {step}: val_loss {val:.4f}")
            clock.lap("eval")

        def save_now(step: int) -> None:
            client = dict(state, phase=phase, fingerprint=fingerprint, epoch=plan.epoch_at(step),
                          samples_seen=step * plan.global_batch, global_batch=plan.global_batch, world_size=world,
                          total_steps=total, rng_torch=torch.get_rng_state())
            save_checkpoint(engine, ckpt_root, step, client, log, cfg.keep_last, rank, world)
            clock.lap("checkpoint")

        # -- the loop ------------------------------------------------------------------------------
        if cfg.initial_eval and state["step"] == 0 and state["last_val_step"] is None:
            evaluate_now(0)
        engine.train()
        step = state["step"]
        prog = Progress(total, phase, unit="step", initial=step, mode="off")   # rate + ETA for the step lines
        while step < total:
            torch.manual_seed((cfg.seed + 1) * 1_000_003 + step * 131 + rank)
            lr = set_lr(optimizer, lr_at(step, total, cfg.lr, cfg.warmup_ratio, cfg.min_lr_ratio))
            units_step = plan.step_rows(step)
            n_tgt = sum(unit_tgt[u] for u in units_step)
            n_tok = sum(unit_len[u] for u in units_step)
            t0 = time.perf_counter()
            local = 0.0
            gn = None
            ind = None
            ul_sum = 0.0
            micro_batches = list(plan.micro_batches(step, rank))
            for k, idx in enumerate(micro_batches):
                res = forward_ce(engine, [train_rows[i] for u in idx for i in units[u]], cfg.max_len, pad_id,
                                 mask_mode, dtype, unlikely)
                s = res[0]
                obj = s * (world / n_tgt)
                if unlikely is not None:       # a token-sum like the CE: the same normalisation
                    obj = obj + cfg.format_unlikelihood * res[2] * (world / n_tgt)
                    ul_sum += float(res[2].detach())
                if cfg.induction_rehearsal > 0 and k == len(micro_batches) - 1:   # once per optimizer step, on its last micro
                    term, ind = rehearsal_loss(engine, cfg, step, rank, world, vocab)
                    obj = obj + cfg.induction_rehearsal * term
                engine.backward(obj, scale_wrt_gas=False)
                if zero_stage == 0 and k == gas - 1:      # DeepSpeed records no norm without ZeRO
                    gn = float(torch.nn.utils.get_total_norm([p.grad for p in engine.module.parameters()
                                                              if p.grad is not None]))
                engine.step()
                local += float(s.detach())
            loss = all_reduce([local])[0] / n_tgt
            if ind is not None:
                ind = all_reduce([ind])[0]      # the rehearsal batch's mean loss over every rank's rows
            dt = time.perf_counter() - t0
            step += 1
            prog.update(1)
            state["step"] = step
            state["tokens_seen"] += n_tok
            state["target_tokens_seen"] += n_tgt
            if zero_stage > 0:
                gn = engine.get_global_grad_norm()
                gn = float(gn) if gn is not None else None
            if not math.isfinite(loss):
                raise FloatingPointError(f"step {step}: loss is {loss}")
            if step % cfg.log_every == 0 or step == total:
                rec = {"kind": "train", "step": step, "epoch": plan.epoch_at(step), "loss": loss, "lr": lr,
                       "grad_norm": gn, "tokens": n_tok, "target_tokens": n_tgt, "tokens_per_s": n_tok / dt,
                       "step_time_s": dt}
                if ind is not None:
                    rec["induction_loss"] = ind
                if unlikely is not None:
                    rec["format_unlikelihood"] = all_reduce([ul_sum])[0] / n_tgt
                log.write(rec, {"train_loss": loss, "lr": lr, "grad_norm": gn, "tokens_per_s": n_tok / dt,
                                "step_time_s": dt, "epoch": rec["epoch"]})
                say(rank, prog.line({"loss": round(loss, 4), "lr": lr, "gn": gn if gn is None else round(gn, 3),
                                     "tok/s": round(n_tok / dt), "step_s": round(dt, 3)}))
            clock.lap("steps")
            if step % cfg.eval_every == 0 or step == total:
                evaluate_now(step)
            if step % cfg.save_every == 0:
                save_now(step)
        if state["last_val_step"] != total:
            evaluate_now(total)
        source = final_checkpoint(engine, ckpt_root, total)     # None: the engine holds the final weights
        if source is not None and not (source / MARKER).is_file():
            save_now(total)

        # -- export --------------------------------------------------------------------------------
        summary = None
        if rank == 0:
            final = out_dir / "final"
            export_final(engine, tokenizer, source, final)
            clock.lap("export")
            summary = {
                "phase": phase, "steps": total, "world_size": world, "zero_stage": zero_stage,
                "global_batch": plan.global_batch, "micro_batch": micro, "grad_accum": gas,
                "epochs": plan.epoch_at(total), "tokens": state["tokens_seen"],
                "target_tokens": state["target_tokens_seen"],
                "initial_val_loss": state["initial_val_loss"], "final_val_loss": state["last_val_loss"],
                "batching": batching, "batch_efficiency": efficiency, "train_units": len(units),
                "packing_efficiency": train_stats["packing_efficiency"], "train_rows": len(train_rows),
                "examples_in": train_stats["examples_in"], "examples_out": train_stats["examples_out"],
                "examples_truncated": train_stats["truncated"],
                "examples_dropped": train_stats["dropped_overlong"] + train_stats["dropped_no_target"],
                "examples_dropped_overlong": train_stats["dropped_overlong"],
                "examples_dropped_no_target": train_stats["dropped_no_target"],
                "tokenize_errors": train_stats["tokenize_errors"], "val": val_stats,
                "checkpoint": checkpoint_at(ckpt_root, total),
            }
            write_summary(final, summary)
            log.final(total, final, summary, time.time() - t_start, clock.seconds)
            if log.mlflow is not None:
                log.mlflow.log_metrics({"final_val_loss": summary["final_val_loss"], "tokens": summary["tokens"]},
                                       step=total)
            say(rank, f"exported {final}")
        dist.barrier()
        ok = True
        return summary
    finally:
        log.close(ok)


def write_summary(final: Path, summary: dict[str, Any]) -> None:
    """``final/training_summary.json``: deterministic given the same inputs (no wall time, no absolute
    path), so the exported folder's DVC hash changes only when the run does."""
    import json

    (final / "training_summary.json").write_text(json.dumps(summary, indent=2, default=str),
                                                 encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    return job_main(train_sft, PHASES, prog="python -m mimesis_lab.jobs.sft",
                    description="SFT-style training (midtrain, sft, agent_sft)", argv=argv)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
