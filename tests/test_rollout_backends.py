"""Generation backends: transformers (batched == alone, log-probs, stop/length, seeding),
OpenAI-compatible (against a real local HTTP server), vLLM (unavailable error; GPU smoke)."""
from __future__ import annotations

import json
import math
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from mimesis_lab.config import ModelParams
from mimesis_lab.models import build_tiny_model
from mimesis_lab.rollout import (
    BackendUnavailable,
    Generation,
    GenerationBackend,
    OpenAIBackend,
    SamplingParams,
    TransformersBackend,
    make_backend,
)

CFG = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256)
CHATS = [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "You are a customer."},
     {"role": "user", "content": "How can I help you with your order today?"}],
    [{"role": "user", "content": "world hello world"}, {"role": "assistant", "content": "hi"},
     {"role": "user", "content": "again"}],
    [{"role": "user", "content": "a much longer question about the refund policy and shipping"}],
]


@pytest.fixture(scope="module")
def tok():
    from mimesis_lab.tokenizer import train_tokenizer

    texts = ["hello world, how can I help you with your order today?",
             "I want a refund for my shipping, the policy says so."] * 20
    return train_tokenizer(texts, vocab_size=300, min_frequency=1)


def _model(tok, seed=1234):
    m = build_tiny_model(CFG.model_copy(update={"seed": seed}), len(tok), tok.pad_token_id, tok.eos_token_id)
    return m.eval()


@pytest.fixture(scope="module")
def backend(tok):
    return TransformersBackend(_model(tok), tok, batch_size=8)


GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=[])


def test_protocol_and_factory(tok):
    b = make_backend("transformers", model=_model(tok), tokenizer=tok, batch_size=2)
    assert isinstance(b, TransformersBackend) and isinstance(b, GenerationBackend)
    assert isinstance(OpenAIBackend("http://127.0.0.1:1/v1", "m"), GenerationBackend)
    with pytest.raises(ValueError, match="unknown generation backend"):
        make_backend("nope")
    with pytest.raises(ValueError):
        SamplingParams(max_new_tokens=0)


def test_greedy_batch_equals_one_by_one(backend, tok):
    batched = backend.generate(CHATS, GREEDY)
    alone = [backend.generate([c], GREEDY)[0] for c in CHATS]
    small = TransformersBackend(backend.model, tok, batch_size=3).generate(CHATS, GREEDY)
    for b, a, s, chat in zip(batched, alone, small, CHATS):
        assert b.finish_reason == "length" and b.error is None
        assert len(b.token_ids) == 12
        assert b.token_ids == a.token_ids == s.token_ids
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert text.endswith("<|im_start|>assistant\n") or "assistant" in text[-40:]
        assert b.prompt_ids == tok(text, add_special_tokens=False)["input_ids"]
        assert b.text == tok.decode(b.token_ids, skip_special_tokens=False)
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    # prompts of different lengths really were padded together
    assert len({len(g.prompt_ids) for g in batched}) > 1


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(max_new_tokens=10, temperature=0.7, top_p=0.9,
                                                           seed=3, stop_token_ids=[])])
def test_logprobs_match_teacher_forcing(backend, params):
    gens = backend.generate(CHATS, params)
    model = backend.model
    for g in gens:
        assert len(g.logprobs) == len(g.token_ids) > 0
        assert all(math.isfinite(x) and x <= 0 for x in g.logprobs)
        full = torch.tensor([g.prompt_ids + g.token_ids])
        with torch.no_grad():
            logits = model(input_ids=full).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        n = len(g.prompt_ids)
        ref = [float(lp[n - 1 + t, tid]) for t, tid in enumerate(g.token_ids)]
        assert g.logprobs == pytest.approx(ref, abs=1e-4)


