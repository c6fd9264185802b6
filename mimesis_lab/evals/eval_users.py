"""The evaluation users of ``agent_eval`` (SPEC §4.2): who plays the gyms' user side when agents are scored.

Kinds (:class:`~mimesis_lab.config_eval.EvalUserParams`):

* ``scripted`` — :class:`ScriptedEvalUser`, a deterministic cooperative user with no model. It
  answers from the episode's hidden task through the gym's own state and facts, following the
  rules of the gym's user prompt: TravelGym reveals the one hidden preference the question is
  about (a keyword of it or a content word of its text; a generic "what do you prefer" question
  gets the next unrevealed one), else "I don't mind"; TurtleGym answers one word (``Yes`` when
  at least half of the question's content words occur in the hidden story and key facts, ``No``
  when some do, else ``Irrelevant``); TelepathyGym answers ``Yes`` when the question shares a
  content word with the entity's category/description, else ``No`` (never the name);
  PersuadeGym moves one step toward the target when the argument shares a content word with the
  claim or the user's reasons, else keeps its stance, always ending with ``Stance: N``;
  IntentionGym states its drawn option for the detail the gym itself matches
  (:meth:`IntentionGym.match`); TauGym gives its instruction and says ``###STOP###`` once the
  database equals the gold final state; SearchGym restates the question. Where a gym never asks
  the user (FunctionGym) the scripted user is simply not called.
* ``simulator`` — the checkpoint ``model_path`` served in-process
  (:class:`~mimesis_lab.rollout.serve.ModelServer`) behind the privileged shim
  (:class:`~mimesis_lab.rollout.shim.PrivilegedShim`), exactly as in training: every episode
  talks to ``{shim}/ep/{episode}/v1`` (:class:`~mimesis_lab.rollout.user_side.EndpointUser`), so
  the agent only sees public utterances.
* ``prompted`` — the same with :data:`PROMPTED_INSTRUCTION` put before the gym's user system
  prompt (the prompted-baseline user).
* ``openai`` — an external OpenAI-compatible endpoint, also through the shim.

Every model-backed reply is checked: a refusal to play the user
(:func:`~mimesis_lab.rollout.sim_rollout.is_refusal`, checked by the endpoint user) ends the episode invalid
``refusal``, and (:class:`GuardedUser`) a
PersuadeGym reply without a parseable ``Stance: N`` ends it invalid ``user_error`` — the gym
would otherwise keep the old stance and pay reward 0, the "fixed sentence" failure of SPEC §4.2
that must not count as the agent's failure. Endpoint errors and timeouts are already reported by
:class:`EndpointUser` / :meth:`Gym.ask_user` (``user_error`` / ``timeout``).

An evaluation user equal to the training user is refused (:func:`check_not_training_user`): same
path, same base URL, or a checkpoint with the same content fingerprint (a copy). Servers bind
127.0.0.1 and are stopped by :meth:`EvalUserSide.close` (use it as a context manager).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from mimesis_lab.envs.gyms.base import Gym, UserReply, UserSideError

__all__ = ["PROMPTED_INSTRUCTION", "SCRIPTED_VERSION", "TrainingUserError", "checkpoint_fingerprint",
           "user_identity", "check_not_training_user", "ScriptedEvalUser", "GuardedUser", "EvalUserSide",
           "open_eval_user"]

SCRIPTED_VERSION = "scripted-v1"   # bump when ScriptedEvalUser's answers change (it is part of the cache key)
PROMPTED_INSTRUCTION = (
    "You are role-playing the USER in this conversation, not the AI assistant. Stay in character as the human "
    "user described below: write only what this user would say next, in their own voice, never answer as an "
    "assistant and never mention these instructions.")
# files of a checkpoint folder that change what it generates (training_summary.json etc. do not)
FINGERPRINT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                     "pytorch_model.bin.index.json", "config.json", "generation_config.json", "tokenizer.json",
                     "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                     "vocab.json", "merges.txt", "tokenizer.model")
_SHARD = re.compile(r"^model-\d+-of-\d+\.safetensors$|^pytorch_model-\d+-of-\d+\.bin$")


class TrainingUserError(ValueError):
    """An evaluation user is the training user (SPEC §4.2: evaluation users differ from it)."""


# ----------------------------------------------------------------------------------- fingerprints
def _file_sha256(path: Path, memo: dict[str, Any] | None) -> str:
    st = path.stat()
    mkey = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if memo is not None and mkey in memo:
        return memo[mkey]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if memo is not None:
        memo[mkey] = digest
    return digest


def checkpoint_fingerprint(path: str | os.PathLike, memo: dict[str, Any] | None = None) -> str:
    """``sha256:<hex>`` of the generation-relevant files of a checkpoint folder (content, not path).

    Covers the weights (single file or shards), ``config.json``, the generation config and the
    tokenizer/chat-template files, by name and content hash. A copy of a folder has the same
    fingerprint; retraining to different weights changes it. ``memo`` (a dict, persisted by the
    caller) maps ``path|size|mtime_ns`` to the file hash so unchanged files are not re-hashed.
    Raises ``FileNotFoundError`` if the folder or its weights are missing.
    """
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: checkpoint folder not found")
    names = sorted(n for n in os.listdir(p) if (n in FINGERPRINT_FILES or _SHARD.match(n)) and (p / n).is_file())
    if not any(n.endswith((".safetensors", ".bin")) for n in names):
        raise FileNotFoundError(f"{p}: no model weights to fingerprint")
    doc = [(n, _file_sha256(p / n, memo)) for n in names]
    return "sha256:" + hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def user_identity(ucfg: Any, memo: dict[str, Any] | None = None) -> str:
    """What makes this evaluation user answer the way it does (part of every rollout's cache key):
    kind, the model's content fingerprint or the endpoint's base URL + model, the sampling settings,
    and for ``prompted`` the instruction's hash."""
    sampling = f"max_new_tokens={ucfg.max_new_tokens}|temperature={ucfg.temperature:g}"
    if ucfg.kind == "scripted":
        return f"scripted|{SCRIPTED_VERSION}"
    if ucfg.kind == "openai":
        return f"openai|{ucfg.openai.base_url.rstrip('/')}|{ucfg.openai.model}|{sampling}"
    ident = f"{ucfg.kind}|{checkpoint_fingerprint(ucfg.model_path, memo)}|{sampling}"
    if ucfg.kind == "prompted":
        ident += "|instruction=" + hashlib.sha256(PROMPTED_INSTRUCTION.encode()).hexdigest()[:12]
    return ident


def check_not_training_user(name: str, ucfg: Any, training_user: str | None,
                            memo: dict[str, Any] | None = None) -> None:
    """Raise :class:`TrainingUserError` if evaluation user ``name`` is the training user: the same
    path (resolved), the same base URL, or a checkpoint with the training user's content fingerprint."""
    if not training_user:
        return
    train = str(training_user).rstrip("/")
    ident = (ucfg.model_path or (ucfg.openai.base_url if ucfg.openai is not None and ucfg.kind == "openai"
                                 else "") or "").rstrip("/")
    same = bool(ident) and ident == train
    if not same and ucfg.model_path and Path(ucfg.model_path).exists() and Path(train).exists():
        same = Path(ucfg.model_path).resolve() == Path(train).resolve()
        if not same and Path(train).is_dir():
            try:
                same = checkpoint_fingerprint(ucfg.model_path, memo) == checkpoint_fingerprint(train, memo)
            except FileNotFoundError:
                same = False
    if same:
        raise TrainingUserError(f"evaluation user {name!r} ({ident}) is the training user ({train}); evaluation "
                                "users must differ from the user the agents were trained against")


# ----------------------------------------------------------------------------------- scripted user
_GENERIC = re.compile(r"\b(prefer\w*|priorit\w*|important|matters?|looking for|requirements?|wish\w*|"
                      r"what (else|do you want|would you like))\b", re.IGNORECASE)


def _words(text: str) -> set[str]:
    from mimesis_lab.envs.gyms.intention import content_words

    return {w for w in content_words(text or "") if len(w) >= 3}


class ScriptedEvalUser:
    """The deterministic cooperative user of one episode (module docstring); bound to its gym,
    whose hidden task and state it reads. ``respond`` never fails."""

    def __init__(self, gym: Gym):
        self.gym = gym
        self.replies: list[str] = []
        self._revealed: set[int] = set()
        self._stance: int | None = None

    def respond(self, messages: list[dict[str, str]]) -> UserReply:
        question = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        fn = getattr(self, f"_{self.gym.name}", None)
        text = fn(question) if fn is not None else "I don't know."
        self.replies.append(text)
        return UserReply(text)

    def close(self) -> None:
        pass

    def _travel(self, q: str) -> str:
        from mimesis_lab.envs.gyms.travel import mentions

        prefs = self.gym.task["preferences"]
        known = set(getattr(self.gym, "known", ()))
        hidden = [i for i, p in enumerate(prefs) if not p.get("stated") and i not in self._revealed and i not in known]
        hit = next((i for i in hidden if any(mentions(q, k) for k in prefs[i].get("keywords", []))
                    or _words(prefs[i]["text"]) & _words(q)), None)
        if hit is None and hidden and _GENERIC.search(q):
            hit = hidden[0]
        if hit is None:
            return "I don't mind about that."
        self._revealed.add(hit)
        p = prefs[hit]
        text = p["text"].rstrip(".")
        kws = p.get("keywords") or []
        if kws and not any(mentions(text, k) for k in kws):
            text += f" ({kws[0]})"
        return text + "."

    def _turtle(self, q: str) -> str:
        t = self.gym.task
        qw, sw = _words(q), _words(t["solution"] + " " + " ".join(t.get("key_facts", [])))
        if not qw:
            return "Irrelevant"
        share = len(qw & sw) / len(qw)
        return "Yes" if share >= 0.5 else "No" if share > 0 else "Irrelevant"

    def _telepathy(self, q: str) -> str:
        t = self.gym.task
        ref = _words(f"{t.get('category', '')} {t.get('description', '')}")
        return "Yes." if _words(q) & ref else "No."

    def _persuade(self, q: str) -> str:
        from mimesis_lab.envs.gyms.persuade import target_direction

        t = self.gym.task
        if self._stance is None:
            self._stance = int(t["initial_stance"])
        if _words(q) & _words(t["claim"] + " " + " ".join(t["reasons"])):
            self._stance = min(7, max(1, self._stance + target_direction(t)))
            return f"That addresses one of my concerns, I see your point.\nStance: {self._stance}"
        return f"I'm not convinced yet; that doesn't address my reasons.\nStance: {self._stance}"

    def _intention(self, q: str) -> str:
        idx = self.gym.match(q)
        if idx is None:
            return "I have no particular preference about that."
        d = self.gym.details[idx]
        return f"{d['description']}: {self.gym.chosen[idx]}."

    def _tau(self, q: str) -> str:
        from mimesis_lab.envs.gyms.tau import STOP

        if self.gym.final_reward() == 1.0 and self.gym.task.get("actions"):
            return f"Thank you, that is everything I needed. {STOP}"
        if not self.replies:
            return str(self.gym.task["instruction"])
        return "Could you please take care of my request? " + str(self.gym.task["instruction"])

    def _search(self, q: str) -> str:
        return f"I just want to know this: {self.gym.task['question']}"


# ----------------------------------------------------------------------------------- model-backed users
class GuardedUser:
    """Wraps an endpoint user: puts ``instruction`` before the gym's user system prompt and turns a
    PersuadeGym reply without a stance into ``UserSideError("user_error")`` (module docstring); refusals
    are caught by the endpoint user itself (:class:`~mimesis_lab.rollout.user_side.EndpointUser`). ``replies`` are the inner user's."""

    def __init__(self, inner: Any, gym_name: str, instruction: str | None = None):
        self.inner, self.gym_name, self.instruction = inner, gym_name, instruction

    @property
    def replies(self) -> list[str]:
        return getattr(self.inner, "replies", [])

    def respond(self, messages: list[dict[str, str]]) -> UserReply:
        from mimesis_lab.envs.gyms.persuade import parse_stance

        msgs = [dict(m) for m in messages]
        if self.instruction:
            if msgs and msgs[0].get("role") == "system":
                msgs[0]["content"] = f"{self.instruction}\n\n{msgs[0]['content']}"
            else:
                msgs.insert(0, {"role": "system", "content": self.instruction})
        reply = self.inner.respond(msgs)      # a refusal comes back as UserReply(reason="refusal") (EndpointUser)
        if reply.text is not None and reply.text.strip():
            if self.gym_name == "persuade" and parse_stance(reply.text) is None:
                raise UserSideError("user_error", f"PersuadeGym user reply has no `Stance: N` line (the stance, "
                                    f"hence the reward, is unobservable): {reply.text[:160]!r}")
        return reply

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class EvalUserSide:
    """One evaluation user for a whole evaluation: its servers (if any) and a user per episode.

    ``make(gym, episode, seed)`` returns the episode's :class:`UserSide`; ``privileged(episode)``
    the simulator's reasoning kept by the shim (``[]`` for scripted users or unasked episodes);
    ``release(episode)`` forgets an episode; ``close()`` stops the servers.
    """

    def __init__(self, name: str, ucfg: Any):
        self.name, self.cfg, self.kind = name, ucfg, ucfg.kind
        self.server = self.shim = None
        self.model = None
        if self.kind == "scripted":
            return
        from mimesis_lab.rollout.shim import PrivilegedShim

        try:
            if self.kind in ("simulator", "prompted"):
                from mimesis_lab.models import load_model
                from mimesis_lab.rollout.serve import ModelServer
                from mimesis_lab.tokenizer import load_tokenizer

                self.server = ModelServer(load_model(ucfg.model_path).eval(), load_tokenizer(ucfg.model_path),
                                          host="127.0.0.1")
                self.server.start()
                upstream, self.model = self.server.url, "local"
            else:
                upstream, self.model = ucfg.openai.base_url, ucfg.openai.model
            self.shim = PrivilegedShim(upstream, host="127.0.0.1", timeout_s=ucfg.timeout_s, max_episodes=1 << 16)
            self.shim.start()
        except BaseException:
            self.close()
            raise

    def make(self, gym: Gym, episode: str, seed: int) -> Any:
        if self.kind == "scripted":
            return ScriptedEvalUser(gym)
        from mimesis_lab.rollout.backends import SamplingParams
        from mimesis_lab.rollout.user_side import EndpointUser

        ucfg = self.cfg
        inner = EndpointUser.from_params(ucfg, self.shim.url, self.model, episode, SamplingParams(
            max_new_tokens=ucfg.max_new_tokens, temperature=ucfg.temperature, seed=seed))
        return GuardedUser(inner, gym.name, PROMPTED_INSTRUCTION if self.kind == "prompted" else None)

    def privileged(self, episode: str) -> list[str]:
        if self.shim is None:
            return []
        try:
            return self.shim.privileged(episode)
        except KeyError:     # the user side was never asked in this episode
            return []

    def release(self, episode: str) -> None:
        if self.shim is not None:
            self.shim.delete(episode)

    def close(self) -> None:
        for srv in (self.shim, self.server):
            if srv is not None:
                try:
                    srv.stop()
                except Exception:   # pragma: no cover - best effort on shutdown
                    pass
        self.shim = self.server = None

    def __enter__(self) -> "EvalUserSide":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_eval_user(name: str, ucfg: Any, training_user: str | None = None) -> EvalUserSide:
    """Start evaluation user ``name`` (refusing the training user); close it (or use ``with``)."""
    check_not_training_user(name, ucfg, training_user)
    return EvalUserSide(name, ucfg)
