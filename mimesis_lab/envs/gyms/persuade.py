"""PersuadeGym: move the user's stance on a claim (SPEC §3.1, DESIGN §5).

The user (the simulator) holds a stance on ``claim`` on a 7-point scale (1 strongly disagree …
7 strongly agree), starting at ``initial_stance``, for the reasons in ``reasons`` (hidden). The
task says which way to persuade (``target``: ``agree`` → toward 7, ``disagree`` → toward 1).

* ``action`` — an argument message, sent to the user (:meth:`Gym.ask_user`). The user's system
  prompt asks for a natural reply ending with ``Stance: <1-7>``. The stance is parsed from the
  reply (the last ``Stance: N`` with N in 1..7, ``**`` and ``N/7`` tolerated); a reply without a
  parseable stance keeps the previous stance (``info["stance_parsed"] = False``). The agent sees
  the reply without the stance line.
* ``answer`` — ends the episode (the agent closes the conversation), reward 0.
* ``search`` — not available (feedback, reward 0).

Reward per ``action`` turn: ``d * (stance_now − stance_before) / 6`` with ``d = +1`` for target
``agree`` and ``−1`` for ``disagree``: positive for moves toward the target, negative for moves
away. The episode total is therefore ``d * (final − initial) / 6``. Done after ``max_steps``
steps or when the stance reaches the target end of the scale (7 for agree, 1 for disagree).

**UserRL's rows** carry the task inline (``create_kwargs``: ``id``, ``claim``, ``argument`` = the
user's case for the claim; :func:`task_from_kwargs`); records of that shape in a task file are read
the same way (:func:`from_userrl`). The user holds the claim and the agent opposes it: ``target``
``disagree``, ``initial_stance`` 6 (:data:`USERRL_INITIAL_STANCE`), the ``reasons`` the argument's
first sentences (at most five). UserRL's prompt tells the agent to argue with ``answer``, so such a
task has ``argue_with = "answer"``: ``answer`` (and ``action``) deliver an argument and nothing but
the turn limit or the target ends the episode.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from mimesis_lab.envs.gyms.base import (CHOICES, Gym, StepResult, check_finite, check_id, check_strings,
                                        register_gym, task_records)

__all__ = ["PersuadeGym", "DEFAULT_TASKS", "load_tasks", "build_rows", "parse_stance", "strip_stance", "STANCE_LABELS",
           "target_direction", "from_userrl", "task_from_kwargs", "USERRL_INITIAL_STANCE"]

DEFAULT_TASKS = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "persuade" / "tasks.json"
STANCE_LABELS = {1: "strongly disagree", 2: "disagree", 3: "somewhat disagree", 4: "neutral",
                 5: "somewhat agree", 6: "agree", 7: "strongly agree"}
_STANCE_RE = re.compile(r"stance\s*[:：=\-]?\s*[*_]*\s*([1-7])(?:\s*/\s*7)?(?!\.?[0-9])", re.IGNORECASE)
_STANCE_LINE_RE = re.compile(r"[*_]*stance\s*[:：=\-]?\s*[*_]*\s*[0-9]+(?:\.[0-9]+)?(?:\s*/\s*7)?[*_]*\.?", re.IGNORECASE)


def parse_stance(text: str) -> int | None:
    """The last ``Stance: N`` (N in 1..7) in ``text``, or ``None``."""
    hits = _STANCE_RE.findall(text or "")
    return int(hits[-1]) if hits else None


def strip_stance(text: str) -> str:
    return _STANCE_LINE_RE.sub("", text).strip()


def target_direction(task: dict) -> int:
    """+1 when the task's target stance is ``agree`` (the stance should go up), else -1."""
    return 1 if task["target"] == "agree" else -1


def _target_end(task: dict) -> int:
    return 7 if task["target"] == "agree" else 1


USERRL_INITIAL_STANCE = 6
MAX_REASONS = 5


