"""Agent gyms (UserRL style, SPEC §3.1, DESIGN §5): one interface, a registry keyed by ``data_source``.

A gym episode is created from one UserRL row: ``data_source = "interact_<gym>"`` (or UserRL's own
published name, :data:`USERRL_DATA_SOURCES`, e.g. ``interact_turtlegym``: both select the gym),
``prompt`` (system + user messages the agent starts from), ``reward_model`` (``ground_truth``,
``env_name``…), ``extra_info.tools_kwargs.interact_with_env.create_kwargs`` (``env_name``, the
task ``id`` and whatever the gym needs). The task itself (hidden preferences, the hidden rule,
the entity to guess, the retail database…) is looked up by id in the gym's task file — or, for the
gyms whose UserRL rows carry it inline (turtle, telepathy, persuade), built from ``create_kwargs``
(:func:`mimesis_lab.envs.gyms.registry.resolve_task`).

The agent acts through one tool, ``interact_with_env(choice, content)`` with ``choice`` in
``{action, answer, search}``; the rollout loop turns a call into ``gym.step(choice, content)``
which returns a :class:`StepResult` (feedback text for the agent, this turn's reward, done).

**The user side of every gym is the simulator.** Gyms that need a human answer (a preference,
a yes/no, a stance) ask their :class:`UserSide` — in training the frozen simulator behind the
privileged shim (:mod:`mimesis_lab.rollout.shim`), which returns only the public utterance —
through :meth:`Gym.ask_user`, with a user-simulator view of the conversation: a system prompt
that holds the user's hidden task, the agent's messages in the ``user`` slot and the user's own
previous replies in the ``assistant`` slot. A user failure (endpoint error, timeout, refusal)
raises :class:`UserSideError`; the rollout loop records the episode as *invalid* with that
reason — never as reward 0.

Everything a gym knows that the agent must discover is listed by :meth:`Gym.hidden_facts`
(the CSD leak validator drops coaching notes that reveal them).
"""
from __future__ import annotations

import json
import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

__all__ = ["CHOICES", "USERRL_DATA_SOURCES", "gym_name", "StepResult", "UserReply", "UserSide", "UserSideError", "Gym", "GYMS", "register_gym",
           "make_gym", "create_kwargs", "ScriptedUser"]

CHOICES = ("action", "answer", "search")
# UserRL's published data_source names that differ from ours (``interact_<gym>``); both are registered
USERRL_DATA_SOURCES = {"interact_taugym": "tau", "interact_turtlegym": "turtle", "interact_telepathygym": "telepathy",
                       "interact_travelgym": "travel", "interact_searchgym": "search"}


@dataclass(frozen=True)
class StepResult:
    """What one tool call returns: ``observation`` (feedback text shown to the agent), the turn's
    ``reward`` (a float, may be 0), ``done``, and ``info`` (logged, never shown to the agent)."""

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UserReply:
    """The user's public reply, or an error reason (``text`` is ``None`` then; ``transient``: a remote
    user whose retries ran out on a timeout, transport error, 429 or 5xx)."""

    text: str | None
    error: str | None = None
    transient: bool = False
    reason: str | None = None     # the invalid reason when known (``refusal``, ``timeout``, ``user_error``)


class UserSideError(RuntimeError):
    """The user side could not answer; ``reason`` is ``user_error``, ``timeout`` or ``refusal``;
    ``transient``: a retry later may succeed (timeout, transport error, 429/5xx after the retries)."""

    def __init__(self, reason: str, detail: str, transient: bool = False):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.transient = reason, detail, transient


@runtime_checkable
class UserSide(Protocol):
    """Who plays the user: ``respond(messages)`` with the user-simulator view → :class:`UserReply`."""

    def respond(self, messages: list[dict[str, str]]) -> UserReply: ...


class ScriptedUser:
    """A deterministic user for tests only: ``fn(messages) -> str`` (never used in training)."""

    def __init__(self, fn):
        self.fn = fn
        self.calls: list[list[dict[str, str]]] = []

    def respond(self, messages: list[dict[str, str]]) -> UserReply:
        self.calls.append([dict(m) for m in messages])
        return UserReply(self.fn(messages))


def create_kwargs(row: dict[str, Any]) -> dict[str, Any]:
    """``extra_info.tools_kwargs.interact_with_env.create_kwargs`` of a UserRL row (``{}`` if absent)."""
    info = row.get("extra_info") or {}
    tk = (info.get("tools_kwargs") or {}).get("interact_with_env") or {}
    return dict(tk.get("create_kwargs") or {})


