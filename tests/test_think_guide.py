"""Format-guided decoding (mimesis_lab.rollout.think_guide): the grammar by hand on a 10-token vocabulary,
then on a real (random) tiny model through the transformers backend and the OpenAI-compatible server."""
from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest
import torch

from mimesis_lab.config import ModelParams
from mimesis_lab.envs.output_format import parse_reply
from mimesis_lab.models import build_tiny_model
from mimesis_lab.rollout import SamplingParams, TransformersBackend
from mimesis_lab.rollout.think_guide import (
    DONE, FIRST, OPEN, THINK, UTTER, ThinkGuide, ThinkTokens, utterance_reserve,
)

# A 10-token vocabulary: 0 <think>, 1 </think>, 2 <|im_end|> (the stop token), 3 <|im_start|> (special),
# 4 " " (whitespace only), 5..9 words.
OPEN_ID, CLOSE_ID, STOP_ID, START_ID, BLANK_ID = 0, 1, 2, 3, 4
TOKENS = ThinkTokens(open_id=OPEN_ID, close_id=CLOSE_ID, special=frozenset({STOP_ID, START_ID}),
                     blank=frozenset({BLANK_ID}))


def _guide(n_rows=1, max_new_tokens=8):
    return ThinkGuide(TOKENS, n_rows=n_rows, max_new_tokens=max_new_tokens, stop_ids=frozenset({STOP_ID}))


def _logits_preferring(token: int, vocab: int = 10) -> torch.Tensor:
    x = torch.zeros(1, vocab)
    x[0, token] = 5.0
    return x


def _allowed(logits: torch.Tensor) -> set[int]:
    return {i for i, v in enumerate(logits[0].tolist()) if math.isfinite(v)}


def test_utterance_reserve_is_a_quarter_of_the_budget_and_at_least_one():
    assert utterance_reserve(48) == 12
    assert utterance_reserve(3) == 1
    assert utterance_reserve(1) == 1


def test_each_state_allows_exactly_what_the_format_allows():
    g = _guide(max_new_tokens=8)            # reserve = 2: close when 2 tokens are left (step 6)
    # open: only <think>; the model preferred word 5, so the guide overrode it once
    x = g.mask(_logits_preferring(5), [0], step=0)
    assert _allowed(x) == {OPEN_ID} and g.guided == [1]
    g.advance(0, OPEN_ID)
    assert g.state == [THINK]
    # think: no second <think>, no end of turn, no other special; </think>, blank and words stay allowed
    x = g.mask(_logits_preferring(6), [0], step=1)
    assert _allowed(x) == {CLOSE_ID, BLANK_ID, 5, 6, 7, 8, 9} and g.guided == [1]
    g.advance(0, 6)
    # the model's own </think> is allowed and not counted as guidance
    x = g.mask(_logits_preferring(CLOSE_ID), [0], step=2)
    assert CLOSE_ID in _allowed(x) and g.guided == [1]
    g.advance(0, CLOSE_ID)
    assert g.state == [FIRST]
    # first utterance token: no tag, no special, no end of turn, not whitespace only
    x = g.mask(_logits_preferring(STOP_ID), [0], step=3)
    assert _allowed(x) == {5, 6, 7, 8, 9} and g.guided == [2]
    g.advance(0, 7)
    assert g.state == [UTTER]
    # utterance: no think tag, no special other than the stop token
    x = g.mask(_logits_preferring(OPEN_ID), [0], step=4)
    assert _allowed(x) == {STOP_ID, BLANK_ID, 5, 6, 7, 8, 9} and g.guided == [3]
    assert g.forced_close == [False]


def test_a_think_block_left_open_is_closed_when_only_the_reserve_is_left():
    g = _guide(max_new_tokens=8)            # reserve 2
    g.advance(0, OPEN_ID)
    for step in range(1, 6):                # steps 1..5 leave 7..3 tokens: the model may go on thinking
        x = g.mask(_logits_preferring(5), [0], step=step)
        assert 5 in _allowed(x)
        g.advance(0, 5)
    x = g.mask(_logits_preferring(5), [0], step=6)     # 2 left = the reserve: </think> is forced
    assert _allowed(x) == {CLOSE_ID}
    assert g.forced_close == [True] and g.guided == [1]
    g.advance(0, CLOSE_ID)
    assert g.state == [FIRST]


