"""The shared DeepSpeed training loop of ``midtrain`` and ``sft`` (SPEC §2.1–2.2).

Runs on every rank (started by ``deepspeed``/``torchrun``, see :mod:`.launch`):
``deepspeed.initialize`` with the phase's JSON config and our own ``torch.optim.AdamW``
(the JSON must not name an optimizer or scheduler); the lr of every step comes from
:func:`.schedule.lr_at` (set on the optimizer's param groups before the boundary step);
gradient clipping is DeepSpeed's (``gradient_clipping`` in the JSON).

Loss = global token mean. For one optimizer step with ``N`` scored tokens over all ranks
and micro-steps, micro-step loss = ``ce_sum_micro * world_size / N`` and
``engine.backward(..., scale_wrt_gas=False)``: DeepSpeed averages gradients over the data-
parallel ranks (÷ world_size) and we turn off its ÷ gradient_accumulation_steps, so the
gradient is that of ``sum(ce over all scored tokens) / N`` whatever the world size /
accumulation split. ``N`` is known on every rank from the data plan (no communication).

Checkpoints (``output_dir/checkpoints/step_<8-digit step>``, e.g. ``step_00000040``, every ``save_every`` steps and at
the end, ``keep_last`` kept): ``engine.save_checkpoint`` with ``client_state`` = step, epoch,
data cursor (samples seen), tokens seen, val losses, rank-0 RNG states; then rank 0 writes
``mimesis_checkpoint.json`` (size + sha256 of every file) *after* the post-save barrier. Only a
folder with that marker counts as complete (DeepSpeed writes its ``latest`` file before all
ranks have finished writing), so a run SIGKILLed mid-save resumes from the previous one.
Exact resume: data order is a pure function of ``(seed, step)`` (:class:`.data.DataPlan`),
the lr a pure function of the step, and torch's RNG is reseeded from ``(seed, step, rank)``
at every step; optimizer/master weights come back from the ZeRO checkpoint — a killed and
rerun job ends with weights equal to an uninterrupted one (tested bit-exact).
``resume: auto`` continues only a checkpoint of the *same* run: its client_state carries
:func:`run_fingerprint` (phase settings, model section, DeepSpeed JSON, data files); after a
change of settings or data it starts fresh (a fresh start clears the output folder's old
checkpoints, metrics and export). An explicit ``resume: <path>`` always resumes.

What runs on CPU here (DeepSpeed 0.19.8, torch 2.13 CPU, ``DS_ACCELERATOR=cpu``, 2 cores):
- backend ``gloo`` (``deepspeed.init_distributed(dist_backend="gloo")``; oneCCL is not
  installed). DeepSpeed's CPU shared-memory allreduce op is kept out (:func:`_disable_shm_comm`):
  its JIT build takes many minutes of C++ on a small machine, under a file lock that a killed
  job leaves behind (the next job then waits forever), and every job leaves a 69 MB
  ``/dev/shm/deepspeed_allreduce_buffer_*`` file behind. ``MIMESIS_DS_SHM_COMM=1`` keeps it.
- world size 1 and 2 with the ``deepspeed`` launcher (on CPU ``--num_gpus N`` means N local
  processes: the runner trims the localhost slot list to ``range(N)`` without asking the
  accelerator, and exports ``LOCAL_SIZE=N``) and with ``torchrun --nproc_per_node N``;
  plain ``python -m mimesis_lab.train.run`` is a world-size-1 job (:mod:`.run` fills in
  ``RANK``/``WORLD_SIZE``/``MASTER_*``).
- ZeRO stages 0, 1, 2 and 3, fp32, with a client ``torch.optim.AdamW``, at world sizes 1 and
  2: all six give the same loss trajectory (checked by hand; the tests cover ZeRO-2 ws 1/2
  under ``deepspeed`` and ZeRO-3 ws 2 under ``torchrun``). Without ZeRO DeepSpeed records no
  gradient norm, so the loop computes it before the boundary step. bf16/fp16 are not run on
  CPU here (paper profile: GPU).
- world size 2 vs 1 at the same global batch (micro 2 × accumulation 1 × 2 ranks vs
  2 × 2 × 1): same rows per step, losses equal to ~1e-5 relative over 200 steps, weights
  to ~1e-5 (only the float summation order differs).
- ``save_checkpoint``/``load_checkpoint`` with ``client_state``; ZeRO checkpoints are tied to
  the world size (checked before loading: a clear error instead of a DeepSpeed assertion).
  SIGKILL of the launcher's process group mid-run, then rerun → bit-identical final weights.
- export: rank 0 consolidates fp32 weights with ``deepspeed.utils.zero_to_fp32`` (stage ≥ 1;
  stage 0 takes the module's state dict) into a fresh model → ``output_dir/final/``
  (``save_pretrained`` + tokenizer; tied embeddings kept tied) + ``training_summary.json``.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from mimesis_lab.packing import collate, masked_token_ce_sum
from mimesis_lab.progress import Progress
from mimesis_lab.tracking import file_sha256
from mimesis_lab.train.data import DataPlan, eval_batches, load_rows, target_count
from mimesis_lab.train.schedule import lr_at

__all__ = ["ResumeError", "TrainConfigError", "CHECKPOINTS", "MARKER", "tag_for", "list_checkpoints",
           "validate_checkpoint", "resolve_resume", "load_ds_config", "run_fingerprint", "run_training"]

CHECKPOINTS = "checkpoints"
MARKER = "mimesis_checkpoint.json"
TAG_PREFIX = "step_"
HASH_LIMIT = 1 << 30          # sha256-verify checkpoints up to 1 GiB on resume (sizes always)
LONG_ROWS = 8192              # above this max_len, packed attention via position_ids (no O(L^2) mask)


class ResumeError(RuntimeError):
    """A checkpoint that cannot be resumed from; the message names the path and the problem."""


class TrainConfigError(ValueError):
    """An unusable training configuration (DeepSpeed JSON, world size, paths)."""


# ----------------------------------------------------------------------------- checkpoints
def tag_for(step: int) -> str:
    return f"{TAG_PREFIX}{step:08d}"


def _tag_step(path: Path) -> int | None:
    name = path.name
    if path.is_dir() and name.startswith(TAG_PREFIX) and name[len(TAG_PREFIX):].isdigit():
        return int(name[len(TAG_PREFIX):])
    return None


def list_checkpoints(root: str | Path, complete_only: bool = True) -> list[tuple[int, Path]]:
    """``(step, folder)`` of the checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = [(s, p) for p in root.iterdir() if (s := _tag_step(p)) is not None]
    if complete_only:
        out = [(s, p) for s, p in out if (p / MARKER).is_file()]
    return sorted(out)


