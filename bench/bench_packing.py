"""Benchmark (not a test): packed vs padded training throughput of the tiny model.

Tokenises the bundled, processed fixtures (``data/processed/role_swap.parquet`` expanded by
its ``copies`` column, as mid-training sees it; ``--dataset thoughttrace`` for the SFT set)
with ``models/tokenizer`` and :func:`mimesis_lab.chat.tokenize_chat` when they exist, else with
a stand-in built the way the tokenizer stage builds it: a byte-level BPE trained in memory on
the same text with the ``tokenizer`` section's ``vocab_size``/``min_frequency``, each message
rendered Qwen-style by hand (``<|im_start|>role\\n content <|im_end|>\\n``), loss mask 1 on
assistant content.

Then, in one process and the same run, it measures forward + backward (token-mean CE,
no optimizer step, so every pass costs the same) over all examples, as

- ``packed``: :func:`mimesis_lab.packing.pack` rows + 4D block-diagonal mask;
- ``padded``: one example per row, right-padded to ``max_len`` (2D padding mask);
- ``padded_dynamic`` (extra, a stronger baseline): one example per row, padded only to the
  longest row of its micro-batch.

Throughput is counted in **real (non-pad) tokens per second**; passes alternate between
modes and the best of ``--repeat`` is kept. Prints and writes ``bench/results/packing.json``
with both rates, the ratio (target >= 2x) and the packing efficiency (target >= 95%).
Usage::

    python bench/bench_packing.py [--dataset role_swap] [--max-len 512] [--batch 4] [--repeat 3]
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

RENDERED_BY_CHAT = False
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def load_conversations(dataset: str) -> list[list[dict]]:
    path = ROOT / "data" / "processed" / f"{dataset}.parquet"
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

    def __init__(self, convs: list[list[dict]], params) -> None:
        tok_dir = ROOT / params.tokenizer.output_dir
        if (tok_dir / "tokenizer.json").is_file() or (tok_dir / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
            self.name = f"{params.tokenizer.output_dir} ({len(tok)} tokens)"
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


def batches(rows, batch: int, max_len: int, pad: int, mode: str):
    out = []
    for i in range(0, len(rows), batch):
        chunk = rows[i:i + batch]
        real = sum(len(r) for r in chunk)
        if mode == "packed":
            b = collate(chunk, max_len, pad)
        else:
            width = max_len if mode == "padded" else max(len(r) for r in chunk)
            b = collate(chunk, width, pad, mask="position_ids")
            # one example per row: a plain 2D padding mask is the standard baseline
            b["attention_mask"] = torch.zeros_like(b["input_ids"])
            for j, r in enumerate(chunk):
                b["attention_mask"][j, :len(r)] = 1
            b["position_ids"] = torch.arange(width).expand(len(chunk), -1).clone()
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="role_swap", choices=["role_swap", "thoughttrace"])
    ap.add_argument("--max-len", type=int, default=None, help="default: midtrain.max_len of params.yaml")
    ap.add_argument("--batch", type=int, default=4, help="rows per micro-batch (all modes)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "packing.json"))
    args = ap.parse_args()

    params = load_params(ROOT / "params.yaml")
    if args.max_len is None:
        args.max_len = params.midtrain.max_len if params.midtrain else 512
    convs = load_conversations(args.dataset)
    enc = Encoder(convs, params)
    examples = [render(enc, c) for c in convs]
    lengths = sorted(len(e[0]) for e in examples)
    kept, fit_stats = fit_examples(examples, args.max_len, "truncate")

    modes = {
        "packed": pack(kept, args.max_len, seed=0),
        "padded": pad_rows(kept, args.max_len),
        "padded_dynamic": pad_rows(kept, args.max_len),
    }
    prepared = {m: batches(rows, args.batch, args.max_len, enc.pad, m) for m, rows in modes.items()}

    model = build_tiny_model(params.model, enc.vocab_size, enc.pad, enc.special["<|im_end|>"])
    model.train()
    for m in prepared:  # warm-up (allocator, kernels)
        one_pass(model, prepared[m][:1])
    best: dict[str, tuple[float, int]] = {}
    for _ in range(args.repeat):
        for m in prepared:
            secs, toks = one_pass(model, prepared[m])
            if m not in best or secs < best[m][0]:
                best[m] = (secs, toks)

    result: dict = {
        "dataset": args.dataset,
        "tokenizer": enc.name,
        "rendering": "mimesis_lab.chat.tokenize_chat" if RENDERED_BY_CHAT else "hand-rendered Qwen-style template",
        "model": {"hidden_size": params.model.hidden_size, "layers": params.model.num_hidden_layers,
                  "vocab_size": enc.vocab_size, "params": sum(p.numel() for p in model.parameters())},
        "max_len": args.max_len,
        "micro_batch_rows": args.batch,
        "repeat": args.repeat,
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "example_tokens": {"n": len(lengths), "min": lengths[0], "median": lengths[len(lengths) // 2],
                           "max": lengths[-1], "mean": round(sum(lengths) / len(lengths), 1)},
        "fit_stats": fit_stats,
    }
    for m, rows in modes.items():
        secs, toks = best[m]
        width_tokens = sum(b["input_ids"].numel() for b, _ in prepared[m])
        result[m] = {"rows": len(rows), "real_tokens": toks, "seconds": round(secs, 3),
                     "real_tokens_per_s": round(toks / secs, 1),
                     "efficiency": round(toks / width_tokens, 4)}
    result["packing_efficiency"] = round(packing_efficiency(modes["packed"], args.max_len), 4)
    result["ratio_packed_vs_padded"] = round(result["packed"]["real_tokens_per_s"]
                                             / result["padded"]["real_tokens_per_s"], 3)
    result["ratio_packed_vs_padded_dynamic"] = round(result["packed"]["real_tokens_per_s"]
                                                     / result["padded_dynamic"]["real_tokens_per_s"], 3)
    result["targets"] = {"ratio": 2.0, "packing_efficiency": 0.95}
    result["met"] = {"ratio": result["ratio_packed_vs_padded"] >= 2.0,
                     "packing_efficiency": result["packing_efficiency"] >= 0.95}

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"dataset {args.dataset}: {len(lengths)} examples, tokens/example median {result['example_tokens']['median']}"
          f" (max {lengths[-1]}), {fit_stats['truncated']} truncated to {args.max_len}; tokenizer: {enc.name}")
    for m in modes:
        r = result[m]
        print(f"{m:>15}: {r['rows']:4d} rows  eff {r['efficiency']:.1%}  {r['real_tokens_per_s']:>9.0f} real tok/s")
    print(f"packing efficiency {result['packing_efficiency']:.1%} (target >= 95%); "
          f"packed/padded {result['ratio_packed_vs_padded']:.2f}x (target >= 2x); "
          f"packed/padded_dynamic {result['ratio_packed_vs_padded_dynamic']:.2f}x")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
