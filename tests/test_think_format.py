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
