"""User side throughput: one round of N episodes' user turns, batched vs serial simulator server.

The path of training (:func:`mimesis_lab.rollout.agent_env.start_user_side`): the simulator is a
:class:`~mimesis_lab.rollout.serve.ModelServer` behind a :class:`~mimesis_lab.rollout.shim.PrivilegedShim`,
every episode's user an :class:`~mimesis_lab.rollout.user_side.EndpointUser` on its own episode URL.
One *round* = ``--episodes`` gyms asking their user at once (``Gym.ask_user`` on concurrent threads,
as :func:`~mimesis_lab.rollout.agent_rollout.run_agent_episodes` steps a round): the user-simulator
view of each (the gym's hidden-task system prompt + the agent's message) is sent through the shim,
sampled with ``agent_grpo.user`` settings (``max_new_tokens``, ``temperature``, one seed).

Three user sides on the same model and the same requests: ``serial`` (``max_batch=1``: one request at
a time, what the server did before micro-batching), ``windows`` (``max_batch=--episodes``, batched by
the arrival windows ``--batch-wait-ms`` / ``--max-batch-wait-ms`` alone) and ``round`` (the same server,
the round announced with :meth:`ModelServer.round`, as the agent jobs and ``agent_eval`` do). Timed rounds
are interleaved (the order rotates every repeat) after a warm-up round each; reported: seconds per round,
median [min–max], and the ratios of the medians to ``serial``.

    python bench/bench_user_side.py [--episodes 16] [--repeat 5] [--max-new-tokens 32] [--batch-wait-ms 5]
                                    [--max-batch-wait-ms 50] [--prefix-cache 0]
                                    [--threads N] [--out f.json]

The model is ``--model`` (a Hugging Face folder) if given, else the tiny model built from the
``model`` section of params.yaml (random init) with the pipeline tokenizer (``tokenizer.output_dir``)
if it was built, else a tokenizer trained in memory on the gym prompts the way the tokenizer stage
trains one (no downloads). A random model rarely emits its stop token: each reply runs to
``max_new_tokens`` in both runs, so the runs generate the same number of tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mimesis_lab.config import load_params  # noqa: E402
from mimesis_lab.envs.gyms.base import UserSideError  # noqa: E402
from mimesis_lab.envs.gyms.registry import ALL_GYMS, MODULES, gym_for_row, load_tasks  # noqa: E402
from mimesis_lab.rollout.backends import SamplingParams  # noqa: E402
from mimesis_lab.rollout.serve import BATCH_WAIT_MS, MAX_BATCH_WAIT_MS, ModelServer  # noqa: E402
from mimesis_lab.rollout.shim import PrivilegedShim  # noqa: E402
from mimesis_lab.rollout.user_side import SHIM_MARGIN_S, EndpointUser  # noqa: E402

AGENT_ASKS = ["Do you prefer the beach or the city?", "What is your budget per night?",
              "Could you tell me more about what you need?", "Is it alive?", "Which date suits you?",
              "Would a refund or a replacement be better for you?", "How many people are travelling?",
              "Do you agree with the proposal so far?"]


def _model_and_tokenizer(params, model_path: str | None, rows: list[dict]):
    from mimesis_lab.models import build_tiny_model, load_model
    from mimesis_lab.tokenizer import load_tokenizer, train_tokenizer

    if model_path:
        return load_model(model_path).eval(), load_tokenizer(model_path), model_path
    tok_dir = ROOT / params.tokenizer.output_dir
    if (tok_dir / "tokenizer.json").is_file():
        tok, tok_name = load_tokenizer(tok_dir), str(params.tokenizer.output_dir)
    else:
        texts = [m["content"] for r in rows for m in r["prompt"]] + AGENT_ASKS
        tok = train_tokenizer(texts, vocab_size=params.tokenizer.vocab_size, min_frequency=1)
        tok_name = f"BPE trained in memory on the gym prompts ({len(tok)} tokens)"
    model = build_tiny_model(params.model, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    n = sum(p.numel() for p in model.parameters())
    return model, tok, f"tiny model from params.model ({n / 1e6:.2f}M parameters), tokenizer: {tok_name}"


class Side:
    """One user side: a model server (``max_batch``) behind its own shim."""

    def __init__(self, name: str, model, tok, max_batch: int, wait_ms: float, max_wait_ms: float, timeout_s: float,
                 prefix_cache: int = 0, announce: bool = False):
        self.name, self.announce = name, announce
        self.server = ModelServer(model, tok, max_batch=max_batch, batch_wait_ms=wait_ms,
                                  max_batch_wait_ms=max_wait_ms, prefix_cache_tokens=prefix_cache).start()
        self.shim = PrivilegedShim(self.server.url, timeout_s=timeout_s).start()
        self.timeout_s = timeout_s
        self.rounds = 0

    def round(self, rows: list[dict], tasks: dict, sampling: SamplingParams, seed: int) -> dict:
        """All episodes' gyms ask their user at once; seconds, replies, failures, generation calls."""
        self.rounds += 1
        users, gyms = [], []
        for i, row in enumerate(rows):
            ep = f"{self.name}r{self.rounds}e{i}"
            u = EndpointUser(self.shim.url, "local", episode=ep, sampling=sampling,
                             timeout_s=self.timeout_s + SHIM_MARGIN_S, max_retries=0)
            users.append(u)
            gyms.append(gym_for_row(row, tasks, u, random.Random(f"{seed}:{i}")))
        asks = [AGENT_ASKS[(seed + i) % len(AGENT_ASKS)] for i in range(len(rows))]
        gate = threading.Barrier(len(rows) + 1)

        def ask(k: int):
            gate.wait()
            try:
                gyms[k].ask_user(asks[k])
                return None
            except UserSideError as e:
                return e.reason

        before = self.server.stats()
        announced = self.server.round(len(rows)) if self.announce else None
        with ThreadPoolExecutor(len(rows)) as pool:
            if announced is not None:
                announced.__enter__()
                step = announced.wrap
            else:
                step = lambda fn: fn  # noqa: E731
            futs = [pool.submit(step(lambda k=k: ask(k))) for k in range(len(rows))]
            gate.wait()
            t0 = time.perf_counter()
            errors = [f.result() for f in futs]
            wall = time.perf_counter() - t0
            if announced is not None:
                announced.__exit__(None, None, None)
        after = self.server.stats()
        for u in users:
            self.shim.delete(u.episode)
            u.close()
        # an empty public reply is a user_error of the random model, not a transport failure
        return {"seconds": wall, "calls": after["batches"] - before["batches"],
                "tokens": after["completion_tokens"] - before["completion_tokens"],
                "failed": sum(e not in (None, "user_error") for e in errors),
                "requests": after["requests"] - before["requests"]}

    def close(self) -> None:
        self.shim.stop()
        self.server.stop()