def validate_checkpoint(tag_dir: str | Path, world_size: int) -> dict[str, Any]:
    """Check a checkpoint folder before DeepSpeed touches it; returns its marker.

    Raises :class:`ResumeError` when the folder or its marker is missing or unreadable, a
    listed file is missing or has another size (or sha256, up to 1 GiB in all), or it was
    written with another world size.
    """
    tag_dir = Path(tag_dir)
    if not tag_dir.is_dir():
        raise ResumeError(f"{tag_dir}: checkpoint folder does not exist")
    marker = tag_dir / MARKER
    if not marker.is_file():
        raise ResumeError(f"{tag_dir}: incomplete or foreign checkpoint (no {MARKER}; the run that wrote it "
                          "was probably killed while saving)")
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
        files = info["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ResumeError(f"{marker}: corrupt checkpoint marker ({e})") from None
    if info.get("world_size") != world_size:
        raise ResumeError(
            f"{tag_dir}: written with world_size {info.get('world_size')}, this run has world_size {world_size}. "
            "ZeRO checkpoints are tied to the world size: resume with the same world_size, or start a new run "
            "from the exported weights (init_from: <output_dir>/final).")
    verify_hash = sum(int(f["size"]) for f in files.values()) <= HASH_LIMIT
    for rel, f in files.items():
        p = tag_dir / rel
        if not p.is_file():
            raise ResumeError(f"{tag_dir}: checkpoint file {rel} is missing")
        if p.stat().st_size != int(f["size"]):
            raise ResumeError(f"{p}: corrupt checkpoint file (size {p.stat().st_size}, expected {f['size']})")
        if verify_hash and file_sha256(p) != f["sha256"]:
            raise ResumeError(f"{p}: corrupt checkpoint file (sha256 differs from {MARKER})")
    return info


def resolve_resume(resume: str, ckpt_root: str | Path, world_size: int) -> tuple[Path, str] | None:
    """Where to resume from: ``(checkpoints root, tag)`` or ``None`` (fresh start).

    ``never`` → None; ``auto`` → the newest *complete* checkpoint under ``ckpt_root`` (None if
    there is none); a path → that checkpoint folder, or the newest complete one in that
    checkpoints folder. A path that does not exist, is not a checkpoint, or fails
    :func:`validate_checkpoint` raises :class:`ResumeError`.
    """
    if resume == "never":
        return None
    if resume == "auto":
        found = list_checkpoints(ckpt_root)
        if not found:
            return None
        tag_dir = found[-1][1]
    else:
        path = Path(resume)
        if not path.exists():
            raise ResumeError(f"resume: {path} does not exist")
        if _tag_step(path) is not None or (path / MARKER).exists():
            tag_dir = path
        else:
            found = list_checkpoints(path)
            if not found:
                raise ResumeError(f"resume: {path} holds no complete checkpoint (expected <output_dir>/{CHECKPOINTS} "
                                  f"or one of its {TAG_PREFIX}<8-digit step> folders)")
            tag_dir = found[-1][1]
    validate_checkpoint(tag_dir, world_size)
    return tag_dir.parent, tag_dir.name


def _write_marker(tag_dir: Path, step: int, world_size: int, client_state: dict[str, Any]) -> dict[str, Any]:
    files = {}
    for p in sorted(tag_dir.rglob("*")):
        if p.is_file() and p.name != MARKER:
            files[str(p.relative_to(tag_dir))] = {"size": p.stat().st_size, "sha256": file_sha256(p)}
    info = {"step": step, "world_size": world_size, "files": files,
            "client_state": {k: v for k, v in client_state.items() if not k.startswith("rng_")}}
    tmp = tag_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(info, indent=1), encoding="utf-8")
    os.replace(tmp, tag_dir / MARKER)
    return info


