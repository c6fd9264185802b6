"""``python -m mimesis_lab.world --out DIR [--seed N] [--users N] …``: write the synthetic world."""
from __future__ import annotations

import argparse
import json
import sys
import time

from pydantic import ValidationError

from mimesis_lab.world.generate import generate_world
from mimesis_lab.world.params import WorldParams

_SIZES = ("users", "chats_per_user", "thoughttrace_conversations", "abcd_scenarios", "gym_tasks", "min_user_turns",
          "max_user_turns", "behavior_turn_budget")
_RATES = ("neutral_share", "enact_rate", "abcd_dev_fraction", "abcd_test_fraction")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mimesis_lab.world", description=__doc__)
    ap.add_argument("--out", required=True, help="output folder (the raw-data root: chats/, thoughttrace/, abcd/, gyms/)")
    ap.add_argument("--seed", type=int, default=WorldParams.model_fields["seed"].default)
    for name in _SIZES:
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name,
                        help=WorldParams.model_fields[name].description)
    for name in _RATES:
        ap.add_argument(f"--{name.replace('_', '-')}", type=float, dest=name,
                        help=WorldParams.model_fields[name].description)
    args = ap.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if k != "out" and v is not None}
    try:
        params = WorldParams(**given)
    except ValidationError as e:
        print(f"world: invalid parameters: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    counts = generate_world(params, args.out)
    print(json.dumps({"out": args.out, "seed": params.seed, "seconds": round(time.perf_counter() - t0, 2),
                      "rows": counts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
