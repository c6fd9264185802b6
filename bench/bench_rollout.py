"""Rollout throughput: batched lock-step episodes vs one episode at a time (tiny model, CPU).

The workload of one simulator-RL step: ``--groups`` task rows drawn from the task mixture of
``params.yaml``, ``--rollouts`` episodes each (a GRPO group). Same episodes, same model, same
sampling settings in both runs; the baseline runs each episode alone through the backend with
``batch_size=1`` (what a per-episode rollout worker does), the batched run drives all episodes
together (:func:`mimesis_lab.rollout.sim_rollout.run_episodes`: one generation call per round,
prompts bucketed by length, a group's identical first-turn prompt prefilled once, finished rows
leaving the batch).

    python bench/bench_rollout.py [--groups 16] [--rollouts 4] [--batch-size 32] [--max-new-tokens 48]

Prints episodes/s for both and their ratio, plus generated tokens/s. Uses ``sim_rl.init_from``
(the SFT model) when it exists, otherwise a tiny model built from the ``model`` section and
the pipeline tokenizer.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mimesis_lab.abcd import load_guidelines, load_kb  # noqa: E402
from mimesis_lab.config import load_params  # noqa: E402
from mimesis_lab.envs.base import TaskContext, make_episode  # noqa: E402
from mimesis_lab.envs.registry import load_task_rows  # noqa: E402
from mimesis_lab.jobs.sim_rl import sample_groups  # noqa: E402
from mimesis_lab.rollout.backends import SamplingParams, TransformersBackend  # noqa: E402
from mimesis_lab.rollout.sim_rollout import run_episodes  # noqa: E402


def _model_and_tokenizer(params):
    from mimesis_lab.models import build_tiny_model, load_model
    from mimesis_lab.tokenizer import load_tokenizer

    init = Path(params.sim_rl.init_from)
    if (init / "config.json").is_file():
        return load_model(init).eval(), load_tokenizer(init), str(init)
    tok = load_tokenizer(params.tokenizer.output_dir)
    model = build_tiny_model(params.model, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    return model, tok, "tiny model built from params.model"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--groups", type=int, default=16, help="task rows (prompts) per step")
    ap.add_argument("--rollouts", type=int, default=4, help="episodes per task row (group size)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions of both runs (medians reported)")
    ap.add_argument("--prefix-cache", type=int, default=65536,
                    help="prefix-cache tokens of the backend in BOTH runs (0 = off)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params(args.params)
    cfg = params.sim_rl
    model, tok, source = _model_and_tokenizer(params)
    rows = {ds: load_task_rows(ds, t.data, t.max_rows)[0] for ds, t in cfg.tasks.items()}
    ctx = TaskContext(kb=load_kb(Path(cfg.kb)), guidelines=load_guidelines(Path(cfg.guidelines)),
                      options={ds: {k: v for k, v in t.model_dump().items() if v is not None}
                               for ds, t in cfg.tasks.items()})
    groups = [g for g in sample_groups(rows, {d: t.weight for d, t in cfg.tasks.items()}, args.groups,
                                       random.Random(args.seed)) for _ in range(args.rollouts)]
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=args.seed)

    def episodes():
        return [make_episode(g, ctx, random.Random(f"{args.seed}:{i}")) for i, g in enumerate(groups)]

    ids = [(f"g{i // args.rollouts}", f"r{i}") for i in range(len(groups))]
    torch.manual_seed(args.seed)
    # warm-up (allocator, kernels)
    run_episodes(episodes()[:2], ids[:2], TransformersBackend(model, tok, batch_size=2), tok, sampling,
                 require_think=cfg.require_think, max_prompt_tokens=cfg.rollout.max_prompt_tokens)

    import statistics

    t_b, t_s = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        batched = run_episodes(episodes(), ids, TransformersBackend(model, tok, batch_size=args.batch_size,
                                                   prefix_cache_tokens=args.prefix_cache), tok,
                               sampling, require_think=cfg.require_think,
                               max_prompt_tokens=cfg.rollout.max_prompt_tokens)
        t_b.append(time.perf_counter() - t0)
        one = TransformersBackend(model, tok, batch_size=1, prefix_cache_tokens=args.prefix_cache)
        t0 = time.perf_counter()
        single = []
        for i, ep in enumerate(episodes()):
            single += run_episodes([ep], [ids[i]], one, tok, sampling, require_think=cfg.require_think,
                                   max_prompt_tokens=cfg.rollout.max_prompt_tokens)
        t_s.append(time.perf_counter() - t0)
    t_batched, t_single = statistics.median(t_b), statistics.median(t_s)
    ratios = sorted(s / b for s, b in zip(t_s, t_b))

    def tokens(rs):
        return sum(r.response_tokens for r in rs)

    res = {
        "model": source, "groups": args.groups, "rollouts_per_group": args.rollouts, "episodes": len(groups),
        "batch_size": args.batch_size, "prefix_cache_tokens": args.prefix_cache,
        "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(),
        "tasks": {d: sum(g.get("data_source") == d for g in groups) for d in rows},
        "batched_s": round(t_batched, 3), "one_at_a_time_s": round(t_single, 3),
        "batched_episodes_per_s": round(len(groups) / t_batched, 3),
        "one_at_a_time_episodes_per_s": round(len(groups) / t_single, 3),
        "speedup": round(t_single / t_batched, 2),
        "speedup_per_repeat": [round(r, 2) for r in ratios],
        "batched_tokens_per_s": round(tokens(batched) / t_batched, 1),
        "one_at_a_time_tokens_per_s": round(tokens(single) / t_single, 1),
        "segments": [sum(len(r.segments) for r in batched), sum(len(r.segments) for r in single)],
    }
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
