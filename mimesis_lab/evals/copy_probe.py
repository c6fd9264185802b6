"""In-context copying of a language model: can it repeat what its context holds?

A simulator must state the facts its system prompt gives it (its name, order id, preferences), and an agent
must act on what the user said; both need *in-context copying*, which pretrained LMs do through induction
heads (Olsson et al., 2022, "In-context learning and induction heads"). A model built from config and
trained for minutes may have none, and then no amount of RL on a reward that needs those facts can help.

:func:`induction_accuracy` is the standard probe: ``n_seqs`` spans of ``span`` random tokens, each followed by
an exact repeat; the score is the greedy (argmax) next-token accuracy on the repeat, its first token left out
(it cannot be predicted). A model with induction heads scores near 1; one without scores about the chance
rate ``1 / (vocab - low)``. Deterministic for a seed; one forward pass.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["induction_accuracy"]


def induction_accuracy(model: Any, vocab_size: int | None = None, *, n_seqs: int = 32, span: int = 30,
                       seed: int = 0, low: int = 100) -> dict[str, float | int]:
    """Greedy accuracy on the second copy of repeated random-token spans (ids drawn from ``[low, vocab_size)``,
    away from the special tokens; ``vocab_size`` defaults to the model's input-embedding rows). Returns
    ``{"acc", "tokens", "chance"}``."""
    if vocab_size is None:
        vocab_size = int(model.get_input_embeddings().weight.shape[0])
    if not 0 <= low < vocab_size - 1:
        raise ValueError(f"low={low} leaves no token ids below vocab_size={vocab_size}")
    if span < 2 or n_seqs < 1:
        raise ValueError(f"need span >= 2 and n_seqs >= 1 (got span={span}, n_seqs={n_seqs})")
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(low, vocab_size, (n_seqs, span), generator=g)
    seq = torch.cat([x, x], dim=1)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=seq.to(device)).logits
    finally:
        model.train(was_training)
    # position span+i predicts token span+i+1 = x[i+1], for i in 0..span-2
    pred = logits[:, span:-1].argmax(-1).cpu()
    hits = (pred == seq[:, span + 1:]).sum().item()
    n = n_seqs * (span - 1)
    return {"acc": hits / n, "tokens": n, "chance": 1.0 / (vocab_size - low)}


def main(argv: list[str] | None = None) -> int:
    """``python -m mimesis_lab.evals.copy_probe MODEL_DIR [MODEL_DIR ...]``: one JSON line per model."""
    import argparse
    import json

    from transformers import AutoModelForCausalLM   # not mimesis_lab.models: it imports this module (warm-up)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="local Hugging Face model folders")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for path in args.models:
        print(json.dumps({"model": path, **induction_accuracy(AutoModelForCausalLM.from_pretrained(path), seed=args.seed)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
