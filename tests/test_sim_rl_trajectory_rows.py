"""One prefix-tree row per simulator rollout (``sim_rl.encode: trajectory``) against one row per turn
(``turn``): the same trained tokens, log-probs, PPO-clip loss and gradients on a fixed batch."""
from __future__ import annotations

import math
import random
import types

import pytest
import torch

from mimesis_lab.config import ModelParams
from mimesis_lab.envs.base import TaskScore
from mimesis_lab.models import build_tiny_model
from mimesis_lab.rl.policy import UpdateRow, pad_update_rows, segment_row, token_logprobs, trajectory_row
from mimesis_lab.rl.ppo import kl_term, ppo_update
from mimesis_lab.rl.sim_batch import build_update_rows
from mimesis_lab.rollout.sim_rollout import Rollout, Segment, render_prompt

CFG = ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=512, seed=3)
SYSTEM = {"role": "system", "content": "You are a customer who wants a refund for a late order."}
AGENT = ["How can I help you?", "Sure, what is the order number?", "Thanks, the refund is on its way."]


def test_tree_row_hand_worked():
    # Tokens by name: S system, U1/U2 the agent, A the generation prompt, T/t/E <think> reasoning </think>,
    # r1/r2 utterances, Z end of turn. Turn 2's history keeps r1 but not turn 1's <think> block.
    S, U1, U2, A, T, E, Z, t1, r1, t2, r2 = range(1, 12)
    turn1 = segment_row([S, U1, A], [T, t1, E, r1, Z], [-1.0] * 5, 0.5, "g", "r")
    turn2 = segment_row([S, U1, A, r1, Z, U2, A], [T, t2, E, r2, Z], [-2.0] * 5, 0.5, "g", "r")
    row = trajectory_row([turn1, turn2])
    # [S U1 A] is shared; turn 2 branches off after A (index 2) with its prompt tail [r1 Z U2 A] + response
    assert row.input_ids == (S, U1, A, T, t1, E, r1, Z, r1, Z, U2, A, T, t2, E, r2, Z)
    assert row.parents == (-1, 0, 1, 2, 3, 4, 5, 6, 2, 8, 9, 10, 11, 12, 13, 14, 15)
    assert row.positions == (3, 4, 5, 6, 7, 12, 13, 14, 15, 16)
    assert row.old_logp == (-1.0,) * 5 + (-2.0,) * 5 and row.adv == (0.5,) * 10
    b = pad_update_rows([row], pad_id=0)
    # each token sits where it sits in its own turn's row: turn 2's branch continues at A's position 2
    assert b["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    seen = b["attention_mask"][0, 0]
    assert seen.shape == (17, 17)
    # turn 2's first response token sees exactly turn 2's prompt: S U1 A r1 Z U2 A (indices 0-2, 8-11) and itself
    assert seen[12].nonzero().flatten().tolist() == [0, 1, 2, 8, 9, 10, 11, 12]


def test_a_prompt_laid_down_already_still_precedes_its_response():
    # the same prompt twice (a retried turn): the second response must follow the prompt's last token,
    # so that token is laid again as the head of the new branch
    first = segment_row([1, 2, 3], [10, 11], [-1.0, -1.0], 1.0, "g", "r")
    again = segment_row([1, 2, 3], [20, 21], [-1.0, -1.0], 1.0, "g", "r")
    row = trajectory_row([first, again])
    assert row.input_ids == (1, 2, 3, 10, 11, 3, 20, 21) and row.parents == (-1, 0, 1, 2, 3, 1, 5, 6)
    assert row.positions == (3, 4, 6, 7)


def test_a_trained_token_must_follow_its_parent():
    bad = UpdateRow((1, 2, 3, 4), (3,), (-1.0,), (1.0,), "g", "r", parents=(-1, 0, 1, 1))
    with pytest.raises(ValueError, match="parent must be the token before it"):
        pad_update_rows([bad], pad_id=0)


def test_a_tree_row_needs_sdpa_or_eager_attention():
    # flex (or flash) attention would not apply the 4D mask as given: refused, never silently wrong
    flex = build_tiny_model(CFG, 32, 0, 1, attn_implementation="flex_attention")
    row = trajectory_row([segment_row([1, 2, 3], [4, 5], [-1.0, -1.0], 1.0, "g", "r"),
                          segment_row([1, 2, 6], [7], [-1.0], 1.0, "g", "r")])
    b = pad_update_rows([row], pad_id=0)
    with pytest.raises(ValueError, match="sdpa or eager"):
        token_logprobs(flex, b["input_ids"], b["attention_mask"], b["position_ids"])


# -- a fixed batch of rollouts rendered with the real chat template -------------------------------------

@pytest.fixture(scope="module")
def tok():
    from mimesis_lab.tokenizer import train_tokenizer

    text = " ".join([SYSTEM["content"], *AGENT, "<think>the order is late</think>I want my money back, it is 42."])
    return train_tokenizer([text] * 40, vocab_size=300, min_frequency=1)


def _episode(tok, replies: list[tuple[str, str | None]]) -> list[Segment]:
    """Segments of an episode whose simulator says ``replies`` (reasoning, utterance); the history keeps only
    the utterance (a reply without reasoning, a format failure, is kept as written)."""
    history, segments = [SYSTEM], []
    for k, (reasoning, utterance) in enumerate(replies):
        history.append({"role": "user", "content": AGENT[k]})
        text = utterance if reasoning is None else f"<think>{reasoning}</think>{utterance}"
        response = tok.encode(text + "<|im_end|>", add_special_tokens=False)
        # rollout log-probs near the tiny model's (about -log 300), so ratios fall inside and outside the clip
        old = [-5.7 + 0.15 * ((3 * j + k) % 5 - 2) for j in range(len(response))]
        segments.append(Segment(render_prompt(tok, history), response, old, "stop", reasoning is not None))
        history.append({"role": "assistant", "content": utterance})
    return segments


def _rollout(rid: str, group: str, segments: list[Segment], raw: float | None = None,
             invalid: str | None = None) -> Rollout:
    r = Rollout(group, rid, "usersim_behavior", "t", segments=segments)
    if invalid:
        r.invalid, r.invalid_detail = invalid, "because"
    else:
        r.score = TaskScore(raw=raw)
    return r


def _batch(tok) -> list[Rollout]:
    return [
        # three turns, each later prompt without the earlier <think> blocks
        _rollout("A", "g1", _episode(tok, [("late order", "I want my money back."), ("number", "It is 42."),
                                           ("done", "Thanks.")]), raw=0.9),
        # a format failure: the reply without reasoning is kept verbatim in the next prompt
        _rollout("B", "g1", _episode(tok, [(None, "I want a refund."), ("number", "It is 42.")]), raw=0.2),
        # a single turn
        _rollout("C", "g1", _episode(tok, [("late", "Refund please.")]), raw=0.5),
        # invalid: left out (exclude) or scored 0 and kept (zero)
        _rollout("D", "g1", _episode(tok, [("late", "I want my money back."), ("x", "42")]),
                 invalid="judge_failure"),
        # another group; its last segment generated nothing (not trained on either way)
        _rollout("E", "g2", _episode(tok, [("late", "Money back."), ("n", "42.")])
                 + [Segment(render_prompt(tok, [SYSTEM]), [], [], "stop", True)], raw=1.0),
        _rollout("F", "g2", _episode(tok, [("late", "Refund.")]), raw=0.0),
    ]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tok):
    return build_tiny_model(CFG, len(tok), tok.pad_token_id, tok.eos_token_id,
                            attn_implementation=request.param).eval()


