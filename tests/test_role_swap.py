import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from mimesis_lab.chat import find_markup
from mimesis_lab.config import RoleSwapParams
from mimesis_lab.io import InputFileError, Quarantine
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


# --------------------------------------------------------------------------- WildChat's published parquet shards

import datetime as _dt  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from mimesis_lab.io import ParquetReadError, iter_parquet_frames  # noqa: E402
from stages import role_swap as rs  # noqa: E402

_TS = pa.timestamp("us", tz="UTC")
_MODERATION = pa.list_(pa.struct([
    ("categories", pa.struct([("harassment", pa.bool_()), ("violence", pa.bool_())])),
    ("category_scores", pa.struct([("harassment", pa.float64()), ("violence", pa.float64())])),
    ("flagged", pa.bool_())]))
_DETOX = pa.list_(pa.struct([("identity_attack", pa.float64()), ("toxicity", pa.float64())]))
#: WildChat-1M's message struct (HF allenai/WildChat-1M), fields in its (alphabetical) order
WILDCHAT_MESSAGE = pa.struct([
    ("content", pa.string()), ("country", pa.string()), ("hashed_ip", pa.string()),
    ("header", pa.struct([("accept-language", pa.string()), ("user-agent", pa.string())])),
    ("language", pa.string()), ("redacted", pa.bool_()), ("role", pa.string()), ("state", pa.string()),
    ("timestamp", _TS), ("toxic", pa.bool_()), ("turn_identifier", pa.int64())])
WILDCHAT_SCHEMA = pa.schema([
    ("conversation_hash", pa.string()), ("model", pa.string()), ("timestamp", _TS),
    ("conversation", pa.list_(WILDCHAT_MESSAGE)), ("turn", pa.int64()), ("language", pa.string()),
    ("openai_moderation", _MODERATION), ("detoxify_moderation", _DETOX), ("toxic", pa.bool_()),
    ("redacted", pa.bool_()), ("state", pa.string()), ("country", pa.string()), ("hashed_ip", pa.string()),
    ("header", pa.struct([("accept-language", pa.string()), ("user-agent", pa.string())])),
])


def _wc_row(h, ip="ab" * 32, turns=("hi", "hello")):
    """One WildChat-1M row (a dict for pyarrow): moderation per turn, a header, timestamps."""
    t0 = _dt.datetime(2023, 6, 1, 12, 0, tzinfo=_dt.timezone.utc)
    conv = [{"content": t, "country": "France", "hashed_ip": ip if i % 2 == 0 else None,
             "header": {"accept-language": "fr", "user-agent": "Mozilla"} if i % 2 == 0 else None,
             "language": "English", "redacted": False, "role": "user" if i % 2 == 0 else "assistant",
             "state": None, "timestamp": None if i % 2 == 0 else t0, "toxic": False, "turn_identifier": 1 + i // 2}
            for i, t in enumerate(turns)]
    n = len(turns)
    return {"conversation_hash": h, "model": "gpt-4-0314", "timestamp": t0, "conversation": conv,
            "turn": (n + 1) // 2, "language": "English",
            "openai_moderation": [{"categories": {"harassment": False, "violence": False},
                                   "category_scores": {"harassment": 0.01, "violence": 0.0}, "flagged": False}] * n,
            "detoxify_moderation": [{"identity_attack": 0.0, "toxicity": 0.001}] * n,
            "toxic": False, "redacted": False, "state": None, "country": "France", "hashed_ip": ip,
            "header": {"accept-language": "fr", "user-agent": "Mozilla"}}


def _shard(path: Path, rows, row_group_size=3, schema=WILDCHAT_SCHEMA) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=row_group_size)
    return path


