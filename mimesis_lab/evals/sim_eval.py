"""Simulator benchmarks (SPEC §4.1) for every simulator of ``params.sim_eval``: :func:`run_sim_eval`.

Per simulator (the trained one and the baselines), one batched rollout per evaluation seed drives
every episode together (one backend call per round, :func:`~mimesis_lab.rollout.sim_rollout.run_episodes`):

1. **RealUserSim fidelity** (first seed): per held-out ThoughtTrace conversation the simulator gets the
   user's system prompt (profile + task) and talks to the fixed assistant (``replay``: the held-out assistant
   turns in order; ``openai``: an endpoint) for ``min(turn_budget, #real user turns)`` turns or until it says
   goodbye / ``###STOP###`` (:class:`FidelityEpisode`); only public utterances count. The fidelity judge
   (:mod:`.fidelity_judge`) compares them with the real user's first turns per dimension; FI via
   ``fidelity_index``, CI = cluster bootstrap over ``user_id`` (over conversations when the set has one user:
   ``fi_ci_unit``).
2. **tau-USI**: D1–D4 = Dice of the mean per-conversation user statistics (:mod:`.user_stats`) of the
   simulated vs the real conversations of step 1. **ECE**: the scripted ABCD support agent serves every
   held-out behaviour scenario (i) with the simulator as a *neutral* customer (the scenario's goal and
   facts, no behaviour: the human did not get one either) and (ii) with the human customer's original
   ABCD utterances replayed through the same episode protocol and the same ``turn_budget``; success = the
   agent performed every required kb action (``agent.finished``); the simulator's success is its rate
   over seeds. Difficulty = number of required kb actions of the scenario's subflow, cut into
   ``ece_bins`` equal-width bins over the observed range (:func:`difficulty_bins`). USI5 from both.
3. **Turing distance**: the discriminator (:mod:`.discriminator`) labels the real and the simulated
   conversations of step 1 (grouped by held-out conversation); ``|accuracy - 50|``.
4. **Behaviour reward decomposition** over the held-out behaviour scenarios (every seed, the
   ``cfg.judge`` behaviour judge) and a **SOUL-style aggregate** in percent: per seed, the mean over the
   simulator tasks (``usersim_behavior`` and the ThoughtTrace tasks built from ``cfg.conversations``, as in
   ``sim_rl``) of each task's mean raw score; mean ± standard error over seeds. A task without a valid
   score in some seed is left out of every seed (listed in ``soul.excluded_tasks``).

Failures are data: generation errors, refusals, context overflow, episodes without any public turn
(``no_public_turn``) are counted in ``counts.invalid`` (and per kind), judge failures in ``counts.judge_failures``,
unparsable LLM answers in ``counts.parse_failures``; all are excluded from means, never scored 0. If every fidelity
or behaviour judgement of a simulator fails: :class:`SimEvalError`. No NaN in the JSON: undefined is ``null``.
"""
from __future__ import annotations

import contextlib
import json
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from mimesis_lab.progress import Progress
from mimesis_lab.envs.base import SimEpisode, TaskScore
from mimesis_lab.envs.output_format import ParsedReply

__all__ = ["run_sim_eval", "SimEvalError", "FidelityEpisode", "Simulator", "load_simulator", "OpenAIAssistant",
           "AssistantEndpointError", "human_replay_success", "task_difficulty", "difficulty_bins",
           "PROMPTED_INSTRUCTION", "NOTE"]

NOTE = "scores computed with a different judge/assistant model are not comparable"
PROMPTED_INSTRUCTION = (
    "You are role-playing the USER (not the assistant) in this conversation. Write only what this user would "
    "say next, in their own voice, following the profile, goal and facts below; never answer as an AI assistant "
    "and never offer help.")
FIDELITY = "sim_eval_fidelity"
_END = re.compile(r"###STOP###|\b(good ?bye|bye)\b", re.I)
_JUDGE_REASONS = ("judge_failure", "timeout")


class SimEvalError(RuntimeError):
    """A simulator could not be evaluated (e.g. every judgement failed); the message names it and the counts."""


# ----------------------------------------------------------------------------- fidelity episodes
class AssistantEndpointError(RuntimeError):
    """The fixed assistant's endpoint gave no usable reply; ``failure`` is the endpoint's failure record."""

    def __init__(self, failure: Any):
        super().__init__(f"assistant endpoint failed: {failure.detail}")
        self.failure = failure