def test_stop_token_and_length(backend, tok):
    free = backend.generate(CHATS[:2], GREEDY)
    # the first generated token as stop token: generation ends right there
    g = backend.generate([CHATS[0]], SamplingParams(max_new_tokens=12, temperature=0,
                                                    stop_token_ids=[free[0].token_ids[0]]))[0]
    assert g.finish_reason == "stop" and g.token_ids == free[0].token_ids[:1]
    # a later token as stop: ends at its first occurrence, stop token kept; the other row continues
    k = 3
    stop_tok = free[1].token_ids[k]
    first = free[1].token_ids.index(stop_tok)
    both = backend.generate(CHATS[:2], SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=[stop_tok]))
    assert both[1].finish_reason == "stop" and both[1].token_ids == free[1].token_ids[:first + 1]
    assert both[1].token_ids[-1] == stop_tok and len(both[1].logprobs) == first + 1
    if stop_tok not in free[0].token_ids:
        assert both[0].finish_reason == "length" and both[0].token_ids == free[0].token_ids
    # max_new_tokens reached -> length
    short = backend.generate([CHATS[0]], SamplingParams(max_new_tokens=3, temperature=0, stop_token_ids=[]))[0]
    assert short.finish_reason == "length" and short.token_ids == free[0].token_ids[:3]
    # default stop = tokenizer eos
    d = SamplingParams(max_new_tokens=5, temperature=0)
    assert all(g.finish_reason == "length" or g.token_ids[-1] == tok.eos_token_id
               for g in backend.generate(CHATS, d))


def test_seeded_sampling_reproducible(backend, tok):
    p = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=7, stop_token_ids=[])
    a = backend.generate(CHATS, p)
    b = backend.generate(CHATS, p)
    c = TransformersBackend(backend.model, tok, batch_size=1).generate(CHATS, p)
    assert [g.token_ids for g in a] == [g.token_ids for g in b] == [g.token_ids for g in c]
    other = backend.generate(CHATS, SamplingParams(max_new_tokens=10, temperature=1.0, seed=8, stop_token_ids=[]))
    assert [g.token_ids for g in a] != [g.token_ids for g in other]


def test_shared_prompts_and_early_finishers(backend, tok):
    """A GRPO group's identical prompts share one prefill; rows that stop leave the batch: neither
    changes any output (greedy ids equal generating each alone; sampled duplicates keep their own
    seeds, so they differ)."""
    chats = [CHATS[1], CHATS[1], CHATS[0], CHATS[1]]
    greedy = backend.generate(chats, GREEDY)
    alone = [backend.generate([c], GREEDY)[0] for c in chats]
    assert [g.token_ids for g in greedy] == [a.token_ids for a in alone]
    for g, a in zip(greedy, alone):
        assert g.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    p = SamplingParams(max_new_tokens=10, temperature=1.0, seed=11, stop_token_ids=[])
    sampled = backend.generate(chats, p)
    one = TransformersBackend(backend.model, tok, batch_size=1).generate(chats, p)
    assert [g.token_ids for g in sampled] == [g.token_ids for g in one]
    assert len({tuple(g.token_ids) for g in (sampled[0], sampled[1], sampled[3])}) > 1
    # a row that stops early (its 2nd token as stop) while the others continue to the length limit
    stop_tok = greedy[2].token_ids[1]
    mixed = backend.generate(chats, SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=[stop_tok]))
    for g, a in zip(mixed, alone):
        k = a.token_ids.index(stop_tok) + 1 if stop_tok in a.token_ids else len(a.token_ids)
        assert g.token_ids == a.token_ids[:k]
        assert g.finish_reason == ("stop" if stop_tok in a.token_ids else "length")


def test_prefix_cache_reuses_kv_without_changing_outputs(backend, tok):
    """A multi-turn prompt that extends an earlier prompt + reply reuses its KV: same greedy ids and
    log-probs (to 1e-4) as a fresh prefill; the cache is dropped when the weights change."""
    cached = TransformersBackend(backend.model, tok, batch_size=4, prefix_cache_tokens=10_000)
    p = SamplingParams(max_new_tokens=10, temperature=0, stop_token_ids=[])
    first = cached.generate(CHATS, p)
    nxt = [list(g.prompt_ids) + list(g.token_ids) + tok.encode("<|im_end|>\n<|im_start|>user\nand then?<|im_end|>\n"
                                                              "<|im_start|>assistant\n", add_special_tokens=False)
           for g in first]
    fresh = backend.generate_ids(nxt, p)
    again = cached.generate_ids(nxt, p)
    assert cached.prefix_cache.hits >= 3 and cached.prefix_cache.reused_tokens > 0
    for a, b in zip(fresh, again):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    sampled = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5, stop_token_ids=[])
    assert [g.token_ids for g in cached.generate_ids(nxt, sampled)] == \
        [g.token_ids for g in backend.generate_ids(nxt, sampled)]
    cached.update_weights(backend.model)
    assert not cached.prefix_cache.entries


