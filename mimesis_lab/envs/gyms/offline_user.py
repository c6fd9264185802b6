"""The offline user of the ``agent_traces`` stage: who answers the experts' questions when the SFT
warm-start traces are recorded (in RL the frozen simulator plays this part).

:class:`OfflineUser` is a deterministic, cooperative :class:`~mimesis_lab.envs.gyms.base.UserSide`
bound to one gym episode. Like any user side it knows the episode's hidden task (it reads it
through the gym) and follows the rules of the gym's user prompt; the *expert* on the other side
never sees the task, only these replies (:mod:`mimesis_lab.envs.gyms.experts`). With probability
``vague_rate`` (drawn from the user's own seeded ``rng``) a reply is uninformative — a real user's
"hmm, not sure" — so the experts must ask again or act on what they have.

Per gym (each reply is what the agent reads):

* Travel — the hidden preference the question is about (one of its keywords, a word of its text,
  or the tag / attribute its check names), in the user's words; when the question named the tag or
  value the preference is about, the reply says it ("…, so a mild menu"). A general question ("what
  else matters?") gets the next unrevealed preference, then "that's all"; anything else "I don't mind".
* Turtle — the host's one word: ``Yes`` when at least half of the question's *new* content words
  (those not already in the surface story, question frames such as "does the story involve" or
  "someone" aside) occur in the hidden story, ``No`` when the question is about the story but not
  true of it, else ``Irrelevant``.
* Telepathy — ``Yes.`` when the question shares a content word with the entity's name, category or
  description (question frames such as "known" or "famous" aside), else ``No.``; never the name.

Words match when they are equal or one is a prefix of the other at least 5 letters long
(:func:`~mimesis_lab.envs.gyms.text.related`: "african" answers "Africa", "knocked" answers "knock").
* Persuade — asked why / what concerns them: the next unrevealed reason, in the first person; an
  argument that addresses a not-yet-addressed reason (at least half of its content words, or
  three of them) moves the stance one step toward the target; every reply ends with ``Stance: N``.
* Intention — the drawn option of the detail the gym itself matches (:meth:`IntentionGym.match`),
  or of a detail whose description the question names; "yes" to a question that repeats a value
  already told; asked an open question ("what else should I know?"), the topic of the most
  important detail not yet told (never its value).
* Tau — the customer: identity (email, or name and zip when the instruction has no email) when
  asked to verify; the request (the instruction in the first person, without the persona line and
  the sentences that say what to do *if* the agent objects) when asked what they need; ``yes`` to a
  proposed change that names an order of the instruction; told that something cannot be done, the
  instruction's fall-back ("in that case, I'd like to return it instead…") or ``###STOP###`` when the
  instruction accepts that; ``###STOP###`` once the database is in the requested state.
* Search — restates the question (the user knows nothing else).

This user exists only to record warm-start traces. It is deliberately not the evaluation's
``ScriptedEvalUser`` (:mod:`mimesis_lab.evals.eval_users`): evaluation users must differ from the
users the agent was trained against.
"""
from __future__ import annotations

import random
import re
from typing import Any

from mimesis_lab.envs.gyms.base import Gym, UserReply
from mimesis_lab.envs.gyms.text import shared, words

__all__ = ["OfflineUser", "VAGUE_REPLIES"]

VAGUE_REPLIES = {
    "travel": "Hmm, I haven't really thought about that yet. What would you suggest?",
    "telepathy": "I'm not sure.",
    "persuade": "Hmm, I don't know. I'd have to think about it.",
    "intention": "Hmm, I'm not sure what you mean.",
    "tau": "Sorry, could you say that again?",
}
_GENERAL = re.compile(r"\b(what else|anything else|something else|else (matters|should)|what (matters|is important)|"
                      r"most important|priorit\w*|what are you looking for|any other (preference|requirement)s?|"
                      r"other (preference|requirement)s?)\b", re.IGNORECASE)
_PRICE_TOPIC = frozenset({"budget", "price", "cost", "spend", "expensive", "cheap", "afford"})
_FRAME = frozenset("known famous someone something related associated connected".split())  # question frames
_TURTLE_FRAME = frozenset("story involve involved involving someone something anyone anything happen happened "
                          "role play part".split())
_WHY = re.compile(r"\b(why|concern\w*|reason\w*|worr\w*|hesita\w*|hold\w* you back|objection\w*|doubt\w*|"
                  r"skeptic\w*|what makes you)\b", re.IGNORECASE)
_OPEN = re.compile(r"\b(what else|anything else|what (details|matters|is important|should i know)|"
                   r"most important|is there anything|other details?)\b", re.IGNORECASE)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


