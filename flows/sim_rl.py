"""Prefect flow ``sim_rl``: joint multi-domain simulator RL from the SFT model (SPEC §2.3–2.4).

Orchestration only: one MLflow parent run for the flow run, the DeepSpeed job
(:mod:`mimesis_lab.rl.sim_rl`) in its own child run named ``sim_rl`` (per-step update and
raw reward, reward per task and per behaviour, the judge's e/p/n/c means, announced rate,
format-failure rate, invalid counts by reason, response length, neutral cooperativeness),
the final model registered as ``mimesis-simulator`` with alias ``sim_rl``, and a markdown
summary with the MLflow link as a Prefect artifact. The same task as the ``simulator`` flow
runs the job (:func:`flows.simulator.train_phase`), so retries resume from the last checkpoint.

Run: ``python -m flows.sim_rl [--params params.yaml]`` (the DVC stage ``sim_rl`` does this).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from flows.simulator import simulator_flow
from prefect import flow


@flow(name="sim_rl", log_prints=True)
def sim_rl_flow(params_path: str = "params.yaml", world_size: int | None = None) -> dict[str, Any]:
    """Simulator RL (FoldGRPO) as its own flow; returns the job's summary."""
    return simulator_flow.fn(phases=["sim_rl"], params_path=params_path, world_size=world_size,
                             flow_name="sim_rl")["sim_rl"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.sim_rl")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--world-size", type=int, default=None, help="override sim_rl.world_size")
    args = ap.parse_args(argv)
    sim_rl_flow(params_path=args.params, world_size=args.world_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
