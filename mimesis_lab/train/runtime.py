"""The distributed runtime every training job shares: process-group start-up, rank-0 printing,
collectives, the DeepSpeed JSON and the per-rank command-line entry point.

A job module (``mimesis_lab.jobs.*``) ends with ``sys.exit(job_main(run, phases=...))``;
:func:`job_main` fills in the environment a plain ``python -m`` start lacks (world size 1),
selects DeepSpeed's CPU accelerator when there is no CUDA, loads ``params.yaml``, and turns the
clear user-facing errors into one ``error: …`` line and exit status 2. What runs on CPU here
(gloo, launchers, ZeRO stages) is written up in ``docs/cpu-notes.md``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mimesis_lab.train.launch import free_port

__all__ = ["TrainConfigError", "UNUSED_BY_DEEPSPEED", "imports_skipped", "dist_init", "say", "all_reduce", "gather",
           "load_ds_config", "param_groups", "make_engine", "set_lr", "require_model_folder", "job_main"]


class TrainConfigError(ValueError):
    """An unusable training configuration (DeepSpeed JSON, world size, paths)."""


def _disable_shm_comm() -> None:
    """Mark DeepSpeed's ``deepspeed_shm_comm`` op incompatible so its TorchBackend never builds it
    and gloo does every collective (its JIT build takes many minutes on a small machine, under a
    file lock a killed job leaves behind, and it leaks a 69 MB ``/dev/shm`` file per job; see
    ``docs/cpu-notes.md``). Opt out: ``MIMESIS_DS_SHM_COMM=1``."""
    if os.environ.get("MIMESIS_DS_SHM_COMM") == "1":
        return
    import deepspeed.ops

    compat = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compat, dict):
        compat["deepspeed_shm_comm"] = False


#: What ``import deepspeed`` imports only for a feature the jobs never use: MLflow, for the autotuner's
#: logging (inside ``try: import mlflow``; 1-2 s of every job's start-up wherever MLflow is installed). The jobs
#: log through :class:`~mimesis_lab.train.metrics_log.MetricsLog`, which imports MLflow itself when it logs there.
UNUSED_BY_DEEPSPEED = ("mlflow",)


@contextlib.contextmanager
def imports_skipped(names: tuple[str, ...]):
    """Inside the block, ``import <name>`` raises ``ImportError`` for each of ``names`` not imported yet (a
    ``None`` entry in ``sys.modules``, Python's documented stop); afterwards they import as usual."""
    skipped = [n for n in names if n not in sys.modules]
    sys.modules.update(dict.fromkeys(skipped))
    try:
        yield
    finally:
        for n in skipped:
            if n in sys.modules and sys.modules[n] is None:
                del sys.modules[n]


def dist_init() -> tuple[int, int]:
    """Start the process group (gloo on CPU, the accelerator's backend otherwise): ``(rank, world)``."""
    with imports_skipped(UNUSED_BY_DEEPSPEED):
        import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    backend = "gloo" if acc.device_name() == "cpu" else acc.communication_backend_name()
    if acc.device_name() == "cpu":
        _disable_shm_comm()
    deepspeed.init_distributed(dist_backend=backend)
    return dist.get_rank(), dist.get_world_size()


def say(rank: int, msg: str) -> None:
    """Print a progress line from rank 0 only."""
    if rank == 0:
        print(f"[train] {msg}", flush=True)


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Element-wise sum (or max) of ``values`` over all ranks, in float64."""
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def gather(obj: Any) -> list[Any]:
    """``[obj of rank 0, obj of rank 1, …]`` on every rank (``[obj]`` at world size 1)."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    return [obj]


def load_ds_config(path: str | Path) -> dict[str, Any]:
    """Read a DeepSpeed JSON; it must not define an optimizer or scheduler (the jobs pass torch
    AdamW and set the lr of every step from params)."""
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


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices, none on vectors (norms, biases)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _standalone_env() -> None:
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def default_ds_accelerator() -> None:
    """``DS_ACCELERATOR=cpu`` where no CUDA device exists and the user set none: what a job's rank needs before it
    imports DeepSpeed, so that the import picks the CPU accelerator quietly."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


def job_main(run: Callable[[str, Any], Any], phases: Sequence[str], prog: str, description: str,
             argv: Sequence[str] | None = None) -> int:
    """Per-rank entry point of a job module: ``run(phase, params)`` on this rank.

    Exit status: 0 on success; 2 for a clear user-facing error (bad params, bad split, bad
    checkpoint to resume from), printed as one ``error: …`` line; 1 with a traceback otherwise.
    """
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--phase", default=phases[0] if len(phases) == 1 else None, required=len(phases) > 1,
                    choices=list(phases), help="params.yaml section to train")
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    args = ap.parse_args(argv)

    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    _standalone_env()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    default_ds_accelerator()

    from mimesis_lab.config import ConfigError, load_params
    from mimesis_lab.models import ModelLoadError
    from mimesis_lab.tokenizer import TokenizerLoadError
    from mimesis_lab.train.checkpoint import ResumeError
    from mimesis_lab.train.data import DataError

    clear = (ConfigError, DataError, ResumeError, TrainConfigError, ModelLoadError, TokenizerLoadError)
    try:
        params = load_params(args.params)
        if getattr(params, args.phase, None) is None:
            raise TrainConfigError(f"params has no `{args.phase}` section")
        run(args.phase, params)
    except Exception as e:
        # an error class may declare itself deterministic (``clear_job_error = True``, e.g. the agent jobs'
        # PrivacyError: seeded rollouts meet the same leak on a resumed run, so a retry only costs time)
        if not isinstance(e, clear) and not getattr(e, "clear_job_error", False):
            raise
        rank = os.environ.get("RANK", "0")
        print(f"error: [{args.phase} rank {rank}] {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


def require_model_folder(key: str, path: str) -> None:
    """A clear error naming the params key when ``path`` is not a Hugging Face model folder."""
    p = Path(path)
    if not p.is_dir():
        raise TrainConfigError(f"{key}: {path} does not exist (expected a Hugging Face model folder, e.g. the "
                               "previous phase's `final/`; run its stage first)")
    if not (p / "config.json").is_file():
        raise TrainConfigError(f"{key}: {path} is not a Hugging Face model folder (no config.json)")


def make_engine(model: torch.nn.Module, cfg: Any, ds_config: dict[str, Any]):
    """``(engine, optimizer)``: ``deepspeed.initialize`` with our own ``torch.optim.AdamW`` (decay on
    matrices only; ``cfg.lr``, ``cfg.beta1``/``beta2``, ``cfg.weight_decay``)."""
    import deepspeed

    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    return engine, optimizer


def set_lr(optimizer, lr: float) -> float:
    """Set the learning rate of every param group (before the step it applies to)."""
    for g in optimizer.param_groups:
        g["lr"] = lr
    return lr