def _summary(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s [{min(xs):.3f}–{max(xs):.3f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--model", default=None, help="HF folder of a simulator (default: the tiny model)")
    ap.add_argument("--episodes", type=int, default=16, help="episodes in the round (concurrent user turns)")
    ap.add_argument("--repeat", type=int, default=5, help="timed rounds per mode (interleaved)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: agent_grpo.user.max_new_tokens")
    ap.add_argument("--batch-wait-ms", type=float, default=BATCH_WAIT_MS,
                    help="the batched server's idle gap (default: the server's)")
    ap.add_argument("--max-batch-wait-ms", type=float, default=MAX_BATCH_WAIT_MS,
                    help="the batched server's longest wait (default: the server's)")
    ap.add_argument("--prefix-cache", type=int, default=0,
                    help="prefix-cache tokens of BOTH servers (0 = off; the rounds repeat the same system prompts, "
                         "so a cache also hits across rounds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", default=None, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params(args.params)
    ucfg = params.agent_grpo.user
    tasks = {g: load_tasks(g) for g in ALL_GYMS}
    pool_rows = [r for g in ALL_GYMS for r in MODULES[g].build_rows(tasks[g], "train")]
    rng = random.Random(args.seed)
    rows = [pool_rows[rng.randrange(len(pool_rows))] for _ in range(args.episodes)]
    model, tok, source = _model_and_tokenizer(params, args.model, pool_rows)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens or ucfg.max_new_tokens,
                              temperature=ucfg.temperature, seed=args.seed)
    sides = {"serial": Side("s", model, tok, 1, 0.0, 0.0, ucfg.timeout_s, args.prefix_cache),
             "windows": Side("w", model, tok, args.episodes, args.batch_wait_ms, args.max_batch_wait_ms,
                             ucfg.timeout_s, args.prefix_cache),
             "round": Side("r", model, tok, args.episodes, args.batch_wait_ms, args.max_batch_wait_ms,
                           ucfg.timeout_s, args.prefix_cache, announce=True)}
    names = list(sides)
    res: dict[str, list[dict]] = {k: [] for k in sides}
    try:
        for name, side in sides.items():      # warm-up (first-call allocations, connections)
            side.round(rows, tasks, sampling, args.seed)
        for r in range(args.repeat):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                res[name].append(sides[name].round(rows, tasks, sampling, args.seed + 1 + r))
    finally:
        for side in sides.values():
            side.close()

    secs = {k: [x["seconds"] for x in v] for k, v in res.items()}
    ratios = {k: round(statistics.median(secs["serial"]) / statistics.median(secs[k]), 2) for k in ("windows", "round")}
    out = {"episodes": args.episodes, "repeat": args.repeat, "max_new_tokens": sampling.max_new_tokens,
           "temperature": sampling.temperature, "batch_wait_ms": args.batch_wait_ms,
           "max_batch_wait_ms": args.max_batch_wait_ms, "prefix_cache": args.prefix_cache, "model": source,
           "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
           "device": str(next(model.parameters()).device),
           "rounds": res, "median_s": {k: statistics.median(v) for k, v in secs.items()}, "speedup": ratios}
    print(f"model: {source}; {torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs")
    print(f"round of {args.episodes} user turns ({sampling.max_new_tokens} new tokens max, temperature "
          f"{sampling.temperature}), {args.repeat} interleaved repeats:")
    for k in names:
        toks = statistics.median([x["tokens"] / x["seconds"] for x in res[k]])
        calls = sorted({x["calls"] for x in res[k]})
        fails = sum(x["failed"] for x in res[k])
        print(f"  {k:8s}: {_summary(secs[k])} per round; {toks:.0f} generated tokens/s; generation calls per "
              f"round {calls}; transport failures {fails}")
    for k, x in ratios.items():
        print(f"speedup of {k} (median serial / median {k}): {x:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
