"""A controllable simulator-RL configuration whose reward must rise: the learning-signal check.

The policy is a tiny randomly initialised model (its tokenizer trained on the task prompts and a
few impatient customer lines); the only task is the ABCD behaviour task with behaviour **B9
(impatient low-signal pressure)** on real ABCD scenarios; the judge is the offline rule judge,
whose B9 exhibit grows with the urgency cues a reply enacts (``min(1, hits/3)``). Thinking is
off (``require_think: false``), one simulator turn per episode. Everything else is the real
pipeline: the ``sim_rl`` Prefect flow, the DeepSpeed job, FoldGRPO, PPO clip, MLflow.

    python scripts/sim_rl_signal.py --out /tmp/sim_rl_signal [--steps 40] [--tracking-uri sqlite:///mlflow/mlflow.db]

writes ``<out>/params.yaml`` and runs ``python -m flows.train --phases sim_rl --params <out>/params.yaml`` (``--no-run``
only builds). The test ``tests/test_sim_rl_flow.py`` uses :func:`build`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESSURES = ["is about to board a flight", "has a meeting in five minutes", "is on a lunch break that ends soon",
             "needs this sorted before the store closes"]
IMPATIENT = ["I need this now! hurry up, this is urgent!", "asap please, I am still waiting, this is ridiculous!",
             "come on, right now! immediately!", "why is this taking so long? hurry!"]


def behavior_rows(n: int = 8) -> list[dict]:
    """B9 task rows on the first ``n`` ABCD train scenarios of the bundled fixture."""
    data = json.loads((ROOT / "data/raw/abcd/abcd_v1.1.json").read_text())
    rows = []
    for i, conv in enumerate(data["train"][:n]):
        sc = conv["scenario"]
        rows.append({"task_id": f"{conv['convo_id']}-B9", "conversation_id": str(conv["convo_id"]),
                     "user_id": sc["personal"].get("username") or f"u{i}", "scenario_key": f"k{i}",
                     "scenario": json.dumps(sc), "behavior_ids": json.dumps(["B9"]),
                     "kwargs": json.dumps({"pressure": PRESSURES[i % len(PRESSURES)]}), "flow": sc["flow"],
                     "subflow": sc["subflow"], "turn_budget": 1, "data_source": "usersim_behavior",
                     "needs_trace": False, "abcd_split": "train", "split": "train"})
    return rows


def build(out: Path, *, steps: int = 40, tracking_uri: str | None = None, experiment: str = "sim-rl-signal",
          seed: int = 7) -> Path:
    """Write the tiny model, tokenizer, task rows and ``params.yaml`` under ``out``; return the params path."""
    import random

    import mimesis_lab.envs.registry  # noqa: F401  (registers the tasks)
    from mimesis_lab.abcd import load_guidelines, load_kb
    from mimesis_lab.config import ModelParams
    from mimesis_lab.envs.base import TaskContext, make_episode
    from mimesis_lab.models import build_tiny_model, save_hf
    from mimesis_lab.tokenizer import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    rows = behavior_rows()
    pl.DataFrame(rows).write_parquet(out / "b9_tasks.parquet")
    ctx = TaskContext(kb=load_kb(ROOT / "data/raw/abcd/kb.json"),
                      guidelines=load_guidelines(ROOT / "data/raw/abcd/guidelines.json"))
    texts = [m["content"] for r in rows for m in make_episode(r, ctx, random.Random(0)).messages()]
    tok = train_tokenizer(texts * 3 + IMPATIENT * 10, vocab_size=1200, min_frequency=1)
    mp = ModelParams(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=32, max_position_embeddings=2048, seed=seed)
    save_hf(build_tiny_model(mp, len(tok), tok.pad_token_id, tok.eos_token_id), tok, out / "init")

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["tracking"].update(tracking_uri=tracking_uri or f"sqlite:///{out / 'mlflow.db'}",
                              artifact_location=str(out / "mlflow-artifacts"), experiment=experiment,
                              simulator_model="mimesis-simulator-signal")
    params["sim_rl"].update(
        init_from=str(out / "init"),
        tasks={"usersim_behavior": {"weight": 1.0, "data": str(out / "b9_tasks.parquet"), "turn_budget": 1}},
        kb=str(ROOT / "data/raw/abcd/kb.json"), guidelines=str(ROOT / "data/raw/abcd/guidelines.json"),
        deepspeed_config=str(ROOT / "configs/tiny/ds_rl.json"), require_think=False, steps=steps,
        prompts_per_step=4, rollouts_per_prompt=8, minibatches=1, micro_rows=32, lr=0.003, seed=seed,
        save_every=max(1, steps // 2), output_dir=str(out / "sim_rl"))
    params["sim_rl"]["rollout"].update(max_new_tokens=12, batch_size=32)
    path = out / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def run(params_path: Path, cwd: Path, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(cwd / "prefect"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "flows.train", "--phases", "sim_rl", "--params", str(params_path)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tracking-uri", default=None, help="default: <out>/mlflow.db")
    ap.add_argument("--experiment", default="sim-rl-signal")
    ap.add_argument("--no-run", action="store_true")
    args = ap.parse_args(argv)
    uri = args.tracking_uri
    if uri:
        from mimesis_lab.tracking import resolve_tracking_uri

        uri = resolve_tracking_uri(uri, Path.cwd())
    p = build(args.out.resolve(), steps=args.steps, tracking_uri=uri, experiment=args.experiment, seed=args.seed)
    print(f"wrote {p}")
    if args.no_run:
        return 0
    res = run(p, args.out.resolve())
    sys.stdout.write(res.stdout[-4000:])
    sys.stderr.write(res.stderr[-4000:])
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
