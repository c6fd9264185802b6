"""CSD wired into the agent job (SPEC §3.3): turn alignment with the simulator's replies, the
teacher forward on left-padded rows, the loss term inside the PPO update (value and gradient
against a hand-built teacher), the coach-endpoint precheck, leak dropping and placebo rows from
another episode. How ``agent_csd`` shares ``agent_grpo``'s settings (``agent_rl``): tests/test_config.py."""
from __future__ import annotations

import random
import types

import pytest
import torch

from mimesis_lab.jobs.agent_csd import CSD
from mimesis_lab.rl.csd import history_before, teacher_logprobs, turn_alignment, turn_positions
from mimesis_lab.rl.losses import csd_loss
from mimesis_lab.rl.policy import UpdateRow, pad_update_rows, token_logprobs
from mimesis_lab.rollout.agent_rollout import AgentTurn, Trajectory
from tests.conftest import ROOT


def _turn(n_ids: int, user_replies: int, start: int = 10, text: str = "[action] hi") -> AgentTurn:
    return AgentTurn(list(range(start, start + n_ids)), [-1.0] * n_ids, [5, 6], text, user_replies=user_replies)


def test_turn_alignment_uses_reply_counts():
    # turn 0 asks the user (reply 0), turn 1 searches (no reply), turn 2 asks again (reply 1)
    turns = [_turn(2, 1), _turn(2, 1), _turn(2, 2)]
    got = turn_alignment(turns, ["z0", "z1"], ["x0", "x1"])
    assert got == [("", "x0"), ("z0", ""), ("z0", "x1")]
    # an explicit empty reasoning entry keeps the alignment
    assert turn_alignment(turns, ["", "z1"], ["x0", "x1"]) == [("", "x0"), ("", ""), ("", "x1")]
    assert turn_alignment([], [], []) == []


def test_history_before_and_positions():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a0"}, {"role": "tool", "content": "t0"},
            {"role": "assistant", "content": "a1"}]
    assert [m["content"] for m in history_before(msgs, 0)] == ["s", "u"]
    assert [m["content"] for m in history_before(msgs, 1)] == ["s", "u", "a0", "t0"]
    with pytest.raises(ValueError):
        history_before(msgs, 2)
    tr = Trajectory("g", "r", "interact_travel", "t1", [1, 2, 3], msgs, turns=[_turn(2, 0), _turn(3, 0)])
    assert turn_positions(tr) == [[3, 4], [7, 8, 9]]
    assert sum(turn_positions(tr), []) == tr.response_positions()


@pytest.fixture(scope="module")
def tiny():
    from mimesis_lab.config import ModelParams
    from mimesis_lab.models import build_tiny_model
    from mimesis_lab.tokenizer import train_tokenizer

    tok = train_tokenizer(["I need a hotel in Lisbon near the beach. [search] hotel [answer] H3 "
                           "Ask about the budget first. Which area do you prefer?"] * 40, vocab_size=300, min_frequency=1)
    model = build_tiny_model(ModelParams(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                         max_position_embeddings=512, seed=5), len(tok), tok.pad_token_id,
                             tok.eos_token_id).eval()
    return tok, model


def test_teacher_logprobs_left_padding_matches_unpadded(tiny):
    _, model = tiny
    short, long_ = [3, 8, 9, 12, 7], [4, 5, 6, 3, 8, 9, 12, 7, 11]
    ids = torch.tensor([[0] * 4 + short, long_])
    attn = torch.tensor([[0] * 4 + [1] * 5, [1] * 9])
    with torch.no_grad():
        padded = teacher_logprobs(model, ids, attn)
        alone = token_logprobs(model, torch.tensor([short]), torch.ones(1, 5, dtype=torch.long))
        alone_long = token_logprobs(model, torch.tensor([long_]), torch.ones(1, 9, dtype=torch.long))
    assert torch.allclose(padded[0, 4:], alone[0], atol=1e-5)
    assert torch.allclose(padded[1], alone_long[0], atol=1e-5)


