"""Travel domain: hotel options, the hotel-booking dialogue and TravelGym tasks.

A user wants a hotel in a city. Their three preferences are their traits: a price ceiling, an
area and an amenity. The opening request names the trip ``purpose`` (public context that
predicts the area and amenity) and, sometimes, states one preference. Asked about a topic, the
user answers directly with probability ``openness`` and otherwise vaguely ("not too pricey");
the private reason always names the real value ("i want it under $80 but i won't say the number
yet"). A follow-up question on the same topic gets the direct answer. A proposed option that
breaks a preference the user never stated is rejected vaguely (hidden criterion) or with the
preference; one that breaks a stated preference draws a complaint.
"""
from __future__ import annotations

import random
from typing import Any

from mimesis_lab.envs.gyms.travel import mentions, satisfies
from mimesis_lab.world import lexicon as L
from mimesis_lab.world.population import User
from mimesis_lab.world.style import Dialogue, plain, say

__all__ = ["TOPICS", "preferences", "make_options", "request_text", "travel_dialogue", "travel_task",
           "travel_reply", "summary_lines"]

TOPICS = ("price", "area", "amenity")
_AMENITY_KEY = {"pet friendly": "pet", "family rooms": "family rooms"}

ASK = {"price": "(what is your budget per night?|how much do you want to spend per night?)",
       "area": "(which area would you like to stay in?|where in {city} do you want to stay?)",
       "amenity": "(is there anything the hotel must have?|what does the hotel need to have?)"}
FOLLOW = {"price": "(what is the most you would pay per night?|can you give me a number for the budget?)",
          "area": "(which area exactly?|can you name the area?)",
          "amenity": "(what exactly must it have?|which feature do you need?)"}
GENERIC = "(anything else i should know?|what matters most to you?)"


def _amen_phrase(u: User) -> str:
    return L.AMENITY_PHRASE[u.amenity]


def _area_phrase(u: User) -> str:
    return L.AREA_PHRASE[u.area][1]


def preferences(u: User, stated: str | None = None) -> list[dict[str, Any]]:
    """The user's three hotel preferences as TravelGym preference records."""
    tag = L.AREA_PHRASE[u.area][0]
    kw_area = L.AREA_PHRASE[u.area][2]
    kw_amen = _AMENITY_KEY.get(u.amenity, u.amenity)
    return [
        {"text": f"price under ${u.price_max} per night", "keywords": [f"${u.price_max}", str(u.price_max)],
         "check": {"attr": "price", "max": u.price_max}, "stated": stated == "price", "topic": "price"},
        {"text": _area_phrase(u), "keywords": [kw_area], "check": {"tag": tag}, "stated": stated == "area",
         "topic": "area"},
        {"text": f"has {_amen_phrase(u)}", "keywords": [kw_amen], "check": {"tag": u.amenity},
         "stated": stated == "amenity", "topic": "amenity"},
    ]


def _name(rng: random.Random, used: set[str]) -> str:
    while True:
        n = f"{rng.choice(L.HOTEL_ADJ)} {rng.choice(L.HOTEL_NOUN)}"
        if n not in used:
            used.add(n)
            return n


def make_options(rng: random.Random, u: User, n: int = 5) -> tuple[list[dict[str, Any]], str]:
    """``n`` hotels of which exactly one (the returned id) satisfies all three preferences;
    each of the first three distractors breaks exactly one preference."""
    tag, p = L.AREA_PHRASE[u.area][0], u.price_max
    other_tags = [L.AREA_PHRASE[a][0] for a in L.AREAS if a != u.area]
    other_amen = [a for a in L.AMENITIES if a != u.amenity]
    used: set[str] = set()

    def opt(price: int, area_tag: str, amen: list[str]) -> dict[str, Any]:
        return {"name": _name(rng, used), "price": max(30, price), "rating": round(rng.uniform(3.5, 4.9), 1),
                "tags": [area_tag, *amen], "description": f"rooms {next(v[1] for v in L.AREA_PHRASE.values() if v[0] == area_tag)}."}
    best = opt(p - rng.choice((5, 10, 15, 20)), tag, [u.amenity, rng.choice(other_amen)])
    pool = [opt(p + rng.choice((20, 30, 40, 60)), tag, [u.amenity]),
            opt(p - rng.choice((5, 10)), rng.choice(other_tags), [u.amenity, rng.choice(other_amen)]),
            opt(p - rng.choice((10, 20)), tag, [rng.choice(other_amen)]),
            opt(p + rng.choice((10, 30)), rng.choice(other_tags), [rng.choice(other_amen)])]
    opts = [best] + pool[:max(0, n - 1)]
    rng.shuffle(opts)
    out = [{"id": f"H{i + 1}", **o} for i, o in enumerate(opts)]
    prefs = preferences(u)
    best_ids = [o["id"] for o in out if all(satisfies(o, q) for q in prefs)]
    assert len(best_ids) == 1, best_ids
    return out, best_ids[0]


