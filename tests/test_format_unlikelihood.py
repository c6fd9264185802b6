"""The format unlikelihood term of the SFT loop (`sft_run.format_unlikelihood`), by hand."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from mimesis_lab.jobs.sft import after_close_mask, forward_ce
from mimesis_lab.packing import IGNORE_INDEX as X
from mimesis_lab.packing import PackedRow

CLOSE, OPEN = 9, 8


def test_after_close_mask_by_hand():
    # two replies in one row: targets at 2..5 and 8..10; </think> (9) at 3 in the first, none in the second
    ids = torch.tensor([[1, 8, 9, 4, 5, 2, 1, 8, 4, 9, 2, 0]])
    labels = torch.tensor([[X, 8, 9, 4, 5, 2, X, X, 4, 9, 2, X]])
    got = after_close_mask(ids, labels, CLOSE)
    # first run (positions 1..5): the close sits at position 2 -> positions 2..5; second run (7..10): close at 9
    want = [False, False, True, True, True, True, False, False, False, True, True, False]
    assert got[0].tolist() == want


class _Engine:
    """A fixed logits table as the model: logits[t] = table[ids[t]] (what forward_ce needs of an engine)."""

    def __init__(self, table: torch.Tensor):
        self.table, self.device = table, "cpu"

    def __call__(self, input_ids, **kw):
        return SimpleNamespace(logits=self.table[input_ids])


def test_unlikelihood_term_by_hand():
    vocab = 10
    table = torch.zeros(vocab, vocab)
    table[4, CLOSE] = math.log(3.0)     # after token 4: p(close) = 3 / (9 + 3) = 0.25, p(open) = 1/12
    row = PackedRow(input_ids=[1, 8, 9, 4, 2], labels=[8, 9, 4, 2, X], position_ids=list(range(5)), seq_lens=[5])
    s, c, ul = forward_ce(_Engine(table), [row], 5, 0, "padding", torch.float32, (CLOSE, CLOSE, OPEN))
    assert int(c) == 4
    # past the close: positions 2 (input 9: uniform) and 3 (input 4)
    uniform = -2 * math.log(1 - 1 / 10)
    at4 = -math.log(1 - 0.25) - math.log(1 - 1 / 12)
    assert ul.item() == pytest.approx(uniform + at4, rel=1e-5)
    s2, c2 = forward_ce(_Engine(table), [row], 5, 0, "padding", torch.float32)
    assert s2.item() == pytest.approx(s.item()) and int(c2) == 4