def _csd_cfg(**over):
    """The profile's CSD settings with ``over``; turn selection as in the reference (``require_reply`` off, the
    tiny profile turns it on) unless ``over`` says otherwise: these synthetic trajectories carry no user reasoning."""
    from mimesis_lab.config import load_params

    over = {"require_reply": False, **over}
    return load_params(ROOT / "params.yaml").agent_csd.model_copy(
        update={"csd": load_params(ROOT / "params.yaml").agent_csd.csd.model_copy(update=over)})


def _traj(tok, tid: str, reply_text: str = "[answer] H3", user_reason: str = "I wonder if they will ask me?"):
    prompt = [{"role": "system", "content": "You help travellers."}, {"role": "user", "content": "I need a hotel."}]
    p_ids = tok.encode(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False),
                       add_special_tokens=False)
    r0 = tok.encode("[action] Which area do you prefer?", add_special_tokens=False)
    env0 = tok.encode("<|im_end|>\n<|im_start|>tool\nNear the beach.<|im_end|>\n<|im_start|>assistant\n",
                      add_special_tokens=False)
    r1 = tok.encode(reply_text, add_special_tokens=False)
    t0 = AgentTurn(r0, [-2.0] * len(r0), env0, "[action] Which area do you prefer?", reward=0.0, choice="action",
                   user_replies=1)
    t1 = AgentTurn(r1, [-2.0] * len(r1), [], reply_text, reward=1.0, choice="answer", user_replies=1)
    msgs = prompt + [{"role": "assistant", "content": t0.text}, {"role": "tool", "content": "Near the beach."},
                     {"role": "assistant", "content": t1.text}]
    return Trajectory("g0", tid, "interact_travel", "travel-1", p_ids, msgs, turns=[t0, t1])


def test_csd_loss_term_matches_hand_built_teacher(tiny):
    """The chunk's CSD value equals csd_loss over a teacher computed row by row without padding,
    and the gradient reaches the student only."""
    tok, model = tiny
    cfg = _csd_cfg(turns_per_trajectory=2, placebo=False, leak_check=False, alpha=0.5)
    csd = CSD(cfg, tok, tasks={}, pad_id=tok.pad_token_id)
    trajs = [_traj(tok, "a"), _traj(tok, "b", reply_text="[search] hotel")]
    reason = "They have not asked about my budget yet. Do they need it?"
    st = csd.prepare(trajs, {"a", "b"}, {"a": [reason], "b": [reason]}, {"a": ["Near the beach."],
                     "b": ["Near the beach."]}, random.Random(0))
    assert st.counts["coach_ok"] >= 2 and st.counts["rows"] >= 2
    rows = [UpdateRow(tuple(t.ids), tuple(t.response_positions()), tuple(x for u in t.turns for x in u.logprobs),
                     tuple([0.1] * len(t.response_positions())), "g0", t.traj_id) for t in trajs]
    b = pad_update_rows(rows, tok.pad_token_id)
    logp = token_logprobs(model, b["input_ids"], b["attention_mask"])
    value, n, stats = csd.loss(model, rows, b, logp)
    # the hand-built reference: each teacher row alone, mapped by positions
    teacher = torch.full_like(logp, float("nan"))
    mask = torch.zeros_like(logp)
    for j, r in enumerate(rows):
        for trow in st.rows[r.rollout_id]:
            with torch.no_grad():
                lp = token_logprobs(model, torch.tensor([trow.input_ids]), torch.ones(1, len(trow.input_ids),
                                                                                      dtype=torch.long))[0]
            for q, p in zip(trow.teacher_positions, trow.student_positions):
                teacher[j, p - 1] = lp[q - 1]
                mask[j, p - 1] = 1.0
    want = csd_loss(logp, torch.nan_to_num(teacher), mask, beta=cfg.csd.beta)
    assert n == float(mask.sum()) == stats["tokens"]
    assert torch.allclose(value, want, atol=1e-5)
    # the same through the student's KV cache (what csd_update hands over): identical value
    logp_c, kv = token_logprobs(model, b["input_ids"], b["attention_mask"], keep_cache=True)
    value_c, n_c, _ = csd.loss(model, rows, {**b, "kv": kv}, logp_c)
    assert n_c == n and torch.allclose(value_c, want, atol=1e-5)
    student = logp.detach().requires_grad_(True)
    v2, _, _ = csd.loss(model, rows, b, student)
    v2.backward()
    g = torch.sigmoid(cfg.csd.beta * (torch.nan_to_num(teacher) - logp.detach()))
    expect = torch.where(mask != 0, -g / mask.sum(), torch.zeros_like(g))
    assert torch.allclose(student.grad, expect, atol=1e-6)


