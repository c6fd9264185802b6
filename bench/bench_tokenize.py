"""Benchmark (not a test): chat tokenisation throughput.

All role-swap conversations (``data/processed/role_swap.parquet``) scaled up ``--scale``
times (default 50). Every copy is made unique (a per-copy marker is appended to every
message), so neither the de-duplication inside ``tokenize_many`` nor a repeated text
can flatter the batched path. Measured in the same run, on the same conversations:

- ``tokenize_many``: :func:`mimesis_lab.chat.tokenize_many` (batched rendering, ONE Rust
  batch call for all increments + one for the full renderings, loss masks, check);
- ``per_example_apply_chat_template``: ``tokenizer.apply_chat_template(messages,
  tokenize=True)`` per conversation (one rendering + one tokenisation; no mask, no
  incremental check) -- the baseline asked for;
- ``per_example_tokenize_chat``: :func:`mimesis_lab.chat.tokenize_chat` per conversation
  (the same work and output as ``tokenize_many``, unbatched);
- ``batched_apply_chat_template`` (reference): ``apply_chat_template(all, tokenize=True)``,
  one render per conversation and one batched tokenisation, no mask and no check.

Each method runs ``--repeat`` times (interleaved); the best time counts. Prints and
writes ``bench/results/tokenize.json`` (conv/s, tokens/s, ratios, CPU count and load).
Usage::

    python bench/bench_tokenize.py [--scale 50] [--repeat 3] [--tokenizer models/tokenizer]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def conversations(path: Path, scale: int) -> list[list[dict]]:
    from mimesis_lab.io import read_parquet

    base = read_parquet(path, "role-swap rows", columns=["messages"])["messages"].to_list()
    return [[{"role": m["role"], "content": f"{m['content']} #{c}"} for m in conv]
            for c in range(scale) for conv in base]


def get_tokenizer(path: Path | None, data: Path):
    from mimesis_lab.tokenizer import load_tokenizer, train_tokenizer

    if path is not None and path.is_dir():
        return load_tokenizer(path), str(path)
    from mimesis_lab.io import read_parquet

    texts = [m["content"] for c in read_parquet(data, "role-swap rows", columns=["messages"])["messages"].to_list()
             for m in c]
    return train_tokenizer(texts, vocab_size=4096, min_frequency=2), "trained in-run (vocab 4096)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", type=Path, default=ROOT / "data/processed/role_swap.parquet")
    ap.add_argument("--tokenizer", type=Path, default=ROOT / "models/tokenizer")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/tokenize.json")
    args = ap.parse_args(argv)

    from mimesis_lab.chat import tokenize_chat, tokenize_many

    tok, tok_src = get_tokenizer(args.tokenizer, args.data)
    convs = conversations(args.data, args.scale)
    n = len(convs)

    # correctness first (a subset): batched == per-example reference
    sub = convs[: min(n, 200)]
    assert tokenize_many(tok, sub) == [tokenize_chat(tok, c) for c in sub], "tokenize_many != tokenize_chat"

    methods = {
        "tokenize_many": lambda: tokenize_many(tok, convs),
        "per_example_apply_chat_template": lambda: [tok.apply_chat_template(c, tokenize=True) for c in convs],
        "per_example_tokenize_chat": lambda: [tokenize_chat(tok, c) for c in convs],
        # reference only: one batched render + one batched tokenisation of the full texts
        # (no increments, no mask, no check) -- a floor for any method on this machine
        "batched_apply_chat_template": lambda: tok.apply_chat_template(convs, tokenize=True)["input_ids"],
    }
    # warm-up (template compilation, BPE cache)
    tokenize_many(tok, convs[:50])
    [tok.apply_chat_template(c, tokenize=True) for c in convs[:50]]

    best: dict[str, float] = {k: float("inf") for k in methods}
    tokens = 0
    for _ in range(args.repeat):
        for name, f in methods.items():
            t0 = time.perf_counter()
            out = f()
            dt = time.perf_counter() - t0
            best[name] = min(best[name], dt)
            if name == "tokenize_many":
                tokens = sum(len(ids) for ids, _ in out)
    res = {
        "conversations": n,
        "scale": args.scale,
        "messages": sum(map(len, convs)),
        "chars": sum(len(m["content"]) for c in convs for m in c),
        "tokens": tokens,
        "tokenizer": tok_src,
        "repeat": args.repeat,
        "seconds": {k: round(v, 4) for k, v in best.items()},
        "conv_per_s": {k: round(n / v, 1) for k, v in best.items()},
        "tokens_per_s": {k: round(tokens / v, 1) for k, v in best.items()},
        "ratio_vs_per_example_apply_chat_template": round(
            best["per_example_apply_chat_template"] / best["tokenize_many"], 3),
        "ratio_vs_per_example_tokenize_chat": round(best["per_example_tokenize_chat"] / best["tokenize_many"], 3),
        "ratio_batched_full_only_vs_per_example_apply_chat_template": round(
            best["per_example_apply_chat_template"] / best["batched_apply_chat_template"], 3),
        "target_ratio": 5.0,
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
        },
    }
    import tokenizers
    import transformers

    res["machine"]["transformers"] = transformers.__version__
    res["machine"]["tokenizers"] = tokenizers.__version__
    for k in methods:
        print(f"{k:34s} {res['seconds'][k]:8.3f}s  {res['conv_per_s'][k]:10.1f} conv/s  "
              f"{res['tokens_per_s'][k]:12.1f} tok/s")
    print(f"ratio tokenize_many vs per-example apply_chat_template: "
          f"{res['ratio_vs_per_example_apply_chat_template']}x (target 5x)")
    print(f"ratio tokenize_many vs per-example tokenize_chat:       {res['ratio_vs_per_example_tokenize_chat']}x")
    print(f"ratio batched full-only (floor) vs per-example:         "
          f"{res['ratio_batched_full_only_vs_per_example_apply_chat_template']}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