def test_update_weights_and_empty_prompt(tok):
    b = TransformersBackend(_model(tok, seed=1), tok)
    target = _model(tok, seed=2)
    ref = TransformersBackend(target, tok).generate(CHATS, GREEDY)
    b.update_weights(target.state_dict())
    assert [g.token_ids for g in b.generate(CHATS, GREEDY)] == [g.token_ids for g in ref]
    out = b.generate_ids([[], ref[0].prompt_ids], GREEDY)
    assert out[0].finish_reason == "error" and "empty" in out[0].error
    assert out[1].token_ids == ref[0].token_ids


# ----------------------------------------------------------------------------- OpenAI backend

VALID = {"choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "Hi there"},
                      "logprobs": {"content": [{"token": "Hi", "logprob": -0.5},
                                               {"token": " there", "logprob": -1.25}]}}]}
VALID_IDS = {"choices": [{"index": 0, "finish_reason": "length",
                          "message": {"role": "assistant", "content": "ab"},
                          "logprobs": {"content": [{"token": "token_id:5", "logprob": -0.1},
                                                   {"token": "token_id:9", "logprob": -0.2}]}}]}
COMPLETION = {"choices": [{"index": 0, "finish_reason": "length", "text": "xy",
                           "logprobs": {"tokens": ["x", "y"], "token_logprobs": [-0.3, -0.4]}}]}


@pytest.fixture(scope="module")
def server():
    hits: dict[str, int] = {}
    bodies: list[dict] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            n = int(self.headers.get("Content-Length", 0))
            bodies.append(json.loads(self.rfile.read(n)))
            mode = self.path.split("/")[1]
            hits[mode] = hits.get(mode, 0) + 1
            if mode == "err":
                code, payload = 500, b'{"error": "boom"}'
            elif mode == "bad":
                code, payload = 200, b'{"choices": [ not json'
            elif mode == "empty":
                code, payload = 200, json.dumps({"choices": [{"message": {"content": ""}}]}).encode()
            elif mode == "ids":
                code, payload = 200, json.dumps(VALID_IDS).encode()
            elif self.path.endswith("/completions") and not self.path.endswith("/chat/completions"):
                code, payload = 200, json.dumps(COMPLETION).encode()
            else:
                code, payload = 200, json.dumps(VALID).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", hits, bodies
    srv.shutdown()
    srv.server_close()


def _oa(url, mode, **kw):
    return OpenAIBackend(f"{url}/{mode}/v1", "sim", api_key_env="MIMESIS_TEST_NO_KEY", timeout_s=5,
                         max_retries=2, backoff_s=0.0, **kw)


def test_openai_valid_answer(server):
    url, hits, bodies = server
    gens = _oa(url, "ok").generate(CHATS[:3], SamplingParams(max_new_tokens=7, temperature=0.5, seed=1))
    assert len(gens) == 3
    for g in gens:
        assert g.finish_reason == "stop" and g.error is None and g.text == "Hi there"
        assert g.logprobs == [-0.5, -1.25] and g.token_ids == [] and g.prompt_ids == []
    body = bodies[-1]
    assert body["logprobs"] is True and body["max_tokens"] == 7 and body["model"] == "sim"
    assert body["messages"] in CHATS[:3] and body["seed"] == 1
    ids = _oa(url, "ids").generate([CHATS[0]], SamplingParams(max_new_tokens=2))[0]
    assert ids.token_ids == [5, 9] and ids.finish_reason == "length"
    comp = _oa(url, "ok").generate_ids([[1, 2, 3]], SamplingParams(max_new_tokens=2))[0]
    assert comp.text == "xy" and comp.logprobs == [-0.3, -0.4] and comp.prompt_ids == [1, 2, 3]
    assert bodies[-1]["prompt"] == [1, 2, 3]


@pytest.mark.parametrize("mode,needle", [("err", "HTTP 500"), ("bad", "malformed JSON"), ("empty", "no message")])
def test_openai_failures_are_data(server, mode, needle):
    url, hits, _ = server
    before = hits.get(mode, 0)
    gens = _oa(url, mode, max_concurrency=1).generate(CHATS[:2], SamplingParams(max_new_tokens=4))
    assert len(gens) == 2
    for g in gens:
        assert isinstance(g, Generation) and g.finish_reason == "error" and not g.ok
        assert needle in g.error and g.text == "" and g.token_ids == [] and g.logprobs == []
    if mode != "empty":
        assert hits[mode] - before == 2 * 3  # 1 try + 2 retries per prompt


