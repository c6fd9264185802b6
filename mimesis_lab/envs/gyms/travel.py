"""TravelGym (SPEC §3.1, DESIGN §5): elicit the user's hidden preferences, search the options, pick one.

A task (``data/raw/gyms/travel/tasks.json``, a list of records or ``{id: record}``)::

    {"id": "travel-1", "aspect": "hotel", "city": "Lisbon", "price_unit": "per night",
     "request": "<the user's opening message>",
     "preferences": [{"text": "Budget under $150 per night", "keywords": ["budget", "$150", …],
                      "check": {"attr": "price", "max": 150}, "stated": false}, …],
     "options": [{"id": "H1", "name": "Hotel Mar Azul", "price": 120, "rating": 4.2,
                  "tags": ["beach", "pet friendly"], "description": "…"}, …],
     "best_id": "H3"}

A preference ``check`` is one of ``{"tag": t}`` (``t`` in the option's tags), ``{"attr": a, "max": v}``,
``{"attr": a, "min": v}`` or ``{"attr": a, "equals": v}``. Exactly one option (``best_id``) satisfies
every preference. ``stated`` preferences are in the opening request (known from the start);
the others are hidden and only the user side knows them. :func:`load_tasks` rejects, naming the field,
a task that breaks this (:func:`check_aspect`): options that are not objects with a unique ``id`` and
a finite number ``price``, preferences without ``text`` or a known ``check``, a ``best_id`` that is
not an option, misses a preference or is not the only option meeting them all, or a NaN / infinite
number anywhere.

**Reward rule** (per step; rewards add up over the episode):

* ``action`` (content = a message to the user): the user side replies; every hidden preference
  not yet elicited one of whose keywords occurs in the reply (case-insensitive, as a whole word
  or phrase, plural -s/-es allowed) becomes *elicited* and earns **0.2** (so at most 0.2 per
  preference per episode). Not done.
* ``search`` (content = a query): content words of the query are matched against each option's
  text (name, aspect, city, tags, description, attribute names); the matching options are
  returned. The **first** valid search (non-empty query matching ≥ 1 option) earns **0.2**; every
  later search earns 0. A query matching nothing returns "no results" (reward 0). Not done.
* ``answer`` (content = exactly one option id or name): **1.0** if the option satisfies every
  preference (the best option); **0.8** if at least one preference is known (stated or elicited)
  and the option satisfies all known preferences but not all preferences; else **0**. A valid
  answer ends the episode; content naming no option or several options is malformed (reward 0,
  not done).

**Multi-aspect tasks** (UserRL's TravelGym ids such as ``apartment:2-86|rental_car:2-60``, 2–4 aspects)::

    {"id": "hotel:1|flight:2", "request": "<the opening message>",
     "aspects": [<an aspect record as above: aspect, city, price_unit, preferences, options, best_id>, …]}

Option ids are unique across aspects. Preferences are elicited over all aspects (0.2 each); a
valid search earns 0.2 for each aspect whose options it lists for the first time. An answer names
one option and is scored **for that option's aspect** as above (1.0 / 0.8 / 0), once per aspect
(UserRL's one choice per aspect: a second answer for an answered aspect is feedback, reward 0);
the episode continues after an answer until every aspect is answered (or the budget ends), so an
episode's reward sums the aspects'. A single-aspect record is a task of one aspect (as before).

Unknown choices, empty content and malformed answers are feedback (reward 0, not done); each call
counts as a step and the episode ends after ``max_steps`` steps.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from mimesis_lab.envs.gyms.base import Gym, StepResult, register_gym, tasks_by_id

__all__ = ["TASKS_PATH", "TravelGym", "load_tasks", "check_aspect", "build_rows", "satisfies", "search_options",
           "mentions", "aspects"]

TASKS_PATH = Path(__file__).resolve().parents[3] / "data" / "raw" / "gyms" / "travel" / "tasks.json"

ELICIT_REWARD = 0.2
SEARCH_REWARD = 0.2
BEST_REWARD = 1.0
CORRECT_REWARD = 0.8

_STOP = frozenset("a an the and or for to of in on at with by from is are be i me my we our you your it its "
                  "that this any some please find show search looking look want need options option "
                  "available list all".split())

SYSTEM_PROMPT = (
    "You are an agent that interacts with an environment on behalf of a traveller. The environment and "
    "your action space are described below.\n\n"
    "- Environment Description: TravelGym is a travel-planning environment. A user asks for help with "
    "one part of a trip (a hotel, a flight, a restaurant, a rental car, a tour…). The user has "
    "preferences they have not told you yet; a small database holds the candidate options. Ask the "
    "user, search the database, and recommend the single option that fits the user best.\n\n"
    "- Action Space: call the tool `interact_with_env` with a `choice` of `action`, `search` or "
    "`answer` and a `content` string.\n\n"
    "- Action Description:\n"
    "  * `action`: send a message to the user in `content`. Ask one clear, specific question about "
    "what matters to them (price, location, amenities, timing…). Vague questions get vague replies.\n"
    "  * `search`: query the option database in `content` (e.g. 'hotel near the beach'). Matching "
    "options are listed with their ids and attributes.\n"
    "  * `answer`: recommend exactly one option by writing its id (or its exact name) in `content`. "
    "Your recommendation ends the episode.\n\n"
    "- Important Notes:\n"
    "  * First reason about your next step between `<think>` and `</think>`, then call the tool.\n"
    "  * The number of interaction rounds is limited; balance asking, searching and answering.\n"
    "  * The user's preferences are often implicit and are revealed only when you ask about the "
    "right topic. Uncover them before you recommend.\n"
    "  * Be focused, curious and efficient. Let's begin!"
)


def _words(text: str) -> set[str]:
    out = set()
    for w in re.findall(r"[a-z0-9$]+", text.lower()):
        if w in _STOP or len(w) < 2:
            continue
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") else w)
    return out


def mentions(text: str, keyword: str) -> bool:
    """Whether ``keyword`` occurs in ``text`` as a whole word/phrase (case-insensitive; plural -s/-es ok)."""
    k = str(keyword).strip().lower()
    if not k:
        return False
    return re.search(r"(?<![a-z0-9])" + re.escape(k) + r"(?:s|es)?(?![a-z0-9])", text.lower()) is not None


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def aspects(task: dict[str, Any]) -> list[dict[str, Any]]:
    """The aspect records of a task: its ``aspects``, or the task itself (single-aspect)."""
    return list(task["aspects"]) if "aspects" in task else [task]


def load_tasks(path: str | Path = TASKS_PATH) -> dict[str, dict[str, Any]]:
    """Tasks by id, from a JSON list of records (each with ``id``) or an ``{id: record}`` object; every
    aspect needs options and preferences (:func:`check_aspect`), a ``best_id`` among its options that is
    the only option satisfying every preference, and option ids are unique. A record that fails is an
    error naming the file, the task and the field."""
    tasks = tasks_by_id(path, "travel", ())
    for tid, t in tasks.items():
        asp = t.get("aspects") if "aspects" in t else [t]
        if not isinstance(asp, list) or not asp or not all(isinstance(a, dict) for a in asp):
            raise ValueError(f"{path}: travel task {tid!r}: aspects must be a non-empty list of objects")
        ids: list[str] = []
        for n, a in enumerate(asp):
            where = f"aspects[{n}]: " if "aspects" in t else ""
            if not a.get("options") or not a.get("preferences"):
                raise ValueError(f"{path}: malformed travel task {tid!r}: {where}an aspect without options or "
                                 f"preferences (field {'options' if not a.get('options') else 'preferences'!r})")
            try:
                check_aspect(a)
            except ValueError as e:
                raise ValueError(f"{path}: malformed travel task {tid!r}: {where}{e}") from None
            ids += [str(o["id"]) for o in a["options"]]
        if len(ids) != len(set(ids)):
            raise ValueError(f"{path}: travel task {tid!r}: field 'id': option ids repeat across aspects")
        if "aspects" in t and not t.get("request"):
            raise ValueError(f"{path}: travel task {tid!r}: a multi-aspect task needs a request")
    return tasks


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_aspect(a: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the field when an aspect cannot be played or would reward the wrong
    option: ``options`` a list of objects, each with a unique non-empty ``id`` and a finite number
    ``price`` (``tags`` a list); ``preferences`` a list of objects with a ``text``, a list of
    ``keywords`` and a ``check`` of a known form (a tag, or an attribute with a finite number
    ``max``/``min`` or an ``equals`` value); ``best_id`` an option id, the one option that satisfies
    every preference (module docstring)."""
    opts, prefs = a["options"], a["preferences"]
    if not isinstance(opts, list) or not all(isinstance(o, dict) for o in opts):
        raise ValueError(f"field 'options' must be a non-empty list of objects, got {opts!r:.60}")
    if not isinstance(prefs, list) or not all(isinstance(p, dict) for p in prefs):
        raise ValueError(f"field 'preferences' must be a non-empty list of objects, got {prefs!r:.60}")
    seen: set[str] = set()
    for i, o in enumerate(opts):
        oid = o.get("id")
        if isinstance(oid, bool) or not isinstance(oid, (str, int)) or not str(oid).strip():
            raise ValueError(f"options[{i}]: missing or empty field 'id' (got {oid!r:.40})")
        if str(oid) in seen:
            raise ValueError(f"options[{i}]: field 'id' {oid!r} repeats an earlier option's id")
        seen.add(str(oid))
        if not _number(o.get("price")):
            raise ValueError(f"options[{i}] ({oid!r}): field 'price' must be a finite number, got "
                             f"{type(o.get('price')).__name__} {o.get('price')!r:.30}")
        if "tags" in o and not (isinstance(o["tags"], list) and all(isinstance(x, str) for x in o["tags"])):
            raise ValueError(f"options[{i}] ({oid!r}): field 'tags' must be a list of strings, got {o['tags']!r:.60}")
    for i, p in enumerate(prefs):
        if not isinstance(p.get("text"), str) or not p["text"].strip():
            raise ValueError(f"preferences[{i}]: missing or empty field 'text'")
        kws = p.get("keywords", [])
        if not isinstance(kws, list) or not all(isinstance(k, str) for k in kws):
            raise ValueError(f"preferences[{i}]: field 'keywords' must be a list of strings, got {kws!r:.60}")
        chk = p.get("check")
        ok = isinstance(chk, dict) and (
            (isinstance(chk.get("tag"), str) and chk["tag"].strip()) or
            (isinstance(chk.get("attr"), str) and chk["attr"].strip() and (
                ("max" in chk and _number(chk["max"])) or ("min" in chk and _number(chk["min"])) or
                ("equals" in chk and chk["equals"] is not None and not isinstance(chk["equals"], (list, dict))))))
        if not ok:
            raise ValueError(f"preferences[{i}]: field 'check' must be {{tag}} or {{attr, max|min|equals}} (max/min a "
                             f"finite number), got {chk!r:.80}")
    if str(a.get("best_id")) not in seen:
        raise ValueError(f"field 'best_id' {a.get('best_id')!r} is not an option id")
    fits = [str(o["id"]) for o in opts if all(satisfies(o, p) for p in prefs)]
    if str(a["best_id"]) not in fits:
        best = next(o for o in opts if str(o["id"]) == str(a["best_id"]))
        miss = next(i for i, p in enumerate(prefs) if not satisfies(best, p))
        raise ValueError(f"field 'best_id' {a['best_id']!r} does not satisfy preferences[{miss}] "
                         f"({prefs[miss]['text']!r:.60})")
    if len(fits) > 1:
        raise ValueError(f"field 'best_id' {a['best_id']!r} is not the only option that satisfies every preference "
                         f"(so do {[f for f in fits if f != str(a['best_id'])]})")


