import pytest

from mimesis_lab.evals.think_format import classify_reply, evaluate_folder


@pytest.mark.parametrize("text,expected", [
    ("<think>why</think>hello<|im_end|>", (True, True)),
    ("  <think>why</think>", (True, True)),
    ("<think>why<|im_end|>", (True, False)),
    ("<think></think>", (True, True)),
    ("hello <think>x</think>", (False, False)),
    ("", (False, False)),
])
def test_classify_reply(text, expected):
    assert classify_reply(text) == expected


def test_empty_split_is_an_error(tmp_path):
    import polars as pl

    from mimesis_lab.config import ModelParams
    from mimesis_lab.models import build_tiny_model, save_hf
    from mimesis_lab.tokenizer import train_tokenizer

    tok = train_tokenizer(["hello world"] * 20, vocab_size=300, min_frequency=1)
    model = build_tiny_model(ModelParams(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8),
                             len(tok), tok.pad_token_id, tok.eos_token_id)
    save_hf(model, tok, tmp_path / "m")
    pl.DataFrame({"messages": []}, schema={"messages": pl.List(pl.Struct({"role": pl.Utf8, "content": pl.Utf8}))}
                 ).write_parquet(tmp_path / "val.parquet")
    with pytest.raises(ValueError, match="empty split"):
        evaluate_folder(tmp_path / "m", tmp_path / "val.parquet")
    pl.DataFrame({"messages": [[{"role": "system", "content": "s"}, {"role": "assistant", "content": "<think>a</think>b"}]]}
                 ).write_parquet(tmp_path / "val.parquet")
    r = evaluate_folder(tmp_path / "m", tmp_path / "val.parquet", max_new_tokens=4)
    assert r["prompts"] == 1 and 0 <= r["think_open_close_rate"] <= r["think_open_rate"] <= 1


def test_sampled_format_counts_parse_reply_over_cycled_prompts(monkeypatch):
    """4 samples cycle over 2 prompts (0, 1, 0, 1); parse_reply decides: 2 of 4 well formed, per prompt [1, 2]."""
    from types import SimpleNamespace

    import mimesis_lab.rollout.backends as backends
    from mimesis_lab.evals.think_format import sampled_format_rates

    texts = ["<think>a</think>hi<|im_end|>", "hello<|im_end|>", "<think>a", "<think>x</think>y"]
    seen = {}

    class FakeBackend:
        def __init__(self, model, tokenizer, batch_size):
            pass

        def generate_ids(self, prompt_ids, params):
            seen.update(prompts=prompt_ids, params=params)
            return [SimpleNamespace(ok=True, text=t) for t in texts]

    class Tok:
        def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
            return "|".join(m["content"] for m in msgs)

        def __call__(self, text, add_special_tokens):
            return SimpleNamespace(input_ids=[len(text)])

    monkeypatch.setattr(backends, "TransformersBackend", FakeBackend)
    conv = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "y"}]
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64))
    r = sampled_format_rates(model, Tok(), [conv], temperature=0.7, top_p=0.9, max_new_tokens=8, n_samples=4, seed=5)
    assert seen["prompts"] == [[1], [5], [1], [5]]                      # "s", "s|x|u" rendered, cycled
    assert (seen["params"].temperature, seen["params"].top_p, seen["params"].max_new_tokens, seen["params"].seed) \
        == (0.7, 0.9, 8, 5)
    assert r["samples"] == 4 and r["well_formed"] == 2 and r["rate"] == 0.5 and r["prompts"] == 2
    assert r["per_prompt"] == [[1, 2], [1, 2]]
    assert r["error_counts"] == {"missing <think> block": 1, "unclosed <think> block": 1}


def test_sampled_format_on_a_tiny_model_is_seeded(tmp_path):
    import polars as pl

    from mimesis_lab.config import ModelParams
    from mimesis_lab.models import build_tiny_model, save_hf
    from mimesis_lab.rollout.backends import SamplingParams
    from mimesis_lab.tokenizer import train_tokenizer

    tok = train_tokenizer(["hello world"] * 20, vocab_size=300, min_frequency=1)
    model = build_tiny_model(ModelParams(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8),
                             len(tok), tok.pad_token_id, tok.eos_token_id)
    save_hf(model, tok, tmp_path / "m")
    msgs = [{"role": "system", "content": "s"}, {"role": "assistant", "content": "<think>a</think>b"}]
    pl.DataFrame({"messages": [msgs]}).write_parquet(tmp_path / "val.parquet")
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, top_p=1.0)
    a = evaluate_folder(tmp_path / "m", tmp_path / "val.parquet", sampling, seed=3, max_new_tokens=4)["sampled"]
    b = evaluate_folder(tmp_path / "m", tmp_path / "val.parquet", sampling, seed=3, max_new_tokens=4)["sampled"]
    assert a["samples"] == 64 and a["per_prompt"][0][1] == 64 and a["examples"] == b["examples"]
    assert a["well_formed"] == b["well_formed"] and a["temperature"] == 1.0 and a["max_new_tokens"] == 4
