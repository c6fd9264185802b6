"""Is mid-training better than counting tokens? The add-one unigram baseline of a trained phase (SPEC §2.1).

The unigram is fitted on the train split's *target* tokens — the same tokenizer, chat tokenisation, loss mask,
mixture expansion and ``max_len`` fitting as the training job (:func:`mimesis_lab.train.data.load_rows`: a token
is a target where its pre-shifted label is not ``-100``) — and scored on the validation split's target tokens.
The model's loss on the same tokens is recomputed per validation conversation, so the report can bootstrap the
difference over conversations (``effects.midtrain_vs_unigram``).
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["unigram_counts", "unigram_nll", "target_tokens", "unigram_baseline"]


def unigram_counts(tokens: Iterable[int]) -> Counter:
    """Token counts of the training targets."""
    return Counter(int(t) for t in tokens)


def unigram_nll(counts: Counter, vocab_size: int, tokens: Sequence[int]) -> float:
    """Summed negative log-likelihood (nats) of ``tokens`` under the add-one smoothed unigram
    ``p(t) = (count(t) + 1) / (N + V)``, ``N`` = number of training targets, ``V`` = ``vocab_size``.

    Worked example: counts {5: 3, 7: 1} (N = 4), V = 4: p(5) = 4/8, p(7) = 2/8, p(9) = 1/8, so
    ``unigram_nll(counts, 4, [5, 9]) = ln 2 + ln 8 = 2.7726``."""
    n = sum(counts.values())
    if vocab_size < len(counts) or vocab_size <= 0:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the {len(counts)} distinct training tokens")
    return -sum(math.log((counts.get(int(t), 0) + 1) / (n + vocab_size)) for t in tokens)


def target_tokens(rows: Sequence[Any]) -> list[int]:
    """The scored tokens of training rows (pre-shifted ``labels`` other than ``-100``)."""
    from mimesis_lab.packing import IGNORE_INDEX

    return [int(t) for r in rows for t in r.labels if t != IGNORE_INDEX]


def unigram_baseline(model_dir: str | Path, cfg: Any, max_examples: int = 256) -> dict[str, Any]:
    """The unigram of ``cfg.train`` scored on ``cfg.val`` (``cfg``: the phase's ``TrainParams``), and the model of
    ``model_dir`` on the same validation targets, per conversation (the first ``max_examples``).

    ``V`` is the model's output vocabulary (the classes its cross-entropy is over). Returns ``val_loss`` (the
    unigram's token mean over all validation targets), ``model_val_loss`` and ``per_example``: one
    ``[model_nll_sum, unigram_nll_sum, n_targets]`` per validation conversation."""
    import torch

    from mimesis_lab.models import load_model
    from mimesis_lab.packing import masked_token_ce_sum
    from mimesis_lab.tokenizer import load_tokenizer
    from mimesis_lab.train.data import build_rows, load_rows, read_conversations

    tok = load_tokenizer(model_dir)
    model = load_model(model_dir)
    model.eval()
    vocab = int(model.get_output_embeddings().weight.shape[0])
    train_rows, _ = load_rows(cfg.train, tok, cfg, train=True, batching="padded")
    counts = unigram_counts(target_tokens(train_rows))
    val_rows, _ = build_rows(tok, read_conversations(cfg.val, expand=False, seed=cfg.seed), train_role=cfg.train_role,
                             max_len=cfg.max_len, overlong=cfg.overlong, batching="padded", source=str(cfg.val))
    val_targets = target_tokens(val_rows)
    per = []
    with torch.no_grad():
        for row in val_rows[:max_examples]:
            logits = model(input_ids=torch.tensor([row.input_ids]), use_cache=False).logits
            m, n = masked_token_ce_sum(logits, torch.tensor([row.labels]))
            per.append([float(m), unigram_nll(counts, vocab, target_tokens([row])), int(n)])
    tot = sum(p[2] for p in per)
    return {"vocab_size": vocab, "train_target_tokens": sum(counts.values()), "val_target_tokens": len(val_targets),
            "val_loss": unigram_nll(counts, vocab, val_targets) / max(1, len(val_targets)),
            "model_val_loss": sum(p[0] for p in per) / tot if tot else None,
            "examples": len(val_rows), "examples_scored": len(per), "per_example": per}
