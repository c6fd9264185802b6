"""Format check of a ThoughtTrace-SFT simulator (SPEC §2.2): does it think before it speaks?

For every assistant (simulator) turn of the validation conversations, the model greedily
continues the public history and we record whether the reply opens a ``<think>`` block
and closes it with ``</think>`` before the end of its turn. Reported as rates; prompts
that do not fit the context are counted as skipped, never silently dropped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from mimesis_lab.io import read_parquet


def classify_reply(text: str) -> tuple[bool, bool]:
    """``(opened, opened_and_closed)`` for a generated reply (special tokens kept in ``text``)."""
    body = text.lstrip()
    opened = body.startswith("<think>")
    return opened, opened and "</think>" in body[len("<think>"):]


def format_rates(model: Any, tokenizer: Any, conversations: Sequence[Sequence[dict]], *,
                 max_new_tokens: int = 96, max_prompts: int | None = None) -> dict[str, Any]:
    """Greedy replies at every assistant turn; rates of opened / opened-and-closed think blocks."""
    model.eval()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eos = [eot] if isinstance(eot, int) and eot >= 0 else None
    limit = getattr(model.config, "max_position_embeddings", 2048) - max_new_tokens
    n = opened = closed = skipped = 0
    examples: list[str] = []
    for conv in conversations:
        for k, msg in enumerate(conv):
            if msg["role"] != "assistant":
                continue
            if max_prompts is not None and n >= max_prompts:
                break
            prompt = tokenizer.apply_chat_template(list(conv[:k]), add_generation_prompt=True, tokenize=False)
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
            if ids.shape[1] > limit:
                skipped += 1
                continue
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                                     pad_token_id=tokenizer.pad_token_id, attention_mask=torch.ones_like(ids))
            text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
            o, c = classify_reply(text)
            n += 1
            opened += o
            closed += c
            if len(examples) < 3:
                examples.append(text[:200])
    return {
        "prompts": n,
        "skipped_too_long": skipped,
        "think_open_rate": opened / n if n else float("nan"),
        "think_open_close_rate": closed / n if n else float("nan"),
        "examples": examples,
    }


def evaluate_folder(model_dir: str | Path, val_parquet: str | Path, **kw: Any) -> dict[str, Any]:
    """:func:`format_rates` for a saved HF folder on a split parquet (column ``messages``)."""
    from mimesis_lab.models import load_model
    from mimesis_lab.tokenizer import load_tokenizer

    model = load_model(model_dir)
    tok = load_tokenizer(model_dir)
    convs = read_parquet(val_parquet, "validation split", columns=["messages"]).get_column("messages").to_list()
    if not convs:
        raise ValueError(f"{val_parquet}: empty split, nothing to evaluate")
    return format_rates(model, tok, convs, **kw)