def test_real_minus_placebo_is_split_by_the_notes_kind(tiny):
    """Each teacher row carries its note's kind (the template coach's leading cue); the loss statistics split the
    placebo-corrected delta by kind, and the parts add up to the totals over the tokens with a placebo row."""
    from mimesis_lab.jobs.agent_csd import NOTE_KINDS
    from mimesis_lab.judges.coach import CoachInput, TemplateCoach

    tok, model = tiny
    cfg = _csd_cfg(turns_per_trajectory=2, placebo=True, placebo_min_pool=2, leak_check=False, alpha=0.5)
    csd = CSD(cfg, tok, tasks={}, pad_id=tok.pad_token_id)
    reasons = {"a": "They have not asked about my budget yet.", "b": "No, that is not what I wanted at all.",
               "c": "Sounds good, go ahead.", "d": "They have not asked about my area yet."}
    trajs = [_traj(tok, t) for t in reasons]
    st = csd.prepare(trajs, set(reasons), {t: [z] for t, z in reasons.items()},
                     {t: ["Near the beach."] for t in reasons}, random.Random(0))
    want = {t: TemplateCoach.cues(CoachInput([], z, "", "", "travel"))[0] for t, z in reasons.items()}
    assert set(want.values()) == {"unmet", "negative", "ready"}
    # the last coached turn (after the user's reasoning) answers: it follows a `ready` note, not an `unmet` one
    want = {t: {"unmet": "unmet_not_followed", "ready": "ready_followed"}.get(k, k) for t, k in want.items()}
    for t, rows in st.rows.items():
        assert len(st.kinds[t]) == len(rows)
        assert NOTE_KINDS[st.kinds[t][-1]] == want[t]
    assert st.counts["placebo_rows"] == st.counts["rows"] > 0
    rows = [UpdateRow(tuple(t.ids), tuple(t.response_positions()), tuple(x for u in t.turns for x in u.logprobs),
                     tuple([0.1] * len(t.response_positions())), "g0", t.traj_id) for t in trajs]
    b = pad_update_rows(rows, tok.pad_token_id)
    logp = token_logprobs(model, b["input_ids"], b["attention_mask"])
    _, n, stats = csd.loss(model, rows, b, logp)
    per = {k: stats[f"placebo_tokens/{k}"] for k in NOTE_KINDS}
    assert sum(per.values()) == stats["placebo_tokens"] == n
    assert sum(stats[f"placebo_delta_sum/{k}"] for k in NOTE_KINDS) == pytest.approx(stats["delta_sum"], abs=1e-4)
    for k in NOTE_KINDS:       # a kind's tokens are those of its rows
        assert per[k] == sum(len(r.teacher_positions) for t, rs in st.rows.items() for r, i in zip(rs, st.kinds[t])
                             if NOTE_KINDS[i] == k)
    assert per["negative"] > 0 and per["ready_followed"] > 0 and per["unmet_not_followed"] > 0


