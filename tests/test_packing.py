"""Packing: isolation of packed examples (sdpa and eager), labels, positions, efficiency, loss; length-grouped
dynamic padding (grouping, padding, loss)."""
from __future__ import annotations

import math
import random

import pytest
import torch

from mimesis_lab.config import ModelParams
from mimesis_lab.models import build_tiny_model
from mimesis_lab.packing import (
    IGNORE_INDEX,
    collate,
    fit_examples,
    group_by_length,
    masked_token_ce_sum,
    masked_token_mean_ce,
    pack,
    packing_efficiency,
    pad_rows,
)

VOCAB = 100
PAD = 0


@pytest.fixture(scope="module")
def tiny_model():
    cfg = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=128, seed=7)
    model = build_tiny_model(cfg, VOCAB, pad_token_id=PAD, eos_token_id=1, bos_token_id=2)
    model.eval()
    return model


def _example(n: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    ids = [rng.randrange(3, VOCAB) for _ in range(n)]
    mask = [0] * (n // 2) + [1] * (n - n // 2)
    return ids, mask


def _alone_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", ["4d", "position_ids"])
def test_packed_logits_equal_logits_alone(tiny_model, impl, mode):
    tiny_model.set_attn_implementation(impl)
    try:
        examples = [_example(n, s) for s, n in enumerate([5, 9, 3, 6, 4])]
        # best-fit decreasing at max_len 22: row 0 = examples 0,1,3 (20 tokens + 2 pads),
        # row 1 = examples 2,4 (7 tokens + 15 pads)
        rows = pack(examples, 22)
        assert [r.example_ids for r in rows] == [[0, 1, 3], [2, 4]]
        for batch_rows in (rows[:1], rows):  # batch size 1 (3 examples in a row) and 2
            _check_isolation(tiny_model, examples, batch_rows, mode)
    finally:
        tiny_model.set_attn_implementation("sdpa")


def _check_isolation(tiny_model, examples, rows, mode):
    batch = collate(rows, 22, PAD, mask=mode)
    assert ("attention_mask" in batch) == (mode == "4d")
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        # position_ids mode: packing is only detected without a cache (see test_position_ids_mode_needs_no_cache)
        packed = tiny_model(**inputs, use_cache=False).logits
    assert torch.isfinite(packed).all()  # pads included: no fully-masked row, no NaN
    for b, row in enumerate(rows):
        start = 0
        for k, n in zip(row.example_ids, row.seq_lens):
            alone = _alone_logits(tiny_model, examples[k][0])
            torch.testing.assert_close(packed[b, start:start + n], alone, atol=1e-5, rtol=0)
            start += n


def test_without_isolation_logits_leak(tiny_model):
    """Control: the isolation test is sensitive (plain causal attention over the row leaks)."""
    examples = [_example(5, 0), _example(9, 1)]
    ids = examples[0][0] + examples[1][0]
    with torch.no_grad():
        leaked = tiny_model(input_ids=torch.tensor([ids])).logits[0, 5:]
    assert (leaked - _alone_logits(tiny_model, examples[1][0])).abs().max() > 1e-3


def test_position_ids_mode_needs_no_cache(tiny_model):
    """Documents a silent trap of the installed transformers: with ``use_cache`` left at its
    default (config.use_cache=True, train or eval), a DynamicCache is created and packed-sequence detection from
    ``position_ids`` is skipped, so examples leak. The 4D mask is unaffected by the cache."""
    examples = [_example(5, 0), _example(9, 1)]
    rows = pack(examples, 16)
    alone = _alone_logits(tiny_model, examples[1][0])
    assert rows[0].example_ids == [0, 1]
    start = 5  # example 1 (9 tokens) follows example 0 (5 tokens)
    pos = collate(rows, 16, PAD, mask="position_ids")
    four = collate(rows, 16, PAD)
    with torch.no_grad():
        leaky = tiny_model(input_ids=pos["input_ids"], position_ids=pos["position_ids"], use_cache=True).logits
        ok = tiny_model(**{k: v for k, v in four.items() if k != "labels"}, use_cache=True).logits
    assert (leaky[0, start:start + 9] - alone).abs().max() > 1e-3
    torch.testing.assert_close(ok[0, start:start + 9], alone, atol=1e-5, rtol=0)


def test_4d_mask_shape_and_pattern():
    ex = [([5, 6, 7], [0, 1, 1]), ([8, 9], [0, 1])]
    rows = [pack(ex, 6)[0]]
    batch = collate(rows, 6, PAD)
    m = batch["attention_mask"]
    assert m.shape == (1, 1, 6, 6) and m.dtype == torch.float32
    allowed = (m[0, 0] == 0).int().tolist()
    # examples keep their input order inside a row
    assert rows[0].example_ids == [0, 1]
    assert allowed == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # the pad sees only itself
    ]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0]]
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, PAD]]
    assert batch["labels"].tolist() == [[6, 7, IGNORE_INDEX, 9, IGNORE_INDEX, IGNORE_INDEX]]
    assert collate(rows, 6, PAD, dtype=torch.bfloat16)["attention_mask"].dtype == torch.bfloat16


