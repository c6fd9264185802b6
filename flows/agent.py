"""Prefect flows of the agent side (SPEC §3.2–3.3): ``agent_sft`` (warm start on successful oracle
traces), ``agent_grpo`` (multi-turn GRPO against the frozen simulator) and ``agent_csd`` (GRPO +
coached on-policy self-distillation, the sibling run with ``alpha > 0``).

Orchestration only: an MLflow parent run per flow run, the DeepSpeed job in its child run named
after the phase (``agent_sft``: the SFT loop's loss curves; ``agent_grpo``: per step reward overall
and per gym, invalid counts by reason, tool-call error rate, choice rates, turns, PPO statistics,
privileged turns collected and the privacy check), the final agent registered as ``mimesis-agent``
with the phase as alias, a markdown summary with the MLflow link as a Prefect artifact.

Run: ``python -m flows.agent [--phases agent_grpo] [--params params.yaml]`` (the DVC stages
``agent_sft``, ``agent_grpo`` and ``agent_csd`` do this, one phase each).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from flows.simulator import simulator_flow
from prefect import flow

AGENT_PHASES = ("agent_sft", "agent_grpo", "agent_csd")


@flow(name="agent_sft", log_prints=True)
def agent_sft_flow(params_path: str = "params.yaml", world_size: int | None = None) -> dict[str, Any]:
    """The agent's SFT warm start as its own flow; returns the job's summary."""
    return simulator_flow.fn(phases=["agent_sft"], params_path=params_path, world_size=world_size,
                             flow_name="agent_sft")["agent_sft"]


@flow(name="agent_grpo", log_prints=True)
def agent_grpo_flow(params_path: str = "params.yaml", world_size: int | None = None) -> dict[str, Any]:
    """Agent multi-turn GRPO as its own flow; returns the job's summary."""
    return simulator_flow.fn(phases=["agent_grpo"], params_path=params_path, world_size=world_size,
                             flow_name="agent_grpo")["agent_grpo"]


@flow(name="agent_csd", log_prints=True)
def agent_csd_flow(params_path: str = "params.yaml", world_size: int | None = None) -> dict[str, Any]:
    """Agent GRPO + coached self-distillation (CSD) as its own flow; the sibling of ``agent_grpo``
    (same initial agent, data and seed; ``alpha > 0``), so MLflow compares the two side by side."""
    return simulator_flow.fn(phases=["agent_csd"], params_path=params_path, world_size=world_size,
                             flow_name="agent_csd")["agent_csd"]


FLOWS = {"agent_sft": agent_sft_flow, "agent_grpo": agent_grpo_flow, "agent_csd": agent_csd_flow}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.agent")
    ap.add_argument("--phases", nargs="+", default=["agent_grpo"], choices=list(FLOWS))
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--world-size", type=int, default=None, help="override the phase's world_size")
    args = ap.parse_args(argv)
    for phase in [p for p in FLOWS if p in args.phases]:
        FLOWS[phase](params_path=args.params, world_size=args.world_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
