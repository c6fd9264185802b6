"""``tokenize_chat`` / ``tokenize_many``: incremental rendering, loss mask, full-rendering check."""
from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from mimesis_lab.chat import tokenize_chat, tokenize_many
from mimesis_lab.tokenizer import ChatTemplateError, train_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ["Be brief.", "hi there", "why not", "hello", "<think>why</think>hello", "what is the plan",
          "The plan is to ship on Thursday.", "assistant user system"] * 10

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def _bpe(texts, specials, **kw):
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, min_frequency=1, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, clean_up_tokenization_spaces=False, **kw)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(CORPUS, vocab_size=400, min_frequency=1)


@pytest.fixture(scope="module")
def llama():
    return _bpe(CORPUS, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", chat_template=LLAMA3_TEMPLATE)


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def masked_runs(tok, ids, mask):
    """Decoded text of each maximal run of mask-1 tokens."""
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]


MSGS = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "<think>why</think>hello"}]


def test_hand_computed_mask_three_messages(tok):
    ids, mask = tokenize_chat(tok, MSGS)
    full = tok.apply_chat_template(MSGS, tokenize=False)
    assert ids == ids_of(tok, full)
    prompt = ids_of(tok, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
                         "<|im_start|>assistant\n")
    target = ids_of(tok, "<think>why</think>hello<|im_end|>")
    newline = ids_of(tok, "\n")
    assert ids == prompt + target + newline
    assert mask == [0] * len(prompt) + [1] * len(target) + [0]
    toks = tok.convert_ids_to_tokens(ids)
    assert [t for t, m in zip(toks, mask) if m][:3] == ["<think>", "why", "</think>"]
    assert [t for t, m in zip(toks, mask) if m][-1] == "<|im_end|>"
    assert toks[-1] == "Ċ" and mask[-1] == 0                              # trailing newline not trained
    assert all(m == 0 for t, m in zip(toks, mask) if t == "<|im_start|>")  # role headers not trained


def test_train_role_user(tok):
    ids, mask = tokenize_chat(tok, MSGS, train_role="user")
    assert masked_runs(tok, ids, mask) == ["hi there<|im_end|>"]
    assert sum(mask) == len(ids_of(tok, "hi there<|im_end|>"))


def test_multi_turn(tok):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "what is the plan"},
            {"role": "assistant", "content": "<think>why not</think>The plan is to ship on Thursday."},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": ""},                       # empty content: only end of turn
            {"role": "user", "content": "assistant"},                   # content equal to a role name
            {"role": "assistant", "content": "assistant"}]
    ids, mask = tokenize_chat(tok, msgs)
    assert ids == ids_of(tok, tok.apply_chat_template(msgs, tokenize=False))
    assert len(mask) == len(ids)
    assert masked_runs(tok, ids, mask) == ["<think>why not</think>The plan is to ship on Thursday.<|im_end|>",
                                           "<|im_end|>", "assistant<|im_end|>"]
    assert masked_runs(tok, *tokenize_chat(tok, msgs, train_role="user")) == [
        "what is the plan<|im_end|>", "hello<|im_end|>", "assistant<|im_end|>"]
    assert sum(tokenize_chat(tok, msgs, train_role="system")[1]) == len(ids_of(tok, "Be brief.<|im_end|>"))


def test_other_template_llama3_like_with_trim_and_bos(llama):
    msgs = [{"role": "user", "content": "  hi there "},
            {"role": "assistant", "content": "\n<think>why</think>hello  "},   # trimmed by the template
            {"role": "user", "content": "what is the plan"},
            {"role": "assistant", "content": "The plan is to ship on Thursday."}]
    ids, mask = tokenize_chat(llama, msgs)
    rendered = llama.apply_chat_template(msgs, tokenize=False)
    assert rendered.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>")
    assert ids == ids_of(llama, rendered)
    assert masked_runs(llama, ids, mask) == ["<think>why</think>hello<|eot_id|>",
                                             "The plan is to ship on Thursday.<|eot_id|>"]
    assert mask[0] == 0 and llama.convert_ids_to_tokens(ids[0]) == "<|begin_of_text|>"
    assert tokenize_many(llama, [msgs, msgs[:2]]) == [(ids, mask), tokenize_chat(llama, msgs[:2])]


def test_footer_without_special_token_is_trained(tok):
    plain = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    t = train_tokenizer(CORPUS, vocab_size=400, min_frequency=1)
    t.chat_template = plain
    msgs = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
    ids, mask = tokenize_chat(t, msgs)
    assert masked_runs(t, ids, mask) == ["hello\n"]


