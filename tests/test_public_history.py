"""`history: public` SFT rows (SPEC §1: the simulator is trained as u(x | c, H) with H the public history).

Every trained turn must see its own earlier turns exactly as simulator RL and the gyms show them, think blocks
removed; one prefix-tree row per conversation must give the same per-token losses as one row per turn, and
train the same target tokens as the verbatim conversation.
"""
from __future__ import annotations

import pytest
import torch

from mimesis_lab.chat import tokenize_many
from mimesis_lab.config import ModelParams
from mimesis_lab.envs.output_format import public_text
from mimesis_lab.models import build_tiny_model
from mimesis_lab.packing import collate, masked_token_ce_sum, tree_example, tree_positions
from mimesis_lab.tokenizer import train_tokenizer
from mimesis_lab.train import token_cache
from mimesis_lab.train.data import build_rows

CONV = [
    {"role": "system", "content": "You are a traveller. Budget under $120."},
    {"role": "user", "content": "hello, how can i help?"},
    {"role": "assistant", "content": "<think>i want it cheap, under $120</think>a hotel in madrid please"},
    {"role": "user", "content": "what is your budget?"},
    {"role": "assistant", "content": "<think>they asked the price</think>max $120 a night"},
    {"role": "user", "content": "sunny inn, $100?"},
    {"role": "assistant", "content": "<think>that fits</think>great, book it. bye"},
]


@pytest.fixture(scope="module")
def tok():
    texts = [m["content"] for m in CONV] * 20 + ["the quick brown fox jumps over the lazy dog"] * 5
    return train_tokenizer(texts, vocab_size=400, min_frequency=2)


@pytest.fixture(scope="module")
def model(tok):
    cfg = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=512, seed=3)
    m = build_tiny_model(cfg, len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None)
    return m.eval()


def _per_turn_examples(tok, conv):
    """One plain example per assistant turn: the public history, then the turn verbatim (its tokens the
    only targets), i.e. the prompt simulator RL would build, plus the reply."""
    out = []
    for k, m in enumerate(conv):
        if m["role"] == "assistant":
            ctx = [dict(x, content=public_text(x["content"])) if x["role"] == "assistant" else x for x in conv[:k]]
            ids, mask = tokenize_many(tok, [ctx + [m]], "assistant")[0]
            end = max(t for t, v in enumerate(mask) if v) + 1
            start = end
            while mask[start - 1]:
                start -= 1
            out.append((list(ids[:end]), [0] * start + [1] * (end - start)))
    return out


def _ce(model, rows, pad):
    batch = collate(rows, max(len(r) for r in rows), pad, mask="padding")
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    per_row = []
    for i in range(len(rows)):
        s, c = masked_token_ce_sum(logits[i:i + 1], batch["labels"][i:i + 1])
        per_row.append((s.item(), int(c.item())))
    return per_row


def test_tree_row_equals_one_row_per_turn(tok, model):
    (row,), stats = build_rows(tok, [CONV], train_role="assistant", max_len=512, overlong="truncate",
                               batching="grouped", history="public")
    assert row.parents is not None and stats["tokenize_errors"] == 0
    turns = _per_turn_examples(tok, CONV)
    plain = build_rows(tok, [CONV], train_role="assistant", max_len=512, overlong="truncate", batching="grouped")
    n_targets = sum(sum(m[1:]) for _, m in turns)
    # the same target tokens as the verbatim conversation, each under its own public history
    assert stats["target_tokens"] == n_targets == plain[1]["target_tokens"]
    assert len(row) < sum(len(ids) for ids, _ in turns)                  # the shared history is encoded once
    assert row.position_ids == tree_positions(row.parents)
    (tree_sum, tree_n), = _ce(model, [row], tok.pad_token_id)
    from mimesis_lab.packing import pad_rows

    alone = _ce(model, pad_rows(turns, 512), tok.pad_token_id)
    assert tree_n == sum(c for _, c in alone) == n_targets
    assert tree_sum == pytest.approx(sum(s for s, _ in alone), rel=1e-5)
    # and the verbatim row differs: its later turns read the earlier reasoning
    (full_sum, _), = _ce(model, plain[0], tok.pad_token_id)
    assert abs(full_sum - tree_sum) > 1e-3


