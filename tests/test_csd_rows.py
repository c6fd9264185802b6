"""CSD building blocks (SPEC §3.3 items 2, 4, 7): turn selection, teacher rows with the same sampled
ids, left padding and the index maps onto the student's shifted grid, gathering, the placebo pool."""
from __future__ import annotations

import random

import pytest
import torch

from mimesis_lab.rl.csd import (
    PlaceboPool,
    TeacherRow,
    build_teacher_row,
    gather_teacher_logp,
    pad_teacher_rows,
    select_turns,
    teacher_index,
)


@pytest.fixture(scope="module")
def tok():
    from mimesis_lab.tokenizer import train_tokenizer

    return train_tokenizer(["You help travellers. I need a hotel in Lisbon. Ask about their budget first. "
                            "[action] Which area do you prefer? <|im_start|>user\nhi<|im_end|>"] * 30,
                           vocab_size=400, min_frequency=1)


# ---- turn selection ------------------------------------------------------------------------------

def test_select_turns_prefers_reasoning_then_fills():
    flags = [False, True, False, True, False]
    assert select_turns(flags, 2) == [1, 3]
    assert select_turns(flags, 3) == [0, 1, 3]          # in order without rng
    assert select_turns(flags, 10) == [0, 1, 2, 3, 4]
    assert select_turns(flags, 0) == []
    assert select_turns(flags, 4, require_reply=True) == [1, 3]
    assert select_turns([False, False], 1, require_reply=True) == []


def test_select_turns_rng_deterministic():
    flags = [True, False, True, True, False, False, True]
    a = select_turns(flags, 3, rng=random.Random(7))
    assert a == select_turns(flags, 3, rng=random.Random(7)) and a == sorted(a)
    assert all(flags[i] for i in a) and len(a) == 3
    b = select_turns(flags, 6, rng=random.Random(1))
    assert {0, 2, 3, 6} <= set(b) and len(b) == 6
    with pytest.raises(ValueError):
        select_turns(flags, -1)


# ---- teacher rows --------------------------------------------------------------------------------

HISTORY = [{"role": "system", "content": "You help travellers."},
           {"role": "user", "content": "I need a hotel in Lisbon."}]
NOTE = "Ask about their budget first."


def test_build_teacher_row_appends_same_response_ids(tok):
    response = tok.encode("[action] Which area do you prefer?", add_special_tokens=False) + [tok.eos_token_id]
    positions = list(range(40, 40 + len(response)))
    row = build_teacher_row(tok, HISTORY, NOTE, response, student_row=3, student_positions=positions,
                            max_len=1000, traj_id="t1", turn=2)
    assert isinstance(row, TeacherRow)
    n = len(response)
    assert list(row.input_ids[-n:]) == response
    assert list(row.teacher_positions) == list(range(len(row.input_ids) - n, len(row.input_ids)))
    assert row.student_row == 3 and list(row.student_positions) == positions
    assert (row.traj_id, row.turn, row.note) == ("t1", 2, NOTE)
    prefix = tok.decode(list(row.input_ids[:-n]), skip_special_tokens=False)
    want = tok.apply_chat_template(HISTORY + [{"role": "user", "content": NOTE}], add_generation_prompt=True,
                                   tokenize=False)
    assert prefix == want
    assert f"<|im_start|>user\n{NOTE}<|im_end|>\n<|im_start|>assistant\n" in prefix
    assert prefix.endswith("<|im_start|>assistant\n")


def test_build_teacher_row_over_width_and_mismatch(tok):
    response = [5, 6, 7]
    full = build_teacher_row(tok, HISTORY, NOTE, response, student_row=0, student_positions=[1, 2, 3], max_len=10_000)
    assert build_teacher_row(tok, HISTORY, NOTE, response, student_row=0, student_positions=[1, 2, 3],
                             max_len=len(full.input_ids) - 1) is None
    assert build_teacher_row(tok, HISTORY, NOTE, response, student_row=0, student_positions=[1, 2, 3],
                             max_len=len(full.input_ids)) == full
    with pytest.raises(ValueError, match="student positions"):
        build_teacher_row(tok, HISTORY, NOTE, response, student_row=0, student_positions=[1, 2], max_len=100)


# ---- padding, index maps, gather -----------------------------------------------------------------

def rows_two():
    # row 0: length 6, response at teacher positions 4,5 -> student row 1 positions 3,4
    r0 = TeacherRow((10, 11, 12, 13, 14, 15), (4, 5), 1, (3, 4))
    # row 1: length 4, response at teacher positions 2,3 -> student row 0 positions 5,6
    r1 = TeacherRow((20, 21, 22, 23), (2, 3), 0, (5, 6))
    return [r0, r1]


def test_pad_teacher_rows_left_pads():
    out = pad_teacher_rows(rows_two(), pad_id=0)
    assert out["input_ids"].tolist() == [[10, 11, 12, 13, 14, 15], [0, 0, 20, 21, 22, 23]]
    assert out["attention_mask"].tolist() == [[1] * 6, [0, 0, 1, 1, 1, 1]]
    assert out["left_pad"].tolist() == [0, 2]
    with pytest.raises(ValueError):
        pad_teacher_rows([], 0)


