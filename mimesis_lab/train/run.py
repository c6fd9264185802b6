"""Per-rank job entry point: ``python -m mimesis_lab.train.run --phase midtrain|sft|agent_sft|sim_rl|agent_grpo|agent_csd --params params.yaml``.

This is what ``deepspeed --module`` / ``torchrun -m`` start on every rank (see :mod:`.launch`).
Run alone with plain ``python -m`` it is a world-size-1 job: missing ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` are filled in. Without CUDA,
``DS_ACCELERATOR=cpu`` is set before deepspeed is imported.

Exit status: 0 on success; 2 for a clear user-facing error (bad params, bad split, bad
checkpoint to resume from), printed as one ``error: …`` line; 1 with a traceback otherwise.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _standalone_env() -> None:
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mimesis_lab.train.run", description=__doc__.splitlines()[0])
    ap.add_argument("--phase", required=True, choices=["midtrain", "sft", "agent_sft", "sim_rl", "agent_grpo", "agent_csd"], help="params.yaml section to train")
    ap.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed launcher")
    args = ap.parse_args(argv)

    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    _standalone_env()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"

    from mimesis_lab.config import ConfigError, load_params
    from mimesis_lab.models import ModelLoadError
    from mimesis_lab.tokenizer import TokenizerLoadError
    from mimesis_lab.train.data import DataError
    from mimesis_lab.train.loop import ResumeError, TrainConfigError, run_training

    from mimesis_lab.rl.agent_grpo import run_agent_csd, run_agent_grpo
    from mimesis_lab.rl.sim_rl import run_sim_rl

    clear = (ConfigError, DataError, ResumeError, TrainConfigError, ModelLoadError, TokenizerLoadError)
    try:
        params = load_params(args.params)
        if args.phase == "sim_rl":
            run_sim_rl(params)
        elif args.phase == "agent_grpo":
            run_agent_grpo(params)
        elif args.phase == "agent_csd":
            run_agent_csd(params)
        else:
            run_training(args.phase, params)
    except clear as e:
        rank = os.environ.get("RANK", "0")
        print(f"error: [{args.phase} rank {rank}] {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