def request_text(u: User, rng: random.Random, city: str, stated: str | None) -> tuple[str, str]:
    """The opening request (public) and its private reason."""
    purpose = L.PURPOSES[u.purpose][0]
    extra = {None: "", "price": f", under ${u.price_max} a night", "area": f", {_area_phrase(u)}",
             "amenity": f", with {_amen_phrase(u)}"}[stated]
    text = say(u, f"(i need|i'm looking for|can you find me) a hotel in {city} for (a|my) {purpose}"
                  f"[, (two|three|four) nights]{extra}", rng, "request", first=True)
    hidden = [t for t in ("price", "area", "amenity") if t != stated]
    reason = plain(f"(it is my|planning my) {purpose}. i want {_value(u, hidden[0])} and {_value(u, hidden[1])}", rng)
    return text, reason


def summary_lines(u: User, city: str, prefs: list[dict[str, Any]]) -> tuple[str, str]:
    """ThoughtTrace task summary/expectation, worded like TravelGym's user prompt."""
    hidden = [p["text"] for p in prefs if not p["stated"]]
    stated = [p["text"] for p in prefs if p["stated"]]
    summary = f"You are a traveller talking to an AI travel assistant about a hotel in {city}."
    exp = "Your private preferences (the assistant does not know them yet): " + "; ".join(hidden) + "."
    if stated:
        exp += " Already told: " + "; ".join(stated) + "."
    return summary, exp + " Reveal one only when asked about its topic."


def _direct(u: User, topic: str) -> str:
    return {"price": f"(under ${u.price_max} a night|max ${u.price_max} per night|no more than ${u.price_max} a night)",
            "area": f"({_area_phrase(u)}|somewhere {_area_phrase(u)}|i want to stay {_area_phrase(u)})",
            "amenity": f"(it (needs|must have) {_amen_phrase(u)}|{_amen_phrase(u)} is a must|i need {_amen_phrase(u)})"
            }[topic]


def _vague(u: User, topic: str) -> str:
    price = "something cheap-ish" if u.price_max <= 80 else "money is not a big issue" if u.price_max >= 150 \
        else "(not too pricey|nothing too fancy)"
    return {"price": price, "area": "(somewhere nice|a good spot|a nice area)",
            "amenity": "(the usual comforts|the usual stuff)"}[topic]


def _value(u: User, topic: str) -> str:
    """What the user wants, worded to follow "i want" in a reason."""
    return {"price": f"it under ${u.price_max}", "area": f"a place {_area_phrase(u)}",
            "amenity": _amen_phrase(u)}[topic]


def _miss(u: User, topic: str) -> str:
    """A reason for rejecting an option that breaks ``topic`` without the user having said it."""
    return {"price": f"it is over ${u.price_max} and i never said my max",
            "area": f"it is not {_area_phrase(u)} and i never said where",
            "amenity": f"it has no {L.AMENITY_PHRASE[u.amenity].removeprefix('a ')} and i never said i need it"}[topic]


def travel_reply(u: User, rng: random.Random, topic: str | None, follow_up: bool, told: set[str],
                 ) -> tuple[str, str, str | None]:
    """The user's answer to a question on ``topic`` (None = a generic question): (text, reason, revealed)."""
    if topic is None:
        rest = [t for t in TOPICS if t not in told] or list(TOPICS)
        t = rng.choice(rest)
        return (say(u, _vague(u, t), rng, "answer"),
                plain(f"i want {_value(u, t)} (but they haven't asked|but i won't say it yet)", rng), None)
    if topic in told:
        return (say(u, f"(i said|like i said,) {_direct(u, topic)}", rng, "complaint"),
                plain(f"i already told them i want {_value(u, topic)}", rng), None)
    if "B3" in u.behaviors and rng.random() < u.behaviors["B3"] * 0.5:
        return (say(u, "(just find me something good|you pick|doesn't matter, just search)", rng, "complaint"),
                plain(f"i want {_value(u, topic)} but i don't feel like answering", rng), None)
    if follow_up or rng.random() < u.openness:
        return (say(u, _direct(u, topic), rng, "answer"),
                plain(f"they asked about {topic}. i want {_value(u, topic)}", rng), topic)
    return (say(u, _vague(u, topic), rng, "answer"),
            plain(f"i want {_value(u, topic)} but i won't say it yet", rng), None)


def _broken(u: User, opt: dict[str, Any]) -> list[str]:
    return [p["topic"] for p in preferences(u) if not satisfies(opt, p)]


def _propose(rng: random.Random, opt: dict[str, Any]) -> str:
    amen = ", ".join(opt["tags"][1:])
    return plain(f"(how about|i suggest) {opt['name']}? ${opt['price']} a night, {opt['tags'][0]}, with {amen}.", rng)


