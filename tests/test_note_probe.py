"""scripts/note_probe.py on a tiny random agent and hand-made coached pairs."""
from __future__ import annotations

import json

import polars as pl
import pytest

from tests.conftest import load_script

READY = "The user is ready: give the final answer now."
ASK = "Ask about their remaining preferences (budget) before searching or answering."


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    from mimesis_lab.config import ModelParams
    from mimesis_lab.models import build_tiny_model, save_hf
    from mimesis_lab.tokenizer import train_tokenizer

    tmp = tmp_path_factory.mktemp("note_probe")
    hist = [{"role": "user", "content": "i need a hotel in rome. Please recommend the one option that suits me best."},
            {"role": "assistant", "content": "[search] hotel in rome"},
            {"role": "tool", "content": "Found 2 option(s): [H1] sun inn | price: $90 | [H2] moon inn | price: $150"}]
    rows = [hist + [{"role": "user", "content": READY}, {"role": "assistant", "content": "[answer] H1"}],
            hist + [{"role": "user", "content": ASK}, {"role": "assistant", "content": "[action] Do you have a budget?"}],
            # a pair whose two notes are the same: the placebo is the real note, so the difference is exactly 0
            hist[:1] + [{"role": "user", "content": ASK}, {"role": "assistant", "content": "[action] Any budget?"}],
            hist[:1] + [{"role": "user", "content": ASK}, {"role": "assistant", "content": "[search] hotel"}]]
    texts = [m["content"] for r in rows for m in r] * 20
    tok = train_tokenizer(texts, vocab_size=400, min_frequency=1)
    mp = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=16, max_position_embeddings=512, seed=3)
    save_hf(build_tiny_model(mp, len(tok), tok.pad_token_id, tok.eos_token_id), tok, tmp / "agent")
    n = len(rows)
    pl.DataFrame({"kind": ["coached"] * n + ["oracle"], "messages": rows + [rows[0][:3] + rows[0][4:]]}) \
        .write_parquet(tmp / "val.parquet")
    return tmp


def test_note_probe_pairs_placebos_and_counts(agent):
    probe = load_script("note_probe")
    out = probe.probe(str(agent / "agent"), str(agent / "val.parquet"))
    assert out["rows"] == 4 and out["paired"] == 4                 # the oracle row is not probed
    by_row = out["real_minus_placebo_by_row"]
    assert by_row[2] == 0.0 and by_row[3] == 0.0                    # the same note as real and as placebo
    assert by_row[0] != 0.0 and by_row[1] != 0.0                    # READY against ASK: the note changes the context
    assert out["real_minus_placebo"] == pytest.approx(sum(by_row) / 4, abs=1e-4)
    assert all(0.0 <= v <= 1.0 for v in out["greedy_follows_note"].values())
    assert set(out["logp_per_token"]) == {"real", "placebo", "none"}
    dest = agent / "probe.json"
    assert probe.main([str(agent / "agent"), "--data", str(agent / "val.parquet"), "--json", str(dest)]) == 0
    assert json.loads(dest.read_text())["real_minus_placebo_by_row"] == by_row


def test_note_probe_needs_coached_rows(agent, tmp_path):
    pl.DataFrame({"kind": ["oracle"], "messages": [[{"role": "user", "content": "hi"},
                                                    {"role": "assistant", "content": "[answer] H1"}]]}) \
        .write_parquet(tmp_path / "none.parquet")
    with pytest.raises(SystemExit, match="no `coached` row"):
        load_script("note_probe").probe(str(agent / "agent"), str(tmp_path / "none.parquet"))


def test_rollout_probe_scores_the_coachs_notes_on_rl_turns(agent, tmp_path):
    """The coach's input per turn as in the CSD job: the reasoning behind the user's previous reply and the
    user's reply to this turn; tau/function rollouts are skipped (not coached)."""
    probe = load_script("note_probe")
    msgs = [{"role": "user", "content": "i need a hotel in rome."},
            {"role": "assistant", "content": "[action] Do you have a budget?"},
            {"role": "tool", "content": "i want it under $90\nReward: 0.2"},      # -> unmet (budget) on turn 0
            {"role": "assistant", "content": "[action] Anything else?"},
            {"role": "tool", "content": "no, that's all\nReward: 0"},              # "no": negative on turn 1
            {"role": "assistant", "content": "[answer] H1"}]                       # reasoning "sounds good": ready
    rows = [{"data_source": "interact_travel", "messages": msgs, "choices": ["action", "action", "answer"],
             "privileged": ["i want cheap", "sounds good, go ahead"]},
            {"data_source": "interact_tau", "messages": msgs, "choices": ["action", "action", "answer"],
             "privileged": ["i want cheap", "sounds good"]}]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    out = probe.rollout_probe(str(agent / "agent"), str(path))
    got = out["real_minus_placebo"]
    assert out["turns"] == 3 == got["all"]["n"]
    assert set(got) == {"all", "travel/unmet/action", "travel/negative/action", "travel/ready/answer"}
    assert probe.note_kind("The user is ready: give the final answer now.") == "ready"
    assert probe.note_kind("Ask about their remaining preferences (budget) before searching.") == "unmet"
    assert probe.note_kind("Be nice.") == "other"