class OpenAIAssistant:
    """The fixed assistant as an OpenAI-compatible endpoint: ``assistant(row, public_log) -> reply``.

    One request through the shared retry loop (:meth:`mimesis_lab.endpoint.ChatEndpoint.call`, no backoff);
    an empty reply is an invalid answer (retried). After the retries it raises :class:`AssistantEndpointError`.
    """

    def __init__(self, endpoint: Any, client: Any = None):
        from mimesis_lab.endpoint import ChatEndpoint

        self.endpoint, self.chat = endpoint, ChatEndpoint(endpoint, client)
        self.identity = f"openai:{endpoint.model}@{endpoint.base_url}"

    def __call__(self, row: dict[str, Any], public_log: list[dict[str, str]]) -> str:
        msgs = [{"role": "system", "content": "You are a helpful AI assistant."}] + [
            {"role": "user" if t["role"] == "user" else "assistant", "content": t["content"]} for t in public_log]
        body = {"model": self.endpoint.model, "temperature": self.endpoint.temperature, "messages": msgs}
        res = self.chat.call(body, _assistant_reply)
        if res.ok:
            return res.value
        raise AssistantEndpointError(res.failure)


def _assistant_reply(payload: dict[str, Any]) -> str:
    from mimesis_lab.endpoint import chat_content

    text = chat_content(payload)
    if not text.strip():
        raise ValueError("empty assistant reply")
    return text


class FidelityEpisode(SimEpisode):
    """The simulated user of one held-out conversation talking to the fixed assistant (not a training task).

    ``row``: a ``usersim_persona`` row (``system_prompt``, ``opening``, ``human_turns``, ``ai_replies``, ids).
    The recorded AI opening (a support agent's greeting, if any) comes first, in both conversations. At most
    ``cap = min(turn_budget, #human turns)`` simulator turns; it ends early on goodbye / ``###STOP###`` or
    when the replayed assistant has no reply left. ``assistant=None`` replays ``ai_replies``.
    """

    data_source = FIDELITY

    def __init__(self, row: dict[str, Any], ctx: Any, rng: random.Random, turn_budget: int,
                 assistant: Callable[[dict[str, Any], list[dict[str, str]]], str] | None = None):
        super().__init__(row, ctx, rng)
        self.task_id = str(row["conversation_id"])
        self.human_turns = [str(t) for t in row.get("human_turns") or []]
        self.ai_replies = [str(t) for t in row.get("ai_replies") or []]
        self.cap = max(1, min(int(turn_budget), len(self.human_turns) or 1))
        self.assistant = assistant
        self.opening = [str(t) for t in row.get("opening") or []]
        self._chat: list[dict[str, str]] = [{"role": "user", "content": o} for o in self.opening]
        self.public_log.extend({"role": "assistant", "content": o} for o in self.opening)

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": str(self.row["system_prompt"])}] + list(self._chat)

    def observe(self, parsed: ParsedReply, public: str) -> bool:
        self.public_log.append({"role": "user", "content": public})
        self.private_log.append({"role": "user", "reasoning": parsed.reasoning, "content": public})
        self._chat.append({"role": "assistant", "content": public})
        j = self.n_sim_turns - 1
        if self.n_sim_turns >= self.cap or _END.search(public) or (self.assistant is None
                                                                     and j >= len(self.ai_replies)):
            self.done = True
            return True
        reply = self.ai_replies[j] if self.assistant is None else self.assistant(self.row, self.public_log)
        self._chat.append({"role": "user", "content": reply})
        self.public_log.append({"role": "assistant", "content": reply})
        return False

    def score(self, judge: Any) -> TaskScore:  # noqa: ARG002 - judged by the fidelity judge, not here
        return TaskScore.failed("env_error", "fidelity episodes are judged by the fidelity judge")

    def real_conversation(self) -> list[dict[str, str]]:
        """The real user's first ``cap`` turns with the assistant turns between them."""
        out: list[dict[str, str]] = [{"role": "assistant", "content": o} for o in self.opening]
        for k, u in enumerate(self.human_turns[:self.cap]):
            if k:
                out.append({"role": "assistant", "content": self.ai_replies[k - 1] if k - 1 < len(self.ai_replies)
                            else ""})
            out.append({"role": "user", "content": u})
        return out

    def sim_conversation(self) -> list[dict[str, str]]:
        return [{"role": t["role"], "content": t["content"].replace("###STOP###", "").strip()} for t in self.public_log]