def travel_dialogue(u: User, rng: random.Random, max_user_turns: int) -> Dialogue:
    """One hotel-booking conversation of ``u`` with a scripted travel assistant."""
    city = rng.choice(L.TRAVEL_CITIES)
    stated = rng.choice(("amenity", "area", "price")) if rng.random() < 0.25 else None
    prefs = preferences(u, stated)
    options, best = make_options(rng, u)
    d = Dialogue(u, "travel", *summary_lines(u, city, prefs))
    d.hidden = [f"${u.price_max}", L.AREA_PHRASE[u.area][2], _AMENITY_KEY.get(u.amenity, u.amenity)]
    d.meta = {"city": city, "stated": stated, "best_id": best, "purpose": u.purpose}
    text, reason = request_text(u, rng, city, stated)
    d.u(text, reason)
    told = {stated} if stated else set()
    asked: list[str] = []
    last: str | None = None
    proposed: set[str] = set()
    while d.n_user < max_user_turns:
        # ---- assistant
        remaining = [t for t in TOPICS if t not in asked and t not in told]
        follow = last is not None and last not in told and rng.random() < 0.8
        if follow:
            d.a(plain(FOLLOW[last], rng), plain("(fair, they want a number|ok, they noticed)", rng))
            topic, is_follow = last, True
        elif remaining and (len(asked) < 2 or rng.random() < 0.6):
            topic = rng.choice(remaining) if rng.random() < 0.85 else None
            q = plain(ASK[topic], rng).replace("{city}", city) if topic else plain(GENERIC, rng)
            d.a(q, plain("(good question|ok, a question)", rng))
            if topic:
                asked.append(topic)
            is_follow = False
        else:
            known = [p for p in preferences(u) if p["topic"] in told]
            cands = [o for o in options if o["id"] not in proposed and all(satisfies(o, p) for p in known)]
            if not cands:
                break
            opt = min(cands, key=lambda o: (o["price"], o["id"])) if rng.random() < 0.5 else rng.choice(cands)
            proposed.add(opt["id"])
            d.a(_propose(rng, opt), plain("(let me check it|hm, an offer)", rng))
            broken = _broken(u, opt)
            if not broken:
                d.u(say(u, "(perfect|great|sounds good), (i'll take it|book it)", rng, "answer"),
                    plain(f"it fits: under ${u.price_max}, {_area_phrase(u)}, {_amen_phrase(u)}. i'll take it", rng))
                d.meta["outcome"] = "booked"
                if rng.random() < 0.5:
                    d.a(plain("(booked|done, it is booked). enjoy your trip!", rng))
                return d
            t = broken[0]
            if t in told:
                rude = "B13" in u.behaviors and rng.random() < u.behaviors["B13"]
                line = "(are you even listening?|i already told you.) " if rude else ""
                d.u(say(u, f"{line}(no,|hmm,) i said {_direct(u, t)}", rng, "complaint"),
                    plain(f"it ignores what i told them, i want {_value(u, t)}", rng))
            elif rng.random() < 0.5 or "B1" in u.behaviors:
                d.u(say(u, "(hmm, not what i had in mind|no, not that one|meh, not really)", rng, "complaint"),
                    plain(_miss(u, t), rng))
            else:
                d.u(say(u, f"(no,|hmm,) {_direct(u, t)}", rng, "answer"),
                    plain(f"it breaks my wish, i want {_value(u, t)}, so i tell them", rng))
                told.add(t)
            last = None
            continue
        # ---- user
        if d.n_user >= u.patience and "B10" in u.behaviors and rng.random() < u.behaviors["B10"]:
            d.u(say(u, "(forget it, i'll look myself|never mind, i'll find one myself)", rng, "complaint"),
                plain("this takes too long, i give up", rng))
            d.meta["outcome"] = "left"
            return d
        text, reason, revealed = travel_reply(u, rng, topic, is_follow, told)
        if d.n_user >= u.patience and "B9" in u.behaviors and rng.random() < u.behaviors["B9"]:
            text = say(u, "(come on,|hurry up,) ", rng, "raw") + " " + text
            reason += ", and i am in a hurry"
        d.u(text, reason)
        if revealed:
            told.add(revealed)
        last = topic if not revealed and topic and not is_follow else None
    d.meta["outcome"] = "open"
    return d


def travel_task(u: User, rng: random.Random, task_id: str) -> dict[str, Any]:
    """A TravelGym task whose hidden preferences are ``u``'s and whose request names their purpose."""
    city = rng.choice(L.TRAVEL_CITIES)
    stated = "amenity" if rng.random() < 0.25 else None
    options, best = make_options(rng, u)
    request, _ = request_text(u, rng, city, stated)
    prefs = [{k: v for k, v in p.items() if k != "topic"} for p in preferences(u, stated)]
    return {"id": task_id, "aspect": "hotel", "city": city, "price_unit": "per night", "request": request,
            "preferences": prefs, "options": options, "best_id": best, "world_user": u.uid, "purpose": u.purpose}


def elicited(reply: str, pref: dict[str, Any]) -> bool:
    """Whether TravelGym would count ``reply`` as eliciting ``pref``."""
    return any(mentions(reply.lower(), k) for k in pref.get("keywords", []))
