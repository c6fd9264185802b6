"""IntentionGym: uncover the missing details of a vague task (SPEC §3.1, DESIGN §5).

Task format = UserRL's ``all_intentions_test.json``: ``{id, category, task, missing_details:
[{description, importance: "1"|"2"|"3", inquiry, options: [str]}]}``. A task that cannot be played
is an error naming the field: null, empty or non-string ``options`` (no wish to draw), a detail
without a ``description``, an importance other than 1/2/3. For each episode one option
per detail is drawn from the gym's ``rng`` (in order of the details) — the user's actual wish;
the user side (the simulator) holds these in its system prompt.

* ``action`` — a clarifying question, sent to the user (:meth:`Gym.ask_user`); the reply is the
  observation.
* ``answer`` — ends the episode, reward 0.
* ``search`` — not available (feedback, reward 0).

**Matching.** Content words = lower-cased ``[a-z0-9]+`` tokens minus stop words, with a plural
``s`` stripped (words longer than 3 letters not ending in ``ss``). For a detail, ``D`` = the
content words of ``description + inquiry`` and ``T`` those of the vague ``task`` text;
for the question's content words ``Q``, ``overlap = (|Q ∩ D − T| + 0.5 |Q ∩ D ∩ T|) / |D|``
(a word of the task itself counts half: every detail shares it). A detail *matches* when
``overlap >= 0.3`` or the question mentions one of its options (the option's tokens appear
contiguously in the question; options without a content word of ≥ 3 letters are never matched by
mention), scoring 1.0. One question uncovers **at most one** detail: the best-scoring
not-yet-uncovered match (ties → the first in task order), as the agent is told to ask one
question per turn.

**Reward of an ``action`` turn**: ``w / W − 0.05`` where ``w`` is the weight of the detail
newly uncovered by the question (0 if none) with weights 1.0 / 0.7 / 0.4 for importance
"3" / "2" / "1", ``W`` = the sum of the weights of all the task's details, and 0.05 the per-step
penalty charged for every question. Over an episode: ``(sum of uncovered weights) / W − 0.05 ×
(number of questions)``; the bonus part is at most 1.0. Malformed input (unknown choice, empty
question) is reward 0, not penalised. Done when every detail is uncovered, on ``answer``, or
after ``max_steps`` steps.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from mimesis_lab.envs.gyms.base import CHOICES, Gym, StepResult, check_finite, check_id, register_gym, task_records

__all__ = ["IntentionGym", "DEFAULT_TASKS", "IMPORTANCE_WEIGHTS", "STEP_PENALTY", "MATCH_THRESHOLD",
           "load_tasks", "build_rows", "content_words", "match_score"]

DEFAULT_TASKS = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "intention" / "tasks.json"
IMPORTANCE_WEIGHTS = {"3": 1.0, "2": 0.7, "1": 0.4}
STEP_PENALTY = 0.05
MATCH_THRESHOLD = 0.3
TASK_WORD_WEIGHT = 0.5

_STOP = set("""a an the and or but if of to in on at for with about as by from into over under than then so such
this that these those it its is are was were be been being am do does did done have has had having can could
would should will shall may might must i me my mine we our you your yours he she they them their his her what
which who whom whose when where why how there here any some all each every both either neither no not nor only
own same too very just also more most other much many please tell let know like want prefer preferred
preference preferences particular specific kind sort thing things something anything get go make
looking interested need needs s t""".split())
_TOKEN = re.compile(r"[a-z0-9]+")


def _stem(w: str) -> str:
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall((text or "").lower())


def content_words(text: str) -> set[str]:
    return {_stem(w) for w in _tokens(text) if w not in _STOP}


def _mentions(question_tokens: list[str], option: str) -> bool:
    opt = _tokens(option)
    if not opt or not any(len(w) >= 3 and w not in _STOP for w in opt):
        return False
    n = len(opt)
    return any(question_tokens[i:i + n] == opt for i in range(len(question_tokens) - n + 1))


def match_score(question: str, detail: dict, task_text: str = "") -> float:
    """1.0 if the question mentions one of the detail's options, else the overlap
    ``(|Q ∩ D − T| + 0.5 |Q ∩ D ∩ T|) / |D|`` (``T`` = the content words of ``task_text``)."""
    qt = _tokens(question)
    if any(_mentions(qt, o) for o in detail.get("options") or []):
        return 1.0
    d = content_words(f"{detail.get('description', '')} {detail.get('inquiry', '')}")
    if not d:
        return 0.0
    hit, t = content_words(question) & d, content_words(task_text)
    return (len(hit - t) + TASK_WORD_WEIGHT * len(hit & t)) / len(d)


def _weight(detail: dict) -> float:
    return IMPORTANCE_WEIGHTS[str(detail["importance"]).strip()]


def load_tasks(path: str | Path = DEFAULT_TASKS) -> dict[str, dict]:
    """Tasks by id from a UserRL intentions file (a list, or a dict by id)."""
    items = task_records(json.loads(Path(path).read_text()), path, "intention")
    out: dict[str, dict] = {}
    for t in items:
        if not isinstance(t, dict):
            raise ValueError(f"{path}: intention task is not an object: {t!r:.80}")
        for k in ("id", "task", "missing_details"):
            if k not in t:
                raise ValueError(f"{path}: intention task {t.get('id')!r} without field {k!r}")
        try:
            check_id(t)
            check_finite(t)
        except ValueError as e:
            raise ValueError(f"{path}: intention task {t.get('id')!r}: {e}") from None
        if not isinstance(t["task"], str) or not t["task"].strip():
            raise ValueError(f"{path}: task {t['id']}: field 'task' must be a non-empty string")
        if t.get("category") is not None and not isinstance(t["category"], str):
            raise ValueError(f"{path}: task {t['id']}: field 'category' must be a string, got {t['category']!r:.40}")
        if not isinstance(t["missing_details"], list):
            raise ValueError(f"{path}: task {t['id']}: field 'missing_details' must be a list")
        details = []
        for i, d in enumerate(t["missing_details"]):
            where = f"{path}: task {t['id']}: missing_details[{i}]"
            if not isinstance(d, dict):
                raise ValueError(f"{where} is not an object")
            if not isinstance(d.get("description"), str) or not d["description"].strip():
                raise ValueError(f"{where}: field 'description' must be a non-empty string")
            if d.get("inquiry") is not None and not isinstance(d["inquiry"], str):
                raise ValueError(f"{where}: field 'inquiry' must be a string, got {d['inquiry']!r:.40}")
            opts = d.get("options", [])
            if opts is None or not isinstance(opts, list) or \
                    not all(isinstance(o, str) and o.strip() for o in opts):
                raise ValueError(f"{where}: field 'options' must be a list of non-empty strings, got {opts!r:.60}")
            if not opts:
                raise ValueError(f"{where}: field 'options' is empty (the user has no wish to draw)")
            d = dict(d, importance=str(d.get("importance", "2")).strip(), options=list(opts))
            if d["importance"] not in IMPORTANCE_WEIGHTS:
                raise ValueError(f"{where}: field 'importance' must be 1, 2 or 3, got {d['importance']!r}")
            details.append(d)
        if not details:
            raise ValueError(f"{path}: task {t['id']} has no missing details (field 'missing_details' is empty)")
        out[str(t["id"])] = dict(t, category=t.get("category") or "", missing_details=details)
    return out


SYSTEM_PROMPT = """You are an agent that interacts with an environment through a tool. Below are the environment, your action space and some notes.

