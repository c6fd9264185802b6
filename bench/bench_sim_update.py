"""Benchmark (not a test): one simulator-RL update with ``sim_rl.encode: turn`` (one row per simulator
turn, every turn re-encoding its whole prompt) vs ``trajectory`` (one prefix-tree row per rollout,
each shared history token encoded once; :func:`mimesis_lab.rl.policy.trajectory_row`).

The batch has the shape of one ``sim_rl`` step of ``params.yaml``: ``prompts_per_step`` groups of
``rollouts_per_prompt`` rollouts, ``--turns`` simulator turns each. Its tokens are synthetic (random
ids of the ``model`` section's tiny model, vocabulary ``tokenizer.vocab_size``) but laid out as the
rollouts lay them: turn ``k``'s prompt is the system prompt, then for every earlier turn the agent's
message, the generation prompt and the simulator's *utterance* (its ``<think>`` block is not kept in
the history), then the agent's ``k``-th message and the generation prompt; its response is
``<think> reasoning </think> utterance <|im_end|>``. Lengths (``--system-tokens`` …) vary ±25% per
rollout and turn (seeded); the defaults give replies of about ``rollout.max_new_tokens``.

One update = :func:`~mimesis_lab.rl.sim_batch.build_update_rows` + :func:`~mimesis_lab.rl.ppo.ppo_update`
with the ``sim_rl`` settings (``minibatches``, ``micro_rows``, ``clip_eps``) on a world-size-1
DeepSpeed engine of the tiny model (``sim_rl.deepspeed_config``), as the job runs it. The learning
rate is 0, so every update sees the same weights and the two encodings' PPO losses are printed side
by side (equal up to float noise; the test is ``tests/test_sim_rl_trajectory_rows.py``). The
variants are interleaved (each repeat runs both, in a rotated order) after one warm-up update each;
median [min–max] over ``--repeat`` updates, and the ratio turn / trajectory paired per repeat.
Prints and writes ``bench/results/sim_update.json``.

    OMP_NUM_THREADS=1 python bench/bench_sim_update.py [--repeat 5] [--threads 1] [--turns 3]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from mimesis_lab.config import load_params  # noqa: E402
from mimesis_lab.envs.base import TaskScore  # noqa: E402
from mimesis_lab.models import build_tiny_model  # noqa: E402
from mimesis_lab.rl.ppo import load_rl_ds_config, ppo_update  # noqa: E402
from mimesis_lab.rl.sim_batch import build_update_rows  # noqa: E402
from mimesis_lab.rollout.sim_rollout import Rollout, Segment  # noqa: E402
from mimesis_lab.train.launch import free_port  # noqa: E402
from mimesis_lab.train.runtime import dist_init, make_engine, set_lr  # noqa: E402

PAD, IM_START, IM_END, THINK, THINK_END, NL, SYSTEM, USER, ASSISTANT = range(9)   # ids the layout names


def _draw(rng: random.Random, n: int) -> int:
    return max(1, round(n * rng.uniform(0.75, 1.25)))


def _words(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(9, vocab) for _ in range(_draw(rng, n))]


def synthetic_rollout(rng: random.Random, group: str, rid: str, args, vocab: int) -> Rollout:
    """A valid, scored rollout of ``args.turns`` segments laid out as the chat template lays them."""
    gen = [IM_START, ASSISTANT, NL]
    history = [IM_START, SYSTEM, NL] + _words(rng, args.system_tokens, vocab) + [IM_END, NL]
    segments = []
    for _ in range(args.turns):
        history += [IM_START, USER, NL] + _words(rng, args.agent_tokens, vocab) + [IM_END, NL]
        utterance = _words(rng, args.utterance_tokens, vocab)
        response = [THINK] + _words(rng, args.reasoning_tokens, vocab) + [THINK_END] + utterance + [IM_END]
        old = [-8.3 + rng.uniform(-0.2, 0.2) for _ in response]       # about -log(vocab): the tiny model's
        segments.append(Segment(history + gen, response, old, "stop", True))
        history = history + gen + utterance + [IM_END, NL]           # the history keeps the utterance only
    r = Rollout(group, rid, "usersim_behavior", "synthetic", segments=segments)
    r.score = TaskScore(raw=rng.random())
    return r


def spread(values: list[float], nd: int = 3) -> dict:
    return {"median": round(statistics.median(values), nd), "min": round(min(values), nd),
            "max": round(max(values), nd)}


def fmt(d: dict, unit: str = "", nd: int = 2) -> str:
    return f"{d['median']:.{nd}f}{unit} [{d['min']:.{nd}f}-{d['max']:.{nd}f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--turns", type=int, default=3, help="simulator turns per rollout (the behaviour task's budget)")
    ap.add_argument("--system-tokens", type=int, default=250)
    ap.add_argument("--agent-tokens", type=int, default=40, help="the partner's message per turn")
    ap.add_argument("--reasoning-tokens", type=int, default=26, help="inside <think>…</think>")
    ap.add_argument("--utterance-tokens", type=int, default=18)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_update.json"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params(args.params)
    cfg = params.sim_rl
    vocab = params.tokenizer.vocab_size

    rng = random.Random(args.seed)
    rollouts = [synthetic_rollout(rng, f"g{g}", f"g{g}r{k}", args, vocab)
                for g in range(cfg.prompts_per_step) for k in range(cfg.rollouts_per_prompt)]

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port())), ("RANK", "0"),
                       ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    dist_init()
    model = build_tiny_model(params.model, vocab, PAD, IM_END)
    engine, optimizer = make_engine(model, cfg, load_rl_ds_config("sim_rl", cfg))
    set_lr(optimizer, 0.0)

    def update(encode: str, seed: int) -> tuple[float, dict]:
        t0 = time.perf_counter()
        rows, _ = build_update_rows(rollouts, cfg.invalid_policy, cfg.adv_eps, encode)
        stats = ppo_update(engine, rows, cfg, random.Random(seed), PAD, world=1)
        return time.perf_counter() - t0, stats

    names = ["turn", "trajectory"]
    batch = {n: build_update_rows(rollouts, cfg.invalid_policy, cfg.adv_eps, n)[1] for n in names}
    loss = {n: update(n, -1)[1]["update/ppo_loss"] for n in names}          # warm-up (allocator, kernels)
    secs: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeat):
        for n in names[r % 2:] + names[:r % 2]:
            s, _ = update(n, r)
            secs[n].append(s)
            print(f"  repeat {r + 1}/{args.repeat} {n:>10}: {s:6.2f} s/update", flush=True)

    result: dict = {
        "batch": {"rollouts": len(rollouts), "turns": args.turns, "system_tokens": args.system_tokens,
                  "agent_tokens": args.agent_tokens, "reasoning_tokens": args.reasoning_tokens,
                  "utterance_tokens": args.utterance_tokens, "tokens_trained": batch["turn"]["tokens_in_update"]},
        "update": {"minibatches": cfg.minibatches, "micro_rows": cfg.micro_rows, "ppo_epochs": cfg.ppo_epochs,
                   "deepspeed_config": cfg.deepspeed_config},
        "model": {"hidden_size": params.model.hidden_size, "layers": params.model.num_hidden_layers,
                  "vocab_size": vocab, "params": sum(p.numel() for p in model.parameters())},
        "repeat": args.repeat, "interleaved": True, "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
    }
    for n in names:
        result[n] = {"rows": batch[n]["rows_in_update"], "tokens_encoded": batch[n]["tokens_encoded"],
                     "tokens_encoded_per_trained": round(batch[n]["tokens_encoded"] / batch[n]["tokens_in_update"], 2),
                     "s_per_update": spread(secs[n]), "ppo_loss": loss[n]}
    result["speedup_turn/trajectory"] = spread([a / b for a, b in zip(secs["turn"], secs["trajectory"])])

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{len(rollouts)} rollouts x {args.turns} turns, {result['batch']['tokens_trained']:.0f} trained tokens; "
          f"{args.repeat} interleaved repeats, {torch.get_num_threads()} torch threads")
    for n in names:
        r = result[n]
        print(f"{n:>11}: {r['rows']:4.0f} rows  {r['tokens_encoded_per_trained']:5.2f} tokens encoded per trained "
              f"token  {fmt(r['s_per_update'], ' s')} per update  ppo_loss {r['ppo_loss']:.6f}")
    print(f"{'speed-up':>11}: {fmt(result['speedup_turn/trajectory'], 'x')} (turn / trajectory, paired per repeat)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