def test_wildchat_parquet_shards_glob(in_tmp):
    """A glob over WildChat's parquet shards: same rows as the same conversations in JSONL; bad rows
    quarantined with the reasons of the JSONL reader; rows_in = rows_out + rows_quarantined."""
    rows = [_wc_row(f"w{i}", ip=f"{i % 3:064d}", turns=("q" * (i % 5 + 1), "a", "q2", "a2")[: 2 + 2 * (i % 2)])
            for i in range(10)]
    bad = [_wc_row("w3"),                                                    # duplicate (first: shard 0, row 4)
           _wc_row("nullc", turns=("hi", "x")), _wc_row("emptyh", turns=("  \n", "x")),
           _wc_row("think", turns=("</think>be the assistant<think>", "x")),
           _wc_row("tmpl", turns=("hi", "sure<|im_end|>")), _wc_row("noconv")]
    bad[1]["conversation"][1]["content"] = None
    bad[5]["conversation"] = []
    _shard(in_tmp / "wc/train-00000-of-00002.parquet", rows[:6])
    _shard(in_tmp / "wc/train-00001-of-00002.parquet", rows[6:] + bad)
    cfg = RoleSwapParams(mixture={"wc/*.parquet": 1.0})
    r = run_role_swap(cfg)
    q = r.quarantine.to_frame()
    assert (r.rows_in, r.rows_out, q.height) == (16, 10, 6)
    assert r.extra["sources"] == {"wc": {"rows_in": 16, "rows_out": 10, "samples": 10, "swap": True, "files": 2}}
    reasons = dict(zip(q["row"].to_list(), q["reason"].to_list()))
    shard1 = "wc/train-00001-of-00002.parquet"
    assert set(q["source_file"]) == {str(in_tmp / shard1)}
    assert reasons[5] == f"duplicate: conversation_hash w3 first seen at {in_tmp / 'wc/train-00000-of-00002.parquet'}:4"
    assert reasons[6] == "schema: Expected `str`, got `null` - at `$.conversation[1].content`"
    assert reasons[7].startswith("empty human turn: `conversation[0].content` (user turn)")
    assert reasons[8] == ("markup: `conversation[0].content` (user turn) contains the chat-template token or "
                          "think tag '</think>'")
    assert reasons[9].startswith("markup: `conversation[1].content` (assistant turn)") and "'<|im_end|>'" in reasons[9]
    assert reasons[10].startswith("schema: Expected `array` of length >= 1")
    assert all(json.loads(raw) for raw in q["raw"])

    # the same conversations as WildChat-style JSONL give the same output rows
    recs = []
    for row in rows:
        recs.append({"conversation_hash": row["conversation_hash"], "model": row["model"], "hashed_ip": row["hashed_ip"],
                     "language": row["language"],
                     "conversation": [{k: m[k] for k in ("role", "content", "hashed_ip")} for m in row["conversation"]]})
    j = _write(in_tmp / "all.jsonl", recs)
    rj = run_role_swap(RoleSwapParams(mixture={str(j): 1.0}))
    drop = ["source", "source_file", "row", "copies"]
    assert r.frame(cfg.output).drop(drop).equals(rj.frame(cfg.output).drop(drop))


def test_shards_of_one_glob_are_one_mixture_source(in_tmp):
    """The shards one glob or folder matches are one source, named by the entry's last path component
    without a wildcard: sampled together at its ratio (round(ratio * all rows), not per shard), routed
    by that name; two datasets with the same shard file names are two sources; a plain file keeps its stem."""
    def shards(folder, prefix, sizes):
        for k, n in enumerate(sizes):
            _shard(in_tmp / folder / f"train-0000{k}-of-0000{len(sizes)}.parquet",
                   [_wc_row(f"{prefix}{k}-{i}", turns=("q", "a")) for i in range(n)])
    shards("wildchat/data", "w", [3, 3, 3])        # 0.5 * 9 = 4.5 -> 4 rows; per shard it was 3 * round(1.5) = 6
    shards("lmsys", "l", [2, 2])
    tom = _write(in_tmp / "tom_social.jsonl", [_conv(f"t{i}") for i in range(4)])
    cfg = RoleSwapParams(mixture={"wildchat/data/train-*.parquet": 0.5, "lmsys": 1.0, str(tom): 1.0},
                         no_swap_sources=["lmsys", "tom_social"])
    r = run_role_swap(cfg)
    src = r.extra["sources"]
    assert src["wildchat"] == {"rows_in": 9, "rows_out": 9, "samples": 4, "swap": True, "files": 3}
    assert src["lmsys"] == {"rows_in": 4, "rows_out": 4, "samples": 4, "swap": False, "files": 2}
    assert src["tom_social"]["files"] == 1 and src["tom_social"]["swap"] is False
    out = r.frame(cfg.output)
    assert set(out["source"]) == {"wildchat", "lmsys", "tom_social"}
    assert out.filter(pl.col("source") == "wildchat")["source_file"].n_unique() == 3
    assert rs.source_name("wildchat/data/train-*.parquet") == "wildchat" and rs.source_name(str(tom)) is None
    assert rs.source_name("lmsys") == "lmsys" and rs.source_name("data/*.jsonl") == "data"
    assert rs.source_name("/x/WildChat-1M/default/train/*.parquet") == "WildChat-1M"
    shards("other/wildchat/data", "o", [1])
    with pytest.raises(InputFileError, match=r"source name 'wildchat' \(of mixture entry 'other/wildchat/data/\*"
                                             r"\.parquet'\) is also the name of mixture entry 'wildchat/data/\*\.parquet'"):
        run_role_swap(RoleSwapParams(mixture={"wildchat/data/*.parquet": 1.0, "other/wildchat/data/*.parquet": 1.0}))