def _first_person(text: str) -> str:
    """Second person → first person for a user restating their instruction ("your order" → "my order")."""
    swaps = {"you are": "I am", "you were": "I was", "you want": "I want", "you need": "I need",
             "you do": "I do", "you have": "I have", "you first": "I first", "you can": "I can",
             "you placed": "I placed", "you no longer": "I no longer", "yours": "mine", "your": "my",
             "you": "I", "yourself": "myself"}
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, swaps), key=len, reverse=True)) + r")\b",
                         re.IGNORECASE)

    def sub(m: re.Match) -> str:
        rep = swaps[m.group(0).lower()]
        return rep[0].upper() + rep[1:] if m.group(0)[0].isupper() else rep
    return pattern.sub(sub, text)


class OfflineUser:
    """The cooperative offline user of one gym episode (module docstring); reads the gym's hidden task.

    ``rng`` draws the uninformative replies (probability ``vague_rate``); ``replies`` are the public
    replies in order. ``respond`` never fails."""

    def __init__(self, gym: Gym, rng: random.Random | None = None, vague_rate: float = 0.0):
        self.gym = gym
        self.rng = rng or random.Random(0)
        self.vague_rate = float(vague_rate)
        self.replies: list[str] = []
        self._told: set[int] = set()        # travel preferences / intention details / persuade reasons told
        self._addressed: set[int] = set()   # persuade reasons an argument addressed
        self._stance: int | None = None

    def respond(self, messages: list[dict[str, str]]) -> UserReply:
        question = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        name = self.gym.name
        if name in VAGUE_REPLIES and self.rng.random() < self.vague_rate:
            text = VAGUE_REPLIES[name]
            if name == "persuade":
                text += f"\nStance: {self._current_stance()}"
        else:
            fn = getattr(self, f"_{name}", None)
            text = fn(question) if fn is not None else "I don't know."
        self.replies.append(text)
        return UserReply(text)

    def close(self) -> None:
        pass

    # ---- travel -------------------------------------------------------------------------------------
    def _travel(self, q: str) -> str:
        from mimesis_lab.envs.gyms.travel import mentions

        prefs = self.gym.task["preferences"]
        qw = words(q)

        def topic(p: dict[str, Any]) -> set[str]:
            chk = p.get("check") or {}
            attr = str(chk.get("attr", ""))
            return words(p["text"]) | words(str(chk.get("tag", ""))) | words(attr.replace("_", " ")) | \
                (_PRICE_TOPIC if attr == "price" else set())

        def about(i: int) -> bool:
            p = prefs[i]
            return any(mentions(q, k) for k in p.get("keywords", [])) or bool(topic(p) & qw)

        hit = next((i for i in range(len(prefs)) if about(i) and i not in self._told and not prefs[i].get("stated")),
                   None)
        if hit is None:
            again = next((i for i in range(len(prefs)) if about(i)), None)
            if again is not None:
                return "As I said: " + self._travel_text(prefs[again], q)
            if _GENERAL.search(q):
                hit = next((i for i, p in enumerate(prefs) if i not in self._told and not p.get("stated")), None)
                if hit is None:
                    return "No, that's everything that matters to me."
            else:
                return "I don't mind about that."
        self._told.add(hit)
        return self._travel_text(prefs[hit], q)

    @staticmethod
    def _travel_text(p: dict[str, Any], q: str) -> str:
        from mimesis_lab.envs.gyms.travel import mentions

        text = p["text"].rstrip(".")
        chk = p.get("check") or {}
        if "tag" in chk and mentions(q, str(chk["tag"])) and not mentions(text, str(chk["tag"])):
            text += f", so {chk['tag']} please"
        if "equals" in chk and mentions(q, str(chk["equals"])) and not mentions(text, str(chk["equals"])):
            text += f" ({chk['equals']})"
        kws = p.get("keywords") or []
        if kws and not any(mentions(text, k) for k in kws):
            text += f" ({kws[0]})"
        return text + "."

    # ---- turtle -------------------------------------------------------------------------------------
    def _turtle(self, q: str) -> str:
        from mimesis_lab.envs.gyms.turtle import content_words

        t = self.gym.task
        surface = content_words(t["surface"])
        story = content_words(t["solution"] + " " + " ".join(t.get("key_facts", [])))
        qw = {w for w in content_words(q) if len(w) >= 3} - _TURTLE_FRAME
        new = qw - shared(qw, surface) or qw
        if not new:
            return "Irrelevant"
        if len(shared(new, story)) / len(new) >= 0.5:
            return "Yes"
        return "No" if shared(qw, story | surface) else "Irrelevant"

    # ---- telepathy ----------------------------------------------------------------------------------
    def _telepathy(self, q: str) -> str:
        t = self.gym.task
        ref = words(f"{t['entity']} {t.get('category', '')} {t.get('description', '')}")
        return "Yes." if shared(words(q) - _FRAME, ref) else "No."

    # ---- persuade -----------------------------------------------------------------------------------
    def _current_stance(self) -> int:
        if self._stance is None:
            self._stance = int(self.gym.task["initial_stance"])
        return self._stance

    def _persuade(self, q: str) -> str:
        from mimesis_lab.envs.gyms.persuade import target_direction

        t = self.gym.task
        stance = self._current_stance()
        claim = words(t["claim"])
        qw = words(q)
        reasons = [words(r) - claim or words(r) for r in t["reasons"]]
        hit = next((i for i, rw in enumerate(reasons) if i not in self._addressed
                    and (len(rw & qw) >= 3 or len(rw & qw) / len(rw) >= 0.5)), None)
        if hit is not None:
            self._addressed.add(hit)
            self._told.add(hit)
            self._stance = min(7, max(1, stance + target_direction(t)))
            return (f"Hm, that's a fair answer to what worried me. I see it a bit differently now."
                    f"\nStance: {self._stance}")
        if _WHY.search(q):
            nxt = next((i for i in range(len(t["reasons"])) if i not in self._told), None)
            if nxt is None:
                return f"I think you've heard all my concerns now.\nStance: {stance}"
            self._told.add(nxt)
            return f"Honestly? {t['reasons'][nxt]}\nStance: {stance}"
        return f"I'm not convinced; that doesn't really address my doubts.\nStance: {stance}"

    # ---- intention ----------------------------------------------------------------------------------
    def _intention(self, q: str) -> str:
        g = self.gym
        task_words = words(g.task["task"])
        idx = g.match(q)
        if idx is None:
            qw = words(q)
            idx = next((i for i, d in enumerate(g.details) if i not in self._told
                        and (words(d["description"]) - task_words) & qw), None)
        if idx is not None:
            self._told.add(idx)
            d = g.details[idx]
            return f"{d['description']}: {g.chosen[idx]}."
        if any(words(g.chosen[i]) and words(g.chosen[i]) <= words(q) for i in self._told):
            return "Yes, that's right."
        if _OPEN.search(q):
            weight = {"3": 0, "2": 1, "1": 2}
            left = sorted((i for i in range(len(g.details)) if i not in self._told and i not in g.uncovered),
                          key=lambda i: (weight[str(g.details[i]["importance"])], i))
            if not left:
                return "No, I think that covers everything."
            return f"Well, I haven't told you about the {g.details[left[0]]['description'].lower()} yet."
        return "I have no particular preference about that."

    # ---- tau ----------------------------------------------------------------------------------------
    def _tau(self, q: str) -> str:
        from mimesis_lab.envs.gyms.tau import STOP

        g = self.gym
        t = g.task
        instruction = str(t["instruction"])
        low = q.lower()
        if t.get("actions") and g.final_reward() == 1.0:
            return f"That's everything I needed, thank you! {STOP}"
        if re.search(r"\b(cannot|can't|can not|unable|not possible|not available|no longer)\b", low):
            if re.search(r"\b(accept that|end the conversation)\b", instruction, re.IGNORECASE):
                return f"I understand, thanks for checking. {STOP}"
            fallback = next((s for s in _sentences(instruction) if re.search(r"\bif\b.*\binstead\b", s, re.I)), None)
            if fallback is not None:
                then = re.search(r"\bif\b[^,]*,\s*(.*)$", fallback, re.IGNORECASE).group(1)
                then = re.sub(r"^(ask to|ask for|you want to)\s+", "", then, flags=re.IGNORECASE)
                return _first_person(f"In that case, I'd like to {then}")
        if re.search(r"\b(email|verify|authenticat\w*|identify|zip)\b", low) and not re.search(r"#w\d+", low):
            email = re.search(r"email (?:is |address is )?([\w.+-]+@[\w.-]+[a-z])", instruction)
            if email:
                return f"Sure, my email is {email.group(1)}."
            who = re.search(r"(?:You are|Your name is) ([A-Z][a-z]+ [A-Z][a-z]+)", instruction)
            zip_ = re.search(r"zip code (?:is )?(\d{5})", instruction)
            return (f"I don't remember which email I used, but I'm {who.group(1) if who else 'the account holder'}"
                    f" and my zip code is {zip_.group(1) if zip_ else 'unknown'}.")
        if re.search(r"\b(proceed|confirm\w*|go ahead|shall i|should i)\b", low):
            named = set(re.findall(r"#W\d+", q))
            if named and named <= set(re.findall(r"#W\d+", instruction)):
                return "Yes, please go ahead."
            return "No, that's not what I asked for. " + self._tau_request(instruction)
        return self._tau_request(instruction)

    @staticmethod
    def _tau_request(instruction: str) -> str:
        """The instruction in the first person, without the persona line and the agent-conditional ones."""
        body = [s for s in _sentences(instruction) if not re.match(r"(you are|your name is)\b", s, re.IGNORECASE)
                and not re.search(r"\bif (asked|the agent|that|it)\b", s, re.IGNORECASE)]
        return _first_person(" ".join(body))

    # ---- search -------------------------------------------------------------------------------------
    def _search(self, q: str) -> str:
        return f"I only want to know this: {self.gym.task['question']}"
