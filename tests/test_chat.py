import random

import polars as pl
import pytest

from mimesis_lab.chat import role_swap, role_swap_frame


def test_role_swap_swaps_user_and_assistant_keeps_system():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi", "hashed_ip": "u1"},
        {"role": "assistant", "content": "hello"},
    ]
    out = role_swap(msgs)
    assert [m["role"] for m in out] == ["system", "assistant", "user"]
    assert [m["content"] for m in out] == ["Be brief.", "hi", "hello"]
    assert out[1]["hashed_ip"] == "u1"          # other keys kept
    assert msgs[1]["role"] == "user"            # input untouched


def test_role_swap_false_returns_a_copy():
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    out = role_swap(msgs, swap=False)
    assert out == msgs
    assert out is not msgs and out[0] is not msgs[0]


def test_role_swap_twice_is_identity():
    msgs = [{"role": r, "content": str(i)} for i, r in enumerate(["system", "user", "assistant", "user"])]
    assert role_swap(role_swap(msgs)) == msgs


def test_role_swap_unknown_role_raises_with_index():
    with pytest.raises(ValueError, match="message 1: unknown role 'bot'"):
        role_swap([{"role": "user", "content": "x"}, {"role": "bot", "content": "y"}])


def test_vectorised_form_matches_reference():
    rng = random.Random(0)
    rows = []
    for i in range(200):
        n = rng.randint(1, 7)
        msgs = [{"role": rng.choice(["system", "user", "assistant"]), "content": f"c{i}-{j}"} for j in range(n)]
        rows.append({"messages": msgs, "swap": rng.random() < 0.7})
    df = pl.DataFrame(rows, schema={"messages": pl.List(pl.Struct({"role": pl.Utf8, "content": pl.Utf8})),
                                    "swap": pl.Boolean})
    got = role_swap_frame(df).get_column("messages").to_list()
    want = [role_swap(r["messages"], r["swap"]) for r in rows]
    assert got == want