def satisfies(option: dict[str, Any], pref: dict[str, Any]) -> bool:
    """Whether ``option`` meets preference ``pref`` (its ``check``)."""
    chk = pref.get("check") or {}
    if "tag" in chk:
        return str(chk["tag"]).lower() in {str(t).lower() for t in option.get("tags", [])}
    val = option.get(chk.get("attr", ""))
    if val is None:
        return False
    if "max" in chk:
        return isinstance(val, (int, float)) and val <= chk["max"]
    if "min" in chk:
        return isinstance(val, (int, float)) and val >= chk["min"]
    if "equals" in chk:
        return str(val).lower() == str(chk["equals"]).lower()
    return False


def _option_text(task: dict[str, Any], opt: dict[str, Any]) -> str:
    attrs = " ".join(k for k in opt if k not in ("id", "name", "tags", "description"))
    return " ".join([str(opt.get("name", "")), str(task.get("aspect", "")), str(task.get("city", "")),
                     " ".join(map(str, opt.get("tags", []))), str(opt.get("description", "")), attrs])


def format_option(task: dict[str, Any], opt: dict[str, Any]) -> str:
    parts = [f"[{opt['id']}] {opt.get('name', opt['id'])}"]
    for k, v in opt.items():
        if k in ("id", "name", "tags", "description"):
            continue
        if k == "price":
            parts.append(f"price: ${v} {task.get('price_unit', '')}".rstrip())
        else:
            parts.append(f"{k.replace('_', ' ')}: {v}")
    if opt.get("tags"):
        parts.append("features: " + ", ".join(map(str, opt["tags"])))
    if opt.get("description"):
        parts.append(str(opt["description"]))
    return " | ".join(parts)