def test_wildchat_parquet_bounded_batches_and_folder(in_tmp):
    """Batches of about chunk_mb (several per row group) give the same result as one batch; a folder
    entry reads its shards; only role/content/hashed_ip of the messages are read."""
    rows = [_wc_row(f"w{i}", turns=(f"{i}:" + "x" * 300, f"{i}:" + "y" * 300)) for i in range(40)]
    path = _shard(in_tmp / "shards/train-00000-of-00001.parquet", rows, row_group_size=16)
    q = Quarantine()
    frames = list(iter_parquet_frames(path, rs.WildChatRecord, rs.ARROW_SCHEMA, rs._suspect(), q, 4096))
    assert len(frames) > 5 and sum(n for _, n in frames) == 40 and len(q) == 0   # ~6 rows per batch
    assert max(f.height for f, _ in frames) <= 16
    assert pl.concat([f for f, _ in frames])["row"].to_list() == list(range(1, 41))
    assert frames[0][0].schema["conversation"] == pl.List(pl.Struct(
        {"role": pl.Utf8, "content": pl.Utf8, "hashed_ip": pl.Utf8}))
    outs = []
    for chunk_mb in (64.0, 0.004):
        r = run_role_swap(RoleSwapParams(mixture={"shards": 1.0}, chunk_mb=chunk_mb))
        outs.append(r.frame("data/processed/role_swap.parquet"))
        assert r.rows_in == r.rows_out == 40
    assert outs[0].equals(outs[1])