# ----------------------------------------------------------------------------- config helpers
def load_ds_config(path: str | Path) -> dict[str, Any]:
    """Read a DeepSpeed JSON; it must not define an optimizer or scheduler (the loop passes its own)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TrainConfigError(f"{path}: cannot read DeepSpeed config ({e})") from None
    except ValueError as e:
        raise TrainConfigError(f"{path}: invalid JSON ({e})") from None
    for key in ("optimizer", "scheduler"):
        if key in cfg:
            raise TrainConfigError(f"{path}: `{key}` must not be set: the loop passes torch AdamW and sets the lr "
                                   "per step from params (lr, warmup_ratio, min_lr_ratio)")
    return cfg


def _tokenizer_path(params: Any, cfg: Any) -> str:
    if cfg.init_from != "model":
        return cfg.init_from
    return params.tokenizer.pretrained or params.tokenizer.output_dir


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


# Keys of a phase section that do not change what is trained (excluded from the fingerprint).
OPERATIONAL_KEYS = ("resume", "eval_every", "save_every", "keep_last", "log_every", "launcher", "output_dir")


def _file_identity(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        return {"path": path, "missing": True}
    size = p.stat().st_size
    return {"size": size, "sha256": file_sha256(p) if size <= HASH_LIMIT else None}


def _init_identity(folder: str) -> dict[str, Any]:
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        if (Path(folder) / name).is_file():
            return _file_identity(str(Path(folder) / name))
    return {"path": folder, "missing": True}


def code_identity() -> str:
    """sha256 over the library's source files: a checkpoint written by other code is another run
    (``dvc repro`` re-runs a stage after a code change and must not resume the old result)."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def run_fingerprint(params: Any, phase: str, ds_config: dict[str, Any]) -> str:
    """sha256 of what determines the trained weights: the phase section (minus
    :data:`OPERATIONAL_KEYS`), the model section when the model is built from it, the
    DeepSpeed JSON, the train/val files (size + sha256 up to 1 GiB) and the library code
    (:func:`code_identity`). ``resume: auto`` only continues a checkpoint with the same fingerprint."""
    import hashlib

    cfg = getattr(params, phase)
    section = {k: v for k, v in cfg.model_dump().items() if k not in OPERATIONAL_KEYS}
    doc = {"phase": phase, "section": section, "ds_config": ds_config,
           "model": params.model.model_dump() if cfg.init_from == "model" else None,
           "init_from": _init_identity(cfg.init_from) if cfg.init_from != "model" else None,
           "train": _file_identity(cfg.train), "val": _file_identity(cfg.val), "code": code_identity()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep only the records of ``path`` (JSON lines with a ``step``) up to ``step``."""
    if not path.is_file():
        return
    keep = [ln for ln in path.read_text(encoding="utf-8").splitlines()
            if ln.strip() and json.loads(ln).get("step", 0) <= step]
    path.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")


class _Log:
    """Rank-0 metrics: always ``output_dir/metrics.jsonl``; MLflow when ``MLFLOW_RUN_ID`` is set."""

    def __init__(self, out_dir: Path, active: bool):
        self.active = active
        self.path = out_dir / "metrics.jsonl"
        self.mlflow = None
        if active and os.environ.get("MLFLOW_RUN_ID"):
            import mlflow

            if os.environ.get("MLFLOW_TRACKING_URI"):
                mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
            mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"])
            self.mlflow = mlflow

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after ``step`` (written by a killed run that is being resumed)."""
        if self.active:
            truncate_jsonl(self.path, step)

    def write(self, record: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        if not self.active:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.mlflow is not None and metrics:
            self.mlflow.log_metrics({k: float(v) for k, v in metrics.items() if v is not None}, step=record["step"])

    def checkpoint(self, step: int, path: Path, info: dict[str, Any]) -> None:
        digests = {k: v["sha256"] for k, v in info["files"].items()}
        self.write({"kind": "checkpoint", "step": step, "path": str(path.resolve()), "sha256": digests})
        if self.mlflow is not None:
            self.mlflow.log_dict({"path": str(path.resolve()), "files": info["files"]}, f"checkpoints/{path.name}.json")
            self.mlflow.set_tag("last_checkpoint", str(path.resolve()))

    def close(self, ok: bool) -> None:
        if self.mlflow is not None:
            self.mlflow.end_run(status="FINISHED" if ok else "FAILED")


def _say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[train] {msg}", flush=True)


# ----------------------------------------------------------------------------- the loop
def _disable_shm_comm() -> None:
    """Mark DeepSpeed's ``deepspeed_shm_comm`` op incompatible so its TorchBackend never builds
    it and gloo does every collective (see the module docstring). Opt out: ``MIMESIS_DS_SHM_COMM=1``."""
    if os.environ.get("MIMESIS_DS_SHM_COMM") == "1":
        return
    import deepspeed.ops

    compat = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compat, dict):
        compat["deepspeed_shm_comm"] = False


def _dist_init() -> tuple[int, int]:
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    backend = "gloo" if acc.device_name() == "cpu" else acc.communication_backend_name()
    if acc.device_name() == "cpu":
        _disable_shm_comm()
    deepspeed.init_distributed(dist_backend=backend)
    return dist.get_rank(), dist.get_world_size()


def _all_sum(values: list[float]) -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def _forward_ce(engine, rows, max_len, pad_id, mask_mode, dtype):
    batch = collate(rows, max_len, pad_id, mask=mask_mode, dtype=dtype)
    labels = batch.pop("labels").to(engine.device)
    batch = {k: v.to(engine.device) for k, v in batch.items()}
    out = engine(**batch, use_cache=False)
    return masked_token_ce_sum(out.logits, labels)


def _evaluate(engine, rows, micro, world, rank, max_len, pad_id, mask_mode, dtype) -> float:
    engine.eval()
    total, count = 0.0, 0.0
    with torch.no_grad():
        for idx in eval_batches(len(rows), micro, world, rank):
            s, c = _forward_ce(engine, [rows[i] for i in (idx or [0])], max_len, pad_id, mask_mode, dtype)
            if idx:
                total, count = total + float(s), count + float(c)
    engine.train()
    total, count = _all_sum([total, count])
    return total / max(count, 1.0)


def _export(engine, tokenizer, ckpt_root: Path, tag: str, zero_stage: int, final: Path) -> None:
    """Rank 0: plain fp32 weights (zero_to_fp32 for ZeRO ≥ 1) as a Hugging Face folder."""
    from mimesis_lab.models import save_hf

    module = engine.module
    if zero_stage >= 1:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        sd = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_root), tag=tag)
        model = type(module)(module.config)          # a plain CPU copy (ZeRO-3 params are partitioned)
        missing, unexpected = model.load_state_dict(sd, strict=False)
        tied = set(getattr(model, "_tied_weights_keys", None) or []) | {"lm_head.weight"}
        if unexpected or [k for k in missing if k not in tied]:
            raise RuntimeError(f"zero_to_fp32 export does not match the model: missing {missing}, "
                               f"unexpected {unexpected}")
        if hasattr(model, "tie_weights"):
            model.tie_weights()
    else:
        model = module
    if final.exists():
        shutil.rmtree(final)
    save_hf(model.to(torch.float32), tokenizer, final)


