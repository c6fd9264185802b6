"""Per-gym numbers of the gym experts (:mod:`mimesis_lab.envs.gyms.experts`) on a world and on the bundled tasks.

For each gym and task set: tasks, rewarded traces (the expert's oracle trace with the offline user,
``vague_rate`` 0.1 as in ``agent_traces``), mean reward and mean turns of the rewarded traces, the
share of rewarded traces that asked the user, and the mean reward per task with the informative
offline user vs an uninformative one (the same non-answer to everything: "Hmm.", "Irrelevant" for
the turtle host), which shows that the answers matter.

    python scripts/expert_measure.py [--world DIR | --seed 1234] [--json out.json]

Without ``--world`` it writes a world with the default :class:`~mimesis_lab.world.WorldParams`
(``--seed``) into a temporary folder.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(tasks: dict[str, dict[str, dict[str, Any]]], gyms: tuple[str, ...] | None = None) -> dict[str, dict]:
    from mimesis_lab.envs.gyms.base import ScriptedUser
    from mimesis_lab.envs.gyms.experts import ORACLE_GYMS, expert_trace
    from mimesis_lab.envs.gyms.registry import MODULES

    out: dict[str, dict] = {}
    for gym in gyms or ORACLE_GYMS:
        rows = MODULES[gym].build_rows(tasks[gym], "train")
        traces = [expert_trace(r, tasks) for r in rows]
        kept = [t for t in traces if t is not None]
        blind_user = "Irrelevant" if gym == "turtle" else "Hmm."
        blind = [expert_trace(r, tasks, user=ScriptedUser(lambda m, s=blind_user: s)) for r in rows]
        n = max(1, len(rows))
        out[gym] = {
            "tasks": len(rows),
            "rewarded": len(kept),
            "mean_reward": round(sum(t["total_reward"] for t in kept) / max(1, len(kept)), 4),
            "mean_turns": round(sum(len(t["rewards"]) for t in kept) / max(1, len(kept)), 2),
            "asked_user_share": round(sum(t["user_turns"] > 0 for t in kept) / max(1, len(kept)), 3),
            "reward_per_task_informed": round(sum(t["total_reward"] for t in kept) / n, 4),
            "reward_per_task_uninformed": round(sum(t["total_reward"] for t in blind if t) / n, 4),
            "unrewarded_ids": [r["reward_model"]["id"] for r, t in zip(rows, traces) if t is None],
        }
    return out


def table(name: str, res: dict[str, dict]) -> str:
    cols = ("tasks", "rewarded", "mean_reward", "mean_turns", "asked_user_share", "reward_per_task_informed",
            "reward_per_task_uninformed")
    head = "| gym | " + " | ".join(cols) + " |"
    lines = [f"### {name}", "", head, "|" + "---|" * (len(cols) + 1)]
    for g, r in res.items():
        lines.append(f"| {g} | " + " | ".join(str(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from mimesis_lab.envs.gyms.registry import ALL_GYMS, load_tasks
    from mimesis_lab.world import WorldParams, generate_world

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=Path, help="an existing world folder (else one is generated)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--gyms", nargs="*", help="only these gyms")
    ap.add_argument("--json", type=Path, help="write the numbers here too")
    ap.add_argument("--no-bundled", action="store_true", help="skip the bundled tasks")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = a.world
        if root is None:
            root = Path(tmp)
            generate_world(WorldParams(seed=a.seed), root)
        world = {g: load_tasks(g, root / "gyms" / g / "tasks.json") for g in ALL_GYMS}
        gyms = tuple(a.gyms) if a.gyms else None
        res = {"world": measure(world, gyms)}
    if not a.no_bundled:
        res["bundled"] = measure({g: load_tasks(g) for g in ALL_GYMS}, gyms)
    for k, v in res.items():
        print(table(f"{k} (seed {a.seed})" if k == "world" else k, v) + "\n")
        for g, r in v.items():
            if r["unrewarded_ids"]:
                print(f"  {k}/{g} unrewarded: {' '.join(r['unrewarded_ids'])}")
        print()
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
