"""Benchmark (not a test): our SFT loop and our simulator-RL GRPO step side by side with TRL on CPU.

Same tiny model (``model`` section of params.yaml, :func:`mimesis_lab.models.build_or_load`, same seed),
same tokenizer (a byte-level BPE trained in memory on the chats by :func:`mimesis_lab.tokenizer.train_tokenizer`
with the ``tokenizer`` section's ``vocab_size``/``min_frequency``, saved to a temporary folder; no downloads),
no induction warm-up and no copy-task rehearsal (TRL has neither: same model init and same objective on both sides),
same data (the bundled ThoughtTrace fixtures ``data/raw/thoughttrace/thoughttrace.jsonl`` formatted by
:func:`mimesis_lab.thoughttrace.format_conversation`; the last ``--val-records`` are the validation split),
same sequence length, batch, learning rate, schedule and number of steps. Everything runs in a temporary
project folder with a generated params file; each variant is its own process (same ``OMP_NUM_THREADS``).

**SFT** (``params.sft`` + ``sft_run``: ``max_len``, packing, the DeepSpeed JSON's batch, ``lr``, warm-up and
cosine floor, AdamW betas, clipping), ``--sft-steps`` optimizer steps:

- ``ours``: the real job, ``python -m mimesis_lab.train.launch --phase sft --params <generated> --launcher
  torchrun`` (DeepSpeed ZeRO-2, step-0 and final evaluation, the ``final/`` export; ``--ours-start direct``:
  ``python -m mimesis_lab.jobs.sft --phase sft --params <generated>``, the documented world-size-1 start
  without a launcher), read back from its ``metrics.jsonl``;
- ``trl``: ``trl.SFTTrainer`` on the *same tokenised examples* (``input_ids`` + ``assistant_masks``, so the
  loss-bearing tokens are the same), ``packing=True`` (TRL's ``bfd``, padding-free) when ``sft.batching`` is ``packed`` (the benchmark sets it),
  ``max_length``, ``per_device_train_batch_size``/``gradient_accumulation_steps`` from the DeepSpeed JSON,
  TRL's own AdamW (same betas, weight decay, clipping), ``use_cpu=True``; the lr of every step is our
  :func:`~mimesis_lab.train.schedule.lr_at` (a ``LambdaLR`` in ``create_scheduler``; ``--trl-schedule hf`` uses
  HF's ``cosine_with_min_lr`` with the same floor and warm-up ratio instead, whose warm-up starts at lr 0, so
  TRL lags a step and the losses agree less on short runs). It also evaluates before and after (with our
  evaluation code on our validation rows) and saves the final model, as our job does.

Reported per run: loss-bearing (target) tokens per second in steady state (steps after ``--warmup-steps``:
sum of target tokens / sum of step times; ours from the job's per-step ``target_tokens``/``step_time_s``,
TRL's from the labels of every micro-batch and the time between consecutive optimizer-step ends), the final
validation loss (agreement: ``|trl - ours| <= --loss-tol * ours``), the end-to-end wall time of the
process including start-up, and where the fixed cost (wall time minus the training steps) goes: seconds per
phase of the job process from its start (:class:`~mimesis_lab.train.metrics_log.PhaseClock`; ours from the
``phases_s`` of the job's final record: start-up = interpreter, imports and params, ``dist_init``, fingerprint,
data, model, engine, plan and resume, eval, steps, checkpoint, export; TRL's: start-up, data, model, trainer,
eval, steps, export) and ``outside`` = wall minus the phases (launcher processes, the exit after the last record).

**GRPO** (``params.sim_rl``: group size ``rollouts_per_prompt``, ``prompts_per_step``, ``rollout.max_new_tokens``,
``rollout.temperature``/``top_p``, ``lr``, ``clip_eps``, ``ppo_epochs``, ``minibatches``, ``micro_rows``), single
turn, the same ``prompts_per_step`` prompts (the system prompt and first exchange of a ThoughtTrace chat; the
policy writes the human's next message) and a trivial reward for both (``-|characters - 120| / 120``):

- ``ours``: the ``sim_rl`` update path in one process: DeepSpeed engine (``configs/tiny/ds_rl.json``),
  the colocated :class:`~mimesis_lab.rollout.backends.TransformersBackend`, :func:`~mimesis_lab.rl.advantages.fold_grpo`,
  :func:`~mimesis_lab.rl.policy.segment_row` and :func:`~mimesis_lab.rl.ppo.ppo_update` (what ``sim_rl`` runs per
  step, minus episode building and the judge);
- ``trl``: ``trl.GRPOTrainer`` with ``num_generations`` = group size, ``per_device_train_batch_size`` =
  ``micro_rows``, ``gradient_accumulation_steps`` = rows per minibatch / ``micro_rows`` and ``steps_per_generation``
  so that one generation feeds ``minibatches`` optimizer steps, ``beta=0`` (no KL, as ours), ``epsilon`` =
  ``clip_eps``, ``max_completion_length``, ``temperature``, ``top_p``, ``top_k=0``, ``use_cpu=True``.

Reported: seconds per optimizer step (RL step time / optimizer steps per RL step, first RL step left out as
warm-up) and generated tokens per second of generation time.

Variants are interleaved (ours, trl, trl, ours, …) ``--repeat`` times; ratios (ours over TRL: >1 means we are
faster) are given as median [min–max] over the repeats, pairing run ``i`` of each. Prints a table and writes
JSON (``--out``)::

    pip install -c requirements.lock -e ".[bench]"      # TRL, benchmark-only
    python bench/bench_peers.py [--repeat 3] [--sft-steps 22] [--ours-start torchrun|direct] [--grpo-steps 4]
                                [--only sft|grpo] [--out f.json]

Not a test; on a busy machine every figure is noisy (say so when quoting them).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FIXTURE = ROOT / "data" / "raw" / "thoughttrace" / "thoughttrace.jsonl"
TARGET_CHARS = 120


# -- shared helpers ---------------------------------------------------------------------------------------------

def reward_of(text: str) -> float:
    """The trivial reward both GRPO variants use: closeness of the reply's length to ``TARGET_CHARS``."""
    return -abs(len(text) - TARGET_CHARS) / TARGET_CHARS


