"""The agent learning-signal check: on TravelGym (the easiest training gym), mean reward must rise
under multi-turn GRPO with a fixed seed.

The agent is a tiny model (its tokenizer trained on the travel prompts and oracle traces) given a
*brief* warm start on the successful oracle traces of the travel training tasks — enough to use the
``[search]``/``[answer]`` interface some of the time, far from solving the tasks. The user side
is a cooperative scripted user served over HTTP behind the real privileged shim (it answers with
private reasoning and a public reply). Everything else is the real pipeline: the ``agent_grpo``
Prefect flow, the DeepSpeed job, per-turn rewards, R2G credit, group-normalised advantages, the
PPO-clip update and MLflow (the reward curve is the child run's ``reward/mean`` metric).

    python scripts/agent_grpo_signal.py --out /tmp/agent_signal [--steps 30] [--tracking-uri sqlite:///mlflow/mlflow.db]

``tests/test_agent_grpo_flow.py`` uses :func:`build` and :func:`run`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import polars as pl
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

USER_REPLY = "<think>I care about the price and the location most.</think>The price and the location matter most to me."


class ScriptedUser(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint whose answer is ``server.reply_for(request body)``
    (by default the same cooperative answer, :data:`USER_REPLY`, every time)."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        reply = self.server.reply_for(raw)
        body = json.dumps({"id": "u", "object": "chat.completion", "model": "user", "choices": [{
            "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def travel_rows() -> list[dict]:
    """The travel training rows in the ``gyms`` stage schema."""
    from mimesis_lab.envs.gyms.registry import MODULES, load_tasks

    rows = []
    for r in MODULES["travel"].build_rows(load_tasks("travel"), "train"):
        rows.append({"data_source": r["data_source"], "gym": "travel", "task_id": str(r["reward_model"]["id"]),
                     "split": "train", "prompt": r["prompt"], "ability": r["ability"],
                     "reward_model": json.dumps(r["reward_model"]), "extra_info": json.dumps(r["extra_info"])})
    return rows


def decode_row(row: dict) -> dict:
    """A :func:`travel_rows` row with ``reward_model`` and ``extra_info`` parsed back to dicts."""
    return dict(row, reward_model=json.loads(row["reward_model"]), extra_info=json.loads(row["extra_info"]))


ASK = "[action] What matters most to you for this trip?"


def travel_oracle_actions(task: dict) -> list[tuple[str, str]]:
    """The task-reading TravelGym oracle this check's warm start was measured with: search the best
    option's name, answer its id. It reads hidden task fields, so it is *not* the pipeline's warm
    start (that is :mod:`mimesis_lab.envs.gyms.experts`, which asks the user); it stays here so the
    measured curve of this check (README) keeps its meaning."""
    best = next(o for o in task["options"] if o["id"] == task["best_id"])
    return [("search", str(best.get("name") or best["id"])), ("answer", str(task["best_id"]))]


def oracle_trace(row: dict, tasks: dict) -> dict | None:
    """:func:`travel_oracle_actions` played through the real TravelGym (no user side); the trace if rewarded."""
    import random

    from mimesis_lab.envs.gyms.registry import gym_for_row

    gym = gym_for_row(row, tasks, user=None, rng=random.Random(0), max_steps=16)
    messages = [dict(m) for m in row["prompt"]]
    rewards = []
    for choice, content in travel_oracle_actions(tasks["travel"][str(row["reward_model"]["id"])]):
        messages.append({"role": "assistant", "content": f"[{choice}] {content}"})
        res = gym.step(choice, content)
        rewards.append(float(res.reward))
        if res.done:
            break
        messages.append({"role": "tool", "content": f"{res.observation}\nReward: {res.reward:g}"})
    return {"messages": messages, "rewards": rewards, "total_reward": sum(rewards)} if sum(rewards) > 0 else None


def with_question(messages: list[dict], reply: str) -> list[dict]:
    """The trace with the agent asking the user first (the user's public ``reply`` as tool feedback)."""
    at = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:at] + [{"role": "assistant", "content": ASK},
                            {"role": "tool", "content": f"{reply}\nReward: 0"}] + messages[at:]


