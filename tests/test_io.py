import pytest

from mimesis_lab.io import InputFileError, Quarantine, load_json_document, read_jsonl
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
