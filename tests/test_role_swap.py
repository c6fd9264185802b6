import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from mimesis_lab.config import RoleSwapParams
from mimesis_lab.io import InputFileError
from mimesis_lab.mixture import expand_mixture, mixture_copies, source_rng
from stages.common import StageError
from stages.role_swap import run_role_swap
from tests.conftest import FIXTURES

MALFORMED = FIXTURES / "malformed" / "chats_malformed.jsonl"


def _conv(h, ip="ab" * 32, turns=("hi", "hello"), system=None):
    c = [{"role": "system", "content": system}] if system else []
    c += [{"role": "user" if i % 2 == 0 else "assistant", "content": t, "hashed_ip": ip if i % 2 == 0 else None}
          for i, t in enumerate(turns)]
    return {"conversation_hash": h, "model": "gpt-4", "conversation": c, "language": "English", "hashed_ip": ip}


def _write(path: Path, records):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def test_malformed_rows_are_quarantined_with_reasons(in_tmp):
    cfg = RoleSwapParams(mixture={str(MALFORMED): 1.0})
    r = run_role_swap(cfg)
    q = r.quarantine.to_frame()
    reasons = dict(zip(q["row"].to_list(), q["reason"].to_list()))
    assert r.rows_in == 13                        # 14 lines, one blank
    assert r.rows_in == r.rows_out + q.height
    assert r.rows_out == 2
    assert sorted(r.frame(cfg.output)["conversation_id"].to_list()) == ["good01", "good02"]
    assert reasons[2].startswith("malformed JSON")
    assert "missing required field `conversation`" in reasons[3]
    assert "Expected `str`, got `int` - at `$.conversation_hash`" in reasons[4]
    assert "length >= 1 - at `$.conversation`" in reasons[5]
    assert "Invalid enum value 'bot' - at `$.conversation[1].role`" in reasons[6]
    assert reasons[7].startswith("duplicate: conversation_hash good01 first seen at") and reasons[7].endswith(":1")
    assert reasons[9].startswith("oversize: `conversation[0].content` has 40000 chars")
    assert reasons[10].startswith("missing user id")
    assert "`$.conversation[0].content`" in reasons[11]
    assert "Expected `object`, got `array`" in reasons[13]
    assert reasons[14].startswith("invalid UTF-8")
    assert set(q["source_file"].to_list()) == {str(MALFORMED)}
    assert all(raw for raw in q["raw"].to_list())                  # raw record kept