def from_userrl(rec: dict) -> dict:
    """A UserRL persuade record (``id``, ``claim``, ``argument``) in our schema (module docstring);
    records already in ours (with ``reasons``) pass through. ``ValueError`` names a missing field."""
    if "reasons" in rec or "argument" not in rec:
        return rec
    for k in ("claim", "argument"):
        if not isinstance(rec.get(k), str) or not rec[k].strip():
            raise ValueError(f"missing or empty field {k!r}")
    sents = [x.strip() for x in re.split(r"(?<=[.!?])\s+|\n+", rec["argument"]) if len(x.split()) >= 6]
    if not sents:
        raise ValueError("field 'argument' has no sentence of at least six words")
    return {"id": str(rec.get("id") or rec["claim"].strip()), "claim": rec["claim"].strip(),
            "initial_stance": USERRL_INITIAL_STANCE, "target": "disagree",
            "persona": "Someone who holds this claim and has argued for it.", "reasons": sents[:MAX_REASONS],
            "argue_with": "answer"}


def task_from_kwargs(kwargs: dict, reward_model: dict | None = None) -> dict | None:
    """The task a UserRL persuade row carries inline (``claim``, ``argument``); ``None`` for ours (an id)."""
    if "claim" not in kwargs and "argument" not in kwargs:
        return None
    return from_userrl({**kwargs, "argument": kwargs.get("argument")})


def load_tasks(path: str | Path = DEFAULT_TASKS) -> dict[str, dict]:
    """Tasks by id: ``{id, claim, initial_stance (1-7), target (agree|disagree), persona, reasons: [str]}``
    (or UserRL's ``{id, claim, argument}``, :func:`from_userrl`); a list or an ``{id: record}`` object. A task
    that cannot be played (no or a non-string ``claim``, a boolean / non-integer ``initial_stance``, a NaN
    anywhere…) is an error naming the file, the task and the field."""
    out: dict[str, dict] = {}
    data = task_records(json.loads(Path(path).read_text()), path, "persuade")
    for t in data:
        if not isinstance(t, dict):
            raise ValueError(f"{path}: persuade task is not an object: {t!r:.80}")
        try:
            t = from_userrl(t)
        except ValueError as e:
            raise ValueError(f"{path}: persuade task {t.get('id')!r}: {e}") from None
        for k in ("id", "claim", "initial_stance", "target", "reasons"):
            if k not in t:
                raise ValueError(f"{path}: persuade task {t.get('id')!r}: missing field {k!r}")
        try:
            check_id(t)
            check_strings(t, ("claim",), ("persona",) if t.get("persona") is not None else ())
            check_finite(t)
        except ValueError as e:
            raise ValueError(f"{path}: persuade task {t.get('id')!r}: {e}") from None
        if not isinstance(t["reasons"], list) or not t["reasons"] or \
                not all(isinstance(r, str) and r.strip() for r in t["reasons"]):
            raise ValueError(f"{path}: task {t['id']}: field 'reasons' must be a non-empty list of non-empty strings")
        if t["target"] not in ("agree", "disagree"):
            raise ValueError(f"{path}: task {t['id']}: field 'target' must be agree or disagree, "
                             f"got {t['target']!r:.30}")
        if isinstance(t["initial_stance"], bool) or not isinstance(t["initial_stance"], int) \
                or not 1 <= t["initial_stance"] <= 7 or t["initial_stance"] == _target_end(t):
            raise ValueError(f"{path}: task {t['id']}: field 'initial_stance' must be an integer 1..7 and not already "
                             f"the target end, got {t['initial_stance']!r:.30}")
        out[str(t["id"])] = dict(t)
    return out


SYSTEM_PROMPT = """You are an agent that interacts with an environment through a tool. Below are the environment, your action space and some notes.

- Environment Description: PersuadeGym is a conversation with a person who holds a stance on a claim, on a 7-point scale from 1 (strongly disagree) to 7 (strongly agree). Your goal is to change their mind in the direction you are given, through respectful, well-reasoned arguments.

- Action Space: call the tool `interact_with_env` with `choice` = `action` (or `answer` to end the conversation).

- Action Description:
  * `action`: put your persuasive message in `content`. The person replies, and the reward of the turn reflects how far their stance moved toward the target (a move away from it is penalised).
  * `answer`: end the conversation (no further reward).

- Important Notes:
  * Write your reasoning between `<think>` and `</think>` before each tool call.
  * Listen to the person's objections and address their actual reasons; pressure, insults or made-up facts tend to backfire.
  * The number of turns is limited, so make every message count."""