def _summary(xs: list[float]) -> dict[str, float] | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _fmt(s: dict[str, float] | None, digits: int = 2) -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def _child_env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}   # no tracking in the bench
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", DISABLE_MLFLOW_INTEGRATION="TRUE",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                        if p]))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


# -- the temporary project ----------------------------------------------------------------------------------------

def prepare(work: Path, args) -> dict[str, Any]:
    """Data splits, tokenizer folder and the generated params file under ``work``; returns the spec."""
    import polars as pl
    import yaml

    from mimesis_lab.config import load_params
    from mimesis_lab.thoughttrace import format_conversation
    from mimesis_lab.tokenizer import train_tokenizer

    records = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]
    convs = [format_conversation(r) for r in records]
    if len(convs) <= args.val_records:
        sys.exit(f"{FIXTURE}: {len(convs)} chats, need more than --val-records {args.val_records}")
    train, val = convs[:-args.val_records], convs[-args.val_records:]
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("val", val)):
        pl.DataFrame({"messages": rows}).write_parquet(data / f"{name}.parquet")

    base = load_params(ROOT / "params.yaml")
    tok = train_tokenizer((m["content"] for c in train for m in c), vocab_size=base.tokenizer.vocab_size,
                          min_frequency=base.tokenizer.min_frequency)
    tok_dir = work / "tokenizer"
    tok.save_pretrained(str(tok_dir))

    # grpo prompts: system prompt + the human's first message + the AI's reply; the policy writes message 2
    prompts = []
    for c in convs:
        if len(c) >= 4 and [m["role"] for m in c[:3]] == ["system", "assistant", "user"]:
            prompts.append(c[:3])
        if len(prompts) == base.sim_rl.prompts_per_step:
            break

    raw = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    raw["tokenizer"].update(pretrained=None, output_dir=str(tok_dir))
    raw["sft"].update(train=str(data / "train.parquet"), val=str(data / "val.parquet"), init_from="model",
                      deepspeed_config=str(ROOT / raw["sft"].get("deepspeed_config", "configs/tiny/ds_zero2.json")),
                      output_dir=str(work / "out" / "ours_sft"), max_steps=args.sft_steps, launcher="torchrun",
                      world_size=1, resume="never", eval_every=10**6, save_every=10**6,
                      batching="packed",   # packed rows on both sides (TRL: packing, bfd)
                      induction_rehearsal=0.0)   # TRL has no copy-task term: the same objective on both sides
    # the induction warm-up prepares the pipeline's model; it is not the loop compared here (left on, the first
    # `ours` run built and cached the warmed-up model inside its timed run: 171 s end to end instead of 31 s)
    raw["model"].update(induction_warmup_steps=0)
    raw["sim_rl"].update(deepspeed_config=str(ROOT / raw["sim_rl"]["deepspeed_config"]), world_size=1,
                         steps=args.grpo_steps)
    params_path = work / "params.yaml"
    params_path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    p = load_params(params_path)         # validates the generated file
    return {"work": str(work), "params": str(params_path), "tokenizer": str(tok_dir), "prompts": prompts,
            "threads": args.threads, "sft_steps": args.sft_steps, "grpo_steps": args.grpo_steps,
            "warmup_steps": args.warmup_steps, "vocab_size": len(tok), "trl_schedule": args.trl_schedule,
            "ours_start": args.ours_start,
            "train_chats": len(train), "val_chats": len(val), "max_len": p.sft.max_len}


# -- SFT: our job -------------------------------------------------------------------------------------------------