def _trained(b: dict[str, torch.Tensor], logp: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The trained tokens of a padded batch in row order: their targets, old log-probs, advantages (and log-probs)."""
    sel = b["mask"] != 0
    out = {"target": b["input_ids"][:, 1:][sel], "old_logp": b["old_logp"][sel], "adv": b["adv"][sel]}
    if logp is not None:
        out["logp"] = logp[sel]
    return out


@pytest.mark.parametrize("policy", ["exclude", "zero"])
def test_same_segments_fewer_rows_and_tokens(tok, policy):
    by_turn, st_turn = build_update_rows(_batch(tok), policy, encode="turn")
    by_traj, st_traj = build_update_rows(_batch(tok), policy, encode="trajectory")
    # A 3 + B 2 + C 1 + E 2 + F 1 segments (+ D 2 under zero); E's empty segment is in neither
    n_seg = 9 if policy == "exclude" else 11
    assert st_turn["segments_in_update"] == st_traj["segments_in_update"] == st_turn["rows_in_update"] == n_seg
    assert st_traj["rows_in_update"] == n_seg - (4 if policy == "exclude" else 5)      # one row per rollout
    assert [r.rollout_id for r in by_traj] == list("ABCEF" if policy == "exclude" else "ABCDEF")
    for key in ("rollouts_in_update", "tokens_in_update", "groups", "groups_single_rollout",
                "groups_zero_variance", "adv_abs_mean"):
        assert st_traj[key] == st_turn[key], key
    assert st_traj["tokens_encoded"] < st_turn["tokens_encoded"]
    assert st_turn["tokens_encoded"] == sum(len(r.input_ids) for r in by_turn)
    a, b = _trained(pad_update_rows(by_turn, tok.pad_token_id)), _trained(pad_update_rows(by_traj, tok.pad_token_id))
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert a["adv"].abs().sum() > 0


@pytest.mark.parametrize("policy", ["exclude", "zero"])
def test_every_trained_log_prob_is_its_turn_rows(tok, model, policy):
    got = {}
    for encode in ("turn", "trajectory"):
        rows, _ = build_update_rows(_batch(tok), policy, encode=encode)
        b = pad_update_rows(rows, tok.pad_token_id)
        assert ("position_ids" in b) == (encode == "trajectory")
        with torch.no_grad():
            got[encode] = _trained(b, token_logprobs(model, b["input_ids"], b["attention_mask"], b.get("position_ids")))
    assert torch.equal(got["turn"]["target"], got["trajectory"]["target"])
    torch.testing.assert_close(got["trajectory"]["logp"], got["turn"]["logp"], rtol=0, atol=1e-5)
    assert math.isfinite(float(got["turn"]["logp"].sum()))


class RecordingEngine:
    """The DeepSpeed engine as :func:`ppo_update` drives it, around a plain module: ``backward``
    accumulates, ``step`` records the accumulated gradients and clears them (no optimizer)."""

    device = torch.device("cpu")

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.grads: list[dict[str, torch.Tensor]] = []

    def __call__(self, **kw):
        return self.module(**kw)

    def parameters(self):
        return self.module.parameters()

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool) -> None:
        loss.backward()

    def step(self) -> None:
        self.grads.append({n: p.grad.clone() for n, p in self.module.named_parameters()})
        self.module.zero_grad()

    def zero_optimization_stage(self) -> int:
        return 0


@pytest.mark.parametrize("micro_rows", [64, 2])
def test_ppo_loss_and_gradients_equal(tok, model, micro_rows):
    # one minibatch (one optimizer step) over the whole batch; micro_rows=2 also splits it into chunks
    cfg = types.SimpleNamespace(ppo_epochs=1, minibatches=1, micro_rows=micro_rows, clip_eps=0.2)
    stats, grads = {}, {}
    for encode in ("turn", "trajectory"):
        rows, _ = build_update_rows(_batch(tok), "exclude", encode=encode)
        engine = RecordingEngine(model)
        stats[encode] = ppo_update(engine, rows, cfg, random.Random(0), tok.pad_token_id, world=1)
        (grads[encode],) = engine.grads
    assert stats["trajectory"]["update/tokens"] == stats["turn"]["update/tokens"]
    for key in ("update/ppo_loss", "update/clip_frac", "update/approx_kl", "update/logp_mismatch"):
        assert stats["trajectory"][key] == pytest.approx(stats["turn"][key], rel=1e-5, abs=1e-7), key
    assert 0 < stats["turn"]["update/clip_frac"] < 1          # some tokens clipped, some not
    norm = torch.sqrt(sum((g ** 2).sum() for g in grads["turn"].values()))
    assert norm > 0
    for name, g in grads["turn"].items():
        torch.testing.assert_close(grads["trajectory"][name], g, rtol=1e-4, atol=1e-6 * float(norm), msg=name)


def test_kl_to_the_initial_policy_adds_its_gradient_only_after_the_policy_moved(tok, model):
    """``kl_coef > 0``: the loss is L_PPO + kl_coef * L_KL against the frozen reference. Against a reference
    equal to the policy the KL and its gradient are 0 (same update as without it); against a moved
    reference the update differs by exactly kl_coef times the KL term's own gradient."""
    import copy

    rows, _ = build_update_rows(_batch(tok), "exclude", encode="turn")
    base = types.SimpleNamespace(ppo_epochs=1, minibatches=1, micro_rows=64, clip_eps=0.2)
    with_kl = types.SimpleNamespace(**vars(base), kl_coef=0.5)
    grads, stats = {}, {}
    for name, cfg, ref in (("plain", base, None), ("same_ref", with_kl, copy.deepcopy(model))):
        engine = RecordingEngine(model)
        stats[name] = ppo_update(engine, rows, cfg, random.Random(0), tok.pad_token_id, world=1, ref=ref)
        (grads[name],) = engine.grads
    assert "update/kl_ref" not in stats["plain"] and stats["same_ref"]["update/kl_ref"] == pytest.approx(0, abs=1e-9)
    for n, g in grads["plain"].items():
        torch.testing.assert_close(grads["same_ref"][n], g, rtol=1e-5, atol=1e-8, msg=n)

    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn_like(p, generator=torch.Generator().manual_seed(1)))
    engine = RecordingEngine(model)
    out = ppo_update(engine, rows, with_kl, random.Random(0), tok.pad_token_id, world=1, ref=moved)
    (g_kl,) = engine.grads
    assert out["update/kl_ref"] > 0
    b = pad_update_rows(rows, tok.pad_token_id)
    model.zero_grad()
    kl = kl_term(moved, b, token_logprobs(model, b["input_ids"], b["attention_mask"], need=b["mask"]))
    assert float(kl.detach()) == pytest.approx(out["update/kl_ref"], rel=1e-5)
    (0.5 * kl).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(g_kl[n], grads["plain"][n] + p.grad, rtol=1e-4, atol=1e-7, msg=n)
    model.zero_grad()
    with pytest.raises(ValueError, match="reference policy"):
        ppo_update(RecordingEngine(model), rows, with_kl, random.Random(0), tok.pad_token_id, world=1)


