"""PersuadeGym expert: ask what holds the user back, then answer that concern; repeat, then close.

The user's reasons are private, so the expert asks for them ("What are your main concerns about
this claim?") and answers each concern it hears: it restates the concern in the second person (so
the user knows it was heard) and counters it, toward the target stance the prompt names. A reply
that is not a concern (uninformative) gets the question once more in other words; an argument the
user rejects is made once more, quoting the concern. When the user has no concern left, or the turns
run out, the expert ends the conversation (``answer``). The stance itself is never shown to the agent.

Exploring, it may open with a generic argument before asking (which rarely moves anyone), ask twice
in a row, or close after the second concern.
"""
from __future__ import annotations

import re
from typing import Generator

from mimesis_lab.envs.gyms.experts.base import Action, Expert
from mimesis_lab.envs.gyms.text import words

__all__ = ["PersuadeExpert", "second_person"]

_ASK = ("What are your main concerns about this claim?", "Is there anything else that makes you hesitate?",
        "What other reasons hold you back?", "Could you tell me why you see it that way?")
_NONE_LEFT = re.compile(r"\b(heard all|no other|nothing else|that's all|no more)\b", re.IGNORECASE)
_ACCEPTED = re.compile(r"\b(fair (answer|point)|i see (it|your)|good point|you're right|that helps)\b", re.IGNORECASE)


def second_person(text: str) -> str:
    """First person → second person ("I worry my …" → "you worry your …")."""
    swaps = {"i am": "you are", "i'm": "you're", "i have": "you have", "i've": "you've", "i was": "you were",
             "i": "you", "me": "you", "my": "your", "mine": "yours", "myself": "yourself"}
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, swaps), key=len, reverse=True)) + r")\b",
                         re.IGNORECASE)
    return pattern.sub(lambda m: swaps[m.group(0).lower()], text)


class PersuadeExpert(Expert):
    gym = "persuade"

    def policy(self) -> Generator[Action, str, None]:
        claim_m = re.search(r'The claim: "(.+?)"', self.view.request)
        claim = claim_m.group(1).rstrip(".") if claim_m else "the claim"
        agree = "persuade them to agree" in self.view.request
        claim_l = claim[0].lower() + claim[1:]
        stance_line = (f"that is a good reason to think that {claim_l}" if agree
                       else f"that is a good reason to doubt that {claim_l}")
        if self.coin(0.35):
            yield ("action", f"Let me make the case plainly: {stance_line[0].upper()}{stance_line[1:]}, "
                             "and most people who look at the evidence end up there.")
        asked = 0
        max_concerns = 2 if self.coin(0.25) else None     # exploring: close after the second concern
        heard = 0
        while self.turns_left > 2:
            obs = yield ("action", _ASK[min(asked, len(_ASK) - 2)])
            asked += 1
            if self.coin(0.2) and self.turns_left > 3:
                obs = yield ("action", _ASK[-1])
            if _NONE_LEFT.search(obs):
                break
            concern = _concern(obs)
            if concern is None and self.turns_left > 3:
                obs = yield ("action", _ASK[-1])      # uninformative reply: ask again, differently
                if _NONE_LEFT.search(obs):
                    break
                concern = _concern(obs)
            if concern is None:
                continue
            heard += 1
            you = second_person(concern).rstrip(".!?")
            obs = yield ("action", f"I understand: {you}. That is a fair concern, and it deserves a real answer. "
                                   "When you look at how this works in practice, the problem is smaller and more "
                                   f"manageable than it first seems, so {stance_line}.")
            if not _ACCEPTED.search(obs) and self.turns_left > 2:
                obs = yield ("action", f"Let me take your point directly: \"{you}\". Even granting that, the "
                                       f"overall balance still favours my view, so {stance_line}.")
            if max_concerns is not None and heard >= max_concerns:
                break
        yield ("answer", "Thank you for hearing me out and for being open about your concerns.")


def _concern(reply: str) -> str | None:
    """The concern stated in a reply, or ``None`` when it states none (a vague or off-topic reply)."""
    text = re.sub(r"^\s*(honestly\??|well,?|to be honest,?)\s*", "", reply.strip(), flags=re.IGNORECASE)
    if re.search(r"\b(don't know|not sure|have to think|not convinced)\b", text, re.IGNORECASE) \
            or _NONE_LEFT.search(text) or not words(text):
        return None
    return text