def load_resume_checkpoint(engine, root: Path, tag: str) -> dict[str, Any]:
    """Load ``root/tag`` (weights and optimizer state) into ``engine``; its client state.
    Raises :class:`ResumeError` naming the folder when DeepSpeed cannot load it."""
    try:
        path, client = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
    except Exception as e:
        raise ResumeError(f"{root / tag}: cannot load checkpoint ({type(e).__name__}: {e})") from e
    if path is None or client is None:
        raise ResumeError(f"{root / tag}: DeepSpeed found no loadable checkpoint there")
    return client


def drop_checkpoints_after(ckpt_root: Path, step: int) -> None:
    """Remove checkpoint folders past ``step`` (stale folders of the killed run being resumed)."""
    for s, p in list_checkpoints(ckpt_root, complete_only=False):
        if s > step:
            shutil.rmtree(p, ignore_errors=True)


def clear_outputs(out_dir: Path, ckpt_root: Path, files: tuple[str, ...]) -> int:
    """A fresh start owns the output folder: remove old checkpoints, ``final/`` and ``files``;
    returns how many checkpoint folders were removed."""
    stale = [p for _, p in list_checkpoints(ckpt_root, complete_only=False)]
    for p in stale + [out_dir / "final"]:
        shutil.rmtree(p, ignore_errors=True)
    for f in files:
        (out_dir / f).unlink(missing_ok=True)
    return len(stale)