def test_a_model_that_follows_the_format_is_never_overridden():
    # greedy on logits whose argmax spells <think> 5 6 </think> 7 8 <|im_end|>: every masked argmax equals the raw
    g = _guide(n_rows=1, max_new_tokens=10)
    path = [OPEN_ID, 5, 6, CLOSE_ID, 7, 8, STOP_ID]
    for step, tok in enumerate(path):
        raw = _logits_preferring(tok)
        masked = g.mask(raw.clone(), [0], step=step)
        assert int(masked.argmax()) == tok
        assert masked[0, tok] == raw[0, tok]          # the kept token's logit is untouched
        g.advance(0, tok)
    assert g.guided == [0] and g.forced_close == [False]
    # a finished row that stays in the batch (no KV pruning) is left alone: its padding steps count nothing
    assert g.state == [DONE]
    x = g.mask(_logits_preferring(OPEN_ID), [0], step=len(path))
    assert _allowed(x) == set(range(10)) and g.guided == [0]


def test_rows_are_independent_and_addressed_through_the_alive_list():
    g = _guide(n_rows=3, max_new_tokens=8)
    for r in range(3):
        g.advance(r, OPEN_ID)
    g.advance(1, CLOSE_ID)                  # row 1 is in its utterance's first token, rows 0 and 2 think
    x = torch.zeros(2, 10)                  # only rows 1 and 2 still generate, in that order
    g.mask(x, [1, 2], step=2)
    allowed1 = {i for i, v in enumerate(x[0].tolist()) if math.isfinite(v)}
    allowed2 = {i for i, v in enumerate(x[1].tolist()) if math.isfinite(v)}
    assert CLOSE_ID not in allowed1 and BLANK_ID not in allowed1
    assert CLOSE_ID in allowed2 and STOP_ID not in allowed2
    assert g.state == [THINK, FIRST, THINK]


# ------------------------------------------------------------------------- a real (random) tiny model

CFG = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256)
CHATS = [
    [{"role": "system", "content": "You are a traveller."}, {"role": "user", "content": "Where do you want to go?"}],
    [{"role": "user", "content": "hello, how can I help you with your order today?"}],
]


@pytest.fixture(scope="module")
def tok():
    from mimesis_lab.tokenizer import train_tokenizer

    texts = ["<think>i want a cheap hotel</think>hello, how can I help you with your order today?",
             "I want a refund for my shipping, the policy says so."] * 20
    return train_tokenizer(texts, vocab_size=300, min_frequency=1)