def search_options(task: dict[str, Any], query: str) -> list[dict[str, Any]]:
    """Options sharing ≥ 1 content word with ``query``, most matches first (ties in file order)."""
    q = _words(query)
    if not q:
        return []
    scored = [(len(q & _words(_option_text(task, o))), i, o) for i, o in enumerate(task["options"])]
    return [o for n, i, o in sorted(scored, key=lambda t: (-t[0], t[1])) if n > 0]


def build_rows(tasks: dict[str, dict[str, Any]], split: str) -> list[dict[str, Any]]:
    rows = []
    for i, (tid, t) in enumerate(tasks.items()):
        if "aspects" in t:
            names = ", ".join(str(a.get("aspect", "option")) for a in t["aspects"])
            user = f"{t['request']}\nPlease recommend one option for each of: {names}."
            truth = str([str(a["best_id"]) for a in t["aspects"]])
        else:
            user = f"{t['request']}\nPlease recommend the one option that suits me best."
            truth = str(t["best_id"])
        rows.append(TravelGym.userrl_row(tid, SYSTEM_PROMPT, user, truth, split, i))
    return rows


@register_gym
class TravelGym(Gym):
    name = "travel"
    env_name = "TravelGym"

    def setup(self) -> None:
        self.aspects = aspects(self.task)
        self.prefs = [(a, p) for a, asp in enumerate(self.aspects) for p in asp.get("preferences", [])]

    def reset_state(self) -> str:
        self.known: set[int] = {i for i, (_, p) in enumerate(self.prefs) if p.get("stated")}
        self.elicited: set[int] = set()
        self.searched_aspects: set[int] = set()
        self.answered: dict[int, str] = {}   # aspect index -> verdict
        return ""

    @property
    def searched(self) -> bool:
        return bool(self.searched_aspects)

    # ---- user side -------------------------------------------------------------------------
    def user_system_prompt(self) -> str:
        t = self.task
        hidden = [p["text"] for _, p in self.prefs if not p.get("stated")]
        stated = [p["text"] for _, p in self.prefs if p.get("stated")]
        what = " and ".join(f"a {a.get('aspect', 'booking')}" for a in self.aspects)
        lines = [
            f"You are a traveller talking to an AI travel assistant about {what}"
            f" in {self.aspects[0].get('city') or t.get('city', 'your destination')}.",
            f"Your opening request was: \"{t['request']}\"",
            "Your private preferences (the assistant does not know them yet):",
            *[f"- {p}" for p in hidden],
        ]
        if stated:
            lines += ["Preferences you already told the assistant:", *[f"- {p}" for p in stated]]
        lines += [
            "Rules: reply briefly and naturally, like a real person. Reveal a preference only when the "
            "assistant asks about its topic, and reveal at most one preference per reply. Never list all "
            "your preferences at once, never name a specific option or id, and if asked about something "
            "you have no preference on, say you don't mind."
        ]
        return "\n".join(lines)

    def hidden_facts(self) -> list[str]:
        facts = [p["text"] for _, p in self.prefs if not p.get("stated")]
        for asp in self.aspects:
            best = next((o for o in asp["options"] if str(o["id"]) == str(asp.get("best_id"))), None)
            if best is not None:
                facts.append(str(best.get("name", best["id"])))
        return facts

    # ---- steps ------------------------------------------------------------------------------
    def step(self, choice: str, content: str) -> StepResult:
        if self.done:
            return StepResult("The episode is already over.", 0.0, True, {"error": "episode_over"})
        self.steps += 1
        c = str(choice or "").strip().strip("[]").lower()
        text = content if isinstance(content, str) else ("" if content is None else str(content))
        text = text.strip()
        if c not in ("action", "search", "answer"):
            return self._finish(f"Invalid choice {choice!r}: use `action` (ask the user), `search` (query the "
                                "options) or `answer` (recommend one option id).", 0.0, False,
                                {"error": "invalid_choice"})
        if not text:
            return self._finish(f"Empty content for `{c}`: write a question, a query or an option id.", 0.0, False,
                                {"error": "empty_content"})
        return getattr(self, f"_{c}")(text)

    def _finish(self, obs: str, reward: float, done: bool, info: dict[str, Any]) -> StepResult:
        if not done and self.steps >= self.max_steps:
            done = True
            obs += "\nThe interaction limit has been reached; the episode is over."
            info["max_steps"] = True
        self.done = done
        info["step"] = self.steps
        return StepResult(obs, round(float(reward), 6), done, info)

    def _action(self, text: str) -> StepResult:
        reply = self.ask_user(text)   # UserSideError propagates to the rollout loop
        low = reply.lower()
        new = []
        for i, (_, p) in enumerate(self.prefs):
            if i in self.known or i in self.elicited:
                continue
            if any(mentions(low, k) for k in p.get("keywords", [])):
                new.append(i)
        self.elicited.update(new)
        self.known.update(new)
        return self._finish(reply, ELICIT_REWARD * len(new), False, {"elicited": new})

    def _search(self, text: str) -> StepResult:
        found = [(a, o) for a, asp in enumerate(self.aspects) for o in search_options(asp, text)]
        if len(self.aspects) > 1:   # most matches first across aspects (ties: aspect, then file order)
            q = _words(text)
            found.sort(key=lambda t: -len(q & _words(_option_text(self.aspects[t[0]], t[1]))))
        if not found:
            return self._finish("No options match this query. Try naming the kind of option "
                                f"(e.g. '{self.aspects[0].get('aspect', 'hotel')}') or a feature.", 0.0, False,
                                {"search_hits": 0})
        new = {a for a, _ in found} - self.searched_aspects
        self.searched_aspects |= new
        obs = f"Found {len(found)} option(s):\n" + "\n".join(format_option(self.aspects[a], o) for a, o in found)
        return self._finish(obs, SEARCH_REWARD * len(new), False, {"search_hits": len(found)})

    def _match_options(self, text: str) -> list[tuple[int, dict[str, Any]]]:
        tokens = set(re.findall(r"[a-z0-9]+", text.lower()))
        ntext = f" {_norm(text)} "
        found = []
        for a, asp in enumerate(self.aspects):
            for o in asp["options"]:
                oid = str(o["id"]).lower()
                name = _norm(str(o.get("name", "")))
                if oid in tokens or (name and f" {name} " in ntext):
                    found.append((a, o))
        return found

    def _answer(self, text: str) -> StepResult:
        found = self._match_options(text)
        if len(found) != 1:
            why = "names no known option" if not found else "names more than one option"
            return self._finish(f"Invalid answer: it {why}. Recommend exactly one option by its id.", 0.0, False,
                                {"error": "malformed_answer"})
        a, opt = found[0]
        name = str(self.aspects[a].get("aspect", "option"))
        if a in self.answered:
            return self._finish(f"You already recommended an option for the {name}; recommend one option for "
                                "each remaining aspect.", 0.0, False, {"error": "aspect_answered", "aspect": name})
        mine = [i for i, (pa, _) in enumerate(self.prefs) if pa == a]
        ok = {i: satisfies(opt, self.prefs[i][1]) for i in mine}
        known = [i for i in mine if i in self.known]
        if all(ok.values()):
            reward, verdict = BEST_REWARD, "best"
        elif known and all(ok[i] for i in known):
            reward, verdict = CORRECT_REWARD, "correct"
        else:
            reward, verdict = 0.0, "wrong"
        self.answered[a] = verdict
        obs = {"best": "Great choice: this option satisfies all of the user's preferences.",
               "correct": "This option fits what the user told you, but it misses some of their preferences.",
               "wrong": "This option does not fit the user's preferences."}[verdict]
        left = [str(asp.get("aspect", "option")) for i, asp in enumerate(self.aspects) if i not in self.answered]
        info = {"answer": opt["id"], "verdict": verdict}
        if len(self.aspects) > 1:
            info.update(aspect=name, aspects_left=left)
            if left:
                obs += f" Still to recommend: {', '.join(left)}."
        return self._finish(obs, reward, not left, info)
