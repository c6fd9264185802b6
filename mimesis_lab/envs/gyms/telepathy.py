"""TelepathyGym (SPEC §3.1, DESIGN §5): guess the entity the user thinks of, with yes/no questions.

A task (``data/raw/gyms/telepathy/tasks.json``, a list of records or ``{id: record}``)::

    {"id": "tele-1", "entity": "Eiffel Tower", "category": "landmark",
     "aliases": ["Tour Eiffel", "La Tour Eiffel"], "description": "<optional one-line gloss>"}

UserRL's entity file (``{id, title, target_entity: "<name> - <gloss>", category, description:
"<the prompt>", goal}``) is read too (:func:`from_userrl`): ``entity`` = ``title``, the name
before `` - `` in ``target_entity`` an alias (when it differs), the gloss after it the
``description``, UserRL's ``description`` the row's prompt. A UserRL row carries its entity inline
(``create_kwargs``: ``title``, ``category``; ``reward_model.ground_truth`` = the target entity;
:func:`task_from_kwargs`, task id = the title).

**Reward rule**:

* ``action`` (content = a yes/no question): the user side, which holds the entity, answers;
  reward 0, not done.
* ``answer`` (content = a guess): **1.0** and done if the normalised guess equals the normalised
  entity or one of its aliases; otherwise reward 0, not done (guesses may be repeated).
  Normalisation: accents stripped, lower-cased, punctuation dropped, whitespace collapsed, a
  leading answer phrase ("my guess is", "it is", "is it"…) and a leading article (the/a/an)
  removed. A guess naming the entity inside a longer phrase ("the Eiffel Tower in Paris") does
  not count: one entity per guess.

Unknown choices (``search`` included) and empty content are feedback (reward 0, not done); each
call counts as a step and the episode ends after ``max_steps`` steps.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Any

from mimesis_lab.envs.gyms.base import (Gym, StepResult, check_string_list, check_strings, register_gym,
                                        tasks_by_id)

__all__ = ["TASKS_PATH", "TelepathyGym", "load_tasks", "build_rows", "normalise", "is_match", "from_userrl",
           "task_from_kwargs", "check_task"]

TASKS_PATH = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "telepathy" / "tasks.json"

_LEADS = ("my final guess is", "my guess is", "i think it is", "i think its", "i guess it is", "the answer is",
          "my answer is", "i guess", "i think", "is it", "it is", "its", "answer")
_ARTICLES = ("the", "a", "an")

SYSTEM_PROMPT = (
    "You are an agent that interacts with an environment to play a guessing game. The environment and your "
    "action space are described below.\n\n"
    "- Environment Description: TelepathyGym is a guessing game. The user is thinking of one entity (a "
    "person, place, object, animal, work…) and tells you only its broad category. Narrow it down with "
    "yes-or-no questions and guess the entity.\n\n"
    "- Action Space: call the tool `interact_with_env` with a `choice` of `action` or `answer` and a "
    "`content` string.\n\n"
    "- Action Description:\n"
    "  * `action`: ask the user one yes-or-no question in `content`.\n"
    "  * `answer`: write your guess in `content`: just the name of one entity. You may guess more than "
    "once; a correct guess ends the game.\n\n"
    "- Important Notes:\n"
    "  * First reason about your next step between `<think>` and `</think>`, then call the tool.\n"
    "  * The number of interaction rounds is limited; ask questions that split the remaining "
    "possibilities roughly in half, and guess when you are fairly sure.\n"
    "  * Be bold, creative and smart. Let's begin!"
)


def normalise(text: str) -> str:
    """Accent-free, lower-case, punctuation-free form of a guess or a name (answer lead and article dropped)."""
    t = unicodedata.normalize("NFKD", str(text))
    t = "".join(ch for ch in t if not unicodedata.combining(ch)).lower()
    t = re.sub(r"[’'`]", "", t)
    t = " ".join(re.findall(r"[a-z0-9]+", t))
    changed = True
    while changed:
        changed = False
        for lead in _LEADS:
            if t.startswith(lead + " "):
                t, changed = t[len(lead) + 1:], True
    for art in _ARTICLES:
        if t.startswith(art + " "):
            t = t[len(art) + 1:]
            break
    return t


def is_match(guess: str, task: dict[str, Any]) -> bool:
    g = normalise(guess)
    return bool(g) and any(g == normalise(n) for n in [task["entity"], *task.get("aliases", [])])


def _entity(title: Any, target: Any, category: Any, tid: Any) -> dict[str, Any]:
    if not isinstance(title, str) or not title.strip():
        raise ValueError("missing or empty field 'title'")
    if not isinstance(category, str) or not category.strip():
        raise ValueError("missing or empty field 'category'")
    title = title.strip()
    name, _, gloss = str(target or "").partition(" - ")
    aliases = [name.strip()] if name.strip() and normalise(name) != normalise(title) else []
    return {"id": str(tid or title), "entity": title, "category": category.strip().replace("_", " "),
            "aliases": aliases, **({"description": gloss.strip()} if gloss.strip() else {})}


def from_userrl(rec: dict[str, Any]) -> dict[str, Any]:
    """A record of UserRL's entity file (``title``, ``target_entity``, ``category``, ``description`` = the
    prompt) in our schema; records already in ours (with ``entity``) pass through. ``ValueError`` names
    a missing field."""
    if "entity" in rec or not any(k in rec for k in ("title", "target_entity")):
        return rec
    if not isinstance(rec.get("target_entity"), str) or not rec["target_entity"].strip():
        raise ValueError("missing or empty field 'target_entity'")
    out = _entity(rec.get("title"), rec["target_entity"], rec.get("category"), rec.get("id"))
    if isinstance(rec.get("description"), str) and rec["description"].strip():
        out["prompt"] = rec["description"].strip()
    return out


def task_from_kwargs(kwargs: dict[str, Any], reward_model: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The entity a UserRL telepathy row carries inline (``create_kwargs``: ``title``, ``category``; the
    gloss from ``reward_model.ground_truth``); ``None`` when the row has no ``title`` (ours: an id)."""
    if "title" not in kwargs:
        return None
    return _entity(kwargs.get("title"), (reward_model or {}).get("ground_truth"), kwargs.get("category"),
                   kwargs.get("id"))


