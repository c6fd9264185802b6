"""Prefect flow ``agent_grpo``: multi-turn GRPO of the agent against the frozen simulator (SPEC §3.1–3.2).

Orchestration only: an MLflow parent run for the flow run, the DeepSpeed job
(:mod:`mimesis_lab.rl.agent_grpo`) in its child run ``agent_grpo`` (per step: reward overall and
per gym, invalid counts by reason, tool-call error rate, choice rates, turns, PPO statistics,
privileged turns collected and the privacy check), the final agent registered as ``mimesis-agent``
with alias ``agent_grpo``, a markdown summary with the MLflow link as a Prefect artifact.

Run: ``python -m flows.agent [--params params.yaml]`` (the DVC stage ``agent_grpo`` does this).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from flows.simulator import simulator_flow
from prefect import flow


@flow(name="agent_grpo", log_prints=True)
def agent_grpo_flow(params_path: str = "params.yaml", world_size: int | None = None) -> dict[str, Any]:
    """Agent multi-turn GRPO as its own flow; returns the job's summary."""
    return simulator_flow.fn(phases=["agent_grpo"], params_path=params_path, world_size=world_size,
                             flow_name="agent_grpo")["agent_grpo"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.agent")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--world-size", type=int, default=None, help="override agent_grpo.world_size")
    args = ap.parse_args(argv)
    agent_grpo_flow(params_path=args.params, world_size=args.world_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