def warm_start(out: Path, rows: list[dict], *, sft_steps: int, seed: int, ask: bool = False,
               traces_fn: Callable[[list[dict]], list[dict]] | None = None,
               model: dict | None = None) -> dict:
    """Tokenizer + tiny model (``model`` overrides its :class:`ModelParams` fields), fine-tuned for ``sft_steps`` steps on the rewarded oracle traces
    (with ``ask``: every other trace first asks the user what matters, so the agent consults the user;
    ``traces_fn(rows)`` replaces the traces altogether, e.g. :mod:`scripts.csd_validity`'s)."""
    import random

    import torch

    from mimesis_lab.chat import tokenize_chat
    from mimesis_lab.config import ModelParams
    from mimesis_lab.envs.gyms.registry import load_tasks
    from mimesis_lab.models import build_tiny_model, save_hf
    from mimesis_lab.tokenizer import train_tokenizer

    tasks = {"travel": load_tasks("travel")}
    decoded = [decode_row(r) for r in rows]
    traces = [t for t in (oracle_trace(r, tasks) for r in decoded) if t is not None]
    if traces_fn is not None:
        traces = traces_fn(decoded)
    elif ask:
        from mimesis_lab.rollout.shim import split_reasoning

        public = split_reasoning(USER_REPLY)[1]
        traces = traces + [dict(t, messages=with_question(t["messages"], public)) for t in traces]
    texts = [m["content"] for t in traces for m in t["messages"]]
    tok = train_tokenizer(texts * 3, vocab_size=1500, min_frequency=1)
    torch.manual_seed(seed)
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, max_position_embeddings=2048, seed=seed)
    model = build_tiny_model(ModelParams(**{**shape, **(model or {})}), len(tok), tok.pad_token_id,
                             tok.eos_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    examples = []
    for t in traces:
        ids, mask = tokenize_chat(tok, t["messages"])
        labels = [i if m else -100 for i, m in zip(ids, mask)]
        examples.append((torch.tensor([ids]), torch.tensor([labels])))
    rng = random.Random(seed)
    losses = []
    for _ in range(sft_steps):
        ids, labels = examples[rng.randrange(len(examples))]
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    save_hf(model, tok, out / "init")
    return {"traces": len(traces), "sft_steps": sft_steps, "sft_final_loss": sum(losses[-5:]) / max(1, len(losses[-5:]))}


def build(out: Path, *, steps: int = 30, sft_steps: int = 300, tracking_uri: str | None = None,
          experiment: str = "agent-grpo-signal", seed: int = 11, lr: float = 1e-3,
          prompts: int = 8, rollouts: int = 4, ask: bool = False,
          user_url: str = "http://127.0.0.1:9/v1",
          traces_fn: Callable[[list[dict]], list[dict]] | None = None, init_from: Path | None = None) -> Path:
    """Write the rows, the warm-started agent and ``params.yaml`` under ``out``; return the params path.
    With ``init_from`` (a local Hugging Face checkpoint) that model is the initial agent: no warm start."""
    from mimesis_lab.config import resolve_groups

    out.mkdir(parents=True, exist_ok=True)
    rows = travel_rows()
    pl.DataFrame(rows).write_parquet(out / "travel.parquet")
    if init_from is None:
        info = warm_start(out, rows, sft_steps=sft_steps, seed=seed, ask=ask, traces_fn=traces_fn)
    else:
        info = {"init_from": str(Path(init_from).resolve()), "warm_start": "none"}
    (out / "warm_start.json").write_text(json.dumps(info, indent=2))
    params = resolve_groups(yaml.safe_load((ROOT / "params.yaml").read_text()))   # agent_grpo in full
    params["tracking"].update(tracking_uri=tracking_uri or f"sqlite:///{out / 'mlflow.db'}",
                              artifact_location=str(out / "mlflow-artifacts"), experiment=experiment,
                              agent_model="mimesis-agent-signal")
    params.pop("agent_csd", None)   # only agent_grpo is set up here (csd_validity adds its own agent_csd)
    params["gyms"]["tasks"] = {g: None for g in params["gyms"]["tasks"]}   # the bundled task files, as the rows
    cfg = params["agent_grpo"]
    cfg.update(init_from=str(Path(init_from).resolve() if init_from else out / "init"), data=str(out / "travel.parquet"), gyms={"travel": 1.0},
               deepspeed_config=str(ROOT / "configs/tiny/ds_rl.json"), steps=steps, prompts_per_step=prompts,
               rollouts_per_prompt=rollouts, minibatches=1, micro_rows=32, lr=lr, seed=seed,
               save_every=max(1, steps // 2), output_dir=str(out / "agent_grpo"))
    cfg["user"].update(kind="openai", openai={**cfg["user"]["openai"], "base_url": user_url, "max_retries": 0})
    cfg["rollout"].update(max_turns=3, max_new_tokens=12, batch_size=32)
    path = out / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def serve_user(reply_for: Callable[[bytes], str] | None = None) -> ThreadingHTTPServer:
    """Serve :class:`ScriptedUser` on 127.0.0.1 (a free port) in a daemon thread."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedUser)
    srv.reply_for = reply_for or (lambda raw: USER_REPLY)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def run(params_path: Path, cwd: Path, timeout: int = 1800, phase: str = "agent_grpo",
        reply_for: Callable[[bytes], str] | None = None) -> subprocess.CompletedProcess:
    """Run the ``phase`` flow on ``params_path`` with the scripted user served for its duration."""
    srv = serve_user(reply_for)
    params = yaml.safe_load(params_path.read_text())
    for sec in ("agent_grpo", "agent_csd"):
        if params.get(sec):
            params[sec]["user"]["openai"]["base_url"] = f"http://127.0.0.1:{srv.server_port}/v1"
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PREFECT_HOME": str(cwd / "prefect"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("MLFLOW_RUN_ID", None)
    try:
        return subprocess.run([sys.executable, "-m", "flows.train", "--phases", phase, "--params",
                               str(params_path)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        srv.shutdown()


def reward_curve(out: Path) -> list[float]:
    recs = [json.loads(x) for x in (out / "agent_grpo" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["metrics"].get("reward/mean", float("nan")) for r in recs if r.get("kind") == "train"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--tracking-uri", default=None, help="default: <out>/mlflow.db")
    ap.add_argument("--experiment", default="agent-grpo-signal")
    ap.add_argument("--no-run", action="store_true")
    args = ap.parse_args(argv)
    uri = args.tracking_uri
    if uri:
        from mimesis_lab.tracking import resolve_tracking_uri

        uri = resolve_tracking_uri(uri, Path.cwd())
    out = args.out.resolve()
    p = build(out, steps=args.steps, sft_steps=args.sft_steps, tracking_uri=uri, experiment=args.experiment, lr=args.lr,
              prompts=args.prompts, rollouts=args.rollouts,
              seed=args.seed)
    print(f"wrote {p}: {(out / 'warm_start.json').read_text()}")
    if args.no_run:
        return 0
    res = run(p, out)
    sys.stdout.write(res.stdout[-3000:])
    sys.stderr.write(res.stderr[-3000:])
    if res.returncode == 0:
        curve = reward_curve(out)
        print("reward/mean per step:", " ".join(f"{x:.3f}" for x in curve))
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
