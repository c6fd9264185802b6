"""Benchmark (not a test): packed vs length-grouped dynamic padding vs padded rows, training throughput
of the tiny model.

Tokenises the bundled, processed fixtures (``data/processed/role_swap.parquet`` expanded by
its ``copies`` column, as mid-training sees it; ``--dataset thoughttrace`` for the SFT set; ``--data``
for another parquet) with ``models/tokenizer`` (``--tokenizer``) and
:func:`mimesis_lab.chat.tokenize_chat` when they exist, else with a stand-in built the way the
tokenizer stage builds it: a byte-level BPE trained in memory on the same text with the
``tokenizer`` section's ``vocab_size``/``min_frequency``, each message rendered Qwen-style by hand
(``<|im_start|>role\\n content <|im_end|>\\n``), loss mask 1 on assistant content.

Then, in one process and the same run, it measures forward + backward (token-mean CE,
no optimizer step, so every pass costs the same) over all examples, as the SFT job's batching
modes (``sft_run.batching``) build them:

- ``packed``: :func:`mimesis_lab.packing.pack` rows, ``--batch`` rows of ``max_len`` per micro-batch,
  4D block-diagonal mask;
- ``grouped``: length-grouped dynamic padding, what HF/TRL ``group_by_length`` does
  (:func:`mimesis_lab.train.data.batch_units`: seeded shuffle, mega-batches sorted by length), each
  micro-batch at most ``--batch x max_len`` padded tokens and padded only to its longest example,
  2D padding mask (the job's ``mask="padding"``);
- ``padded``: one example per row, ``--batch`` rows per micro-batch, right-padded to ``max_len``
  (2D padding mask);
- ``padded_dynamic`` (extra): ``--batch`` examples per micro-batch in random order, padded to the
  longest of the micro-batch (dynamic padding without length grouping).

Throughput is counted in **real (non-pad) tokens per second**; every mode passes over the same
examples (each with targets), so the ratios are also those of loss-bearing (target) tokens per second. The modes are interleaved (each repeat runs every mode
once, in a rotated order) and each mode reports median [min–max] over ``--repeat`` passes; the ratios
are paired per repeat (same repeat, adjacent passes) and reported the same way. On a shared machine
the passes are noisy: read the spread. Prints and writes ``bench/results/packing.json``.
Usage::

    python bench/bench_packing.py [--dataset role_swap] [--max-len 2048] [--batch 1] [--repeat 5] [--limit N]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import random  # noqa: E402
import statistics  # noqa: E402

import torch  # noqa: E402

from mimesis_lab.config import load_params  # noqa: E402
from mimesis_lab.io import ParquetReadError, read_parquet  # noqa: E402
from mimesis_lab.models import build_tiny_model  # noqa: E402
from mimesis_lab.packing import (  # noqa: E402
    collate,
    fit_examples,
    masked_token_mean_ce,
    pack,
    packing_efficiency,
    pad_rows,
)
from mimesis_lab.train.data import batch_units  # noqa: E402

RENDERED_BY_CHAT = False
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def load_conversations(dataset: str, path: Path | None = None) -> list[list[dict]]:
    path = path or ROOT / "data" / "processed" / f"{dataset}.parquet"
    try:
        df = read_parquet(path, f"the {dataset} rows", hint=f"run `dvc repro {dataset}` first")
    except ParquetReadError as e:
        sys.exit(str(e))
    copies = df["copies"].to_list() if "copies" in df.columns else [1] * df.height
    convs = []
    for msgs, c in zip(df["messages"].to_list(), copies):
        convs.extend([msgs] * int(c))
    return convs


class Encoder:
    """``encode(text) -> ids`` plus the ids of the chat specials and the vocabulary size."""

    def __init__(self, convs: list[list[dict]], params, tok_dir: Path | None = None) -> None:
        tok_dir = tok_dir or ROOT / params.tokenizer.output_dir
        if (tok_dir / "tokenizer.json").is_file() or (tok_dir / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
            self.name = f"{tok_dir} ({len(tok)} tokens)"
            self.tokenizer = tok
            self.encode = lambda s: tok(s, add_special_tokens=False)["input_ids"]
            self.vocab_size = len(tok)
            unk = tok.unk_token_id
            ids = {s: tok.convert_tokens_to_ids(s) for s in SPECIALS}
            fallback = tok.eos_token_id if tok.eos_token_id is not None else 0
            self.special = {s: (i if i is not None and i != unk else fallback) for s, i in ids.items()}
            self.pad = tok.pad_token_id if tok.pad_token_id is not None else fallback
            return
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=params.tokenizer.vocab_size, min_frequency=params.tokenizer.min_frequency,
            special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator((m["content"] for c in convs for m in c), trainer)
        self.name = (f"in-memory byte-level BPE stand-in (vocab {tok.get_vocab_size()}, "
                     f"min_frequency {params.tokenizer.min_frequency}; {tok_dir} absent)")
        self.tokenizer = None
        self.encode = lambda s: tok.encode(s).ids
        self.vocab_size = tok.get_vocab_size()
        self.special = {s: tok.token_to_id(s) for s in SPECIALS}
        self.pad = self.special["<|endoftext|>"]


def render(enc: Encoder, messages: list[dict]) -> tuple[list[int], list[int]]:
    """The real :func:`mimesis_lab.chat.tokenize_chat` with the real tokenizer when both exist,
    else the same Qwen-style rendering done by hand with the stand-in tokenizer."""
    if enc.tokenizer is not None and getattr(enc.tokenizer, "chat_template", None):
        try:
            from mimesis_lab.chat import tokenize_chat
        except ImportError:
            pass
        else:
            global RENDERED_BY_CHAT
            RENDERED_BY_CHAT = True
            return tokenize_chat(enc.tokenizer, messages, train_role="assistant")
    ids: list[int] = []
    mask: list[int] = []
    nl = enc.encode("\n")
    for m in messages:
        head = [enc.special["<|im_start|>"]] + enc.encode(m["role"]) + nl
        body = enc.encode(m["content"])
        tail = [enc.special["<|im_end|>"]] + nl
        ids += head + body + tail
        mask += [0] * len(head) + [int(m["role"] == "assistant")] * len(body) + [0] * len(tail)
    return ids, mask


def batches(rows, groups, max_len: int, pad: int, mode: str):
    """``[(tensors, real tokens)]``, one per micro-batch; ``groups``: lists of row indices."""
    out = []
    for g in groups:
        chunk = [rows[i] for i in g]
        real = sum(len(r) for r in chunk)
        if mode == "packed":
            b = collate(chunk, max_len, pad)
        else:
            width = max_len if mode == "padded" else max(len(r) for r in chunk)
            b = collate(chunk, width, pad, mask="padding")
        out.append((b, real))
    return out


def one_pass(model, prepared) -> tuple[float, int]:
    tokens = 0
    start = time.perf_counter()
    for b, real in prepared:
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"], use_cache=False).logits
        loss = masked_token_mean_ce(logits, b["labels"])
        loss.backward()
        model.zero_grad(set_to_none=True)
        tokens += real
    return time.perf_counter() - start, tokens


def spread(values: list[float], nd: int = 3) -> dict:
    return {"median": round(statistics.median(values), nd), "min": round(min(values), nd),
            "max": round(max(values), nd)}


def fmt(d: dict, unit: str = "", nd: int = 2) -> str:
    return f"{d['median']:.{nd}f}{unit} [{d['min']:.{nd}f}-{d['max']:.{nd}f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="role_swap", choices=["role_swap", "thoughttrace"])
    ap.add_argument("--data", default=None, help="a processed parquet to read instead of data/processed/<dataset>")
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: tokenizer.output_dir)")
    ap.add_argument("--max-len", type=int, default=None, help="default: midtrain.max_len of params.yaml")
    ap.add_argument("--batch", type=int, default=None,
                    help="max_len rows per micro-batch (packed, padded; grouped: budget batch x max_len tokens); "
                         "default: midtrain's train_micro_batch_size_per_gpu")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--limit", type=int, default=None, help="use a seeded sample of N (expanded) conversations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", default="packed,grouped,padded,padded_dynamic",
                    help="comma-separated subset (padded to max_len is by far the slowest pass)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "packing.json"))
    args = ap.parse_args()

    params = load_params(ROOT / "params.yaml")
    if args.max_len is None:
        args.max_len = params.midtrain.max_len if params.midtrain else 512
    if args.batch is None:
        ds = json.loads((ROOT / params.midtrain.deepspeed_config).read_text()) if params.midtrain else {}
        args.batch = int(ds.get("train_micro_batch_size_per_gpu", 1))
    convs = load_conversations(args.dataset, Path(args.data) if args.data else None)
    if args.limit:                       # a seeded sample, not the first sources of the file
        keep = random.Random(args.seed).sample(range(len(convs)), min(args.limit, len(convs)))
        convs = [convs[i] for i in sorted(keep)]
    enc = Encoder(convs, params, Path(args.tokenizer) if args.tokenizer else None)
    examples = [render(enc, c) for c in convs]
    lengths = sorted(len(e[0]) for e in examples)
    kept, fit_stats = fit_examples(examples, args.max_len, "truncate")

    singles = pad_rows(kept, args.max_len)
    packed = pack(kept, args.max_len, seed=args.seed)
    grouped, _ = batch_units(singles, "grouped", args.batch, args.max_len, args.seed)
    shuffled = list(range(len(singles)))
    random.Random(args.seed).shuffle(shuffled)
    chunks = [shuffled[i:i + args.batch] for i in range(0, len(shuffled), args.batch)]
    modes = {
        "packed": (packed, [list(range(i, min(i + args.batch, len(packed)))) for i in range(0, len(packed), args.batch)]),
        "grouped": (singles, grouped),
        "padded": (singles, chunks),
        "padded_dynamic": (singles, chunks),
    }
    wanted = args.modes.split(",")
    if unknown := set(wanted) - set(modes):
        sys.exit(f"unknown mode(s) {sorted(unknown)}; modes: {', '.join(modes)}")
    prepared = {m: batches(*modes[m], args.max_len, enc.pad, m) for m in wanted}

    model = build_tiny_model(params.model, enc.vocab_size, enc.pad, enc.special["<|im_end|>"])
    model.train()
    for m in prepared:  # warm-up (allocator, kernels)
        one_pass(model, prepared[m][:2])
    names = list(prepared)
    rates: dict[str, list[float]] = {m: [] for m in names}
    for r in range(args.repeat):          # interleaved: every mode once per repeat, rotated order
        for m in names[r % len(names):] + names[:r % len(names)]:
            secs, toks = one_pass(model, prepared[m])
            rates[m].append(toks / secs)
            print(f"  repeat {r + 1}/{args.repeat} {m:>14}: {toks / secs:9.0f} real tok/s", flush=True)

    result: dict = {
        "dataset": args.data or args.dataset,
        "tokenizer": enc.name,
        "rendering": "mimesis_lab.chat.tokenize_chat" if RENDERED_BY_CHAT else "hand-rendered Qwen-style template",
        "model": {"hidden_size": params.model.hidden_size, "layers": params.model.num_hidden_layers,
                  "vocab_size": enc.vocab_size, "params": sum(p.numel() for p in model.parameters())},
        "max_len": args.max_len,
        "micro_batch_rows": args.batch,
        "repeat": args.repeat,
        "interleaved": True,
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "example_tokens": {"n": len(lengths), "min": lengths[0], "median": lengths[len(lengths) // 2],
                           "max": lengths[-1], "mean": round(sum(lengths) / len(lengths), 1)},
        "fit_stats": fit_stats,
    }
    for m in names:
        width_tokens = sum(b["input_ids"].numel() for b, _ in prepared[m])
        real = sum(t for _, t in prepared[m])
        result[m] = {"micro_batches": len(prepared[m]), "real_tokens": real,
                     "real_tokens_per_s": spread(rates[m], 1), "efficiency": round(real / width_tokens, 4)}
    result["packing_efficiency"] = round(packing_efficiency(packed, args.max_len), 4)
    result["grouped_padding_efficiency"] = round(sum(len(singles[i]) for g in grouped for i in g)
                                                 / sum(len(g) * max(len(singles[i]) for i in g) for g in grouped), 4)
    ratios = {}
    for a, b in (("packed", "grouped"), ("packed", "padded"), ("grouped", "padded"), ("packed", "padded_dynamic"),
                 ("grouped", "padded_dynamic")):
        if a not in rates or b not in rates:
            continue
        ratios[f"{a}/{b}"] = spread([x / y for x, y in zip(rates[a], rates[b])])
    result["ratios"] = ratios
    result["fastest"] = max(names, key=lambda m: statistics.median(rates[m]))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"dataset {result['dataset']}: {len(lengths)} examples, tokens/example median "
          f"{result['example_tokens']['median']} (max {lengths[-1]}), {fit_stats['truncated']} truncated to "
          f"{args.max_len}; tokenizer: {enc.name}; {args.repeat} interleaved repeats, "
          f"{torch.get_num_threads()} torch threads")
    for m in names:
        r = result[m]
        print(f"{m:>15}: {r['micro_batches']:4d} micro-batches  eff {r['efficiency']:.1%}  "
              f"{fmt(r['real_tokens_per_s'], nd=0)} real tok/s (median [min-max])")
    for k, v in ratios.items():
        print(f"{k:>24}: {fmt(v, 'x')}")
    print(f"packing efficiency {result['packing_efficiency']:.1%}; fastest: {result['fastest']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