def test_teacher_index_hand_computed():
    rows = rows_two()
    pad = pad_teacher_rows(rows, pad_id=0)
    idx = teacher_index(rows, pad["left_pad"], n_student_rows=2, student_width=8)   # grid [2, 7]
    want_row = [[-1] * 7, [-1] * 7]
    want_map = [[-1] * 7, [-1] * 7]
    # row 0 (no pad): student row 1, positions 3,4 -> grid 2,3; teacher positions 4,5 -> 3,4
    want_row[1][2], want_row[1][3] = 0, 0
    want_map[1][2], want_map[1][3] = 3, 4
    # row 1 (left pad 2): student row 0, positions 5,6 -> grid 4,5; teacher positions 2,3 -> 1+2, 2+2
    want_row[0][4], want_row[0][5] = 1, 1
    want_map[0][4], want_map[0][5] = 3, 4
    assert idx["row_idx"].tolist() == want_row
    assert idx["index_map"].tolist() == want_map
    assert idx["sdpo_mask"].dtype == torch.float32
    assert idx["sdpo_mask"].tolist() == [[float(v >= 0) for v in r] for r in want_row]
    # the map is right: on the padded teacher ids, grid index k predicts ids[k+1] = the response token
    ids = pad["input_ids"]
    for b in range(2):
        for t in range(7):
            r = idx["row_idx"][b, t]
            if r >= 0:
                assert ids[r, idx["index_map"][b, t] + 1] == rows[r].input_ids[rows[r].teacher_positions[
                    list(rows[r].student_positions).index(t + 1)]]


def test_gather_teacher_logp_hand_made():
    rows = rows_two()
    idx = teacher_index(rows, [0, 2], n_student_rows=2, student_width=8)
    teacher = torch.arange(10, dtype=torch.float32).reshape(2, 5)   # [R=2, W-1=5]
    got = gather_teacher_logp(teacher, idx)
    assert got.shape == (2, 7)
    assert got[1, 2].item() == 3.0 and got[1, 3].item() == 4.0     # row 0, cols 3,4
    assert got[0, 4].item() == 8.0 and got[0, 5].item() == 9.0     # row 1, cols 3,4
    nan = torch.isnan(got)
    assert nan.sum().item() == 14 - 4 and (nan == (idx["sdpo_mask"] == 0)).all()
    filled = torch.nan_to_num(got) * idx["sdpo_mask"]
    assert filled.sum().item() == 3 + 4 + 8 + 9


def test_teacher_index_errors():
    r0 = TeacherRow((1, 2, 3), (1, 2), 0, (3, 4))
    r1 = TeacherRow((1, 2, 3, 4), (2, 3), 0, (4, 5))
    with pytest.raises(ValueError, match="coached twice"):
        teacher_index([r0, r1], [1, 0], n_student_rows=1, student_width=8)
    with pytest.raises(ValueError, match="student row"):
        teacher_index([TeacherRow((1, 2), (1,), 5, (1,))], [0], n_student_rows=2, student_width=4)
    with pytest.raises(ValueError, match="no predicting logit"):
        teacher_index([TeacherRow((1, 2), (1,), 0, (4,))], [0], n_student_rows=1, student_width=4)
    with pytest.raises(ValueError, match="left-pad"):
        teacher_index([r0], [0, 0], n_student_rows=1, student_width=8)


# ---- placebo pool --------------------------------------------------------------------------------

def test_placebo_pool_min_size_and_exclusions():
    pool = PlaceboPool(min_size=8, capacity=512)
    rng = random.Random(0)
    for i in range(7):
        pool.add(f"note {i}", f"ep{i % 2}")
    assert len(pool) == 7 and pool.draw("x", "ep9", rng) is None
    pool.add("note 7", "ep1")
    assert len(pool) == 8
    seen = set()
    for _ in range(200):
        got = pool.draw("note 3", "ep0", rng)
        assert got is not None and got != "note 3"
        assert int(got.split()[1]) % 2 == 1 or got == "note 7"   # never a note of episode ep0
        seen.add(got)
    assert seen == {"note 1", "note 5", "note 7"}                # note 3 is ep1 but the same string
    assert pool.draw("note 0", "ep1", random.Random(1)) in {"note 2", "note 4", "note 6"}
    same = PlaceboPool(min_size=2)
    same.add("a", "e")
    same.add("b", "e")
    assert same.draw("c", "e", rng) is None                      # all from the same episode
    assert same.draw("a", "f", rng) == "b"
    pool.add("   ", "ep5")
    assert len(pool) == 8                                        # blank notes are ignored


def test_placebo_pool_fifo_eviction_and_determinism():
    pool = PlaceboPool(min_size=2, capacity=3)
    for i in range(5):
        pool.add(f"n{i}", f"e{i}")
    assert len(pool) == 3 and [n for n, _ in pool.items] == ["n2", "n3", "n4"]
    draws = {pool.draw("zz", "ez", random.Random(3)) for _ in range(5)}
    assert len(draws) == 1 and draws <= {"n2", "n3", "n4"}
    with pytest.raises(ValueError):
        PlaceboPool(min_size=10, capacity=5)