def save_checkpoint(engine, ckpt_root: Path, step: int, client: dict[str, Any], log: "_Log", keep_last: int,
                    rank: int, world: int) -> None:
    """Save on every rank, then (rank 0) write the completeness marker, log it and keep the last
    ``keep_last`` complete checkpoints."""
    import torch.distributed as dist

    engine.save_checkpoint(str(ckpt_root), tag=tag_for(step), client_state=client)
    dist.barrier()
    if rank == 0:
        tag_dir = ckpt_root / tag_for(step)
        info = _write_marker(tag_dir, step, world, client)
        log.checkpoint(step, tag_dir, info)
        for _, old in list_checkpoints(ckpt_root)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def run_training(phase: str, params: Any) -> dict[str, Any] | None:
    """Train ``params.<phase>`` on this rank; rank 0 returns the training summary."""
    import torch.distributed as dist
    import deepspeed

    from mimesis_lab.models import build_or_load, load_model
    from mimesis_lab.tokenizer import load_tokenizer

    cfg = getattr(params, phase, None)
    if cfg is None:
        raise TrainConfigError(f"params has no `{phase}` section")
    rank, world = _dist_init()
    if world != cfg.world_size:
        raise TrainConfigError(f"{phase}.world_size is {cfg.world_size} but {world} processes were launched")
    out_dir = Path(cfg.output_dir)
    ckpt_root = out_dir / CHECKPOINTS
    ds_config = load_ds_config(cfg.deepspeed_config)
    fingerprint = run_fingerprint(params, phase, ds_config)
    resume = resolve_resume(cfg.resume, ckpt_root, world)        # fails fast, before any heavy work
    if resume is not None:
        stored = json.loads((resume[0] / resume[1] / MARKER).read_text())["client_state"].get("fingerprint")
        if stored != fingerprint and cfg.resume == "auto":
            _say(rank, f"resume: auto: {resume[0] / resume[1]} belongs to a run with other settings or data "
                       "(fingerprint differs); starting fresh")
            resume = None
        elif stored != fingerprint:
            _say(rank, f"note: resuming from {resume[0] / resume[1]}, written with other settings or data")
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    tokenizer = load_tokenizer(_tokenizer_path(params, cfg))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    train_rows, train_stats = load_rows(cfg.train, tokenizer, cfg, train=True)
    val_rows, val_stats = load_rows(cfg.val, tokenizer, cfg, train=False)

    torch.manual_seed(cfg.seed)
    model = build_or_load(params.model, tokenizer) if cfg.init_from == "model" else load_model(cfg.init_from)
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr,
                                  betas=(cfg.beta1, cfg.beta2))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    zero_stage = engine.zero_optimization_stage()
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float16 if engine.fp16_enabled() else torch.float32
    mask_mode = "4d" if cfg.max_len <= LONG_ROWS else "position_ids"
    micro, gas = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    plan = DataPlan(len(train_rows), micro, gas, world, cfg.seed)
    total = plan.total_steps(cfg.epochs, cfg.max_steps)
    row_len = [len(r) for r in train_rows]
    row_tgt = [target_count(r) for r in train_rows]

    log = _Log(out_dir, rank == 0)
    ok = False
    try:
        state: dict[str, Any] = {"step": 0, "tokens_seen": 0, "target_tokens_seen": 0,
                                 "initial_val_loss": None, "last_val_loss": None, "last_val_step": None}
        if resume is not None:
            root, tag = resume
            client = load_resume_checkpoint(engine, root, tag)
            if client.get("global_batch") != plan.global_batch:
                raise ResumeError(f"{root / tag}: written with global batch {client.get('global_batch')} rows/step, "
                                  f"this run has {plan.global_batch}; the data position would not carry over")
            state.update({k: client[k] for k in state if k in client})
            if state["step"] > total:
                raise ResumeError(f"{root / tag}: checkpoint is at step {state['step']}, past this run's last step "
                                  f"{total} (epochs/max_steps were lowered); use resume: never to start over")
            if client.get("total_steps") not in (None, total):
                _say(rank, f"note: the checkpoint's run had {client['total_steps']} steps, this one has {total}: "
                           "the lr schedule of the remaining steps follows the new total")
            if rank == 0:
                drop_checkpoints_after(ckpt_root, state["step"])
                log.truncate_after(state["step"])
            _say(rank, f"resumed from {root / tag} at step {state['step']} (epoch {plan.epoch_at(state['step']):.3f})")
        elif rank == 0:
            # a fresh start owns the output folder: leftovers of an earlier run (checkpoints that
            # were not resumed, their metrics, an old export) would mix with this run's
            stale = clear_outputs(out_dir, ckpt_root, ("metrics.jsonl",))
            if stale:
                _say(rank, f"fresh start (resume: {cfg.resume}): removed {stale} old checkpoint folder(s)")
        log.write({"kind": "start", "step": state["step"], "phase": phase, "world_size": world,
                   "zero_stage": zero_stage,
                   "micro_batch": micro, "grad_accum": gas, "global_batch": plan.global_batch, "total_steps": total,
                   "train_rows": len(train_rows), "val_rows": len(val_rows), "resumed": resume is not None})
        _say(rank, f"{phase}: {len(train_rows)} train rows ({train_stats['packing_efficiency']:.3f} packed), "
                   f"{len(val_rows)} val rows, global batch {plan.global_batch} = {micro}x{gas}x{world}, "
                   f"steps {state['step']}->{total}, ZeRO-{zero_stage}, {dtype}")

        def evaluate_now(step: int) -> None:
            val = _evaluate(engine, val_rows, micro, world, rank, cfg.max_len, pad_id, mask_mode, dtype)
            if state["initial_val_loss"] is None:
                state["initial_val_loss"] = val
            state["last_val_loss"], state["last_val_step"] = val, step
            log.write({"kind": "eval", "step": step, "val_loss": val}, {"val_loss": val})
            _say(rank, f"step {step}: val_loss {val:.4f}")

        def save_now(step: int) -> None:
            client = dict(state, phase=phase, fingerprint=fingerprint, epoch=plan.epoch_at(step),
                          samples_seen=step * plan.global_batch,
                          global_batch=plan.global_batch, world_size=world, total_steps=total,
                          rng_torch=torch.get_rng_state())
            save_checkpoint(engine, ckpt_root, step, client, log, cfg.keep_last, rank, world)

        if state["step"] == 0 and state["last_val_step"] is None:
            evaluate_now(0)
        engine.train()
        step = state["step"]
        prog = Progress(total, phase, unit="step", initial=step, mode="off")   # rate + ETA for the step lines
        while step < total:
            torch.manual_seed((cfg.seed + 1) * 1_000_003 + step * 131 + rank)
            lr = lr_at(step, total, cfg.lr, cfg.warmup_ratio, cfg.min_lr_ratio)
            for g in optimizer.param_groups:
                g["lr"] = lr
            rows_step = plan.step_rows(step)
            n_tgt = sum(row_tgt[i] for i in rows_step)
            n_tok = sum(row_len[i] for i in rows_step)
            t0 = time.perf_counter()
            local = 0.0
            gn = None
            for k, idx in enumerate(plan.micro_batches(step, rank)):
                s, _ = _forward_ce(engine, [train_rows[i] for i in idx], cfg.max_len, pad_id, mask_mode, dtype)
                engine.backward(s * (world / n_tgt), scale_wrt_gas=False)
                if zero_stage == 0 and k == gas - 1:      # DeepSpeed records no norm without ZeRO
                    gn = float(torch.nn.utils.get_total_norm([p.grad for p in engine.module.parameters()
                                                              if p.grad is not None]))
                engine.step()
                local += float(s.detach())
            loss = _all_sum([local])[0] / n_tgt
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
                log.write(rec, {"train_loss": loss, "lr": lr, "grad_norm": gn, "tokens_per_s": n_tok / dt,
                                "step_time_s": dt, "epoch": rec["epoch"]})
                _say(rank, prog.line({"loss": round(loss, 4), "lr": lr, "gn": gn if gn is None else round(gn, 3),
                                      "tok/s": round(n_tok / dt), "step_s": round(dt, 3)}))
            if step % cfg.eval_every == 0 or step == total:
                evaluate_now(step)
            if step % cfg.save_every == 0 or step == total:
                save_now(step)
        if state["last_val_step"] != total:
            evaluate_now(total)
        if not (ckpt_root / tag_for(total) / MARKER).is_file():
            save_now(total)
        summary = None
        if rank == 0:
            final = out_dir / "final"
            _export(engine, tokenizer, ckpt_root, tag_for(total), zero_stage, final)
            summary = {
                "phase": phase, "steps": total, "world_size": world, "zero_stage": zero_stage,
                "global_batch": plan.global_batch, "micro_batch": micro, "grad_accum": gas,
                "epochs": plan.epoch_at(total), "tokens": state["tokens_seen"],
                "target_tokens": state["target_tokens_seen"],
                "initial_val_loss": state["initial_val_loss"], "final_val_loss": state["last_val_loss"],
                "packing_efficiency": train_stats["packing_efficiency"], "train_rows": len(train_rows),
                "examples_in": train_stats["examples_in"], "examples_out": train_stats["examples_out"],
                "examples_truncated": train_stats["truncated"],
                "examples_dropped": train_stats["dropped_overlong"] + train_stats["dropped_no_target"],
                "examples_dropped_overlong": train_stats["dropped_overlong"],
                "examples_dropped_no_target": train_stats["dropped_no_target"],
                "tokenize_errors": train_stats["tokenize_errors"], "val": val_stats,
                "checkpoint": str((ckpt_root / tag_for(total)).resolve()),
                "wall_time_s_this_run": time.time() - t_start,
            }
            (final / "training_summary.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
            log.write({"kind": "final", "step": total, "path": str(final.resolve())})
            if log.mlflow is not None:
                log.mlflow.log_dict(summary, "training_summary.json")
                log.mlflow.log_metrics({"final_val_loss": summary["final_val_loss"], "tokens": summary["tokens"]},
                                       step=total)
            _say(rank, f"exported {final}")
        dist.barrier()
        ok = True
        return summary
    finally:
        log.close(ok)