def test_openai_unreachable_is_data():
    # a port nothing listens on (bind, read the port, close)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    g = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "m", timeout_s=2, max_retries=1, backoff_s=0).generate(
        [CHATS[0]], SamplingParams())[0]
    assert g.finish_reason == "error" and "transport error" in g.error


# ----------------------------------------------------------------------------- vLLM


def test_vllm_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(BackendUnavailable, match="vllm"):
        make_backend("vllm", model_path="/nonexistent")


def test_vllm_needs_cuda(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable, match="CUDA"):
        make_backend("vllm", model_path="/nonexistent")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_vllm_generates(tok, tmp_path):
    pytest.importorskip("vllm")
    from mimesis_lab.models import save_hf

    save_hf(_model(tok), tok, tmp_path / "m")
    b = make_backend("vllm", model_path=str(tmp_path / "m"), gpu_memory_utilization=0.2, enforce_eager=True)
    gens = b.generate(CHATS, GREEDY)
    assert all(g.finish_reason == "length" and len(g.token_ids) == 12 for g in gens)
    assert all(len(g.logprobs) == 12 and all(x <= 0 for x in g.logprobs) for g in gens)


def test_decoding_appends_to_a_reserved_kv_buffer(backend, tok):
    """The KV cache of a generation appends in place (no whole-cache copy per step); rows that
    finish early leave the batch and the buffer is rebuilt at the reserved length, not doubled."""
    from mimesis_lab.rollout.backends import _GROWING_LAYER, _reserve_cache

    assert _GROWING_LAYER is not None
    from transformers import DynamicCache

    k = torch.randn(3, 2, 5, 4)
    past = DynamicCache(ddp_cache_data=[(k, k + 1)])
    _reserve_cache(past, 16)
    lay = past.layers[0]
    assert type(lay) is _GROWING_LAYER and lay._kbuf.shape[-2] == 16 and torch.equal(lay.keys, k)
    buf = lay._kbuf
    new = torch.randn(3, 2, 1, 4)
    keys, values = lay.update(new, new)
    assert lay._kbuf is buf and torch.equal(keys, torch.cat([k, new], dim=-2))
    assert torch.equal(values, torch.cat([k + 1, new], dim=-2))
    past.batch_select_indices(torch.tensor([0, 2]))
    keys, _ = lay.update(new[:2], new[:2])
    assert lay._kbuf.shape[-2] == 16 and keys.shape == (2, 2, 7, 4)
    assert torch.equal(keys, torch.cat([k[[0, 2]], new[[0, 2]], new[:2]], dim=-2))
    for _ in range(10):                      # past the reservation: it grows
        keys, _ = lay.update(new[:2], new[:2])
    assert keys.shape[-2] == 17 and lay._kbuf.shape[-2] >= 17 and torch.equal(keys[:, :, -1:], new[:2])
    # and generation still matches teacher forcing / alone (the other tests), with early stops
    p = SamplingParams(max_new_tokens=12, temperature=0.0)
    together = backend.generate(CHATS, p)
    alone = [backend.generate([c], p)[0] for c in CHATS]
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]


def test_prompts_of_very_different_lengths_prefill_in_buckets(backend, tok, monkeypatch):
    """A batch mixing short and long prompts is prefilled in length buckets (less padding); the
    result is the same as each prompt alone: greedy tokens, log-probs, seeded samples."""
    import mimesis_lab.rollout.backends as B

    seen = []
    real = B._buckets
    monkeypatch.setattr(B, "_buckets", lambda lens, overhead: seen.append(real(lens, overhead)) or seen[-1])
    assert real([3, 4, 5, 150, 160], 64) == [(0, 3), (3, 5)] and real([10, 12], 64) == [(0, 2)]
    long = "I want a refund for my shipping, the policy says so. " * 8
    chats = [[{"role": "user", "content": "hello"}], [{"role": "user", "content": long}],
             [{"role": "user", "content": "hi there"}], [{"role": "user", "content": long + " again please"}],
             [{"role": "user", "content": "world"}]]
    for p in (GREEDY, SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=3, stop_token_ids=[])):
        seen.clear()
        together = backend.generate(chats, p, seeds=[5, 6, 7, 8, 9])
        assert seen and len(seen[0]) >= 2, seen             # the bucket path was taken
        alone = [backend.generate([c], p, seeds=[s])[0] for c, s in zip(chats, [5, 6, 7, 8, 9])]
        for t, a in zip(together, alone):
            assert t.token_ids == a.token_ids
            assert t.logprobs == pytest.approx(a.logprobs, abs=1e-4)