@pytest.fixture(scope="module")
def backend(tok):
    model = build_tiny_model(CFG, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    return TransformersBackend(model, tok, batch_size=8)


def test_a_random_model_always_replies_in_the_format_when_guided(backend):
    # a random model never writes <think>…</think>utterance by itself; guided, every sample parses
    prompts = CHATS * 8
    for think_format in (False, True):
        gens = backend.generate(prompts, SamplingParams(max_new_tokens=16, temperature=1.0, seed=7,
                                                        think_format=think_format))
        ok = [parse_reply(g.text).ok for g in gens]
        if think_format:
            assert all(ok), [g.text for g, o in zip(gens, ok) if not o]
            assert all(g.guided >= 1 for g in gens)          # at least the forced opening <think>
            assert sum(g.forced_close for g in gens) >= 1
            assert all(len(g.token_ids) <= 16 for g in gens)
        else:
            assert sum(ok) <= 2
            assert all(g.guided == 0 and not g.forced_close for g in gens)


def test_guided_greedy_batch_equals_one_by_one(backend):
    p = SamplingParams(max_new_tokens=12, temperature=0.0, think_format=True)
    together = backend.generate(CHATS, p)
    alone = [backend.generate([c], p)[0] for c in CHATS]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert [g.guided for g in together] == [g.guided for g in alone]


def test_a_tokenizer_without_single_think_tokens_is_refused():
    from mimesis_lab.rollout.think_guide import think_tokens

    class NoThink:
        unk_token_id = 0

        def convert_tokens_to_ids(self, t):
            return 0

        def decode(self, ids):
            return "<unk>"

    with pytest.raises(ValueError, match="single token"):
        think_tokens(NoThink())


def test_the_server_takes_think_format_and_counts_the_guidance(tok):
    from mimesis_lab.rollout.serve import ModelServer

    model = build_tiny_model(CFG, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    server = ModelServer(model, tok)
    server.start()
    try:
        body = {"messages": CHATS[0], "max_tokens": 12, "temperature": 0.0, "think_format": True}
        r = httpx.post(f"{server.url}/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert parse_reply(r.json()["choices"][0]["message"]["content"]).ok
        s = server.stats()
        assert s["guided_requests"] == 1 and s["guided_replies"] == 1 and s["guided_tokens"] >= 1
        r = httpx.post(f"{server.url}/chat/completions", json=body | {"think_format": "yes"}, timeout=60)
        assert r.status_code == 400 and "think_format" in r.text
        r = httpx.post(f"{server.url}/chat/completions", json=body | {"think_format": False}, timeout=60)
        assert r.status_code == 200 and server.stats()["guided_requests"] == 1
    finally:
        server.stop()


def test_sampling_body_sends_think_format_only_when_set():
    from mimesis_lab.rollout.backends import sampling_body

    assert "think_format" not in sampling_body("m", SamplingParams())
    assert sampling_body("m", SamplingParams(think_format=True))["think_format"] is True


# ------------------------------------------------------------------------- an RL step's user side, end to end

class _AskingAgent:
    """A scripted agent (backend double) that asks the user every turn, tokenised like a model's output."""

    def __init__(self, tok):
        self.tok = tok

    def generate_ids(self, prompts, params):
        from mimesis_lab.rollout.backends import Generation

        out = []
        for p in prompts:
            ids = self.tok.encode("[action] What matters most to you?", add_special_tokens=False) + [
                self.tok.eos_token_id]
            out.append(Generation(list(p), ids, [-1.0] * len(ids), self.tok.decode(ids), "stop"))
        return out


@pytest.mark.parametrize("think_format", [False, True])
def test_an_rl_step_with_an_untrained_simulator_has_no_invalid_episode_when_guided(tmp_path, think_format):
    """collect_episodes on TravelGym with a random tiny simulator served in-process (kind `simulator`, behind the
    real shim): decoding freely, its replies carry no reasoning; under the grammar every reply has reasoning and
    an utterance, no episode is invalid, and the step reports the server's guided_* counters."""
    import random

    from mimesis_lab.config import load_params
    from mimesis_lab.envs.gyms.registry import MODULES, load_tasks
    from mimesis_lab.rollout.agent_env import SERVER_STAT_KEYS, collect_episodes, start_user_side
    from mimesis_lab.tokenizer import train_tokenizer

    tasks = {"travel": load_tasks("travel")}
    rows = MODULES["travel"].build_rows(tasks["travel"], "train")
    tok = train_tokenizer([m["content"] for r in rows for m in r["prompt"]] + ["<think>cheap</think>yes"],
                          vocab_size=600, min_frequency=1)
    sim_dir = tmp_path / "sim"
    build_tiny_model(CFG, len(tok), tok.pad_token_id, tok.eos_token_id).save_pretrained(sim_dir)
    tok.save_pretrained(sim_dir)
    base = load_params(Path(__file__).resolve().parents[1] / "params.yaml").agent_grpo
    cfg = base.model_copy(update={
        "prompts_per_step": 2, "rollouts_per_prompt": 2, "gyms": {"travel": 1.0},
        "user": base.user.model_copy(update={"kind": "simulator", "model_path": str(sim_dir), "max_new_tokens": 12,
                                             "format_retries": 0, "think_format": think_format}),
        "rollout": base.rollout.model_copy(update={"max_turns": 2})})
    server, shim, model = start_user_side(cfg.user, max_episodes=8)
    try:
        batch = collect_episodes(cfg, 0, 0, 1, {"travel": rows}, tasks, shim, model, _AskingAgent(tok), tok,
                                 user_server=server)
    finally:
        shim.stop()
        server.stop()
    assert len(batch.trajs) == 4
    assert batch.user_stats["batches"] >= 1 and batch.user_stats["round_wait_capped"] == 0   # always reported
    replies = sum(len(batch.replies[t.traj_id]) for t in batch.trajs)
    assert replies >= 4
    if think_format:
        assert [t.invalid for t in batch.trajs] == [None] * 4
        assert batch.user_stats["format_failures"] == 0
        assert set(SERVER_STAT_KEYS) <= set(batch.user_stats)
        assert batch.user_stats["guided_requests"] == replies and batch.user_stats["guided_replies"] == replies
        assert all(r for t in batch.trajs for r in batch.replies[t.traj_id])       # every user reply has text
        assert all(z for t in batch.trajs for z in batch.privileged[t.traj_id])    # and reasoning behind it
    else:   # the shim takes a reply without think tags as a plain utterance: no reasoning for a coach
        assert sum(bool(z) for t in batch.trajs for z in batch.privileged[t.traj_id]) <= 1
        assert not set(SERVER_STAT_KEYS) & set(batch.user_stats)