- Environment Description: IntentionGym gives you a vague request from a user. Important details the user has in mind are missing from it; your goal is to find them out by asking the user clarifying questions.

- Action Space: call the tool `interact_with_env` with `choice` = `action` (or `answer` once you are done).

- Action Description:
  * `action`: put one clarifying question in `content`. It should aim at a detail of the request that is still unclear; the user answers it.
  * `answer`: end the clarification (for example with a short summary of what you learned).

- Important Notes:
  * Write your reasoning between `<think>` and `</think>` before each tool call.
  * Ask exactly one question per turn. Every question costs a little, so ask about the details that matter most for the request and do not repeat yourself.
  * The number of turns is limited; try to uncover all the important missing details efficiently."""


def build_rows(tasks: dict[str, dict], split: str) -> list[dict]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        user_msg = (f"Task category: {t.get('category', '')}\n"
                    f"The user's vague request: {t['task']}\n"
                    "Find out the missing details of this request by asking clarifying questions.")
        gt = ", ".join(d["description"] for d in t["missing_details"])
        rows.append(IntentionGym.userrl_row(tid, SYSTEM_PROMPT, user_msg, gt, split, i,
                                            extra={"category": t.get("category", ""), "task": t["task"]}))
    return rows


USER_PROMPT = """You are a person who just asked an AI assistant: "{task}"