def test_note_kind_splits_recommending_cues_by_the_reply():
    from mimesis_lab.jobs.agent_csd import NOTE_KINDS, note_kind

    assert NOTE_KINDS[note_kind("unmet", "action")] == "unmet_followed"
    assert NOTE_KINDS[note_kind("unmet", "answer")] == "unmet_not_followed"
    assert NOTE_KINDS[note_kind("ready", "answer")] == "ready_followed"
    assert NOTE_KINDS[note_kind("ready", None)] == "ready_not_followed"
    assert NOTE_KINDS[note_kind("negative", "answer")] == "negative"
    assert NOTE_KINDS[note_kind("", "answer")] == NOTE_KINDS[note_kind("made up", None)] == "other"


def test_leaky_notes_dropped_and_counted(tiny):
    tok, _ = tiny

    class Leaky:
        kind = "test"

        def coach(self, inp):
            from mimesis_lab.judges.coach import CoachResult
            return CoachResult("Recommend Casa das Ondas, it is by the beach and pet friendly.", "ok")

        def close(self):
            pass

    from mimesis_lab.envs.gyms.registry import load_tasks

    cfg = _csd_cfg(turns_per_trajectory=2, placebo=False)
    csd = CSD(cfg, tok, tasks={"travel": load_tasks("travel")}, pad_id=tok.pad_token_id)
    csd.coach = Leaky()
    st = csd.prepare([_traj(tok, "a")], {"a"}, {"a": ["z"]}, {"a": ["x"]}, random.Random(0))
    assert st.counts["coach_ok"] == 2 and st.counts["leaks_dropped"] == 2 and st.counts["rows"] == 0
    assert not st.rows


def test_placebo_rows_come_from_other_episodes(tiny):
    tok, _ = tiny
    cfg = _csd_cfg(turns_per_trajectory=1, placebo=True, placebo_min_pool=2, leak_check=False)
    csd = CSD(cfg, tok, tasks={}, pad_id=tok.pad_token_id)
    notes = iter([f"Note number {i}: ask about the remaining details." for i in range(100)])
    csd.coach = types.SimpleNamespace(coach=lambda inp: __import__("mimesis_lab.judges.coach", fromlist=["x"])
                                      .CoachResult(next(notes), "ok"), close=lambda: None)
    trajs = [_traj(tok, f"e{i}") for i in range(4)]
    st = csd.prepare(trajs, {t.traj_id for t in trajs}, {}, {}, random.Random(1))
    assert st.counts["rows"] == 4 and st.counts["placebo_rows"] == 4
    for tid, prows in st.placebo.items():
        real = st.rows[tid][0]
        for p in prows:
            assert p.note != real.note
            assert p.input_ids[-len(real.teacher_positions):] == real.input_ids[-len(real.teacher_positions):]
            owner = [k for k, rs in st.rows.items() if rs[0].note == p.note]
            assert owner and owner[0] != tid          # drawn from another episode


def test_skipped_gyms_and_alpha_zero(tiny):
    tok, _ = tiny
    csd = CSD(_csd_cfg(skip_gyms=["travel"]), tok, tasks={}, pad_id=tok.pad_token_id)
    st = csd.prepare([_traj(tok, "a")], {"a"}, {}, {}, random.Random(0))
    assert st.counts["trajectories_skipped_gym"] == 1 and not st.rows
    off = CSD(_csd_cfg(alpha=0.0), tok, tasks={}, pad_id=tok.pad_token_id)
    assert not off.prepare([_traj(tok, "a")], {"a"}, {}, {}, random.Random(0)).rows


def test_coach_endpoint_must_differ_from_the_simulator(tiny):
    tok, _ = tiny
    cfg = _csd_cfg()
    coach = cfg.csd.coach.model_copy(update={"kind": "openai", "openai": cfg.csd.coach.openai.model_copy(
        update={"base_url": "http://localhost:8000/v1"})})
    bad = cfg.model_copy(update={"csd": cfg.csd.model_copy(update={"coach": coach})})
    with pytest.raises(ValueError, match="same"):
        CSD(bad, tok, tasks={}, pad_id=0, forbidden_urls=["http://127.0.0.1:8000/v1"])
    CSD(bad, tok, tasks={}, pad_id=0, forbidden_urls=["http://127.0.0.1:8002/v1"]).close()