def _replay_file(path, conversations) -> str:
    import polars as pl

    pl.DataFrame({"messages": conversations}).write_parquet(path)
    return str(path)


def test_ptx_replay_adds_exactly_its_cross_entropy_gradient(tok, model, tmp_path):
    """``ptx_coef > 0``: each optimizer step adds ptx_coef * L_SFT on ``ptx_rows`` conversations drawn from the
    update's rng after its minibatch plan; the step's gradient is the plain update's plus exactly that term's, and
    the replay's cross-entropy is logged. Conversations that cannot be replayed are left out and counted."""
    from mimesis_lab.chat import tokenize_chat
    from mimesis_lab.rl.losses import sft_loss
    from mimesis_lab.rl.policy import minibatch_plan
    from mimesis_lab.rl.ppo import load_replay

    convs = [[SYSTEM, {"role": "user", "content": a}, {"role": "assistant", "content": r}]
             for a, r in zip(AGENT, ["<think>late</think>It is 42.", "I want my money back.", "<think>ok</think>Thanks."])]
    long = [SYSTEM, {"role": "user", "content": AGENT[0]}, {"role": "assistant", "content": " ".join(AGENT * 20)}]
    path = _replay_file(tmp_path / "replay.parquet", convs + [long, [SYSTEM, {"role": "user", "content": "hi"}]])
    rows, _ = build_update_rows(_batch(tok), "exclude", encode="turn")
    base = types.SimpleNamespace(ppo_epochs=1, minibatches=1, micro_rows=64, clip_eps=0.2, seed=0)
    cfg = types.SimpleNamespace(**vars(base), ptx_coef=0.5, ptx_data=path, ptx_rows=2,
                                rollout=types.SimpleNamespace(max_total_tokens=100))
    assert load_replay(base, tok) is None
    replay = load_replay(cfg, tok)
    assert len(replay.rows) == 3 and replay.skipped == {"tokenize_error": 0, "too_long": 1, "no_target": 1}
    ids, mask = tokenize_chat(tok, convs[1])
    assert replay.rows[1].input_ids == tuple(ids)
    assert replay.rows[1].positions == tuple(t for t, m in enumerate(mask) if m)

    plain = RecordingEngine(model)
    stats = ppo_update(plain, rows, base, random.Random(0), tok.pad_token_id, world=1)
    assert "update/ptx_loss" not in stats
    engine = RecordingEngine(model)
    out = ppo_update(engine, rows, cfg, random.Random(0), tok.pad_token_id, world=1, replay=replay)
    rng = random.Random(0)
    minibatch_plan(len(rows), 1, rng)
    pick = rng.sample(range(3), 2)
    b = pad_update_rows([replay.rows[i] for i in pick], tok.pad_token_id)
    model.zero_grad()
    ce = sft_loss(token_logprobs(model, b["input_ids"], b["attention_mask"], need=b["mask"]), b["mask"])
    assert out["update/ptx_loss"] == pytest.approx(float(ce.detach()), rel=1e-6) and float(ce.detach()) > 0
    assert out["update/ppo_loss"] == pytest.approx(stats["update/ppo_loss"], rel=1e-6)
    (0.5 * ce).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(engine.grads[0][n], plain.grads[0][n] + p.grad, rtol=1e-4, atol=1e-7, msg=n)
    model.zero_grad()


def test_ptx_replay_needs_a_file_with_something_to_replay(tok, tmp_path):
    from mimesis_lab.config import AgentGRPOParams
    from mimesis_lab.rl.ppo import load_replay
    from mimesis_lab.train.runtime import TrainConfigError

    with pytest.raises(ValueError, match="ptx_coef > 0 needs ptx_data"):
        AgentGRPOParams.model_validate({"init_from": "m", "deepspeed_config": "d.json", "steps": 1,
                                        "prompts_per_step": 1, "rollouts_per_prompt": 2, "ptx_coef": 0.1})
    cfg = types.SimpleNamespace(ptx_coef=0.1, ptx_data=str(tmp_path / "missing.parquet"), ptx_rows=2, seed=0)
    with pytest.raises(TrainConfigError, match="missing.parquet"):
        load_replay(cfg, tok)
    cfg.ptx_data = _replay_file(tmp_path / "none.parquet", [[SYSTEM, {"role": "user", "content": "hi"}]])
    with pytest.raises(TrainConfigError, match=r"none.parquet: no conversation to replay is left of 1"):
        load_replay(cfg, tok)