# ----------------------------------------------------------------------------- simulators
class _ChatIds:
    """Lets :func:`run_episodes` (which renders token ids) drive a chat-only backend: the "ids" of a prompt
    are a one-element handle to the stored messages."""

    def __init__(self, backend: Any):
        self.backend, self.prompts = backend, []

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):  # noqa: ARG002
        self.prompts.append([dict(m) for m in messages])
        return [len(self.prompts) - 1]

    def generate_ids(self, prompt_ids, params):
        return self.backend.generate([self.prompts[p[0]] for p in prompt_ids], params)


@dataclass
class Simulator:
    name: str
    kind: str
    backend: Any
    tokenizer: Any
    identity: dict[str, Any]
    prefix: str | None
    require_think: bool
    max_prompt_tokens: int

    def close(self) -> None:
        getattr(getattr(self.backend, "backend", self.backend), "close", lambda: None)()
        self.backend = self.tokenizer = None


def _fingerprint(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    w = next((p / f for f in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
              if (p / f).is_file()), None)
    st = w.stat() if w else None
    return {"path": str(path), "weights": w.name if w else None, "bytes": st.st_size if st else None,
            "mtime": int(st.st_mtime) if st else None}


def _base_tokenizer_path(cfg: Any, model_cfg: Any, explicit: str | None) -> str:
    if explicit:
        return str(explicit)
    if model_cfg is not None and getattr(model_cfg, "init", "tiny") == "pretrained" and model_cfg.pretrained_path:
        return str(model_cfg.pretrained_path)
    return next((str(s.model_path) for s in cfg.simulators.values()
                 if s.model_path and s.kind in ("checkpoint", "prompted")), "models/tokenizer")


def load_simulator(name: str, scfg: Any, cfg: Any, model_cfg: Any = None, tokenizer_path: str | None = None,
                   batch_size: int = 32) -> Simulator:
    """The simulator ``scfg`` (:class:`~mimesis_lab.config_eval.EvalSimulatorParams`) with its backend and identity."""
    prefix = PROMPTED_INSTRUCTION if scfg.kind == "prompted" else None
    if scfg.kind == "openai":
        from mimesis_lab.rollout.backends import make_backend

        ep = scfg.openai
        be = _ChatIds(make_backend("openai", base_url=ep.base_url, model=ep.model, api_key_env=ep.api_key_env,
                                   timeout_s=ep.timeout_s, max_retries=ep.max_retries))
        return Simulator(name, "openai", be, be, {"kind": "openai", "model": ep.model, "base_url": ep.base_url},
                         None, False, 10 ** 9)
    import torch

    from mimesis_lab.models import build_or_load, load_model
    from mimesis_lab.rollout.backends import TransformersBackend
    from mimesis_lab.tokenizer import load_tokenizer

    if scfg.model_path:
        model, tok = load_model(scfg.model_path), load_tokenizer(scfg.model_path)
        ident = {"kind": scfg.kind, **_fingerprint(scfg.model_path)}
    else:   # kind base, tiny profile: random weights from the `model` section, seeded
        if model_cfg is None:
            raise SimEvalError(f"simulator {name!r}: kind `base` without model_path needs model_cfg (params.model)")
        tp = _base_tokenizer_path(cfg, model_cfg, tokenizer_path)
        tok = load_tokenizer(tp)
        model = build_or_load(model_cfg, tok)
        ident = {"kind": "base", "init": model_cfg.init, "seed": model_cfg.seed, "tokenizer": tp,
                 "path": model_cfg.pretrained_path if model_cfg.init == "pretrained" else None}
    model = model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
    limit = int(getattr(model.config, "max_position_embeddings", 2048)) - int(cfg.max_new_tokens)
    return Simulator(name, scfg.kind, TransformersBackend(model, tok, batch_size=batch_size), tok, ident, prefix,
                     scfg.kind == "checkpoint", limit)


def _with_prefix(ep: SimEpisode, prefix: str) -> SimEpisode:
    orig = ep.messages

    def messages() -> list[dict[str, str]]:
        msgs = [dict(m) for m in orig()]
        if msgs and msgs[0]["role"] == "system":
            msgs[0]["content"] = f"{prefix}\n\n{msgs[0]['content']}"
        else:
            msgs.insert(0, {"role": "system", "content": prefix})
        return msgs

    ep.messages = messages  # type: ignore[method-assign]
    return ep


# ----------------------------------------------------------------------------- ECE pieces (pure)
def task_difficulty(row: dict[str, Any], kb: dict[str, list[str]]) -> int:
    """Number of kb actions the agent must perform for the scenario's subflow (0 if unknown)."""
    from mimesis_lab.abcd_policy import base_subflow

    return len(kb.get(base_subflow(str(row.get("subflow") or "")), []))


def difficulty_bins(difficulties: Sequence[float], n_bins: int) -> list[int]:
    """Equal-width bins over ``[min, max]`` of the difficulties: ``min(n-1, floor((d-min)/(max-min)*n))``."""
    if not difficulties:
        return []
    lo, hi = min(difficulties), max(difficulties)
    if hi == lo:
        return [0] * len(difficulties)
    return [min(n_bins - 1, int((d - lo) / (hi - lo) * n_bins)) for d in difficulties]


def _neutral(row: dict[str, Any]) -> dict[str, Any]:
    return dict(row, behavior_ids="[]", kwargs="{}", task_id=f"{row.get('task_id')}#ece")


def human_replay_success(row: dict[str, Any], original: Sequence[Sequence[str]], ctx: Any) -> bool:
    """Replay the human customer's ABCD utterances through the behaviour-episode protocol (same agent, same
    ``turn_budget``, same end rules); ``True`` iff the agent performed every required action."""
    from mimesis_lab.envs.behavior_task import BehaviorEpisode

    ep = BehaviorEpisode(_neutral(row), ctx, random.Random(0))
    for text in [str(t[1]) for t in original if str(t[0]) == "customer" and str(t[1]).strip()]:
        if ep.agent is None or ep.observe(ParsedReply(True, "", text), text):
            break
    if ep.env_error or ep.agent is None:
        raise ValueError(ep.env_error or "agent failed")
    return bool(ep.agent.finished)


def _abcd_originals(path: str | Path) -> dict[str, list]:
    p = Path(path)
    if not p.is_file():
        return {}
    doc = json.loads(p.read_text(encoding="utf-8"))
    convs = [c for part in doc.values() for c in part] if isinstance(doc, dict) else list(doc)
    return {str(c.get("convo_id")): c.get("original") or [] for c in convs if isinstance(c, dict)}


# ----------------------------------------------------------------------------- helpers
def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _mean_se(xs: Sequence[float]) -> tuple[float | None, float | None]:
    from mimesis_lab.evals.metrics import mean_and_stderr

    return mean_and_stderr(list(xs)) if len(xs) >= 2 else (_mean(xs), None)


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats → None, tuples → lists, counters → dicts."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return {str(k): _clean(v) for k, v in x.items()} if isinstance(x, dict) else x


def _identity(obj: Any) -> str:
    """``obj.identity``, else ``kind:model@base_url`` of an endpoint-backed object, else its class."""
    if getattr(obj, "identity", None):
        return str(obj.identity)
    ep = getattr(obj, "endpoint", None)
    if ep is not None:
        return f"openai:{ep.model}@{ep.base_url}"
    return f"{getattr(obj, 'kind', 'custom')}:{type(obj).__name__}"


# ----------------------------------------------------------------------------- one simulator
@dataclass
class _Data:
    convs: list[dict[str, Any]]
    brows: list[dict[str, Any]]
    usersim: dict[str, list[dict[str, Any]]]
    ctx: Any
    human_success: dict[str, bool | None]
    difficulty: dict[str, int]


def _evaluate(sim: Simulator, cfg: Any, data: _Data, fjudge: Any, bjudge: Any, disc: Any, partner: Any,
              records: list[dict[str, Any]]) -> dict[str, Any]:
    from mimesis_lab.envs.base import make_episode
    from mimesis_lab.evals.fidelity_judge import DIMENSIONS, FidelityFailure, FidelityRequest
    from mimesis_lab.evals.metrics import cluster_bootstrap_ci, ece, fidelity_index, turing_distance, usi5
    from mimesis_lab.evals.user_stats import conversation_stats, task_facts, usi_dimensions
    from mimesis_lab.rollout.backends import SamplingParams
    from mimesis_lab.rollout.sim_rollout import run_episodes, score_rollouts

    c: dict[str, Any] = {"conversations": len(data.convs), "behavior_episodes": 0, "judge_failures": 0,
                         "parse_failures": 0, "invalid": Counter(), "format_failures": 0, "fidelity_judged": 0,
                         "behavior_judged": 0, "discriminator_failures": 0, "judge_failures_by_kind": Counter(),
                         "invalid_by_kind": {k: Counter() for k in ("fidelity", "behavior", "ece", *data.usersim)}}
    fid: list[tuple[dict[str, Any], FidelityEpisode]] = []
    beh: list[Any] = []
    soul: dict[int, dict[str, list[float]]] = {s: {} for s in cfg.seeds}
    ece_sim: dict[str, list[float]] = {}
    for si, seed in enumerate(cfg.seeds):
        eps: list[SimEpisode] = []
        ids: list[tuple[str, str]] = []
        meta: list[tuple[str, dict[str, Any]]] = []

        def add(ep: SimEpisode, kind: str, row: dict[str, Any]) -> None:
            eps.append(_with_prefix(ep, sim.prefix) if sim.prefix else ep)
            key = f"{kind}:{ep.task_id}"
            ids.append((key, f"{key}:s{seed}"))
            meta.append((kind, row))

        def rng(kind: str, row: dict[str, Any]) -> random.Random:
            return random.Random(f"{seed}:{kind}:{row.get('task_id') or row.get('conversation_id')}")

        if si == 0:
            for row in data.convs:
                add(FidelityEpisode(row, data.ctx, rng("fidelity", row), cfg.turn_budget, partner), "fidelity", row)
        for row in data.brows:
            add(make_episode(row, data.ctx, rng("behavior", row)), "behavior", row)
            if json.loads(row.get("behavior_ids") or "[]"):
                add(make_episode(_neutral(row), data.ctx, rng("ece", row)), "ece", row)
        for ds, rows in data.usersim.items():
            for row in rows:
                add(make_episode(row, data.ctx, rng(ds, row)), ds, row)
        sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                  seed=int(seed) * 1_000_003 + 17)
        rolls = run_episodes(eps, ids, sim.backend, sim.tokenizer, sampling, require_think=sim.require_think,
                             max_prompt_tokens=sim.max_prompt_tokens)
        gen_invalid = [r.invalid for r in rolls]
        judged = [i for i, (k, _) in enumerate(meta) if k not in ("fidelity", "ece")]
        score_rollouts([rolls[i] for i in judged], [eps[i] for i in judged], bjudge)
        for r, ep, (kind, row), pre in zip(rolls, eps, meta, gen_invalid):
            c["format_failures"] += r.format_failures
            env_err = "env_error" if getattr(ep, "env_error", None) else None
            reason = pre or (env_err or "no_public_turn" if ep.n_sim_turns == 0 else None)
            judge_fail = reason is None and r.score is not None and r.score.invalid in _JUDGE_REASONS
            if reason is None and r.invalid is not None and not judge_fail:
                reason = r.invalid      # a task-side failure while scoring (env_error)
            if reason:
                c["invalid"][reason] += 1
                c["invalid_by_kind"][kind][reason] += 1
            if judge_fail:
                c["judge_failures"] += 1
                c["judge_failures_by_kind"][kind] += 1
            records.append({"type": "rollout", "simulator": sim.name, "seed": seed, "kind": kind,
                            "excluded": reason or ("judge_failure" if judge_fail else None), **r.to_json()})
            if kind == "behavior":
                c["behavior_episodes"] += 1
            if kind == "ece" or (kind == "behavior" and ep.behavior == "N"):
                if reason is None and ep.agent is not None:
                    ece_sim.setdefault(str(row["task_id"]), []).append(float(ep.agent.finished))
            if kind == "fidelity":
                if reason is None:
                    fid.append((row, ep))
                continue
            if reason is None and not judge_fail and r.raw is not None:
                soul[seed].setdefault(kind if kind != "behavior" else ep.data_source, []).append(float(r.raw))
                if kind == "behavior":
                    c["behavior_judged"] += 1
                    beh.append(r.score)

    # -- fidelity
    matches: dict[str, list[int]] = {d: [] for d in DIMENSIONS}
    fi_vals, fi_users, fi_convs, pairs = [], [], [], []
    for row, ep in fid:
        req = FidelityRequest(str(row["conversation_id"]), str(row["system_prompt"]), ep.human_turns[:ep.cap],
                              [t["content"] for t in ep.sim_conversation() if t["role"] == "user"], ep.ai_replies)
        try:
            v = fjudge.judge(req)
        except Exception as e:  # noqa: BLE001 - a judge that raises is a judge failure
            v = FidelityFailure("judge_failure", f"judge raised {type(e).__name__}: {e}")
        c["parse_failures"] += int(getattr(v, "parse_failures", 0) or 0)
        rec = {"type": "fidelity_judgement", "simulator": sim.name, "conversation_id": req.conversation_id,
               "user_id": row.get("user_id"), "real_turns": req.real_turns, "sim_turns": req.sim_turns}
        if isinstance(v, FidelityFailure) or not hasattr(v, "matches"):
            c["judge_failures"] += 1
            c["judge_failures_by_kind"]["fidelity"] += 1
            records.append(rec | {"failure": getattr(v, "reason", "judge_failure"), "detail": getattr(v, "detail", "")})
            continue
        c["fidelity_judged"] += 1
        records.append(rec | {"matches": v.matches, "features": v.features, "rationale": v.rationale})
        for d in DIMENSIONS:
            matches[d].append(int(v.matches[d]))
        fi_vals.append(100.0 * sum(int(v.matches[d]) for d in DIMENSIONS) / len(DIMENSIONS))
        fi_users.append(str(row.get("user_id") or row["conversation_id"]))
        fi_convs.append(str(row["conversation_id"]))
        pairs.append((row, ep, req))
    for kind, k, n, ok in (("fidelity", "fidelity", len(data.convs), fi_vals),
                           ("behaviour", "behavior", c["behavior_episodes"], beh)):
        if not ok:
            raise SimEvalError(f"simulator {sim.name!r}: every {kind} judgement failed or had nothing to judge ({n} "
                               f"episodes, {c['judge_failures_by_kind'][k]} judge failures, invalid "
                               f"{dict(c['invalid_by_kind'][k])})")
    per_dim, fi = fidelity_index(matches)
    fi_ci, unit = None, None
    for clusters, name in ((fi_users, "user_id"), (fi_convs, "conversation (held-out set has one user)")):
        if len(set(clusters)) >= 2:
            b = cluster_bootstrap_ci(fi_vals, clusters, n_boot=max(2, int(cfg.bootstrap)), seed=int(cfg.seeds[0]))
            fi_ci, unit = [b.low, b.high], name
            break

    # -- tau-USI: D1-D4 on the fidelity pairs, ECE on the behaviour scenarios
    hum_stats, sim_stats = [], []
    for row, ep, _ in pairs:
        facts = task_facts(str(row["system_prompt"]))
        hum_stats.append(conversation_stats(ep.real_conversation(), facts))
        sim_stats.append(conversation_stats(ep.sim_conversation(), facts))
        records.append({"type": "usi_stats", "simulator": sim.name, "conversation_id": row["conversation_id"],
                        "human": hum_stats[-1], "sim": sim_stats[-1]})
    dims, dropped = usi_dimensions(sim_stats, hum_stats)
    ece_rows = [r for r in data.brows if data.human_success.get(str(r["task_id"])) is not None
                and ece_sim.get(str(r["task_id"]))]
    c["ece_tasks"], c["ece_excluded_tasks"] = len(ece_rows), len(data.brows) - len(ece_rows)
    ece_v = None
    if ece_rows:
        s_succ = [_mean(ece_sim[str(r["task_id"])]) for r in ece_rows]
        h_succ = [float(data.human_success[str(r["task_id"])]) for r in ece_rows]
        bins = difficulty_bins([data.difficulty[str(r["task_id"])] for r in ece_rows], cfg.ece_bins)
        ece_v = ece(s_succ, h_succ, bins)
        for r, s, h, b in zip(ece_rows, s_succ, h_succ, bins):
            records.append({"type": "ece_task", "simulator": sim.name, "task_id": r["task_id"], "bin": b,
                            "difficulty": data.difficulty[str(r["task_id"])], "sim_success": s, "human_success": h,
                            "sim_runs": len(ece_sim[str(r["task_id"])])})
    usi = usi5(dims["d1"], dims["d2"], dims["d3"], dims["d4"], ece_v) \
        if ece_v is not None and all(dims[d] is not None for d in dims) else None

    # -- Turing distance
    groups = [q.conversation_id for _, _, q in pairs]
    res = disc.classify([q.real_turns for _, _, q in pairs], [q.sim_turns for _, _, q in pairs], groups, groups)
    c["discriminator_failures"] = res.n_failed
    c["parse_failures"] += res.parse_failures
    records.append({"type": "turing", "simulator": sim.name, "accuracy": res.accuracy, "n_scored": res.n_scored,
                    "n_failed": res.n_failed, "predictions": res.predictions})

    # -- behaviour decomposition and SOUL
    raws = [s.raw for s in beh]
    reward, reward_se = _mean_se(raws)
    comp = lambda k: _mean([s.components[k] for s in beh if k in s.components])  # noqa: E731
    behavior = {"reward": reward, "reward_se": reward_se, **{k: comp(k) for k in
                ("exhibit", "placement", "naturalness", "on_task", "announced", "cooperativeness")}}
    tasks = sorted({t for per in soul.values() for t in per})
    keep = [t for t in tasks if all(soul[s].get(t) for s in cfg.seeds)]
    seed_scores = [100.0 * _mean([_mean(soul[s][t]) for t in keep]) for s in cfg.seeds] if keep else []
    soul_mean, soul_se = _mean_se(seed_scores)
    soul_out = {"mean": soul_mean, "se": soul_se,
                "per_task": {t: 100.0 * _mean([_mean(soul[s][t]) for s in cfg.seeds]) for t in keep},
                "per_seed": dict(zip([str(s) for s in cfg.seeds], seed_scores)),
                "excluded_tasks": [t for t in tasks if t not in keep]}

    c["invalid"] = {k: v for k, v in c["invalid"].items() if v}
    c["invalid_by_kind"] = {k: dict(v) for k, v in c["invalid_by_kind"].items()}
    c["judge_failures_by_kind"] = dict(c["judge_failures_by_kind"])
    return {"model": sim.identity, "fi": fi, "fi_ci": fi_ci, "fi_ci_unit": unit, "fi_per_dim": per_dim,
            "d1": dims["d1"], "d2": dims["d2"], "d3": dims["d3"], "d4": dims["d4"], "ece": ece_v, "usi5": usi,
            "usi_dropped_features": dropped, "turing_accuracy": res.accuracy,
            "turing_distance": turing_distance(res.accuracy) if res.accuracy is not None else None,
            "behavior": behavior, "soul": soul_out, "counts": c}


