import polars as pl
import pytest

from mimesis_lab.io import (InputFileError, ParquetReadError, Quarantine, load_json_document, read_jsonl,
                            read_parquet)
from stages.role_swap import WildChatRecord


def test_blank_lines_are_not_records(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('\n\n{"conversation_hash": "a", "conversation": [{"role": "user", "content": "x"}]}\n  \n')
    q = Quarantine()
    b = read_jsonl(p, WildChatRecord, q)
    assert b.rows_in == 1 and b.line_numbers == [3] and len(q) == 0


def test_invalid_utf8_kept_raw(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"conversation_hash": "\xff"}\n')
    q = Quarantine()
    read_jsonl(p, WildChatRecord, q)
    assert q.reason[0].startswith("invalid UTF-8") and q.raw[0] == '{"conversation_hash": "\\xff"}'


def test_json_document_error_names_file_and_line(tmp_path):
    p = tmp_path / "doc.json"
    p.write_text('{\n  "train": [\n    {"a": 1},\n    oops\n  ]\n}\n')
    with pytest.raises(InputFileError, match=r"doc.json \(line 4\): not valid JSON"):
        load_json_document(p)


# Fast path (one Arrow read + msgspec re-check of suspects) and slow path (msgspec on
# every line) must quarantine the same rows with the same reasons.
import json  # noqa: E402

import pytest as _pytest  # noqa: E402

from mimesis_lab.io import read_jsonl_frame  # noqa: E402
from stages import role_swap as _rs, thoughttrace as _tt  # noqa: E402

_GOOD = {"conversation_hash": "g", "hashed_ip": "u", "conversation": [{"role": "user", "content": "x"}]}


@_pytest.mark.parametrize("bad", [
    {"hashed_ip": "u", "conversation": [{"role": "user", "content": "x"}]},               # missing id
    {"conversation_hash": "b", "conversation": []},                                       # empty
    {"conversation_hash": "b", "conversation": None},                                     # null
    {"conversation_hash": "b", "conversation": [{"role": "bot", "content": "x"}]},         # enum
    {"conversation_hash": "b", "conversation": [{"role": "user"}]},                        # missing content
    {"conversation_hash": "b", "conversation": [None]},                                    # null message
    {"conversation_hash": None, "conversation": [{"role": "user", "content": "x"}]},       # null id
])
def test_fast_and_slow_paths_agree_role_swap(tmp_path, bad):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps(_GOOD) + "\n" + json.dumps(bad) + "\n")
    q_fast = Quarantine()
    df, n = read_jsonl_frame(p, _rs.WildChatRecord, _rs.ARROW_SCHEMA, _rs._suspect(), q_fast)
    q_slow = Quarantine()
    read_jsonl(p, _rs.WildChatRecord, q_slow)
    assert n == 2 and df.height == 1 and df["row"].to_list() == [1]
    assert q_fast.reason == q_slow.reason and q_fast.row == [2] and len(q_slow) == 1


_TT = {"id": "user1_task1_conversation1", "task_summary": "t",
       "messages": [{"type": "user", "content": "x", "reasons": [{"content": "r"}]}]}


@_pytest.mark.parametrize("patch", [
    {"id": "nope"}, {"task_summary": None}, {"messages": []},
    {"messages": [{"type": "system", "content": "x"}]},
    {"messages": [{"type": "user", "content": "x", "reasons": [{"label": "no content"}]}]},
    {"survey_answers": [None]},
    {"survey_answers": [{"purposes": ["a", None]}]},
])
def test_fast_and_slow_paths_agree_thoughttrace(tmp_path, patch):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(_TT) + "\n" + json.dumps({**_TT, **patch}) + "\n")
    q_fast, q_slow = Quarantine(), Quarantine()
    df, n = read_jsonl_frame(p, _tt.TTRecord, _tt.ARROW_SCHEMA, _tt._suspect(), q_fast)
    read_jsonl(p, _tt.TTRecord, q_slow)
    assert n == 2 and df.height == 1
    assert q_fast.reason == q_slow.reason and len(q_slow) == 1