#: How the ``ours`` SFT job starts (``--ours-start``): the launcher the pipeline uses, or the job module itself.
OURS_START = {"torchrun": ["mimesis_lab.train.launch", "--launcher", "torchrun"], "direct": ["mimesis_lab.jobs.sft"]}


def run_ours_sft(spec: dict[str, Any], i: int) -> dict[str, Any]:
    import yaml

    work = Path(spec["work"])
    raw = yaml.safe_load(Path(spec["params"]).read_text(encoding="utf-8"))
    out_dir = work / "out" / f"ours_sft_{i}"
    raw["sft"]["output_dir"] = str(out_dir)
    params_path = work / f"params_ours_sft_{i}.yaml"
    params_path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    cmd = [sys.executable, "-m", *OURS_START[spec["ours_start"]], "--phase", "sft", "--params", str(params_path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, env=_child_env(spec["threads"]), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"our SFT job failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    recs = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]
    train = [r for r in recs if r.get("kind") == "train"]
    evals = [r for r in recs if r.get("kind") == "eval"]
    final = [r for r in recs if r.get("kind") == "final"]
    steady = [r for r in train if r["step"] > spec["warmup_steps"]]
    tgt = sum(r["target_tokens"] for r in steady)
    secs = sum(r["step_time_s"] for r in steady)
    return {"wall_s": wall, "steps": len(train), "steady_steps": len(steady),
            "target_tokens_per_s": tgt / secs if secs else None, "steady_target_tokens": tgt,
            "steady_seconds": secs, "step_time_s_median": statistics.median(r["step_time_s"] for r in steady),
            "initial_val_loss": evals[0]["val_loss"] if evals else None,
            "final_val_loss": evals[-1]["val_loss"] if evals else None,
            "final_train_loss": train[-1]["loss"] if train else None,
            "train_losses": [r["loss"] for r in train], "phases_s": final[-1]["phases_s"]}


# -- SFT: TRL (worker process) ------------------------------------------------------------------------------------

def _val_loss(model, rows, max_len: int, pad_id: int) -> float:
    """Token-mean CE over every target token of ``rows`` (the computation of our job's ``evaluate``)."""
    import torch

    from mimesis_lab.packing import collate, masked_token_ce_sum

    was = model.training
    model.eval()
    total, count = 0.0, 0.0
    with torch.no_grad():
        for r in rows:
            b = collate([r], max_len, pad_id, mask="4d", dtype=torch.float32)
            labels = b.pop("labels")
            s, c = masked_token_ce_sum(model(**b, use_cache=False).logits, labels)
            total, count = total + float(s), count + float(c)
    model.train(was)
    return total / max(count, 1.0)


def worker_trl_sft(spec: dict[str, Any], i: int) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from mimesis_lab.chat import tokenize_many
    from mimesis_lab.config import load_params
    from mimesis_lab.models import build_or_load
    from mimesis_lab.packing import fit_examples
    from mimesis_lab.tokenizer import load_tokenizer
    from mimesis_lab.tracking import process_age_s
    from mimesis_lab.train.data import build_rows, read_conversations
    from mimesis_lab.train.metrics_log import PhaseClock
    from mimesis_lab.train.runtime import load_ds_config
    from mimesis_lab.train.schedule import lr_at

    clock = PhaseClock(process_age_s())          # start-up: interpreter and imports, as in our job
    params = load_params(spec["params"])
    cfg = params.sft
    ds = load_ds_config(cfg.deepspeed_config)
    micro = int(ds["train_micro_batch_size_per_gpu"])
    gas = int(ds.get("gradient_accumulation_steps") or ds["train_batch_size"] // micro)
    tok = load_tokenizer(spec["tokenizer"])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    convs = read_conversations(cfg.train, expand=True, seed=cfg.seed)
    results = tokenize_many(tok, convs, cfg.train_role, errors="return")
    examples = [r for r in results if not isinstance(r, Exception)]
    kept, _ = fit_examples(examples, cfg.max_len, cfg.overlong)
    train_ds = Dataset.from_dict({"input_ids": [list(ids) for ids, _ in kept],
                                  "assistant_masks": [list(m) for _, m in kept]})
    val_rows, _ = build_rows(tok, read_conversations(cfg.val, expand=False, seed=cfg.seed), train_role=cfg.train_role,
                             max_len=cfg.max_len, overlong=cfg.overlong, batching=cfg.batching)
    clock.lap("data")

    torch.manual_seed(cfg.seed)
    model = build_or_load(params.model, tok)
    clock.lap("model")
    out_dir = Path(spec["work"]) / "out" / f"trl_sft_{i}"
    args = SFTConfig(
        output_dir=str(out_dir), max_steps=spec["sft_steps"], per_device_train_batch_size=micro,
        gradient_accumulation_steps=gas, learning_rate=cfg.lr, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": cfg.min_lr_ratio}, warmup_steps=cfg.warmup_ratio,
        weight_decay=cfg.weight_decay, adam_beta1=cfg.beta1, adam_beta2=cfg.beta2,
        max_grad_norm=float(ds.get("gradient_clipping", 0.0)) or 1e9, max_length=cfg.max_len,
        packing=cfg.batching == "packed", packing_strategy="bfd", use_cpu=True, report_to="none", logging_steps=1,
        save_strategy="no", eval_strategy="no", seed=cfg.seed, dataloader_num_workers=0, bf16=False, fp16=False,
        disable_tqdm=True, dataset_num_proc=None)

    total = spec["sft_steps"]

    class Counting(SFTTrainer):
        bench_tokens = 0

        def create_scheduler(self, num_training_steps, optimizer=None):
            if spec["trl_schedule"] == "hf" or self.lr_scheduler is not None:
                return super().create_scheduler(num_training_steps, optimizer)
            # the lr of every step as in our job (HF's linear warm-up starts at lr 0 instead)
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer or self.optimizer,
                lambda s: lr_at(s, total, cfg.lr, cfg.warmup_ratio, cfg.min_lr_ratio) / cfg.lr)
            return self.lr_scheduler

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            Counting.bench_tokens += int((inputs["labels"][:, 1:] != -100).sum())
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    marks: list[tuple[float, int]] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks.append((time.perf_counter(), Counting.bench_tokens))

        def on_step_end(self, args, state, control, **kw):
            marks.append((time.perf_counter(), Counting.bench_tokens))

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    trainer = Counting(model=model, args=args, train_dataset=train_ds, processing_class=tok, callbacks=[Clock()])
    clock.lap("trainer")
    initial_val = _val_loss(model, val_rows, cfg.max_len, pad_id)
    clock.lap("eval")
    trainer.train()
    clock.lap("steps")
    final_val = _val_loss(model, val_rows, cfg.max_len, pad_id)
    clock.lap("eval")
    trainer.save_model(str(out_dir / "final"))
    clock.lap("export")
    # steps 1..n end at marks[1..n]; step k took marks[k] - marks[k-1] (data loading and logging included)
    w = spec["warmup_steps"]
    steps = [(marks[k][0] - marks[k - 1][0], marks[k][1] - marks[k - 1][1]) for k in range(1, len(marks))]
    steady = steps[w:]
    secs = sum(s for s, _ in steady)
    tgt = sum(t for _, t in steady)
    return {"steps": len(steps), "steady_steps": len(steady), "target_tokens_per_s": tgt / secs if secs else None,
            "steady_target_tokens": tgt, "steady_seconds": secs,
            "step_time_s_median": statistics.median(s for s, _ in steady) if steady else None,
            "initial_val_loss": initial_val, "final_val_loss": final_val,
            "final_train_loss": losses[-1] if losses else None, "train_losses": losses,
            "train_rows_packed": len(trainer.train_dataset), "phases_s": clock.seconds}


# -- GRPO: ours (worker process) ----------------------------------------------------------------------------------

def worker_ours_grpo(spec: dict[str, Any], i: int) -> dict[str, Any]:
    t_start = time.perf_counter()
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    from mimesis_lab.train.launch import free_port as _free_port

    os.environ["MASTER_PORT"] = str(_free_port())
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import random

    import torch

    from mimesis_lab.config import load_params
    from mimesis_lab.models import assert_no_dropout, build_or_load, disable_dropout
    from mimesis_lab.rl.advantages import fold_grpo
    from mimesis_lab.rl.policy import segment_row
    from mimesis_lab.rl.ppo import load_rl_ds_config, ppo_update
    from mimesis_lab.rollout.backends import SamplingParams, colocated_backend
    from mimesis_lab.rollout.sim_rollout import render_prompt
    from mimesis_lab.tokenizer import load_tokenizer
    from mimesis_lab.train.runtime import dist_init, make_engine, set_lr
    from mimesis_lab.train.schedule import lr_at

    params = load_params(spec["params"])
    cfg = params.sim_rl
    rank, world = dist_init()
    ds_config = load_rl_ds_config("sim_rl", cfg)
    tok = load_tokenizer(spec["tokenizer"])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    torch.manual_seed(cfg.seed)
    model = disable_dropout(build_or_load(params.model, tok))
    assert_no_dropout(model)
    engine, optimizer = make_engine(model, cfg, ds_config)
    backend = colocated_backend(cfg.rollout, "model", engine.module, tok)
    prompt_ids = [render_prompt(tok, p) for p in spec["prompts"]]
    t_setup = time.perf_counter() - t_start

    G = cfg.rollouts_per_prompt
    steps = []
    for step in range(spec["grpo_steps"]):
        t0 = time.perf_counter()
        lr = set_lr(optimizer, lr_at(step, cfg.steps, cfg.lr, cfg.warmup_ratio, cfg.min_lr_ratio))
        ids, groups, rids = [], [], []
        for gi, p in enumerate(prompt_ids):
            for k in range(G):
                ids.append(p)
                groups.append(f"s{step}g{gi}")
                rids.append(f"s{step}g{gi}r{k}")
        if hasattr(backend, "reset_prefix_cache"):
            backend.reset_prefix_cache()
        sampling = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
                                  top_p=cfg.rollout.top_p, seed=cfg.seed * 1_000_003 + step * 9973)
        tg = time.perf_counter()
        gens = backend.generate_ids(ids, sampling)
        t_gen = time.perf_counter() - tg
        bad = [g.error for g in gens if not g.ok]
        if bad:
            raise RuntimeError(f"generation failed: {bad[0]}")
        scores = [reward_of(tok.decode(g.token_ids, skip_special_tokens=True)) for g in gens]
        adv = fold_grpo(scores, groups, rids, eps=cfg.adv_eps)
        rows = [segment_row(g.prompt_ids, g.token_ids, g.logprobs, a, gid, rid)
                for g, a, gid, rid in zip(gens, adv, groups, rids) if g.token_ids]
        upd = ppo_update(engine, rows, cfg, random.Random(f"{cfg.seed}:{step}:update"), pad_id, world)
        steps.append({"seconds": time.perf_counter() - t0, "gen_seconds": t_gen,
                      "gen_tokens": sum(len(g.token_ids) for g in gens), "opt_steps": upd["update/opt_steps"],
                      "reward_mean": sum(scores) / len(scores), "lr": lr, "loss": upd.get("update/ppo_loss")})
    return {"setup_s": t_setup, "rl_steps": steps}


# -- GRPO: TRL (worker process) -----------------------------------------------------------------------------------

def worker_trl_grpo(spec: dict[str, Any], i: int) -> dict[str, Any]:
    t_start = time.perf_counter()
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mimesis_lab.config import load_params
    from mimesis_lab.models import build_or_load, disable_dropout
    from mimesis_lab.tokenizer import load_tokenizer
    from mimesis_lab.train.runtime import load_ds_config

    params = load_params(spec["params"])
    cfg = params.sim_rl
    ds = load_ds_config(cfg.deepspeed_config)
    tok = load_tokenizer(spec["tokenizer"])
    torch.manual_seed(cfg.seed)
    model = disable_dropout(build_or_load(params.model, tok))
    G, P = cfg.rollouts_per_prompt, len(spec["prompts"])
    per_gen = P * G                                  # completions per generation = one RL step
    per_minibatch = per_gen // cfg.minibatches       # completions per optimizer step
    if per_gen % cfg.minibatches or per_minibatch % cfg.micro_rows:
        raise SystemExit("bench needs prompts*group divisible by minibatches*micro_rows")
    gas = per_minibatch // cfg.micro_rows
    opt_per_rl = cfg.minibatches * cfg.ppo_epochs
    args = GRPOConfig(
        output_dir=str(Path(spec["work"]) / "out" / f"trl_grpo_{i}"), max_steps=spec["grpo_steps"] * opt_per_rl,
        per_device_train_batch_size=cfg.micro_rows, gradient_accumulation_steps=gas,
        steps_per_generation=per_gen // cfg.micro_rows, num_iterations=cfg.ppo_epochs, num_generations=G,
        max_completion_length=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p, top_k=0, learning_rate=cfg.lr, lr_scheduler_type="constant",
        weight_decay=cfg.weight_decay, adam_beta1=cfg.beta1, adam_beta2=cfg.beta2,
        max_grad_norm=float(ds.get("gradient_clipping", 0.0)) or 1e9, beta=0.0, epsilon=cfg.clip_eps,
        use_cpu=True, report_to="none", logging_steps=1, save_strategy="no", seed=cfg.seed, bf16=False,
        disable_tqdm=True, log_completions=False, disable_dropout=True)

    def reward(prompts, completions, **kw):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward_of(t) for t in texts]

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args,
                          train_dataset=Dataset.from_dict({"prompt": spec["prompts"]}), processing_class=tok)
    gen = {"seconds": 0.0, "tokens": 0}
    inner = trainer._generate_single_turn

    def timed(*a, **kw):
        t = time.perf_counter()
        out = inner(*a, **kw)
        gen["seconds"] += time.perf_counter() - t
        gen["tokens"] += sum(len(c) for c in out[0])
        return out

    trainer._generate_single_turn = timed
    marks: list[tuple[float, float, int]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks.append((time.perf_counter(), gen["seconds"], gen["tokens"]))

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % opt_per_rl == 0:
                marks.append((time.perf_counter(), gen["seconds"], gen["tokens"]))

    trainer.add_callback(Clock())
    t_setup = time.perf_counter() - t_start
    trainer.train()
    steps = [{"seconds": marks[k][0] - marks[k - 1][0], "gen_seconds": marks[k][1] - marks[k - 1][1],
              "gen_tokens": marks[k][2] - marks[k - 1][2], "opt_steps": opt_per_rl} for k in range(1, len(marks))]
    return {"setup_s": t_setup, "rl_steps": steps}


def _grpo_summary(res: dict[str, Any], wall: float) -> dict[str, Any]:
    steady = res["rl_steps"][1:] or res["rl_steps"]
    secs = sum(s["seconds"] for s in steady)
    opt = sum(s["opt_steps"] for s in steady)
    gs = sum(s["gen_seconds"] for s in steady)
    gt = sum(s["gen_tokens"] for s in steady)
    return {"wall_s": wall, "setup_s": res["setup_s"], "rl_steps": len(res["rl_steps"]), "steady_rl_steps": len(steady),
            "s_per_opt_step": secs / opt if opt else None, "s_per_rl_step": secs / len(steady),
            "gen_tokens_per_s": gt / gs if gs else None, "gen_share": gs / secs if secs else None,
            "gen_tokens_per_rl_step": gt / len(steady), "steps": res["rl_steps"]}


WORKERS = {"trl_sft": worker_trl_sft, "ours_grpo": worker_ours_grpo, "trl_grpo": worker_trl_grpo}


def run_worker(name: str, spec_path: Path, spec: dict[str, Any], i: int) -> tuple[dict[str, Any], float]:
    out = Path(spec["work"]) / f"result_{name}_{i}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--spec", str(spec_path),
           "--index", str(i), "--result", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=spec["work"], env=_child_env(spec["threads"]), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"worker {name} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return json.loads(out.read_text(encoding="utf-8")), wall


# -- main ---------------------------------------------------------------------------------------------------------

def _order(repeat: int) -> list[tuple[str, int]]:
    """ours, trl, trl, ours, ours, trl, … (ABBA), with the run index of each variant."""
    seq: list[str] = []
    for r in range(repeat):
        seq += ["ours", "trl"] if r % 2 == 0 else ["trl", "ours"]
    seen = {"ours": 0, "trl": 0}
    out = []
    for v in seq:
        out.append((v, seen[v]))
        seen[v] += 1
    return out


def _interleaved_runs(repeat: int, run_one: Callable[[str, int], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """``{"ours": [...], "trl": [...]}``: ``run_one(variant, i)`` for every repeat, in the interleaved order."""
    runs: dict[str, list[dict[str, Any]]] = {"ours": [None] * repeat, "trl": [None] * repeat}
    for v, i in _order(repeat):
        runs[v][i] = run_one(v, i)
    return runs


def _compare(runs: dict[str, list[dict[str, Any]]], ratios: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """The runs, the ratios and each side's median [min–max] of ``keys``."""
    return {"runs": runs, "ratios_ours_over_trl": ratios,
            **{side: {k: _summary([r[k] for r in runs[side]]) for k in keys} for side in ("ours", "trl")}}


def with_outside(phases_s: dict[str, float], wall_s: float) -> dict[str, float]:
    """The job's phases (:class:`~mimesis_lab.train.metrics_log.PhaseClock`, from its process start) and
    ``outside``: the rest of the wall time (launcher processes, the exit after the job's last record)."""
    return {**phases_s, "outside": wall_s - sum(phases_s.values())}


def bench_sft(spec: dict[str, Any], spec_path: Path, repeat: int) -> dict[str, Any]:
    def run_one(v: str, i: int) -> dict[str, Any]:
        if v == "ours":
            r = run_ours_sft(spec, i)
        else:
            r, wall = run_worker("trl_sft", spec_path, spec, i)
            r["wall_s"] = wall
        r["phases_s"] = with_outside(r["phases_s"], r["wall_s"])
        r["fixed_s"] = r["wall_s"] - r["phases_s"]["steps"]
        print(f"  sft {v:>4} run {i}: {r['target_tokens_per_s']:.0f} target tok/s, final val loss "
              f"{r['final_val_loss']:.4f}, wall {r['wall_s']:.1f} s", flush=True)
        return r

    runs = _interleaved_runs(repeat, run_one)
    o, t = runs["ours"], runs["trl"]
    ratios = {
        "target_tokens_per_s": _summary([a["target_tokens_per_s"] / b["target_tokens_per_s"] for a, b in zip(o, t)]),
        "end_to_end_wall": _summary([b["wall_s"] / a["wall_s"] for a, b in zip(o, t)]),
        "fixed_cost": _summary([b["fixed_s"] / a["fixed_s"] for a, b in zip(o, t)]),
    }
    out = _compare(runs, ratios, ("target_tokens_per_s", "final_val_loss", "wall_s", "fixed_s", "initial_val_loss",
                                  "step_time_s_median"))
    for side in ("ours", "trl"):
        out[side]["phases_s"] = {k: _summary([r["phases_s"].get(k) for r in runs[side]])
                                 for k in dict.fromkeys(k for r in runs[side] for k in r["phases_s"])}
    return out


def bench_grpo(spec: dict[str, Any], spec_path: Path, repeat: int) -> dict[str, Any]:
    def run_one(v: str, i: int) -> dict[str, Any]:
        res, wall = run_worker(f"{v}_grpo", spec_path, spec, i)
        r = _grpo_summary(res, wall)
        print(f"  grpo {v:>4} run {i}: {r['s_per_opt_step']:.2f} s/opt step, {r['gen_tokens_per_s']:.0f} gen tok/s, "
              f"wall {wall:.1f} s", flush=True)
        return r

    runs = _interleaved_runs(repeat, run_one)
    o, t = runs["ours"], runs["trl"]
    ratios = {
        "opt_step_speed": _summary([b["s_per_opt_step"] / a["s_per_opt_step"] for a, b in zip(o, t)]),
        "gen_tokens_per_s": _summary([a["gen_tokens_per_s"] / b["gen_tokens_per_s"] for a, b in zip(o, t)]),
        "end_to_end_wall": _summary([b["wall_s"] / a["wall_s"] for a, b in zip(o, t)]),
    }
    return _compare(runs, ratios, ("s_per_opt_step", "gen_tokens_per_s", "wall_s", "setup_s", "gen_share"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each variant, interleaved ABBA")
    ap.add_argument("--sft-steps", type=int, default=22)
    ap.add_argument("--grpo-steps", type=int, default=4, help="RL steps per GRPO run (the first is warm-up)")
    ap.add_argument("--warmup-steps", type=int, default=2, help="SFT steps left out of the steady-state rate")
    ap.add_argument("--ours-start", choices=sorted(OURS_START), default="torchrun",
                    help="our SFT job under the launcher (torchrun, as the pipeline) or started directly")
    ap.add_argument("--val-records", type=int, default=6)
    ap.add_argument("--loss-tol", type=float, default=0.02, help="relative tolerance of the final val loss")
    ap.add_argument("--trl-schedule", choices=["ours", "hf"], default="ours",
                    help="TRL SFT lr per step: ours (same lr_at values) or hf (cosine_with_min_lr, warm-up from 0)")
    ap.add_argument("--only", choices=["sft", "grpo"], default=None)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1),
                    help="OMP_NUM_THREADS of every run (default: this shell's, else all CPUs)")
    ap.add_argument("--workdir", default=None, help="keep the temporary project here (default: a temp dir, removed)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "peers.json"))
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        spec = json.loads(Path(args.spec).read_text(encoding="utf-8"))
        res = WORKERS[args.worker](spec, args.index)
        Path(args.result).write_text(json.dumps(res), encoding="utf-8")
        return

    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("TRL is a benchmark-only extra: pip install -c requirements.lock -e \".[bench]\"")
    import torch
    import transformers

    tmp = None
    if args.workdir:
        work = Path(args.workdir).resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="bench_peers_")
        work = Path(tmp.name)
    t_all = time.perf_counter()
    spec = prepare(work, args)
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    from mimesis_lab.config import load_params

    p = load_params(spec["params"])
    result: dict[str, Any] = {
        "command": "python bench/bench_peers.py " + " ".join(sys.argv[1:]),
        "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs", "threads": args.threads,
        "repeat": args.repeat, "order": "interleaved ours, trl, trl, ours, ...",
        "load_avg_1m_at_start": os.getloadavg()[0],
        "data": {"source": str(FIXTURE.relative_to(ROOT)), "train_chats": spec["train_chats"],
                 "val_chats": spec["val_chats"], "tokenizer_vocab": spec["vocab_size"]},
        "model": p.model.model_dump(),
    }
    print(f"bench_peers: TRL {trl.__version__}, torch {torch.__version__}, {args.threads} thread(s), "
          f"repeat {args.repeat} (interleaved); work dir {work}", flush=True)
    if args.only in (None, "sft"):
        ds = json.loads(Path(p.sft.deepspeed_config).read_text(encoding="utf-8"))
        result["sft_settings"] = {"steps": args.sft_steps, "warmup_steps_excluded": args.warmup_steps,
                                  "max_len": p.sft.max_len, "batching": p.sft.batching, "lr": p.sft.lr,
                                  "warmup_ratio": p.sft.warmup_ratio, "min_lr_ratio": p.sft.min_lr_ratio,
                                  "micro_batch": ds["train_micro_batch_size_per_gpu"],
                                  "global_batch_rows": ds["train_batch_size"], "loss_rel_tol": args.loss_tol,
                                  "trl_schedule": args.trl_schedule, "ours_start": args.ours_start}
        print(f"SFT: {args.sft_steps} steps, max_len {p.sft.max_len}, batching {p.sft.batching}, "
              f"batch {ds['train_batch_size']} rows, lr {p.sft.lr}; ours started by {args.ours_start}", flush=True)
        sft = bench_sft(spec, spec_path, args.repeat)
        o, t = sft["ours"]["final_val_loss"]["median"], sft["trl"]["final_val_loss"]["median"]
        sft["loss_agreement"] = {"ours_final_val_loss": o, "trl_final_val_loss": t,
                                 "rel_diff": abs(t - o) / o, "within_tol": abs(t - o) <= args.loss_tol * o}
        result["sft"] = sft
    if args.only in (None, "grpo"):
        c = p.sim_rl
        result["grpo_settings"] = {"rl_steps": args.grpo_steps, "warmup_rl_steps_excluded": 1,
                                   "prompts": len(spec["prompts"]), "group_size": c.rollouts_per_prompt,
                                   "max_new_tokens": c.rollout.max_new_tokens, "temperature": c.rollout.temperature,
                                   "top_p": c.rollout.top_p, "lr": c.lr, "minibatches": c.minibatches,
                                   "micro_rows": c.micro_rows, "ppo_epochs": c.ppo_epochs,
                                   "reward": f"-|chars - {TARGET_CHARS}| / {TARGET_CHARS}"}
        print(f"GRPO: {args.grpo_steps} RL steps, {len(spec['prompts'])} prompts x group {c.rollouts_per_prompt}, "
              f"max_new_tokens {c.rollout.max_new_tokens}, T {c.rollout.temperature}, "
              f"{c.minibatches * c.ppo_epochs} optimizer steps per RL step", flush=True)
        result["grpo"] = bench_grpo(spec, spec_path, args.repeat)
    result["total_wall_s"] = time.perf_counter() - t_all
    result["load_avg_1m_at_end"] = os.getloadavg()[0]

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")

    print(f"\nours vs TRL {trl.__version__}, median [min-max] over {args.repeat} interleaved runs "
          f"({args.threads} thread(s); 1-min load average {result['load_avg_1m_at_start']:.1f} at start, "
          f"{result['load_avg_1m_at_end']:.1f} at end on {os.cpu_count()} CPUs: a busy machine makes every "
          "figure noisy); ratio > 1 = ours better")
    print(f"{'metric':<44}{'ours':>26}{'TRL':>26}{'ratio':>26}")
    if "sft" in result:
        s = result["sft"]
        print(f"{'SFT target tokens/s (steady)':<44}{_fmt(s['ours']['target_tokens_per_s'], 0):>26}"
              f"{_fmt(s['trl']['target_tokens_per_s'], 0):>26}{_fmt(s['ratios_ours_over_trl']['target_tokens_per_s']):>26}")
        print(f"{f'SFT end-to-end wall, {args.sft_steps} steps (s)':<44}{_fmt(s['ours']['wall_s'], 1):>26}"
              f"{_fmt(s['trl']['wall_s'], 1):>26}{_fmt(s['ratios_ours_over_trl']['end_to_end_wall']):>26}")
        la = s["loss_agreement"]
        agree = ("agree" if la["within_tol"] else "DIFFER") + f" ({la['rel_diff']:.2%})"
        print(f"{'SFT final val loss':<44}{_fmt(s['ours']['final_val_loss'], 4):>26}"
              f"{_fmt(s['trl']['final_val_loss'], 4):>26}"
              f"{agree:>26}")
        print(f"{'SFT fixed cost = wall - steps (s)':<44}{_fmt(s['ours']['fixed_s'], 1):>26}"
              f"{_fmt(s['trl']['fixed_s'], 1):>26}{_fmt(s['ratios_ours_over_trl']['fixed_cost']):>26}")
        po, pt = s["ours"]["phases_s"], s["trl"]["phases_s"]
        for k in dict.fromkeys([*po, *pt]):
            print(f"{f'  phase {k} (s)':<44}{_fmt(po.get(k)):>26}{_fmt(pt.get(k)):>26}")
    if "grpo" in result:
        g = result["grpo"]
        print(f"{'GRPO s / optimizer step':<44}{_fmt(g['ours']['s_per_opt_step']):>26}"
              f"{_fmt(g['trl']['s_per_opt_step']):>26}{_fmt(g['ratios_ours_over_trl']['opt_step_speed']):>26}")
        print(f"{'GRPO generated tokens/s':<44}{_fmt(g['ours']['gen_tokens_per_s'], 0):>26}"
              f"{_fmt(g['trl']['gen_tokens_per_s'], 0):>26}{_fmt(g['ratios_ours_over_trl']['gen_tokens_per_s']):>26}")
        print(f"{f'GRPO end-to-end wall, {args.grpo_steps} RL steps (s)':<44}{_fmt(g['ours']['wall_s'], 1):>26}"
              f"{_fmt(g['trl']['wall_s'], 1):>26}{_fmt(g['ratios_ours_over_trl']['end_to_end_wall']):>26}")
    print(f"wrote {out}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