def task_records(data: Any, path: str | Path, gym: str) -> list[Any]:
    """The records of a parsed task file: a JSON list, ``{"tasks": [...]}``, or an ``{id: record}`` object
    (a record without ``id`` gets its key). Any other document is a ``ValueError`` naming ``path``."""
    if isinstance(data, dict):
        if isinstance(data.get("tasks"), list):
            return data["tasks"]
        return [dict(v, id=v.get("id", k)) if isinstance(v, dict) else v for k, v in data.items()]
    if not isinstance(data, list):
        raise ValueError(f"{path}: the {gym} task file must be a JSON list of tasks or an {{id: task}} object, "
                         f"got {type(data).__name__}")
    return data


def check_id(rec: dict[str, Any]) -> None:
    """``ValueError`` unless the record's ``id`` is a non-empty string or an integer (not a boolean)."""
    tid = rec.get("id")
    if isinstance(tid, bool) or not isinstance(tid, (str, int)) or not str(tid).strip():
        raise ValueError(f"missing or empty field 'id' (got {tid!r:.40})")


def check_finite(value: Any, where: str = "") -> None:
    """``ValueError`` naming the field (``options[0].price``) of the first NaN or infinite number in ``value``
    (a record, walked through its objects and lists): no task may hold one."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"field {where or 'value'!r} is not finite ({value!r})")
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_finite(v, f"{where}[{i}]")


def check_strings(rec: dict[str, Any], required: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> None:
    """``ValueError`` naming the field unless each ``required`` field is a non-empty string and each
    ``optional`` one, when present, a string."""
    for k in required:
        v = rec.get(k)
        if v is None or v == "" or v == [] or v == {}:
            raise ValueError(f"missing or empty field {k!r}")
        if not isinstance(v, str) or not v.strip():
            raise ValueError(f"field {k!r} must be a non-empty string, got {type(v).__name__} {v!r:.40}")
    for k in optional:
        if k in rec and not isinstance(rec[k], str):
            raise ValueError(f"field {k!r} must be a string, got {type(rec[k]).__name__} {rec[k]!r:.40}")


def check_string_list(rec: dict[str, Any], key: str, required: bool = False) -> None:
    """``ValueError`` naming ``key`` unless it is a list of non-empty strings (non-empty when ``required``;
    when not required the field may be absent, but not null)."""
    if key not in rec and not required:
        return
    v = rec.get(key)
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise ValueError(f"field {key!r} must be a list of non-empty strings, got {v!r:.60}")
    if required and not v:
        raise ValueError(f"missing or empty field {key!r}")


def tasks_by_id(path: str | Path, gym: str, required: tuple[str, ...], convert=None) -> dict[str, dict[str, Any]]:
    """Tasks by id, from a JSON list of records (each with ``id``) or an ``{id: record}`` object; a
    record that is not an object, has no ``id`` or an empty ``required`` field is an error naming ``path``
    and the missing field. ``convert(record)`` (optional) maps another schema (UserRL's) onto ours first
    (and may check the record); it raises ``ValueError`` naming the field. A NaN or infinite number
    anywhere in a record is an error naming its field (:func:`check_finite`)."""
    data = task_records(json.loads(Path(path).read_text(encoding="utf-8")), path, gym)
    tasks: dict[str, dict[str, Any]] = {}
    for rec in data:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: malformed {gym} task (not an object): {rec!r:.80}")
        if "id" not in rec:
            raise ValueError(f"{path}: malformed {gym} task: missing field 'id': {rec!r:.80}")
        try:
            check_id(rec)
            check_finite(rec)
            if convert is not None:
                rec = convert(rec)
        except ValueError as e:
            raise ValueError(f"{path}: malformed {gym} task {str(rec['id'])!r}: {e}") from None
        missing = [k for k in required if not rec.get(k)]
        if missing:
            raise ValueError(f"{path}: malformed {gym} task {str(rec['id'])!r}: missing or empty field "
                             f"{missing[0]!r}")
        tasks[str(rec["id"])] = rec
    return tasks


class Gym(ABC):
    """One episode of one gym. Subclasses set ``name`` (``travel``…), ``env_name`` (``TravelGym``…)
    and implement :meth:`step` (and usually :meth:`reset_state`, :meth:`setup`, :meth:`user_system_prompt`,
    :meth:`hidden_facts`). ``task`` is the gym's task record (from its task file, by id)."""

    name: ClassVar[str] = ""
    env_name: ClassVar[str] = ""

    def __init__(self, task: dict[str, Any], user: UserSide | None = None, rng: random.Random | None = None,
                 max_steps: int = 16):
        self.task = task
        self.user = user
        self.rng = rng or random.Random(0)
        self.max_steps = max_steps
        self.steps = 0
        self.done = False
        self.dialogue: list[dict[str, str]] = []   # agent <-> user messages, public only
        self.setup()
        self.reset()

    @classmethod
    def data_source(cls) -> str:
        return f"interact_{cls.name}"

    @classmethod
    def userrl_row(cls, task_id: str, system: str, user: str, ground_truth: str, split: str, index: int,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """One UserRL-format row of this gym; ``extra`` fields go into both ``reward_model`` and the
        ``create_kwargs`` (as the real IntentionGym rows carry ``category`` and ``task``)."""
        extra = dict(extra or {})
        return {
            "data_source": cls.data_source(),
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "ability": "interaction",
            "reward_model": {**extra, "env_name": cls.env_name, "ground_truth": ground_truth, "id": task_id,
                             "style": "rule"},
            "extra_info": {"split": split, "index": index, "need_tools_kwargs": True,
                           "tools_kwargs": {"interact_with_env": {"create_kwargs": {
                               **extra, "env_name": cls.env_name, "id": task_id}}}},
        }

    def setup(self) -> None:
        """One-time preparation of this episode before its first :meth:`reset` (an index, a database,
        the user's drawn choices…); nothing by default."""

    def reset(self) -> str:
        """Start the episode: no steps, not done, no dialogue, then :meth:`reset_state`; returns the
        initial observation appended to the agent's prompt (``""`` for none)."""
        self.steps, self.done, self.dialogue = 0, False, []
        return self.reset_state()

    def reset_state(self) -> str:
        """The gym's own episode state; returns the initial observation (``""`` for none)."""
        return ""

    @abstractmethod
    def step(self, choice: str, content: str) -> StepResult:
        """Apply ``interact_with_env(choice, content)``; an unknown choice is feedback, not an exception."""

    def user_system_prompt(self) -> str:
        """The simulator's instructions for this episode (holds the user's hidden task)."""
        return "You are a human user talking to an AI assistant."

    def hidden_facts(self) -> list[str]:
        """Strings the agent must discover (preferences, the answer, the entity…): a coaching note
        containing one of them leaks the task."""
        return []

    def ask_user(self, agent_message: str) -> str:
        """Send ``agent_message`` to the user side and return its public reply (raises :class:`UserSideError`)."""
        if self.user is None:
            raise UserSideError("user_error", f"{self.env_name} needs a user side but none was given")
        self.dialogue.append({"role": "agent", "content": agent_message})
        view = [{"role": "system", "content": self.user_system_prompt()}]
        for m in self.dialogue:
            view.append({"role": "user" if m["role"] == "agent" else "assistant", "content": m["content"]})
        reply = self.user.respond(view)
        if reply.text is None or not reply.text.strip():
            reason = getattr(reply, "reason", None) or \
                ("timeout" if reply.error and "timeout" in reply.error.lower() else "user_error")
            raise UserSideError(reason, reply.error or "empty user reply",
                                transient=reason == "timeout" or bool(getattr(reply, "transient", False)))
        self.dialogue.append({"role": "user", "content": reply.text.strip()})
        return reply.text.strip()


GYMS: dict[str, type[Gym]] = {}


def register_gym(cls: type[Gym]) -> type[Gym]:
    """Register ``cls`` under ``interact_<name>`` and under UserRL's own data_source name for it (if any)."""
    names = [cls.data_source(), *(ds for ds, g in USERRL_DATA_SOURCES.items() if g == cls.name)]
    if not cls.name or any(ds in GYMS and GYMS[ds] is not cls for ds in names):
        raise ValueError(f"gym {cls.__name__}: missing or duplicate name {cls.name!r}")
    for ds in names:
        GYMS[ds] = cls
    return cls


def gym_name(data_source: Any) -> str | None:
    """The gym name (``turtle``…) of a row's ``data_source`` — ours (``interact_turtle``) or UserRL's
    (``interact_turtlegym``) — or ``None`` when no gym is registered for it."""
    cls = GYMS.get(str(data_source))
    return cls.name if cls is not None else None


def make_gym(data_source: str, task: dict[str, Any], user: UserSide | None = None,
             rng: random.Random | None = None, max_steps: int = 16) -> Gym:
    if data_source not in GYMS:
        raise KeyError(f"no gym registered for data_source {data_source!r} (known: {sorted(GYMS)})")
    return GYMS[data_source](task, user=user, rng=rng, max_steps=max_steps)