def test_labels_never_cross_boundaries_and_positions_restart():
    rng = random.Random(3)
    examples = []
    for _ in range(40):
        n = rng.randint(2, 30)
        examples.append(([rng.randrange(3, VOCAB) for _ in range(n)], [rng.randint(0, 1) for _ in range(n)]))
    examples, _ = fit_examples(examples, 64)
    rows = pack(examples, 64)
    seen = sorted(k for r in rows for k in r.example_ids)
    assert seen == list(range(len(examples)))  # every example exactly once
    for row in rows:
        assert len(row) <= 64 and sum(row.seq_lens) == len(row)
        start = 0
        for k, n in zip(row.example_ids, row.seq_lens):
            ids, mask = examples[k]
            assert row.input_ids[start:start + n] == ids
            assert row.position_ids[start:start + n] == list(range(n))
            lab = row.labels[start:start + n]
            assert lab[-1] == IGNORE_INDEX  # last token of an example never predicts the next example
            for t in range(n - 1):
                assert lab[t] == (ids[t + 1] if mask[t + 1] else IGNORE_INDEX)
            start += n


def test_pack_is_deterministic_and_best_fit():
    examples = [([3] * n, [0] + [1] * (n - 1)) for n in [6, 2, 5, 3, 4, 4, 2]]
    a, b = pack(examples, 10), pack(examples, 10)
    assert [r.example_ids for r in a] == [r.example_ids for r in b]
    # best-fit decreasing, items 6,5,4,4,3,2,2 into rooms of 10:
    # 6 -> r0 (4 left); 5 -> r1 (5 left); 4 -> r0 (tightest fit, 0 left); 4 -> r1 (1 left);
    # 3 -> new r2 (7 left); 2 -> r2 (5 left); 2 -> r2 (3 left)
    assert [sorted(r.seq_lens) for r in a] == [[4, 6], [4, 5], [2, 2, 3]]
    assert [r.example_ids for r in a] == [[0, 4], [2, 5], [1, 3, 6]]
    shuffled = pack(examples, 10, seed=1)
    assert sorted(r.example_ids for r in shuffled) == sorted(r.example_ids for r in a)
    assert [r.example_ids for r in pack(examples, 10, seed=1)] == [r.example_ids for r in shuffled]


def test_packing_efficiency_by_hand():
    examples = [([3] * n, [0, 1] + [0] * (n - 2)) for n in [6, 5, 4, 4, 3]]
    rows = pack(examples, 10)  # 6+4 | 5+4 | 3  -> 22 tokens / (3*10)
    assert [sum(r.seq_lens) for r in rows] == [10, 9, 3]
    assert packing_efficiency(rows, 10) == pytest.approx(22 / 30)
    assert packing_efficiency(pad_rows(examples, 10), 10) == pytest.approx(22 / 50)
    assert packing_efficiency([], 10) == 0.0


def test_fit_examples_truncate_vs_drop_and_no_target():
    examples = [
        ([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 1]),  # overlong; truncated to 4 -> no target left
        ([1, 2, 3, 4, 5, 6], [0, 1, 1, 1, 1, 1]),  # overlong; truncated keeps targets
        ([1, 2, 3], [0, 0, 0]),                    # all masked
        ([1, 2, 3], [1, 0, 0]),                    # only the first token: never a target
        ([1, 2, 3], [0, 0, 1]),                    # fine
    ]
    kept, st = fit_examples(examples, 4, "truncate")
    assert kept == [([1, 2, 3, 4], [0, 1, 1, 1]), ([1, 2, 3], [0, 0, 1])]
    assert st["truncated"] == 2 and st["dropped_overlong"] == 0 and st["dropped_no_target"] == 3
    assert st["examples_in"] == 5 and st["examples_out"] == 2
    assert st["tokens_in"] == 21 and st["tokens_out"] == 7 and st["target_tokens_out"] == 4
    kept, st = fit_examples(examples, 4, "drop")
    assert kept == [([1, 2, 3], [0, 0, 1])]
    assert st["truncated"] == 0 and st["dropped_overlong"] == 2 and st["dropped_no_target"] == 2
    assert st["examples_in"] == st["examples_out"] + st["dropped_overlong"] + st["dropped_no_target"]


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="example 0"):
        fit_examples([([1, 2], [1])], 4)
    with pytest.raises(ValueError, match="0/1"):
        fit_examples([([1, 2], [0, 2])], 4)
    with pytest.raises(ValueError, match="fit_examples"):
        pack([([1] * 5, [1] * 5)], 4)
    with pytest.raises(ValueError, match="overlong"):
        fit_examples([], 4, "clip")


def test_masked_token_mean_ce_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5)
    labels = torch.tensor([[1, -100, 4, -100], [-100, 0, 2, 3]])
    terms = []
    for b in range(2):
        for t in range(4):
            y = labels[b, t].item()
            if y != -100:
                row = logits[b, t]
                terms.append(-(row[y] - math.log(sum(math.exp(v) for v in row.tolist()))))
    expected = sum(float(x) for x in terms) / len(terms)
    assert masked_token_mean_ce(logits, labels).item() == pytest.approx(expected, abs=1e-5)
    total, count = masked_token_ce_sum(logits, labels)
    assert count.item() == 5 and total.item() == pytest.approx(expected * 5, abs=1e-4)