def test_earlier_reasoning_is_invisible_to_later_turns(tok):
    (row,), _ = build_rows(tok, [CONV], train_role="assistant", max_len=512, overlong="truncate",
                           batching="grouped", history="public")
    batch = collate([row], len(row), tok.pad_token_id, mask="padding")
    seen = batch["attention_mask"][0, 0] == 0                               # [query, key] may attend
    think = tok.convert_tokens_to_ids("<think>")
    opens = [j for j, t in enumerate(row.input_ids) if t == think]
    assert len(opens) == 3                                                   # each turn's own reasoning, once
    last = len(row) - 1                                                      # the final turn's last token
    assert seen[last, opens[2]] and not seen[last, opens[0]] and not seen[last, opens[1]]
    # the public utterance of turn 1 is visible to the last turn (as public text)
    words = tok("a hotel in madrid please", add_special_tokens=False).input_ids
    hits = [j for j in range(len(row) - len(words)) if row.input_ids[j:j + len(words)] == words]
    assert len(hits) == 2 and sum(bool(seen[last, j]) for j in hits) == 1  # private copy hidden, public seen


def test_a_tree_and_a_plain_row_share_a_micro_batch(tok, model):
    (tree,), _ = build_rows(tok, [CONV], train_role="assistant", max_len=512, overlong="truncate",
                            batching="grouped", history="public")
    plain = build_rows(tok, [CONV[:3]], train_role="assistant", max_len=512, overlong="truncate",
                       batching="grouped")[0][0]
    both = _ce(model, [tree, plain], tok.pad_token_id)
    assert both[0] == pytest.approx(_ce(model, [tree], tok.pad_token_id)[0], rel=1e-5)
    assert both[1] == pytest.approx(_ce(model, [plain], tok.pad_token_id)[0], rel=1e-5)


def test_truncated_tree_and_token_cache_round_trip(tok, tmp_path):
    rows, stats = build_rows(tok, [CONV, CONV[:5]], train_role="assistant", max_len=60, overlong="truncate",
                             batching="grouped", history="public")
    assert stats["truncated"] >= 1 and all(len(r) <= 60 and all(q < j for j, q in enumerate(r.parents))
                                           for r in rows)
    path = tmp_path / "rows.parquet"
    token_cache.write_rows(path, rows, stats, "k")
    back, _ = token_cache.read_rows(path, "k")
    assert [(r.input_ids, r.labels, r.position_ids, r.parents) for r in back] == \
           [(r.input_ids, r.labels, r.position_ids, r.parents) for r in rows]
    plain, pstats = build_rows(tok, [CONV], train_role="assistant", max_len=512, overlong="truncate",
                               batching="grouped")
    token_cache.write_rows(path, plain, pstats, "p")
    assert token_cache.read_rows(path, "p")[0][0].parents is None


def test_tree_example_rejects_bad_turns_and_packed_trees_stay_apart(tok, model):
    with pytest.raises(ValueError, match="target start"):
        tree_example([([5, 6, 7], 0)])
    with pytest.raises(ValueError, match="history must be"):
        build_rows(tok, [CONV], train_role="assistant", max_len=512, overlong="truncate", batching="grouped",
                   history="private")
    # two trees packed into one row: each as if alone
    rows, _ = build_rows(tok, [CONV, CONV[:5]], train_role="assistant", max_len=1024, overlong="truncate",
                         batching="packed", history="public")
    assert len(rows) == 1 and len(rows[0].seq_lens) == 2
    alone, _ = build_rows(tok, [CONV, CONV[:5]], train_role="assistant", max_len=1024, overlong="truncate",
                          batching="grouped", history="public")
    batch = collate(rows, 1024, tok.pad_token_id, mask="4d")
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    s, c = masked_token_ce_sum(logits, batch["labels"])
    parts = _ce(model, alone, tok.pad_token_id)
    assert int(c) == sum(n for _, n in parts) and s.item() == pytest.approx(sum(x for x, _ in parts), rel=1e-5)
