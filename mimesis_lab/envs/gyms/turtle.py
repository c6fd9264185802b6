"""TurtleGym (SPEC §3.1, DESIGN §5): a lateral-thinking "turtle soup" story; yes/no questions, then an explanation.

A task (``data/raw/gyms/turtle/tasks.json``, a list of records or ``{id: record}``)::

    {"id": "turtle-1", "title": "…", "surface": "<the puzzling story shown to the agent>",
     "solution": "<the hidden full story>", "key_facts": ["<short fact>", …]}

UserRL's own story file (``{id: {new_title, new_surface, new_bottom, evaluation: [{statement,
score}], judgment…}}``) is read too (:func:`from_userrl`): ``surface``/``solution`` are
``new_surface``/``new_bottom`` and the key facts the sentences of the bottom story, as for a UserRL
row, which carries its story inline (``create_kwargs``: ``title``, ``surface``, ``bottom``;
:func:`task_from_kwargs`, task id = the title): one story is judged the same way whichever file it
came from. UserRL's ``evaluation`` statements are written for its LLM judge ("The story reveals that
the protagonist is…", "The motive … is explained and logically justifiable"); word overlap cannot
check them (the bottom story itself covered none of them for 2 of the 6 sample stories), so they are
kept as the task's ``evaluation`` (statement, score) and not used by the rule judge.

**Reward rule** (a deterministic rule judge stands in for the reference's LLM judge):

* ``action`` (content = a yes/no question): the user side, which holds the solution and answers
  only Yes / No / Irrelevant, replies; reward 0, not done.
* ``answer`` (content = the agent's explanation of the story): each key fact is *covered* when more
  than half of its *new* content words occur in the explanation — content words lower-cased,
  stop-words dropped, a trailing plural ``s`` stripped; *new* means not already shown by the title
  or the surface story (the protagonist's name, the city), which the agent can copy without asking
  anything; a fact whose words the surface all shows counts all of them. ``score = covered /
  len(key_facts)``. (With "at least half" of all the words, "kate's work" covered 2 of 3 facts of a
  story whose key facts were "kate works as a nurse", "kate started work at dawn": the agent learned
  to repeat the name and a frequent word instead of asking.) The reward is the
  gain over the best score so far, ``max(0, score - best)``, then ``best = max(best, score)``
  (so the rewards of an episode sum to its best score). The episode is done when
  ``score >= 0.99``; answers may be given several times.

Unknown choices (``search`` included) and empty content are feedback (reward 0, not done); each
call counts as a step and the episode ends after ``max_steps`` steps.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from mimesis_lab.envs.gyms.base import Gym, StepResult, register_gym, tasks_by_id

__all__ = ["TASKS_PATH", "TurtleGym", "load_tasks", "build_rows", "content_words", "fact_covered", "judge",
           "from_userrl", "task_from_kwargs", "check_task"]

TASKS_PATH = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "turtle" / "tasks.json"

COVER_THRESHOLD = 0.5
DONE_SCORE = 0.99

_STOP = frozenset("""a an the and or but if then so because as of in on at to for from by with without into onto
over under about after before during while when where which who whom whose what why how that this these those
there here it its he him his she her hers they them their we us our you your i me my mine is are was were be been
being am do does did done has have had having not no nor yes can could would should will shall may might must
very just only also too than up down out off all any each every some such own same other another again once
one""".split())

SYSTEM_PROMPT = (
    "You are an agent that interacts with an environment to solve a puzzle. The environment and your "
    "action space are described below.\n\n"
    "- Environment Description: TurtleGym is a lateral-thinking story game (a 'turtle soup' puzzle). "
    "You are shown the surface of a strange story; behind it is a hidden full story with a twist. "
    "Find out what really happened by asking the host yes-or-no questions, then explain the story.\n\n"
    "- Action Space: call the tool `interact_with_env` with a `choice` of `action` or `answer` and a "
    "`content` string.\n\n"
    "- Action Description:\n"
    "  * `action`: ask the host one yes-or-no question in `content`. The host answers only Yes, No or "
    "Irrelevant.\n"
    "  * `answer`: give your explanation of the whole hidden story in `content`: who did what and why, "
    "including every twist you have uncovered. You may answer several times; a better explanation "
    "earns more.\n\n"
    "- Important Notes:\n"
    "  * First reason about your next step between `<think>` and `</think>`, then call the tool.\n"
    "  * The number of interaction rounds is limited; test bold hypotheses with sharp questions.\n"
    "  * Think about unusual readings of every detail in the surface story.\n"
    "  * Be bold, creative and smart. Let's begin!"
)


def content_words(text: str) -> set[str]:
    """Lower-cased alphanumeric words minus stop-words, a trailing plural ``s`` stripped."""
    out = set()
    for w in re.findall(r"[a-z0-9]+", str(text).lower()):
        if w in _STOP or (len(w) < 2 and not w.isdigit()):
            continue
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def fact_covered(fact: str, explanation: str | set[str], shown: str | set[str] = frozenset()) -> bool:
    """Whether ``explanation`` covers ``fact``: more than :data:`COVER_THRESHOLD` of the fact's content
    words that ``shown`` (the text the agent already sees: title and surface) does not hold occur in it;
    all of the fact's words when ``shown`` holds every one."""
    fw = content_words(fact)
    ew = explanation if isinstance(explanation, set) else content_words(explanation)
    new = fw - (shown if isinstance(shown, (set, frozenset)) else content_words(shown)) or fw
    return bool(new) and len(new & ew) / len(new) > COVER_THRESHOLD


