"""The byte-level BPE tokenizer, its chat template, loading, and the ``tokenizer`` stage."""
from __future__ import annotations

import json

import polars as pl
import pytest

from mimesis_lab.config import TokenizerParams
from mimesis_lab.tokenizer import (ADDED_TOKENS, CHAT_TEMPLATE, SPECIAL_TOKENS, ChatTemplateError,
                                   TokenizerLoadError, load_tokenizer, require_chat_template, train_tokenizer)

TEXTS = [
    "rewrite this so it sounds professional, its going to my manager",
    "Here's a more professional version: Hi team, a quick update on the launch.",
    "<think>I wanted to check the abbreviations first</think>Can you simplify this?",
    "Plain-language instructions at roughly a 6th-grade reading level — naïve café 🙂",
    "ok thanks, that works. one more thing: can you make it shorter?",
] * 20


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS, vocab_size=400, min_frequency=2)


def test_special_and_think_tokens_are_single_ids(tok):
    for t in SPECIAL_TOKENS + ADDED_TOKENS:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, t
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert [tok.convert_tokens_to_ids(t) for t in ADDED_TOKENS] == [len(tok) - 2, len(tok) - 1]
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 0
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert len(tok) <= 400
    # inside text too, and think tags survive skip_special_tokens (they are not special)
    ids = tok("a<think>b</think>c", add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids("<think>") in ids and tok.convert_tokens_to_ids("</think>") in ids
    assert tok.decode(ids, skip_special_tokens=True) == "a<think>b</think>c"
    assert tok("hi", add_special_tokens=True)["input_ids"] == tok("hi", add_special_tokens=False)["input_ids"]


def test_template_renders_chatml_verbatim(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "<think>why</think>hello"}]
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<think>why</think>hello<|im_end|>\n")
    assert tok.apply_chat_template(msgs[1:2], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")   # no default system prompt


def test_roundtrip_is_lossless(tok):
    for text in TEXTS[:5] + ["  leading/trailing  \n\n", "unseen ŝçřïpţ 漢字 \t tabs", "<|im_end|>x"]:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_training_is_deterministic(tok):
    again = train_tokenizer(TEXTS, vocab_size=400, min_frequency=2)
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def test_vocab_size_too_small():
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_tokenizer(TEXTS, vocab_size=100, min_frequency=1)


def test_save_and_load(tok, tmp_path):
    tok.save_pretrained(tmp_path / "tok")
    back = load_tokenizer(tmp_path / "tok")
    assert back.chat_template == CHAT_TEMPLATE
    assert back(TEXTS[2], add_special_tokens=False)["input_ids"] == tok(TEXTS[2], add_special_tokens=False)["input_ids"]
    assert back.eos_token == "<|im_end|>" and back.pad_token == "<|endoftext|>"


def test_load_missing_or_corrupt_names_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(TokenizerLoadError, match="nope: tokenizer folder not found"):
        load_tokenizer(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerLoadError, match="empty: not a tokenizer folder"):
        load_tokenizer(empty)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text("{ this is not json")
    (bad / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(TokenizerLoadError, match="bad: cannot load tokenizer"):
        load_tokenizer(bad)


def test_require_chat_template(tok):
    assert require_chat_template(tok) is tok
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer)
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        require_chat_template(bare, "some/dir")


# ---------------------------------------------------------------- the stage

def _corpus(path, convs):
    pl.DataFrame({"messages": convs},
                 schema={"messages": pl.List(pl.Struct({"role": pl.Utf8, "content": pl.Utf8}))}
                 ).write_parquet(path)


def _convs():
    return [
        [{"role": "system", "content": "You are a user."},
         {"role": "assistant", "content": f"<think>reason {i}</think>{TEXTS[i % 5]}"},
         {"role": "user", "content": TEXTS[(i + 1) % 5]}]
        for i in range(6)
    ]


def test_stage_trains_saves_and_reports(in_tmp):
    from stages.common import write_result
    from stages.tokenizer import run_tokenizer

    _corpus(in_tmp / "a.parquet", _convs()[:4])
    _corpus(in_tmp / "b.parquet", _convs()[4:] + [[], [{"role": "user", "content": "  "}]])
    cfg = TokenizerParams(corpus=["a.parquet", "b.parquet"], vocab_size=320, min_frequency=1, output_dir="out/tok")
    m = write_result("tokenizer", run_tokenizer(cfg))
    assert (m["rows_in"], m["rows_out"], m["rows_quarantined"]) == (8, 6, 2)
    assert m["quarantine_by_reason"] == {"empty": 2}
    assert m["roundtrip"]["ok"] and m["roundtrip"]["contents_checked"] == 18
    assert m["vocab_size"] <= 320 and m["source"] == "trained"
    assert m["chars_per_token"] == round(m["corpus_chars"] / m["content_tokens"], 4)
    assert 0 < m["trained_tokens"] < m["conversation_tokens"]
    assert set(m["files_sha256"]) >= {"tokenizer.json", "tokenizer_config.json"}
    q = pl.read_parquet("data/quarantine/tokenizer.parquet")
    assert q["source_file"].to_list() == ["b.parquet", "b.parquet"] and q["row"].to_list() == [3, 4]
    assert json.loads((in_tmp / "metrics/tokenizer.json").read_text())["rows_out"] == 6
    assert load_tokenizer("out/tok").chat_template == CHAT_TEMPLATE


def test_stage_pretrained_copies_and_requires_template(in_tmp, tok):
    from stages.common import StageError
    from stages.tokenizer import run_tokenizer

    _corpus(in_tmp / "a.parquet", _convs())
    tok.save_pretrained(in_tmp / "ckpt")
    cfg = TokenizerParams(pretrained="ckpt", corpus=["a.parquet"], output_dir="out/tok")
    res = run_tokenizer(cfg)
    assert res.extra["source"] == "pretrained:ckpt" and res.rows_out == 6
    assert load_tokenizer("out/tok").backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()

    with pytest.raises(StageError, match="missing: tokenizer folder not found"):
        run_tokenizer(TokenizerParams(pretrained="missing", corpus=["a.parquet"], output_dir="out/t2"))
    cfg_path = in_tmp / "ckpt" / "tokenizer_config.json"
    cfg_path.write_text(json.dumps({k: v for k, v in json.loads(cfg_path.read_text()).items()
                                    if k != "chat_template"}))
    (in_tmp / "ckpt" / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(StageError, match="ckpt: tokenizer has no chat template"):
        run_tokenizer(TokenizerParams(pretrained="ckpt", corpus=["a.parquet"], output_dir="out/t3"))


def test_stage_missing_corpus_is_a_file_error(in_tmp):
    from mimesis_lab.io import InputFileError
    from stages.tokenizer import run_tokenizer

    with pytest.raises(InputFileError, match="nothere.parquet: corpus file not found"):
        run_tokenizer(TokenizerParams(corpus=["nothere.parquet"], output_dir="out/tok"))