# ----------------------------------------------------------------------------- entry point
def _load_data(cfg: Any, kb_path: str | Path, guidelines_path: str | Path, abcd_raw: str | Path) -> _Data:
    from mimesis_lab.abcd import load_guidelines, load_kb
    from mimesis_lab.envs.base import TaskContext
    from mimesis_lab.envs.behavior_task import DATA_SOURCE as BEHAVIOR, load_behavior_rows
    from mimesis_lab.envs.registry import TaskDataError, load_task_rows
    from mimesis_lab.envs.usersim_tasks import NEXT_TURN, PERSONA, TOM, build_rows_with_skips, load_thoughttrace_rows

    if not Path(cfg.conversations).is_file():
        raise SimEvalError(f"{cfg.conversations}: held-out conversations not found")
    convs, _ = build_rows_with_skips(PERSONA, load_thoughttrace_rows(cfg.conversations))
    convs = convs[:cfg.max_conversations] if cfg.max_conversations else convs
    if not convs:
        raise SimEvalError(f"{cfg.conversations}: no usable held-out conversation")
    if not Path(cfg.behavior_tasks).is_file():
        raise SimEvalError(f"{cfg.behavior_tasks}: held-out behaviour scenarios not found")
    brows = load_behavior_rows(cfg.behavior_tasks)
    brows = brows[:cfg.max_behavior_tasks] if cfg.max_behavior_tasks else brows
    if not brows:
        raise SimEvalError(f"{cfg.behavior_tasks}: no behaviour scenario")
    kb, gl = load_kb(Path(kb_path)), load_guidelines(Path(guidelines_path))
    ctx = TaskContext(kb=kb, guidelines=gl, options={BEHAVIOR: {"turn_budget": cfg.turn_budget},
                                                     PERSONA: {"turn_budget": cfg.turn_budget}})
    usersim: dict[str, list[dict[str, Any]]] = {}
    for ds in (NEXT_TURN, PERSONA, TOM):   # a task without held-out rows is not part of the aggregate
        with contextlib.suppress(TaskDataError):
            usersim[ds] = load_task_rows(ds, cfg.conversations, cfg.max_conversations)[0]
    originals = _abcd_originals(abcd_raw)
    human: dict[str, bool | None] = {}
    for r in brows:
        orig = originals.get(str(r.get("conversation_id")))
        try:
            human[str(r["task_id"])] = human_replay_success(r, orig, ctx) if orig else None
        except (ValueError, KeyError):
            human[str(r["task_id"])] = None
    return _Data(convs, brows, usersim, ctx, human, {str(r["task_id"]): task_difficulty(r, kb) for r in brows})