def test_teacher_from_the_student_prefix_cache_matches_full_rows(tiny):
    """Reusing the student's KV for the shared history gives the same teacher log-probs as scoring
    each full teacher row (different history lengths, two rows on one student row)."""
    from mimesis_lab.rl.csd import teacher_logprobs_from_prefix
    from mimesis_lab.rl.policy import cache_layers
    from mimesis_lab.rl.csd import TeacherRow, gather_teacher_logp, teacher_index

    _, model = tiny
    s0 = [3, 8, 9, 12, 7, 20, 21, 22, 5, 6]          # student row 0: history [3..7], response 20..22 at 5..7
    s1 = [4, 5, 6, 3, 20, 21, 9, 9]                   # student row 1: history [4,5,6], response 3,20 at 3..4
    width = 10
    sid = torch.tensor([s0, s1 + [0] * (width - len(s1))])
    attn = torch.tensor([[1] * 10, [1] * 8 + [0] * 2])
    with torch.no_grad():
        out = model(input_ids=sid, attention_mask=attn, use_cache=True)
    kv = cache_layers(out.past_key_values)
    rows = [TeacherRow((3, 8, 9, 12, 7, 30, 31, 20, 21, 22), (7, 8, 9), 0, (5, 6, 7), "a", 0, "n"),
            TeacherRow((3, 8, 9, 12, 7, 32, 20, 21, 22), (6, 7, 8), 0, (5, 6, 7), "a", 0, "m"),
            TeacherRow((4, 5, 6, 33, 34, 35, 3, 20), (6, 7), 1, (3, 4), "b", 0, "n")]
    with torch.no_grad():
        lp, cut = teacher_logprobs_from_prefix(model, rows[:1] + rows[2:], sid, kv, pad_id=0)
        got = gather_teacher_logp(lp, teacher_index(cut, [0] * len(cut), 2, width))
        full = [token_logprobs(model, torch.tensor([r.input_ids]), torch.ones(1, len(r.input_ids), dtype=torch.long))[0]
                for r in rows]
    assert torch.allclose(got[0, 4:7], full[0][torch.tensor([6, 7, 8])], atol=1e-5)
    assert torch.allclose(got[1, 2:4], full[2][torch.tensor([5, 6])], atol=1e-5)
    assert torch.isnan(got[0, :4]).all() and torch.isnan(got[1, :2]).all()
    with torch.no_grad():
        lp2, cut2 = teacher_logprobs_from_prefix(model, rows[1:2], sid, kv, pad_id=0)
        got2 = gather_teacher_logp(lp2, teacher_index(cut2, [0], 2, width))
    assert torch.allclose(got2[0, 4:7], full[1][torch.tensor([5, 6, 7])], atol=1e-5)


def _coached_update(tok, model):
    """Two trajectories' update rows (advantages +0.3 / -0.3) and ``update(kl_coef=0, ref=None, replay=None)``:
    one :func:`csd_update` of them with both coached (alpha 0.5, one minibatch), returning its metrics and the
    step's gradients (:class:`RecordingEngine`)."""
    from mimesis_lab.jobs.agent_csd import csd_update
    from tests.test_sim_rl_trajectory_rows import RecordingEngine

    trajs = [_traj(tok, "a"), _traj(tok, "b", reply_text="[search] hotel")]
    rows = [UpdateRow(tuple(t.ids), tuple(t.response_positions()), tuple(x for u in t.turns for x in u.logprobs),
                      tuple([0.3 if t.traj_id == "a" else -0.3] * len(t.response_positions())), "g0", t.traj_id)
            for t in trajs]
    reason = "They have not asked about my budget yet. Do they need it?"

    def update(kl_coef=0.0, ref=None, replay=None):
        cfg = _csd_cfg(turns_per_trajectory=2, placebo=False, leak_check=False, alpha=0.5).model_copy(
            update={"kl_coef": kl_coef, "minibatches": 1, "micro_rows": 8})
        csd = CSD(cfg, tok, tasks={}, pad_id=tok.pad_token_id)
        csd.prepare(trajs, {"a", "b"}, {"a": [reason], "b": [reason]}, {"a": ["Near the beach."],
                    "b": ["Near the beach."]}, random.Random(0))
        engine = RecordingEngine(model)
        out = csd_update(engine, rows, csd, cfg, random.Random(0), tok.pad_token_id, world=1, ref=ref, replay=replay)
        return out, engine.grads[0]

    return rows, update