Your request was vague on purpose. These are the details you actually have in mind:
{details}

Rules:
- The assistant will ask clarifying questions. Answer each one briefly and naturally, in your own words.
- Reveal a detail only when a question asks about it; do not volunteer the others.
- If asked about something not listed above, say you have no particular preference or are not sure.
- Never mention this list or that you are following instructions."""


@register_gym
class IntentionGym(Gym):
    name = "intention"
    env_name = "IntentionGym"

    def setup(self) -> None:
        self.details = list(self.task["missing_details"])
        self.chosen = [self.rng.choice(d["options"]) if d.get("options") else "no particular preference"
                       for d in self.details]
        self.total_weight = sum(_weight(d) for d in self.details)

    def reset_state(self) -> str:
        self.uncovered: list[int] = []   # detail indices, in the order uncovered
        self.questions = 0
        return ""

    def total_reward(self) -> float:
        """``sum(uncovered weights) / W − STEP_PENALTY × questions`` (the sum of the turn rewards)."""
        return sum(_weight(self.details[i]) for i in self.uncovered) / self.total_weight - STEP_PENALTY * self.questions

    def match(self, question: str) -> int | None:
        """Index of the detail the question uncovers, or ``None``."""
        best, best_score = None, 0.0
        for i, d in enumerate(self.details):
            if i in self.uncovered:
                continue
            s = match_score(question, d, self.task["task"])
            if s >= MATCH_THRESHOLD and s > best_score:
                best, best_score = i, s
        return best

    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode has already ended.", 0.0, True, {"error": "episode_done"})
        self.steps += 1
        ch = choice.strip().strip("[]").lower() if isinstance(choice, str) else ""
        reward, info = 0.0, {}
        if ch == "action":
            if not isinstance(content, str) or not content.strip():
                obs, info = "Error: `action` needs a clarifying question in `content`.", {"error": "empty_question"}
            else:
                reply = self.ask_user(content.strip())
                self.questions += 1
                idx = self.match(content)
                gain = 0.0
                if idx is not None:
                    self.uncovered.append(idx)
                    gain = _weight(self.details[idx]) / self.total_weight
                reward = gain - STEP_PENALTY
                info = {"uncovered": None if idx is None else self.details[idx]["description"],
                        "n_uncovered": len(self.uncovered), "n_details": len(self.details)}
                obs = reply
                if len(self.uncovered) == len(self.details):
                    self.done = True
                    info["ended_by"] = "all_uncovered"
                    obs += "\nAll the missing details have been clarified."
        elif ch == "answer":
            self.done = True
            obs, info = "The clarification has ended.", {"ended_by": "agent"}
        elif ch == "search":
            obs, info = "Error: `search` is not available in IntentionGym; use `action`.", {"error": "unsupported_choice"}
        else:
            obs, info = (f"Error: unknown choice {choice!r}; use one of {list(CHOICES)} (`action` here).",
                         {"error": "unknown_choice"})
        if not self.done and self.steps >= self.max_steps:
            self.done = True
            obs += "\nThe maximum number of turns is reached; the episode ends."
            info["ended_by"] = "max_steps"
        return StepResult(obs, reward, self.done, info)

    def user_system_prompt(self) -> str:
        lines = [f"- {d['description']}: {c}" for d, c in zip(self.details, self.chosen)]
        return USER_PROMPT.format(task=self.task["task"], details="\n".join(lines))

    def hidden_facts(self) -> list[str]:
        return [c for c in self.chosen if c != "no particular preference"]