def test_masked_token_mean_ce_no_targets_is_zero_with_grad():
    logits = torch.randn(1, 3, 4, requires_grad=True)
    loss = masked_token_mean_ce(logits, torch.full((1, 3), -100))
    loss.backward()
    assert loss.item() == 0.0 and logits.grad is not None and logits.grad.abs().sum() == 0


def test_packed_loss_equals_sum_of_losses_alone(tiny_model):
    """The global token mean over a packed batch equals the one over the examples run alone."""
    examples = [_example(n, 10 + s) for s, n in enumerate([6, 8, 3, 5])]
    rows = pack(examples, 12)
    batch = collate(rows, 12, PAD)
    with torch.no_grad():
        logits = tiny_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"]).logits
        packed = masked_token_mean_ce(logits, batch["labels"])
        tot, cnt = 0.0, 0
        for row in pad_rows(examples, 12):
            single = collate([row], len(row), PAD)
            s, c = masked_token_ce_sum(_alone_logits(tiny_model, row.input_ids)[None], single["labels"])
            tot, cnt = tot + s.item(), cnt + c.item()
    assert packed.item() == pytest.approx(tot / cnt, abs=1e-5)


# ----------------------------------------------------------------------------- length-grouped dynamic padding
def test_group_by_length_partitions_within_budget_and_groups_by_length():
    rng = random.Random(5)
    lengths = [rng.randint(1, 64) for _ in range(500)]
    groups = group_by_length(lengths, 128, seed=3, mega=4)
    assert sorted(i for g in groups for i in g) == list(range(500))         # every example exactly once
    assert all(g and len(g) * max(lengths[i] for i in g) <= 128 for g in groups)
    assert group_by_length(lengths, 128, seed=3, mega=4) == groups           # deterministic
    assert group_by_length(lengths, 128, seed=4, mega=4) != groups           # the seed shuffles
    # grouped: far less padding than random micro-batches of the same sizes
    def fed(gs):
        return sum(len(g) * max(lengths[i] for i in g) for g in gs)
    order = list(range(500))
    random.Random(0).shuffle(order)
    it = iter(order)
    rand = [[next(it) for _ in g] for g in groups]
    assert sum(lengths) / fed(groups) > 0.85 > sum(lengths) / fed(rand)
    # a length equal to the budget is a group of its own; longer is an error
    assert group_by_length([4, 2, 2], 4, seed=0) in ([[0], [1, 2]], [[1, 2], [0]])
    with pytest.raises(ValueError, match="example 1 has 9 tokens"):
        group_by_length([3, 9], 8, seed=0)
    assert group_by_length([], 8, seed=0) == []


def test_padding_collate_pads_only_to_the_micro_batch_max():
    rows = pad_rows([([5, 6, 7], [0, 1, 1]), ([8, 9], [0, 1])], 64)
    batch = collate(rows, max(len(r) for r in rows), PAD, mask="padding")
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 1, 2]]
    assert batch["labels"].tolist() == [[6, 7, IGNORE_INDEX], [9, IGNORE_INDEX, IGNORE_INDEX]]
    with pytest.raises(ValueError, match="one example each"):
        collate(pack([([5, 6], [0, 1]), ([8, 9], [0, 1])], 4), 4, PAD, mask="padding")


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_grouped_loss_equals_losses_one_by_one(tiny_model, impl):
    """A length-grouped micro-batch (2D padding mask, padded to its longest example): same logits as
    each example alone, and its token-mean CE equals the token mean over the examples run one by one."""
    tiny_model.set_attn_implementation(impl)
    try:
        examples = [_example(n, 20 + s) for s, n in enumerate([7, 3, 9, 5, 9, 2])]
        rows = pad_rows(examples, 32)
        for group in group_by_length([len(r) for r in rows], 27, seed=1, mega=1):
            chunk = [rows[i] for i in group]
            width = max(len(r) for r in chunk)
            assert len(chunk) * width <= 27
            batch = collate(chunk, width, PAD, mask="padding")
            assert batch["input_ids"].shape == (len(chunk), width)
            with torch.no_grad():
                logits = tiny_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    position_ids=batch["position_ids"], use_cache=False).logits
                grouped = masked_token_mean_ce(logits, batch["labels"])
                tot, cnt = 0.0, 0
                for b, row in enumerate(chunk):
                    alone = _alone_logits(tiny_model, row.input_ids)
                    torch.testing.assert_close(logits[b, :len(row)], alone, atol=1e-5, rtol=0)
                    s, c = masked_token_ce_sum(alone[None], torch.tensor([row.labels]))
                    tot, cnt = tot + s.item(), cnt + c.item()
            assert grouped.item() == pytest.approx(tot / cnt, abs=1e-5)
    finally:
        tiny_model.set_attn_implementation("sdpa")
