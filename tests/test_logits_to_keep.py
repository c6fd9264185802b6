"""The LM head only where a loss reads it (`logits_to_keep`): the same losses, log-probs and gradients as the
full projection, in the SFT loss, the RL log-probs, the induction loss and CSD's student grid."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from mimesis_lab.config import ModelParams
from mimesis_lab.jobs.agent_csd import CSD
from mimesis_lab.jobs.sft import forward_ce
from mimesis_lab.models import build_tiny_model, induction_batch, induction_loss, supports_logits_to_keep
from mimesis_lab.packing import IGNORE_INDEX as X
from mimesis_lab.packing import PackedRow
from mimesis_lab.rl.policy import token_logprobs

CFG = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256, seed=5)
VOCAB = 120
CLOSE, OPEN = 9, 8


class _Full(torch.nn.Module):
    """The model without ``logits_to_keep`` in its signature: every position projected (the fallback)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, **kw):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache, **kw)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_tiny_model(CFG, VOCAB, 0, 1)


def test_which_models_keep_logits(model):
    assert supports_logits_to_keep(model)
    assert supports_logits_to_keep(SimpleNamespace(module=model))      # a DeepSpeed engine wraps the model
    assert not supports_logits_to_keep(_Full(model))
    assert not supports_logits_to_keep(torch.nn.Linear(2, 2))


class _KeepTable:
    """A fixed logits table as the model, honouring a boolean ``logits_to_keep`` as transformers does."""

    def __init__(self, table: torch.Tensor):
        self.table, self.device = table, "cpu"

    def forward(self, input_ids, logits_to_keep=0, **kw):
        logits = self.table[input_ids]
        return SimpleNamespace(logits=logits[logits_to_keep] if isinstance(logits_to_keep, torch.Tensor) else logits)

    __call__ = forward


def test_sft_loss_by_hand_on_the_kept_positions():
    # the hand-worked case of test_format_unlikelihood, through the kept-positions path
    table = torch.zeros(10, 10)
    table[4, CLOSE] = math.log(3.0)
    row = PackedRow(input_ids=[1, 8, 9, 4, 2], labels=[8, 9, 4, 2, X], position_ids=list(range(5)), seq_lens=[5])
    engine = _KeepTable(table)
    assert supports_logits_to_keep(engine)
    s, c, ul = forward_ce(engine, [row], 5, 0, "padding", torch.float32, (CLOSE, CLOSE, OPEN))
    assert int(c) == 4
    assert s.item() == pytest.approx(3 * math.log(10) + math.log(12), rel=1e-6)  # p(2 | 4) = 1/12, the rest 1/10
    assert ul.item() == pytest.approx(-2 * math.log(0.9) - math.log(0.75) - math.log(1 - 1 / 12), rel=1e-5)


def _rows(rng: torch.Generator) -> list[PackedRow]:
    rows = []
    for n in (11, 17, 7):
        ids = torch.randint(3, VOCAB, (n,), generator=rng).tolist()
        ids[n // 2] = CLOSE
        labels = [X] * (n // 3) + ids[n // 3 + 1:] + [X]          # a prompt, then the targets
        rows.append(PackedRow(input_ids=ids, labels=labels, position_ids=list(range(n)), seq_lens=[n]))
    return rows


def test_sft_loss_and_gradients_equal_the_full_projection(model):
    rows = _rows(torch.Generator().manual_seed(1))
    got = {}
    for name, m in (("kept", model), ("full", _Full(model))):
        model.zero_grad(set_to_none=True)
        s, c, ul = forward_ce(_Call(m), rows, 32, 0, "padding",
                              torch.float32, (CLOSE, CLOSE, OPEN))
        (s + ul).backward()
        got[name] = (float(s.detach()), int(c), float(ul.detach()), [p.grad.clone() for p in model.parameters()])
    assert got["kept"][1] == got["full"][1]
    assert got["kept"][0] == pytest.approx(got["full"][0], rel=1e-6)
    assert got["kept"][2] == pytest.approx(got["full"][2], rel=1e-5)
    for a, b in zip(got["kept"][3], got["full"][3]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


class _Call:
    """An engine-like callable around a module (``device`` + ``__call__``), as forward_ce drives it."""

    def __init__(self, module):
        self.module, self.device = module, torch.device("cpu")

    def __call__(self, **kw):
        return self.module(**kw)


def test_token_logprobs_where_needed_equal_the_full_ones(model):
    rng = torch.Generator().manual_seed(2)
    ids = torch.randint(3, VOCAB, (3, 14), generator=rng)
    attn = torch.ones_like(ids)
    attn[2, 10:] = 0
    need = torch.zeros((3, 13))
    need[0, 5:9] = 1
    need[1, 0] = 1
    need[2, 6:9] = 1                                  # row 2 is padded from 10 on
    full = token_logprobs(model, ids, attn)
    kept = token_logprobs(model, ids, attn, need=need)
    sel = need != 0
    torch.testing.assert_close(kept[sel], full[sel], rtol=0, atol=1e-6)
    assert torch.all(kept[~sel] == 0)
    grads = []
    for logp in (full, kept):
        model.zero_grad(set_to_none=True)
        (logp * need).sum().backward(retain_graph=True)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # with the KV cache kept (CSD's teacher reuses it), the cache is the full forward's
    logp, layers = token_logprobs(model, ids, attn, keep_cache=True, need=need)
    _, full_layers = token_logprobs(model, ids, attn, keep_cache=True)
    torch.testing.assert_close(logp[sel], full[sel], rtol=0, atol=1e-6)
    for (k1, v1), (k2, v2) in zip(layers, full_layers):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    # a model without logits_to_keep: the full projection, `need` ignored
    torch.testing.assert_close(token_logprobs(_Full(model), ids, attn, need=need), full, rtol=0, atol=0)


def test_induction_loss_equals_the_full_projection(model):
    seq, start = induction_batch(torch.Generator().manual_seed(3), VOCAB, 4)
    kept = induction_loss(model, seq, start)
    full = induction_loss(_Full(model), seq, start)
    logits = model(input_ids=seq).logits
    by_hand = torch.nn.functional.cross_entropy(logits[:, start:-1].reshape(-1, VOCAB), seq[:, start + 1:].reshape(-1))
    assert kept.item() == pytest.approx(by_hand.item(), rel=1e-6)
    assert full.item() == pytest.approx(by_hand.item(), rel=1e-6)


def test_csd_need_adds_the_coached_positions_to_the_ppo_mask():
    coached = SimpleNamespace(student_positions=(4, 5, 6))
    placebo = SimpleNamespace(student_positions=(4, 5, 6))
    other = SimpleNamespace(student_positions=(2,))
    me = SimpleNamespace(step=SimpleNamespace(rows={"a": [coached], "c": [other]}, placebo={"a": [placebo]}))
    mask = torch.zeros((3, 8))
    mask[1, 1:3] = 1
    chunk = [SimpleNamespace(rollout_id="a"), SimpleNamespace(rollout_id="b"), SimpleNamespace(rollout_id="c")]
    grid = CSD.need(me, chunk, mask)
    want = torch.zeros((3, 8), dtype=torch.bool)
    want[0, 3:6] = True                               # student position p is read at grid p - 1
    want[1, 1:3] = True
    want[2, 1] = True
    assert torch.equal(grid, want)
