"""The world's own user policy as a gym user side (scripted; for tests, baselines and sanity checks).

:func:`world_user` returns ``fn(messages) -> str`` for a gym task, usable as
``ScriptedUser(fn)``: it answers the agent's last message the way the task's world user does in the
generated conversations (same functions, same traits). It is the "ideal simulator" of the world:
a trained simulator that reproduces it perfectly would give agents the same rewards.
"""
from __future__ import annotations

import random
import re
from typing import Any, Callable

from mimesis_lab.envs.gyms.intention import MATCH_THRESHOLD, match_score
from mimesis_lab.envs.gyms.tau import STOP
from mimesis_lab.world import lexicon as L
from mimesis_lab.world.games import answer_attribute, host_answer, stance_reply
from mimesis_lab.world.population import User
from mimesis_lab.world.style import say
from mimesis_lab.world.travel import travel_reply

__all__ = ["world_user", "travel_topic"]

_TOPIC = (("price", r"budget|price|spend|pay|cost|cheap|expensive|\$"),
          ("area", r"area|where|location|neighbou?rhood|near|district|stay in"),
          ("amenity", r"must have|need to have|feature|amenit|facilit|have in the hotel|need in"))


def travel_topic(text: str) -> str | None:
    low = text.lower()
    return next((t for t, rx in _TOPIC if re.search(rx, low)), None)


def _claim_id(text: str) -> str:
    return next(k for k, v in L.CLAIMS.items() if v[0] == text)


def world_user(gym: str, task: dict[str, Any], population: dict[str, User], seed: int = 0
               ) -> Callable[[list[dict[str, str]]], str]:
    """A deterministic user side for ``task`` of ``gym`` played by its world user (``task['world_user']``)."""
    u = population[task["world_user"]]
    rng = random.Random(f"{seed}:{gym}:{task['id']}")
    state: dict[str, Any] = {"told": set(), "last": None}

    def last(messages: list[dict[str, str]]) -> str:
        return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")

    if gym == "travel":
        def fn(messages):
            topic = travel_topic(last(messages))
            follow = topic is not None and topic == state["last"]
            text, _, revealed = travel_reply(u, rng, topic, follow, state["told"])
            if revealed:
                state["told"].add(revealed)
            state["last"] = topic
            return text
    elif gym == "persuade":
        state["stance"] = task["initial_stance"]

        def fn(messages):
            text, _, state["stance"] = stance_reply(u, rng, _claim_id(task["claim"]), state["stance"],
                                                    tuple(task["reasons"]), task["target"], last(messages))
            return text
    elif gym == "intention":
        def fn(messages):
            q = last(messages)
            scored = [(match_score(q, d, task["task"]), d) for d in task["missing_details"]]
            s, d = max(scored, key=lambda x: x[0])
            return say(u, d["options"][0], rng, "answer") if s >= MATCH_THRESHOLD else \
                say(u, "(not sure, you decide|anything is fine)", rng, "answer")
    elif gym == "telepathy":
        cat = next(c for c, ents in L.ENTITIES.items() if task["entity"] in ents)

        def fn(messages):
            q = last(messages).lower()
            attr = next((a for a, text in L.ATTRIBUTE_QUESTION.items() if text.rstrip("?") in q), None)
            if attr is None:
                return say(u, "i'm not sure", rng, "answer")
            return say(u, "(yes|yep)" if answer_attribute(cat, task["entity"], attr) else "(no|nope)", rng, "raw")
    elif gym == "turtle":
        def fn(messages):
            m = re.search(r"involve (?:a |an |the )?([a-z ]+?)\?", last(messages).lower())
            return host_answer(task, m.group(1)) if m else "Irrelevant"
    elif gym == "tau":
        a = task["actions"][0]

        def fn(messages):
            q = last(messages).lower()
            if re.search(r"anything else|all set|is there more", q):
                return say(u, "(no thanks|no, that's all)", rng, "answer") + f" {STOP}"
            if re.search(r"go ahead|confirm|shall i|is that right|proceed", q):
                return say(u, "(yes, go ahead|yes please)", rng, "answer")
            if "email" in q:
                return say(u, "my email is {v}", rng, "answer", slots={"v": u.email})
            if "order" in q:
                return say(u, "it's order {v}", rng, "answer", slots={"v": a["kwargs"]["order_id"]})
            return say(u, "i need help with my order", rng, "answer")
    elif gym == "search":
        def fn(messages):
            return say(u, "(i just need the answer to my question|not sure, that is all i know)", rng, "answer")
    else:
        raise ValueError(f"gym {gym!r} has no user side")
    return fn