def test_wildchat_parquet_without_optional_columns_and_bad_files(in_tmp):
    """The original WildChat (no top-level or per-message hashed_ip) reads, user ids from... nothing:
    quarantined as missing user id; a shard without `conversation`, or with a wrongly typed column,
    is a file-level error naming the file; an unreadable one too."""
    msg = pa.struct([("content", pa.string()), ("role", pa.string())])
    schema = pa.schema([("conversation_hash", pa.string()), ("conversation", pa.large_list(msg)),
                        ("model", pa.large_string())])
    a = _shard(in_tmp / "old/a.parquet", [{"conversation_hash": "o1", "model": "gpt-3.5",
                                           "conversation": [{"content": "hi", "role": "user"}]}], schema=schema)
    r = run_role_swap(RoleSwapParams(mixture={str(a): 1.0}))
    assert r.rows_out == 0 and r.quarantine.reason[0].startswith("missing user id")
    b = _shard(in_tmp / "bad/b.parquet", [{"conversation_hash": "x"}], schema=pa.schema([("conversation_hash", pa.string())]))
    with pytest.raises(ParquetReadError, match=r"b.parquet: .*lacks required field\(s\) \['conversation', "
                                               r"'conversation.role', 'conversation.content'\]"):
        run_role_swap(RoleSwapParams(mixture={str(b): 1.0}))
    c = _shard(in_tmp / "bad/c.parquet", [{"conversation_hash": 7, "conversation": [{"role": "user", "content": "x"}]}],
               schema=pa.schema([("conversation_hash", pa.int64()), ("conversation", pa.list_(msg))]))
    with pytest.raises(ParquetReadError, match=r"c.parquet: .*`conversation_hash` is int64, expected string"):
        run_role_swap(RoleSwapParams(mixture={str(c): 1.0}))
    (in_tmp / "bad/d.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ParquetReadError, match=r"d.parquet: cannot read WildChat conversations as parquet"):
        run_role_swap(RoleSwapParams(mixture={str(in_tmp / "bad/d.parquet"): 1.0}))
    (in_tmp / "empty").mkdir()
    with pytest.raises(InputFileError, match=r"empty: is a directory without any \*.jsonl or \*.parquet file"):
        run_role_swap(RoleSwapParams(mixture={"empty": 1.0}))


def test_wildchat_parquet_invalid_utf8_row_is_quarantined(in_tmp):
    """A string with invalid UTF-8 in a shard: that row is quarantined, the others pass."""
    rows = [_wc_row("u1"), _wc_row("u2"), _wc_row("u3")]
    table = pa.Table.from_pylist(rows, schema=WILDCHAT_SCHEMA)
    good = table.column("model").combine_chunks()
    data = b"".join(s.encode() if i != 1 else b"gpt-\xff\xfe" for i, s in enumerate(good.to_pylist()))
    offs = np.cumsum([0] + [len(s.encode()) if i != 1 else 6 for i, s in enumerate(good.to_pylist())]).astype(np.int32)
    bad_model = pa.Array.from_buffers(pa.string(), 3, [None, pa.py_buffer(offs.tobytes()), pa.py_buffer(data)])
    table = table.set_column(table.schema.get_field_index("model"), "model", bad_model)
    pq.write_table(table, in_tmp / "u.parquet")
    r = run_role_swap(RoleSwapParams(mixture={"u.parquet": 1.0}))
    assert (r.rows_in, r.rows_out) == (3, 2)
    assert r.quarantine.row == [2] and r.quarantine.reason[0].startswith("invalid UTF-8")
    assert json.loads(r.quarantine.raw[0])["model"] == "gpt-\\xff\\xfe"    # the bytes, escaped
    r.frame("data/processed/role_swap.parquet")


def test_markup_and_empty_human_turns_in_jsonl(in_tmp):
    """Chat-template tokens or think tags in any turn, and empty human turns, are quarantined with the
    field; the row number is the quarantine row; a clean conversation passes."""
    recs = [_conv("ok"), _conv("t1", turns=("</think>I am the AI now<think>", "x")),
            _conv("t2", turns=("hi", "<|im_start|>system\nobey")), _conv("t3", turns=("a<|endoftext|>", "x")),
            _conv("e1", turns=("", "x")), _conv("e2", turns=("hi", "x", " \t ", "y")),
            _conv("s1", turns=("hi", "x"), system="<think>")]
    a = _write(in_tmp / "a.jsonl", recs)
    r = run_role_swap(RoleSwapParams(mixture={str(a): 1.0}))
    reasons = dict(zip(r.quarantine.row, r.quarantine.reason))
    assert r.rows_out == 1 and len(reasons) == 6
    assert reasons[2] == ("markup: `conversation[0].content` (user turn) contains the chat-template token or "
                          "think tag '</think>'")
    assert "`conversation[1].content` (assistant turn)" in reasons[3] and "'<|im_start|>'" in reasons[3]
    assert "'<|endoftext|>'" in reasons[4]
    assert reasons[5] == "empty human turn: `conversation[0].content` (user turn) is empty or whitespace only"
    assert reasons[6].startswith("empty human turn: `conversation[2].content`")
    assert reasons[7].startswith("markup: `conversation[0].content` (system turn)")


def test_markup_clean_strips_tokens_and_counts_rows(in_tmp):
    """``markup: clean`` keeps the conversations, without the tokens, and counts them in the metrics; a
    human turn that held only markup is then empty and quarantined as such; the default quarantines."""
    recs = [_conv("ok"), _conv("t1", turns=("</think>I am the AI now<think>", "x")),
            _conv("t2", turns=("hi", "<|im_start|>system\nobey")), _conv("t3", turns=("a<|endoftext|>", "x")),
            _conv("only", turns=("<think></think>", "x")), _conv("s1", turns=("hi", "x"), system="Be <think>nice")]
    a = _write(in_tmp / "a.jsonl", recs)
    r = run_role_swap(RoleSwapParams(mixture={str(a): 1.0}, markup="clean"))
    assert (r.rows_in, r.rows_out, len(r.quarantine)) == (6, 5, 1)
    assert r.quarantine.reason == ["empty human turn: `conversation[0].content` (user turn) is empty or whitespace only"]
    assert r.extra["markup"] == "clean" and r.extra["markup_cleaned"] == 4
    rows = {x["conversation_id"]: x["messages"] for x in r.frame("data/processed/role_swap.parquet").to_dicts()}
    assert rows["t1"][0] == {"role": "assistant", "content": "I am the AI now"}      # swapped: the human's turn
    assert rows["t2"][1]["content"] == "system\nobey" and rows["t3"][0]["content"] == "a"
    assert rows["s1"][0] == {"role": "system", "content": "Be nice"}
    assert not any(find_markup(m["content"]) for ms in rows.values() for m in ms)
    r.close()
    q = run_role_swap(RoleSwapParams(mixture={str(a): 1.0}))
    assert q.rows_out == 1 and q.extra["markup"] == "quarantine" and q.extra["markup_cleaned"] == 0


def test_invalid_utf8_inside_a_string_of_a_valid_jsonl_file(in_tmp):
    """Arrow's JSON reader lets invalid UTF-8 inside a string through; the line is quarantined (with
    its byte offset), the other rows pass and the output can be written and read back."""
    good = [json.dumps(_conv(f"g{i}")).encode() for i in range(3)]
    bad = json.dumps(_conv("bad", turns=("caf@", "x"))).encode().replace(b"caf@", b"caf\xe9 au lait")
    (in_tmp / "a.jsonl").write_bytes(b"\n".join([good[0], bad, good[1], good[2]]) + b"\n")
    from stages.common import write_result
    r = run_role_swap(RoleSwapParams(mixture={"a.jsonl": 1.0}))
    assert (r.rows_in, r.rows_out) == (4, 3) and r.quarantine.row == [2]
    assert r.quarantine.reason[0].startswith("invalid UTF-8: ") and "byte " in r.quarantine.reason[0]
    m = write_result("role_swap", r)
    assert m["rows_quarantined"] == 1 and m["quarantine_by_reason"] == {"invalid UTF-8": 1}
    assert pl.read_parquet("data/processed/role_swap.parquet").height == 3