def test_swap_routing_and_output_contract(in_tmp):
    a = _write(in_tmp / "human.jsonl", [_conv("h1", system="Be nice."), _conv("h2", turns=("q", "a", "q2", "a2"))])
    b = _write(in_tmp / "tom.jsonl", [_conv("t1", ip="cd" * 32)])
    cfg = RoleSwapParams(mixture={str(a): 1.0, str(b): 1.0}, no_swap_sources=["tom"])
    out = run_role_swap(cfg).frame(cfg.output).sort("conversation_id")
    rows = {r["conversation_id"]: r for r in out.iter_rows(named=True)}
    assert rows["h1"]["messages"] == [{"role": "system", "content": "Be nice."},
                                      {"role": "assistant", "content": "hi"}, {"role": "user", "content": "hello"}]
    assert rows["h1"]["swap"] is True and rows["h1"]["source"] == "human"
    assert rows["t1"]["swap"] is False
    assert rows["t1"]["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert rows["h2"]["n_target_turns"] == 2 and rows["h2"]["n_messages"] == 4
    assert rows["t1"]["user_id"] == "cd" * 32
    assert out.columns[:4] == ["conversation_id", "user_id", "source", "source_file"]


def test_user_id_falls_back_to_first_user_turn(in_tmp):
    rec = _conv("h1", ip="ef" * 32)
    del rec["hashed_ip"]
    a = _write(in_tmp / "a.jsonl", [rec])
    r = run_role_swap(RoleSwapParams(mixture={str(a): 1.0}))
    assert r.frame("data/processed/role_swap.parquet")["user_id"].to_list() == ["ef" * 32]


def test_no_swap_source_without_assistant_turn_is_quarantined(in_tmp):
    rec = _conv("t1", turns=("only the human speaks",))
    a = _write(in_tmp / "tom.jsonl", [rec])
    r = run_role_swap(RoleSwapParams(mixture={str(a): 1.0}, no_swap_sources=["tom"]))
    assert r.rows_out == 0
    assert r.quarantine.reason[0].startswith("no target turn: no `assistant` message")


def test_duplicate_across_files(in_tmp):
    a = _write(in_tmp / "a.jsonl", [_conv("same")])
    b = _write(in_tmp / "b.jsonl", [_conv("same")])
    r = run_role_swap(RoleSwapParams(mixture={str(a): 1.0, str(b): 1.0}))
    assert r.rows_out == 1 and r.quarantine.reason[0].startswith("duplicate:")
    assert r.quarantine.source_file[0] == str(b)


def test_file_level_errors_name_the_file(in_tmp):
    with pytest.raises(InputFileError, match=r"nothing/\*\.jsonl: no input file matches"):
        run_role_swap(RoleSwapParams(mixture={"nothing/*.jsonl": 1.0}))
    (in_tmp / "adir.jsonl").mkdir()
    with pytest.raises(InputFileError, match=r"adir.jsonl: is a directory"):
        run_role_swap(RoleSwapParams(mixture={str(in_tmp / "adir.jsonl"): 1.0}))
    os.symlink(in_tmp / "gone", in_tmp / "dangling.jsonl")
    with pytest.raises(InputFileError, match=r"dangling.jsonl: cannot read input file"):
        run_role_swap(RoleSwapParams(mixture={str(in_tmp / "dangling.jsonl"): 1.0}))


def test_file_matched_twice_and_unknown_no_swap_source(in_tmp):
    a = _write(in_tmp / "a.jsonl", [_conv("x")])
    with pytest.raises(InputFileError, match="matched by two mixture globs"):
        run_role_swap(RoleSwapParams(mixture={str(a): 1.0, str(in_tmp / "*.jsonl"): 1.0}))
    with pytest.raises(StageError, match=r"no_swap_sources names unknown source\(s\) \['tomm'\]"):
        run_role_swap(RoleSwapParams(mixture={str(a): 1.0}, no_swap_sources=["tomm"]))


def test_mixture_copies_ratio_semantics():
    rng = np.random.default_rng(0)
    c = mixture_copies(10, 0.5, rng)
    assert c.sum() == 5 and set(c.tolist()) <= {0, 1}
    c = mixture_copies(10, 2.5, np.random.default_rng(0))
    assert c.sum() == 25 and c.max() >= 2          # with replacement
    assert mixture_copies(10, 1.0, np.random.default_rng(0)).tolist() == [1] * 10
    assert mixture_copies(0, 3.0, rng).tolist() == []
    a = mixture_copies(50, 1.7, source_rng(7, "s")).tolist()
    assert a == mixture_copies(50, 1.7, source_rng(7, "s")).tolist()
    assert a != mixture_copies(50, 1.7, source_rng(8, "s")).tolist()


def test_stage_mixture_is_seeded_and_expands(in_tmp):
    a = _write(in_tmp / "a.jsonl", [_conv(f"h{i}") for i in range(20)])
    b = _write(in_tmp / "b.jsonl", [_conv(f"g{i}") for i in range(10)])
    cfg = RoleSwapParams(mixture={str(a): 0.5, str(b): 2.0}, seed=3)
    r1 = run_role_swap(cfg)
    df = r1.frame(cfg.output)
    assert r1.extra["sources"]["a"]["samples"] == 10 and r1.extra["sources"]["b"]["samples"] == 20
    assert r1.rows_out == 30                               # one row per conversation, nothing lost
    assert df.equals(run_role_swap(cfg).frame(cfg.output))
    mixed = expand_mixture(df, seed=1)
    assert mixed.height == 30
    assert mixed.filter(pl.col("source") == "b").height == 20
    assert not mixed["conversation_id"].to_list() == sorted(mixed["conversation_id"].to_list())


def test_chunked_run_equals_single_chunk(in_tmp):
    """Tiny chunks (many per file) give the same output, quarantine and metrics as one chunk."""
    recs = [_conv(f"h{i}", ip=f"{i % 4:064d}", turns=("q" * (i % 7 + 1), "a")) for i in range(40)]
    recs[13] = _conv("h3")                                   # duplicate of an earlier chunk's id
    recs[20] = '{"conversation_hash": "broken", "conversation": ['
    recs[30] = {"conversation_hash": "empty", "conversation": [], "hashed_ip": "x"}
    a = _write(in_tmp / "a.jsonl", recs)
    b = _write(in_tmp / "b.jsonl", [_conv(f"h{i}") for i in range(5)] + [_conv("z1")])  # dups across files
    runs = []
    for chunk_mb in (64.0, 0.0004):                          # 0.0004 MiB ~ 420 bytes: a few lines per chunk
        cfg = RoleSwapParams(mixture={str(a): 1.0, str(b): 2.0}, chunk_mb=chunk_mb, seed=9)
        r = run_role_swap(cfg)
        runs.append((r.frame(cfg.output), r.quarantine.to_frame().sort("source_file", "row"), r.extra))
        r.close()
    (f1, q1, e1), (f2, q2, e2) = runs
    assert f1.equals(f2) and q1.equals(q2) and e1 == e2
    reasons = q1.select("row", "reason").rows()
    assert (14, "duplicate: conversation_hash h3 first seen at " + str(a) + ":4") in reasons
    assert sum(r.startswith("duplicate") for _, r in reasons) == 6
    assert f1.height == 38                                 # 40 + 6 lines - 2 bad - 6 duplicates