def check_task(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` if it can be played, else ``ValueError`` naming the field: ``entity`` and ``category``
    non-empty strings, ``aliases`` (optional) a list of non-empty strings, ``description`` and
    ``prompt`` (optional) strings."""
    check_strings(rec, ("entity", "category"), ("description", "prompt"))
    if not normalise(rec["entity"]):
        raise ValueError(f"field 'entity' {rec['entity']!r:.40} has no letter or digit (no guess could match it)")
    check_string_list(rec, "aliases")
    return rec


def load_tasks(path: str | Path = TASKS_PATH) -> dict[str, dict[str, Any]]:
    """Tasks by id, from a JSON list of records (each with ``id``) or an ``{id: record}`` object, in our
    schema or UserRL's (:func:`from_userrl`); a task that cannot be played is an error naming the field
    (:func:`check_task`)."""
    return tasks_by_id(path, "telepathy", ('entity', 'category'), convert=lambda rec: check_task(from_userrl(rec)))


def build_rows(tasks: dict[str, dict[str, Any]], split: str) -> list[dict[str, Any]]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        user = (t["prompt"] if t.get("prompt") else
                f"I am thinking of a {t['category']}. Try to guess what it is by asking yes-or-no questions!")
        user += "\nFind out which one I have in mind!"
        rows.append(TelepathyGym.userrl_row(tid, SYSTEM_PROMPT, user, t["entity"], split, i))
    return rows


@register_gym
class TelepathyGym(Gym):
    name = "telepathy"
    env_name = "TelepathyGym"

    def reset_state(self) -> str:
        self.guesses: list[str] = []
        return ""

    def user_system_prompt(self) -> str:
        t = self.task
        gloss = f" ({t['description']})" if t.get("description") else ""
        aliases = f" Also known as: {', '.join(t['aliases'])}." if t.get("aliases") else ""
        return (
            f"You are playing a guessing game with an AI assistant. You are thinking of this {t['category']}: "
            f"{t['entity']}{gloss}.{aliases}\n"
            "The assistant asks yes-or-no questions to find it. Answer each question truthfully about "
            f"{t['entity']} with 'Yes', 'No', or 'I'm not sure' when the answer is ambiguous, optionally with a "
            "few words of clarification. Never say the name or an alias, and never give hints beyond the "
            "question asked."
        )

    def hidden_facts(self) -> list[str]:
        return [self.task["entity"], *self.task.get("aliases", [])]

    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode is already over.", 0.0, True, {"error": "episode_over"})
        self.steps += 1
        c = str(choice or "").strip().strip("[]").lower()
        text = content if isinstance(content, str) else ("" if content is None else str(content))
        text = text.strip()
        if c not in ("action", "answer"):
            return self._finish(f"Invalid choice {choice!r}: use `action` (ask a yes-or-no question) or `answer` "
                                "(guess the entity). Search is not available in this game.", 0.0, False,
                                {"error": "invalid_choice"})
        if not text or (c == "answer" and not normalise(text)):
            return self._finish(f"Empty content for `{c}`: write a yes-or-no question or a guess.", 0.0, False,
                                {"error": "empty_content"})
        if c == "action":
            reply = self.ask_user(text)   # UserSideError propagates to the rollout loop
            return self._finish(reply, 0.0, False, {})
        self.guesses.append(text)
        if is_match(text, self.task):
            return self._finish(f"Correct! I was thinking of {self.task['entity']}.", 1.0, True, {"correct": True})
        return self._finish("No, that is not what I am thinking of. Keep asking or guess again.", 0.0, False,
                            {"correct": False})

    def _finish(self, obs: str, reward: float, done: bool, info: dict[str, Any]) -> StepResult:
        if not done and self.steps >= self.max_steps:
            done = True
            obs += "\nThe interaction limit has been reached; the episode is over."
            info["max_steps"] = True
        self.done = done
        info["step"] = self.steps
        return StepResult(obs, round(float(reward), 6), done, info)