def test_non_prefix_template_raises(tok):
    t = train_tokenizer(CORPUS, vocab_size=400, min_frequency=1)
    t.chat_template = ("{% for m in messages %}{% if loop.last %}[LAST]{% endif %}"
                       "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    msgs = MSGS[1:]
    with pytest.raises(ValueError, match=r"message 1: the rendering of messages\[:2\] does not extend"):
        tokenize_chat(t, msgs)
    with pytest.raises(ValueError, match=r"conversation 1: message 1: the rendering"):
        tokenize_many(t, [msgs[:1], msgs])


def test_token_merge_across_boundary_raises():
    t = _bpe(["abcd"] * 50, ["<pad>"], chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert len(ids_of(t, "abcd")) == 1
    msgs = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}]
    with pytest.raises(ValueError, match="message 0: the incrementally tokenized conversation differs"):
        tokenize_chat(t, msgs)
    out = tokenize_many(t, [msgs, msgs[:1]], errors="return")
    assert isinstance(out[0], ValueError) and "conversation 0: message 0" in str(out[0])
    assert out[1] == tokenize_chat(t, msgs[:1])


def test_template_exception_becomes_value_error():
    t = train_tokenizer(CORPUS, vocab_size=400, min_frequency=1)
    t.chat_template = ("{% for m in messages %}{% if m['role'] == 'bot' %}{{ raise_exception('no bots') }}"
                       "{% endif %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}")
    bad = MSGS[1:] + [{"role": "bot", "content": "x"}]
    with pytest.raises(ValueError, match=r"chat template failed on messages\[:3\]: TemplateError: no bots"):
        tokenize_chat(t, bad)
    out = tokenize_many(t, [MSGS[1:], bad], errors="return")
    assert out[0] == tokenize_chat(t, MSGS[1:])
    assert str(out[1]).startswith("conversation 1: chat template failed on messages[:3]")


def test_no_chat_template_is_a_clear_error(tok):
    bare = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer)
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        tokenize_chat(bare, MSGS)
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        tokenize_many(bare, [MSGS])


def test_bad_inputs(tok):
    with pytest.raises(ValueError, match="empty conversation"):
        tokenize_chat(tok, [])
    with pytest.raises(ValueError, match="message 0: content of a 'assistant' message must be a string"):
        tokenize_chat(tok, [{"role": "assistant", "content": None}])
    out = tokenize_many(tok, [MSGS, [], MSGS], errors="return")
    assert out[0] == out[2] == tokenize_chat(tok, MSGS)
    assert isinstance(out[1], ValueError) and str(out[1]).startswith("conversation 1: empty conversation")
    with pytest.raises(ValueError, match="conversation 1: empty conversation"):
        tokenize_many(tok, [MSGS, []])
    assert tokenize_many(tok, []) == []


class _NoOffsets:
    """A tokenizer proxy without offsets (as a slow tokenizer): exercises the piecewise path."""

    is_fast = False

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, text, **kw):
        assert not kw.pop("return_offsets_mapping", False)
        return self._tok(text, **kw)


def test_tokenizer_without_offsets_gives_the_same_result(tok, llama):
    msgs = MSGS + [{"role": "user", "content": "what is the plan"},
                   {"role": "assistant", "content": "The plan is to ship on Thursday."}]
    for t in (tok, llama):
        assert tokenize_chat(_NoOffsets(t), msgs) == tokenize_chat(t, msgs)
        assert tokenize_many(_NoOffsets(t), [msgs, MSGS]) == tokenize_many(t, [msgs, MSGS])


def _bundled(tmp):
    """The bundled fixtures (data/raw/) through the real role_swap and thoughttrace stages (no pipeline run
    needed; the default pipeline reads the generated world instead)."""
    from mimesis_lab.config import load_params
    from stages.role_swap import run_role_swap
    from stages.thoughttrace import run_thoughttrace

    params = load_params(ROOT / "params.yaml")
    rs = params.role_swap.model_copy(update={
        # one entry per file: a glob is one source (its shards), and tom_social must stay its own no-swap source
        "mixture": {str(p): 1.0 for p in sorted((ROOT / "data/raw/chats").glob("*.jsonl"))},
        "output": str(tmp / "rs.parquet")})
    tt = params.thoughttrace.model_copy(update={
        "input": str(ROOT / "data/raw/thoughttrace/thoughttrace.jsonl"), "output": str(tmp / "tt.parquet")})
    convs = []
    for result, out in ((run_role_swap(rs), rs.output), (run_thoughttrace(tt), tt.output)):
        convs += result.frame(out)["messages"].to_list()
        result.close()
    return convs


def test_tokenize_many_equals_tokenize_chat_on_bundled_data(tmp_path):
    convs = _bundled(tmp_path)
    tok = train_tokenizer([m["content"] for c in convs for m in c], vocab_size=1000, min_frequency=2)
    many = tokenize_many(tok, convs)
    assert many == [tokenize_chat(tok, c) for c in convs]
    for conv, (ids, mask) in zip(convs, many):
        assert masked_runs(tok, ids, mask) == [m["content"] + "<|im_end|>" for m in conv
                                               if m["role"] == "assistant"]
    assert tokenize_many(tok, convs, train_role="user") == [tokenize_chat(tok, c, "user") for c in convs]