def run_sim_eval(cfg: Any, model_cfg: Any = None, out_dir: str | Path | None = None, *,
                 kb: str | Path = "data/raw/abcd/kb.json", guidelines: str | Path = "data/raw/abcd/guidelines.json",
                 abcd_raw: str | Path = "data/raw/abcd/abcd_v1.1.json", tokenizer_path: str | None = None,
                 fidelity_judge: Any = None, behavior_judge: Any = None, discriminator: Any = None,
                 assistant: Any = None) -> dict[str, Any]:
    """Evaluate every simulator of ``cfg`` (:class:`~mimesis_lab.config_eval.SimEvalParams`); see the module doc.

    ``model_cfg`` (``params.model``) builds the un-trained ``base`` simulator; its tokenizer is
    ``tokenizer_path``, else the first checkpoint simulator's folder, else ``models/tokenizer``.
    ``kb`` / ``guidelines`` / ``abcd_raw`` are the ABCD files (the behaviour agent and the human replay).
    ``fidelity_judge`` / ``behavior_judge`` / ``discriminator`` / ``assistant`` replace the ones built from
    ``cfg`` (test doubles, shared clients). Writes ``<out_dir>/summary.json`` and
    ``<out_dir>/<simulator>/records.jsonl``; returns the summary. Raises :class:`SimEvalError`.
    """
    from mimesis_lab.evals.discriminator import make_discriminator
    from mimesis_lab.evals.fidelity_judge import make_fidelity_judge
    from mimesis_lab.judges.behavior_judge import make_judge

    t0 = time.perf_counter()
    out = Path(out_dir or cfg.output_dir)
    data = _load_data(cfg, kb, guidelines, abcd_raw)
    fjudge = fidelity_judge or make_fidelity_judge(cfg.judge)
    bjudge = behavior_judge or make_judge(cfg.judge.kind, cfg.judge.openai)
    disc = discriminator or make_discriminator(cfg.discriminator)
    partner = assistant if assistant is not None else (
        None if cfg.assistant.kind == "replay" else OpenAIAssistant(cfg.assistant.openai))
    sims: dict[str, Any] = {}
    prog = Progress(len(cfg.simulators), "sim_eval", unit="simulator")
    for name, scfg in cfg.simulators.items():
        t1 = time.perf_counter()
        sim = load_simulator(name, scfg, cfg, model_cfg, tokenizer_path)
        records: list[dict[str, Any]] = []
        try:
            entry = _evaluate(sim, cfg, data, fjudge, bjudge, disc, partner, records)
        finally:
            sim.close()
            (out / name).mkdir(parents=True, exist_ok=True)
            (out / name / "records.jsonl").write_text("".join(
                json.dumps(_clean(r), allow_nan=False, default=str) + "\n" for r in records), encoding="utf-8")
        entry["wall_s"] = round(time.perf_counter() - t1, 3)
        sims[name] = entry
        prog.update(1, simulator=name)
    prog.close()
    summary = {
        "simulators": sims, "judge": f"fidelity: {_identity(fjudge)}; behaviour: {_identity(bjudge)}",
        "assistant": "replay (the held-out conversation's own assistant turns)" if partner is None
        else _identity(partner), "discriminator": _identity(disc), "note": NOTE, "seeds": list(cfg.seeds),
        "data": {"conversations": str(cfg.conversations), "behavior_tasks": str(cfg.behavior_tasks),
                 "n_conversations": len(data.convs), "n_behavior_tasks": len(data.brows),
                 "usersim_tasks": {k: len(v) for k, v in data.usersim.items()},
                 "turn_budget": cfg.turn_budget, "max_new_tokens": cfg.max_new_tokens},
        "wall_s": round(time.perf_counter() - t0, 3),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(_clean(summary), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return _clean(summary)
