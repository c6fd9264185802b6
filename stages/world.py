"""DVC stage ``world``: the seeded synthetic world, the default raw data of the pipeline.

One population of users with latent, consistent traits (preferences, budget, writing style,
patience, behaviour propensities); every raw input is drawn from it and written in the real public
format the stages read (:mod:`mimesis_lab.world`): WildChat-style chats, ThoughtTrace, ABCD with its
kb and guidelines, and the eight gyms' task files. Same seed, byte-identical files. The world is
synthetic: the miniature it feeds shows the mechanism, not the paper's effect sizes.

Accounting: every generated row is an output (rows_in == rows_out, nothing quarantined).
"""
from __future__ import annotations

import shutil
from pathlib import Path

from mimesis_lab.config import Params
from mimesis_lab.io import Quarantine
from mimesis_lab.world import generate_world
from mimesis_lab.world.params import WorldParams
from stages.common import StageError, StageResult
from stages.common import main as stage_main

STAGE = "world"


def build(params: Params) -> StageResult:
    cfg = params.world
    if cfg is None:
        raise StageError("params has no `world` section")
    out = Path(cfg.output_dir)
    if out.exists():
        shutil.rmtree(out)          # the folder is this stage's output: no file of an older world may remain
    world = WorldParams(**cfg.model_dump(exclude={"output_dir"}))
    counts = generate_world(world, out)
    total = int(sum(counts.values()))
    return StageResult(outputs={}, rows_in=total, rows_out=total, quarantine=Quarantine(), inputs=[],
                       extra={"files": counts, "output_dir": cfg.output_dir, "seed": cfg.seed})


def main(argv: list[str] | None = None) -> int:
    """``python -m stages.world [--params params.yaml] [--no-track]``."""
    return stage_main(STAGE, build, lambda p: p.world, argv)


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