def test_csd_update_adds_the_kl_term_as_grpo_does(tiny):
    """``kl_coef > 0`` in the CSD recipe: against a reference equal to the policy the update is the one without
    the KL term; against a moved reference it differs by exactly ``kl_coef`` times the KL term's gradient over the
    PPO tokens (the same term as :func:`mimesis_lab.rl.ppo.ppo_update` adds)."""
    import copy

    from mimesis_lab.rl.ppo import kl_term

    tok, model = tiny
    rows, update = _coached_update(tok, model)
    plain, g_plain = update(kl_coef=0.0, ref=None)
    same, g_same = update(kl_coef=0.5, ref=copy.deepcopy(model))
    assert plain["csd/tokens"] > 0 and "update/kl_ref" not in plain
    assert same["update/kl_ref"] == pytest.approx(0, abs=1e-9)
    for n, g in g_plain.items():
        torch.testing.assert_close(g_same[n], g, rtol=1e-5, atol=1e-8, msg=n)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    out, g_kl = update(kl_coef=0.5, ref=moved)
    b = pad_update_rows(rows, tok.pad_token_id)
    model.zero_grad()
    kl = kl_term(moved, b, token_logprobs(model, b["input_ids"], b["attention_mask"], need=b["mask"]))
    assert out["update/kl_ref"] == pytest.approx(float(kl.detach()), rel=1e-5) and out["update/kl_ref"] > 0
    (0.5 * kl).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(g_kl[n], g_plain[n] + p.grad, rtol=1e-4, atol=1e-7, msg=n)
    model.zero_grad()


def test_csd_update_adds_the_ptx_replay_term_as_grpo_does(tiny):
    """``ptx_coef > 0`` in the CSD recipe: each optimizer step adds ``ptx_coef * L_SFT`` on the replayed
    demonstrations, drawn from the update's rng after its minibatch plan, as :func:`ppo_update` does; the gradient
    is the update's without it plus exactly that term's."""
    from mimesis_lab.rl.losses import sft_loss
    from mimesis_lab.rl.policy import minibatch_plan
    from mimesis_lab.rl.ppo import Replay

    tok, model = tiny
    rows, update = _coached_update(tok, model)
    demos = [UpdateRow(tuple(t.ids), tuple(t.response_positions()), (0.0,) * len(t.response_positions()),
                       (0.0,) * len(t.response_positions()), "ptx", f"ptx-{i}")
             for i, t in enumerate([_traj(tok, "c", reply_text="[action] What is your budget?"), _traj(tok, "d"),
                                    _traj(tok, "e", reply_text="[search] hotel")])]
    plain, g_plain = update()
    out, g_ptx = update(replay=Replay(demos, 0.25, 2, {}))
    assert plain["csd/tokens"] > 0 and "update/ptx_loss" not in plain
    assert out["csd/loss"] == pytest.approx(plain["csd/loss"], rel=1e-6)
    rng = random.Random(0)
    minibatch_plan(len(rows), 1, rng)
    b = pad_update_rows([demos[i] for i in rng.sample(range(3), 2)], tok.pad_token_id)
    model.zero_grad()
    ce = sft_loss(token_logprobs(model, b["input_ids"], b["attention_mask"], need=b["mask"]), b["mask"])
    assert out["update/ptx_loss"] == pytest.approx(float(ce.detach()), rel=1e-6)
    (0.25 * ce).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(g_ptx[n], g_plain[n] + p.grad, rtol=1e-4, atol=1e-7, msg=n)
    model.zero_grad()