def test_long_line_larger_than_arrow_block(tmp_path):
    p = tmp_path / "x.jsonl"
    big = {**_GOOD, "conversation": [{"role": "user", "content": "y" * (6 << 20)}]}
    p.write_text(json.dumps(_GOOD) + "\n" + json.dumps({**big, "conversation_hash": "big"}) + "\n")
    df, n = read_jsonl_frame(p, _rs.WildChatRecord, _rs.ARROW_SCHEMA, _rs._suspect(), Quarantine())
    assert df.height == 2


def test_line_spans_blank_lines():
    from mimesis_lab.io import line_spans
    data = b'{"a":1}\n\n   \n\t{"b":2}\n \r\n{"c":3}'
    starts, ends, idx = line_spans(data)
    assert [data[s:e] for s, e in zip(starts, ends)] == [b'{"a":1}', b'\t{"b":2}', b'{"c":3}']
    assert idx.tolist() == [0, 3, 5]
    assert line_spans(b"")[2].tolist() == []


def test_iter_line_chunks_whole_lines_any_size(tmp_path):
    from mimesis_lab.io import iter_line_chunks
    lines = [b"x" * n for n in (3, 50, 1, 0, 200, 7)]
    p = tmp_path / "c.jsonl"
    p.write_bytes(b"\n".join(lines))                       # no trailing newline
    for size in (1, 8, 64, 10_000):
        chunks = list(iter_line_chunks(p, size))
        assert b"".join(chunks) == p.read_bytes()
        assert all(c.endswith(b"\n") for c in chunks[:-1])


# ---- read_parquet: one reader, one named error naming the file and what it is
def test_read_parquet_reads_the_columns_asked_for(tmp_path):
    p = tmp_path / "rows.parquet"
    pl.DataFrame({"user_id": ["u1"], "conversation_id": ["c1"], "messages": [["hi"]]}).write_parquet(p)
    df = read_parquet(p, "dataset 'x'", columns=["messages"], required=["user_id"])
    assert df.columns == ["messages"] and df.height == 1


def test_read_parquet_missing_file(tmp_path):
    with pytest.raises(ParquetReadError, match=r"nope.parquet: gym rows not found \(run `dvc repro gyms`\)$") as e:
        read_parquet(tmp_path / "nope.parquet", "gym rows", hint="run `dvc repro gyms`")
    assert e.value.problem == "missing" and e.value.what == "gym rows" and isinstance(e.value, InputFileError)


@pytest.mark.parametrize("make", [lambda p: p.write_bytes(b"PAR1 but not really parquet"),
                                  lambda p: p.write_text('{"a": 1}'), lambda p: p.mkdir()])
def test_read_parquet_unreadable(tmp_path, make):
    p = tmp_path / "bad.parquet"
    make(p)
    with pytest.raises(ParquetReadError, match=r"bad.parquet: (cannot read corpus file as parquet|corpus file is a "
                       r"directory)") as e:
        read_parquet(p, "corpus file", columns=["messages"])
    assert e.value.problem == "unreadable" and e.value.path == p


def test_read_parquet_missing_columns(tmp_path):
    p = tmp_path / "tt.parquet"
    pl.DataFrame({"conversation_id": ["c1"], "turns": [[1]]}).write_parquet(p)
    with pytest.raises(ParquetReadError, match=r"tt.parquet: ThoughtTrace parquet lacks column\(s\) \['user_id'\] "
                       r"\(columns: \['conversation_id', 'turns'\]\)") as e:
        read_parquet(p, "ThoughtTrace parquet", required=("conversation_id", "user_id", "turns"))
    assert e.value.problem == "columns" and e.value.missing_columns == ["user_id"]
    with pytest.raises(ParquetReadError, match=r"lacks column\(s\) \['messages'\]"):
        read_parquet(p, "corpus file", columns=["messages"])