def judge(key_facts: list[str], explanation: str, weights: list[float] | None = None, shown: str = "") -> float:
    """Share of ``key_facts`` covered by ``explanation`` (:func:`fact_covered`; words of ``shown``, the
    title and surface the agent sees, are no evidence), weighted by ``weights`` when given; 0 when
    there are no key facts."""
    if not key_facts:
        return 0.0
    ew, sw = content_words(explanation), content_words(shown)
    w = [float(x) for x in weights] if weights and len(weights) == len(key_facts) else [1.0] * len(key_facts)
    total = sum(w)
    return sum(wi for f, wi in zip(key_facts, w) if fact_covered(f, ew, sw)) / total if total > 0 else 0.0


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", str(text).strip()) if content_words(s)]


def _text(rec: dict[str, Any], key: str) -> str:
    v = rec.get(key)
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"missing or empty field {key!r}")
    return v.strip()


def from_userrl(rec: dict[str, Any]) -> dict[str, Any]:
    """A task of UserRL's story file (``new_title``/``new_surface``/``new_bottom``/``evaluation``) in our
    schema; records already in ours pass through. ``ValueError`` names a missing field."""
    if not any(k in rec for k in ("new_title", "new_surface", "new_bottom")):
        return rec
    surface, bottom = _text(rec, "new_surface"), _text(rec, "new_bottom")
    evaluation = []
    for i, e in enumerate(rec.get("evaluation") or []):
        if not isinstance(e, dict) or not isinstance(e.get("statement"), str) or not e["statement"].strip():
            raise ValueError(f"evaluation[{i}] has no 'statement'")
        score = e.get("score", 1.0)
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not score >= 0 or score == float("inf"):
            raise ValueError(f"evaluation[{i}].score {score!r} is not a finite number >= 0")
        evaluation.append({"statement": e["statement"].strip(), "score": float(score)})
    facts = _sentences(bottom)
    if not facts:
        raise ValueError("field 'new_bottom' has no sentence with a content word")
    out = {"id": str(rec["id"]), "title": str(rec.get("new_title") or "Untitled"), "surface": surface,
           "solution": bottom, "key_facts": facts}
    if evaluation:
        out["evaluation"] = evaluation
    return out


def task_from_kwargs(kwargs: dict[str, Any], reward_model: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The task a UserRL turtle row carries inline (``create_kwargs``: ``title``, ``surface``, ``bottom``);
    ``None`` when the row carries none (ours: only an id). ``ValueError`` names a missing field."""
    if not any(k in kwargs for k in ("surface", "bottom")):
        return None
    surface, bottom = _text(kwargs, "surface"), _text(kwargs, "bottom")
    title = str(kwargs.get("title") or "").strip()
    facts = _sentences(bottom)
    if not facts:
        raise ValueError("field 'bottom' has no sentence with a content word")
    return {"id": str(kwargs.get("id") or title or surface[:60]), "title": title or "Untitled", "surface": surface,
            "solution": bottom, "key_facts": facts}


def check_task(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` if it can be played, else ``ValueError`` naming the field: ``surface`` and ``solution``
    non-empty strings (``title`` a string), ``key_facts`` a non-empty list of strings each with a content
    word (a fact without one can never be covered, so the story could never be solved), and
    ``key_fact_weights`` (optional) one finite number >= 0 per key fact, not all 0."""
    for k in ("surface", "solution"):
        if not isinstance(rec.get(k), str) or not rec[k].strip():
            raise ValueError(f"missing or empty field {k!r}" if not rec.get(k) else
                             f"field {k!r} must be a non-empty string, got {type(rec[k]).__name__} {rec[k]!r:.40}")
    if "title" in rec and not isinstance(rec["title"], str):
        raise ValueError(f"field 'title' must be a string, got {type(rec['title']).__name__}")
    facts = rec.get("key_facts")
    if not facts:
        raise ValueError("missing or empty field 'key_facts'")
    if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
        raise ValueError(f"field 'key_facts' must be a list of strings, got {facts!r:.60}")
    empty = [i for i, f in enumerate(facts) if not content_words(f)]
    if empty:
        raise ValueError(f"field 'key_facts' [{empty[0]}] {facts[empty[0]]!r:.40} has no content word (it can never "
                         "be covered)")
    if "key_fact_weights" in rec:
        w = rec["key_fact_weights"]
        if not isinstance(w, list) or len(w) != len(facts) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in w) \
                or not sum(w) > 0:
            raise ValueError(f"field 'key_fact_weights' must be one finite number >= 0 per key fact (not all 0), "
                             f"got {w!r:.60}")
    return rec


