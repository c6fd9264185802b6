"""IntentionGym expert: ask what is still missing from the request, then ask about that detail.

The missing details are the user's, so the expert asks an open question ("What else should I know
about your request?"); the user names a detail they have not told yet ("I haven't told you about the
budget for the trip yet"), and the expert asks about it in the user's words ("What budget for the
trip do you have in mind?"). An uninformative reply gets the open question once more in other words.
It stops when the user has nothing more to add (or the gym says every detail is clarified) and ends
with ``answer``: a summary of what it learnt.

Exploring, it may first ask a common clarifying question on its own (budget, timing, who is
involved…), which costs a question and may uncover nothing, confirm a detail it was told (another
question), or stop one detail early.
"""
from __future__ import annotations

import re
from typing import Generator

from mimesis_lab.envs.gyms.experts.base import Action, Expert

__all__ = ["IntentionExpert"]

_OPEN = ("What else should I know about your request?", "Is there anything else that is important to you here?",
         "What other details matter to you?")
_COMMON = ("What budget do you have in mind?", "When do you need this done?", "Who else is involved?")
_DONE = re.compile(r"\b(covers everything|nothing else|that's all|all the missing details have been clarified)\b",
                   re.IGNORECASE)
_TOPIC = re.compile(r"\babout (?:the |my )?(.+?)(?: yet)?\.?\s*$", re.IGNORECASE)


class IntentionExpert(Expert):
    gym = "intention"

    def policy(self) -> Generator[Action, str, None]:
        learnt: list[str] = []
        if self.coin(0.3):
            obs = yield ("action", self.explore.choice(_COMMON))
            if ":" in obs:
                learnt.append(obs.strip().splitlines()[0])
        stop_early = self.coin(0.2)
        opened = 0
        while self.turns_left > 2:
            obs = yield ("action", _OPEN[opened % len(_OPEN)])
            opened += 1
            if _DONE.search(obs):
                break
            topic = _TOPIC.search(obs.strip().splitlines()[0])
            if topic is None:
                if ":" in obs:   # the user answered a detail outright
                    learnt.append(obs.strip().splitlines()[0])
                continue
            what = topic.group(1).strip().rstrip(".")
            obs = yield ("action", f"What {what} do you have in mind?")
            if ":" in obs:
                learnt.append(obs.strip().splitlines()[0])
                if self.coin(0.2) and self.turns_left > 2:
                    value = obs.strip().splitlines()[0].split(":", 1)[1].strip().rstrip(".")
                    obs = yield ("action", f"Just to confirm, for the {what}: {value}?")
            if _DONE.search(obs) or (stop_early and len(learnt) >= 2):
                break
        summary = "; ".join(learnt) if learnt else "no further details"
        yield ("answer", f"Thanks, here is what I have: {summary}.")
