"""In-context copy probe (mimesis_lab.evals.copy_probe): a perfect copier scores 1, a model that ignores its
context scores about chance, and bad arguments are refused."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mimesis_lab.evals.copy_probe import induction_accuracy


class _Fake(torch.nn.Module):
    """A stand-in LM: ``forward(input_ids).logits`` from :meth:`scores` (batch x time x vocab)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids):
        return SimpleNamespace(logits=self.scores(input_ids, torch.zeros(*input_ids.shape, self.vocab)))


class Copier(_Fake):
    """Predicts, at every position, the token that followed the previous occurrence of the current token."""

    def scores(self, input_ids, logits):
        for i in range(input_ids.shape[0]):
            seen: dict[int, int] = {}
            for j in range(input_ids.shape[1]):
                cur = int(input_ids[i, j])
                if cur in seen:
                    logits[i, j, seen[cur]] = 1.0
                if j > 0:
                    seen[int(input_ids[i, j - 1])] = cur
        return logits


class Blind(_Fake):
    def scores(self, input_ids, logits):
        logits[..., 7] = 1.0              # always the same token, whatever the context
        return logits


def test_a_copier_scores_one_and_a_blind_model_about_chance():
    r = induction_accuracy(Copier(20100), 20100, n_seqs=8, span=20)   # a large vocabulary: no repeats in a span
    assert r["acc"] == pytest.approx(1.0) and r["tokens"] == 8 * 19
    assert r["chance"] == pytest.approx(1 / 20000)
    assert induction_accuracy(Blind(500), 500, n_seqs=8, span=20)["acc"] == 0.0


def test_deterministic_and_leaves_the_training_flag_alone():
    m = Copier(300)
    m.train()
    a = induction_accuracy(m, 300, seed=3)
    assert a == induction_accuracy(m, 300, seed=3) and m.training


def test_the_tiny_model_runs_through_it():
    from mimesis_lab.models import build_tiny_model

    cfg = SimpleNamespace(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, max_position_embeddings=256, rope_theta=10000.0,
                          tie_word_embeddings=True, seed=0)
    r = induction_accuracy(build_tiny_model(cfg, 400, 0, 1), 400, n_seqs=4, span=10)
    assert induction_accuracy(build_tiny_model(cfg, 400, 0, 1), n_seqs=4, span=10) == r   # vocab from the model
    assert 0.0 <= r["acc"] <= 0.2 and r["tokens"] == 36        # random weights: no copying


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        induction_accuracy(Blind(50), 50, low=100)
    with pytest.raises(ValueError, match="span"):
        induction_accuracy(Blind(500), 500, span=1)