def build_rows(tasks: dict[str, dict], split: str) -> list[dict]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        s = t["initial_stance"]
        user_msg = (f"The claim: \"{t['claim']}\"\n"
                    f"The person's current stance: {s} ({STANCE_LABELS[s]}).\n"
                    f"Your goal: persuade them to {t['target']} with the claim as much as you can.")
        rows.append(PersuadeGym.userrl_row(tid, SYSTEM_PROMPT, user_msg, t["target"], split, i))
    return rows


USER_PROMPT = """You are a real person chatting with someone who wants to change your mind.

Who you are: {persona}
The claim under discussion: "{claim}"
Your stance at the start of the conversation: {stance} out of 7 ({label}), on a scale from 1 (strongly disagree) to 7 (strongly agree).
Your reasons:
{reasons}

Rules:
- Reply naturally in a few sentences, in your own voice; push back where you are not convinced.
- Change your stance only when an argument genuinely addresses your reasons; small steps are normal, and a weak or pushy argument can make you more skeptical.
- End every reply with a final line of the form `Stance: <1-7>` giving your stance after this message."""


@register_gym
class PersuadeGym(Gym):
    name = "persuade"
    env_name = "PersuadeGym"

    def reset_state(self) -> str:
        self.stance = int(self.task["initial_stance"])
        self.history = [self.stance]
        return ""

    def total_reward(self) -> float:
        """``d * (stance − initial) / 6`` so far (the sum of the per-turn rewards)."""
        return target_direction(self.task) * (self.stance - int(self.task["initial_stance"])) / 6

    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode has already ended.", 0.0, True, {"error": "episode_done"})
        self.steps += 1
        ch = choice.strip().strip("[]").lower() if isinstance(choice, str) else ""
        reward, info = 0.0, {}
        argue = ("action", "answer") if self.task.get("argue_with") == "answer" else ("action",)
        if ch in argue:
            if not isinstance(content, str) or not content.strip():
                obs, info = f"Error: `{ch}` needs a non-empty message in `content`.", {"error": "empty_message"}
            else:
                reply = self.ask_user(content.strip())
                new = parse_stance(reply)
                before = self.stance
                info = {"stance_parsed": new is not None, "stance_before": before}
                if new is not None:
                    self.stance = new
                self.history.append(self.stance)
                reward = target_direction(self.task) * (self.stance - before) / 6
                info["stance"] = self.stance
                obs = strip_stance(reply) or "(no reply)"
                if self.stance == _target_end(self.task):
                    self.done = True
                    info["ended_by"] = "target_reached"
        elif ch == "answer":
            self.done = True
            obs, info = "The conversation is over.", {"ended_by": "agent"}
        elif ch == "search":
            obs, info = "Error: `search` is not available in PersuadeGym; use `action`.", {"error": "unsupported_choice"}
        else:
            obs, info = (f"Error: unknown choice {choice!r}; use one of {list(CHOICES)} (`action` here).",
                         {"error": "unknown_choice"})
        if not self.done and self.steps >= self.max_steps:
            self.done = True
            obs += "\nThe maximum number of turns is reached; the conversation ends."
            info["ended_by"] = "max_steps"
        return StepResult(obs, reward, self.done, info)

    def user_system_prompt(self) -> str:
        t = self.task
        return USER_PROMPT.format(persona=t.get("persona") or "An ordinary adult.", claim=t["claim"],
                                  stance=t["initial_stance"], label=STANCE_LABELS[t["initial_stance"]],
                                  reasons="\n".join(f"- {r}" for r in t["reasons"]))

    def hidden_facts(self) -> list[str]:
        return list(self.task["reasons"])