def load_tasks(path: str | Path = TASKS_PATH) -> dict[str, dict[str, Any]]:
    """Tasks by id, from a JSON list of records (each with ``id``) or an ``{id: record}`` object, in our
    schema or UserRL's (:func:`from_userrl`); a task that cannot be played is an error naming the field
    (:func:`check_task`)."""
    return tasks_by_id(path, "turtle", ('surface', 'solution', 'key_facts'),
                       convert=lambda rec: check_task(from_userrl(rec)))


def build_rows(tasks: dict[str, dict[str, Any]], split: str) -> list[dict[str, Any]]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        user = (f"Title: {t.get('title', 'Untitled')}\nSurface: {t['surface']}\n"
                "Uncover the hidden story behind the surface and explain what really happened!")
        rows.append(TurtleGym.userrl_row(tid, SYSTEM_PROMPT, user, t["solution"], split, i))
    return rows


@register_gym
class TurtleGym(Gym):
    name = "turtle"
    env_name = "TurtleGym"

    def reset_state(self) -> str:
        self.best = 0.0
        return ""

    def user_system_prompt(self) -> str:
        t = self.task
        return (
            "You are the host of a lateral-thinking puzzle game. The player sees only the surface story and "
            "asks you yes-or-no questions to uncover the hidden story.\n"
            f"Surface story: {t['surface']}\n"
            f"Hidden story (secret): {t['solution']}\n"
            "Rules: answer every question with exactly one word: 'Yes', 'No' or 'Irrelevant' (for questions "
            "that do not matter to the hidden story or cannot be answered with yes or no). Answer truthfully "
            "according to the hidden story. Never reveal or hint at the hidden story beyond that one word."
        )

    def hidden_facts(self) -> list[str]:
        return [self.task["solution"], *self.task["key_facts"]]

    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode is already over.", 0.0, True, {"error": "episode_over"})
        self.steps += 1
        c = str(choice or "").strip().strip("[]").lower()
        text = content if isinstance(content, str) else ("" if content is None else str(content))
        text = text.strip()
        if c not in ("action", "answer"):
            return self._finish(f"Invalid choice {choice!r}: use `action` (ask a yes-or-no question) or `answer` "
                                "(explain the hidden story). Search is not available in this game.", 0.0, False,
                                {"error": "invalid_choice"})
        if not text:
            return self._finish(f"Empty content for `{c}`: write a yes-or-no question or your explanation.", 0.0,
                                False, {"error": "empty_content"})
        if c == "action":
            reply = self.ask_user(text)   # UserSideError propagates to the rollout loop
            return self._finish(reply, 0.0, False, {})
        score = judge(self.task["key_facts"], text, self.task.get("key_fact_weights"),
                      shown=f"{self.task.get('title', '')} {self.task['surface']}")
        gain = max(0.0, score - self.best)
        self.best = max(self.best, score)
        done = score >= DONE_SCORE
        if done:
            obs = "Your explanation captures the whole hidden story. Well done!"
        elif gain > 0:
            obs = f"Your explanation covers more of the hidden story than before ({score:.0%} of it)."
        else:
            obs = f"Your explanation covers {score:.0%} of the hidden story, no better than your best so far."
        return self._finish(obs, gain, done, {"score": score, "best": self.best})

    def _finish(self, obs: str, reward: float, done: bool, info: dict[str, Any]) -> StepResult:
        if not done and self.steps >= self.max_steps:
            done = True
            obs += "\nThe interaction limit has been reached; the episode is over."
            info["max_steps"] = True
        self.done = done
        info["step"] = self.steps
        return StepResult(obs, round(float(reward), 6), done, info)
