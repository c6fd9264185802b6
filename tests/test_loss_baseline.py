"""The add-one unigram baseline of mid-training (mimesis_lab/evals/loss_baseline.py)."""
from __future__ import annotations

import math
from collections import Counter

import pytest

from mimesis_lab.evals.loss_baseline import target_tokens, unigram_baseline, unigram_counts, unigram_nll
from tests.conftest import ROOT


def test_unigram_worked_example():
    counts = unigram_counts([5, 5, 5, 7])                        # N = 4, V = 4
    assert unigram_nll(counts, 4, [5]) == pytest.approx(-math.log(4 / 8))
    assert unigram_nll(counts, 4, [5, 9]) == pytest.approx(2.772589, abs=1e-6)   # ln 2 + ln 8
    with pytest.raises(ValueError):
        unigram_nll(Counter({1: 1, 2: 1, 3: 1}), 2, [1])

    class Row:
        labels = [-100, 5, 7, -100, 9]
    assert target_tokens([Row(), Row()]) == [5, 7, 9, 5, 7, 9]   # the training loss mask: labels != -100



def test_unigram_baseline_uses_the_training_targets(tmp_path):
    """On a tiny model: the unigram is fitted on exactly the train rows' scored tokens, every validation target is
    scored once, and the per-conversation model NLLs add up to the model's token-mean loss."""
    import polars as pl

    from mimesis_lab.config import ModelParams, load_params
    from mimesis_lab.models import build_tiny_model, save_hf
    from mimesis_lab.tokenizer import load_tokenizer, train_tokenizer
    from mimesis_lab.train.data import load_rows

    tok = train_tokenizer(["hello world, how are you"] * 20, vocab_size=300, min_frequency=1)
    model = build_tiny_model(ModelParams(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8),
                             len(tok), tok.pad_token_id, tok.eos_token_id)
    save_hf(model, tok, tmp_path / "m")
    conv = lambda a, b: [{"role": "user", "content": a}, {"role": "assistant", "content": b}]  # noqa: E731
    pl.DataFrame({"messages": [conv("hello", "world how"), conv("how are", "you")]}).write_parquet(
        tmp_path / "t.parquet")
    pl.DataFrame({"messages": [conv("are you", "hello world"), conv("world", "how are you")]}).write_parquet(
        tmp_path / "v.parquet")
    cfg = load_params(str(ROOT / "params.yaml")).midtrain.model_copy(
        update={"train": str(tmp_path / "t.parquet"), "val": str(tmp_path / "v.parquet")})
    u = unigram_baseline(tmp_path / "m", cfg)
    rows, stats = load_rows(cfg.train, load_tokenizer(tmp_path / "m"), cfg, train=True, batching="padded")
    assert u["train_target_tokens"] == stats["target_tokens"] == len(target_tokens(rows))
    assert u["vocab_size"] == len(tok) and u["examples"] == u["examples_scored"] == 2
    assert sum(p[2] for p in u["per_example"]) == u["val_target_tokens"] > 0
    assert u["val_loss"] == pytest.approx(sum(p[1] for p in u["per_example"]) / u["val_target_tokens"])
    assert u["model_val_loss"] == pytest.approx(sum(p[0] for p in u["per_example"]) / u["val_target_tokens"])
    assert math.log(len(tok)) * 0.5 < u["model_val_loss"] < math.log(len(tok)) * 1.5    # an untrained model
