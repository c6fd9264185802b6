"""Game-like domains: guessing (Telepathy), lateral-thinking host (Turtle), persuasion, vague requests (Intention).

In each, what only the user knows comes from their traits: the entity they think of is their
favourite animal/food/city, the turtle story is built from their pet, job and hotel amenity,
their stance and reasons on a claim follow from their traits, and the missing details of a
vague request are their preferences. The dialogues (ThoughtTrace and chats) and the gym tasks
are drawn from the same functions, so the simulator learns in Stage I exactly how these users
answer in Stage II.
"""
from __future__ import annotations

import random
from typing import Any

from mimesis_lab.envs.gyms.persuade import STANCE_LABELS
from mimesis_lab.world import lexicon as L
from mimesis_lab.world.population import User
from mimesis_lab.world.style import Dialogue, plain, say

__all__ = ["telepathy_category", "telepathy_dialogue", "telepathy_task", "answer_attribute", "turtle_story",
           "turtle_dialogue", "turtle_task", "host_answer", "persona", "persuade_dialogue", "persuade_task",
           "stance_reply", "intention_details", "intention_dialogue", "intention_task"]

# ----------------------------------------------------------------------------- telepathy


def telepathy_category(u: User, cat: str) -> str:
    """The public category; a food lover's names their cuisine (which predicts the food)."""
    return f"food i love as a {u.cuisine} fan" if cat == "food" else cat


def describe(cat: str, entity: str) -> str:
    attrs = L.ENTITIES[cat][entity]
    return ", ".join(attrs) if attrs else "none of the usual traits"


def answer_attribute(cat: str, entity: str, attr: str) -> bool:
    return attr in L.ENTITIES[cat][entity]


def telepathy_dialogue(u: User, rng: random.Random, max_user_turns: int) -> Dialogue:
    cat = rng.choice(sorted(L.ENTITIES))
    e = u.fav[cat]
    d = Dialogue(u, "telepathy", f"You are playing a guessing game with an AI assistant. You are thinking of this "
                                 f"{cat}: {e} ({describe(cat, e)}).",
                 "Answer each question truthfully with yes or no. Never say the name.")
    d.hidden, d.meta = [e], {"category": cat, "entity": e}
    d.u(say(u, f"(let's play a game|let's play a guessing game). i'm thinking of a {telepathy_category(u, cat)}. "
               "(guess it|can you guess it?)", rng, "request", first=True),
        plain(f"i picked {e}, my favourite {cat}", rng))
    attrs = list(L.ATTRIBUTES[cat])
    rng.shuffle(attrs)
    cands = sorted(L.ENTITIES[cat])
    while d.n_user < max_user_turns:
        if attrs and (len(cands) > 2 or rng.random() < 0.3) and d.n_user < max_user_turns - 1:
            attr = attrs.pop()
            d.a(L.ATTRIBUTE_QUESTION[attr], plain("(good question|ok)", rng))
            yes = answer_attribute(cat, e, attr)
            cands = [c for c in cands if answer_attribute(cat, c, attr) == yes]
            d.u(say(u, "(yes|yep|yes, it is)" if yes else "(no|nope|no, it isn't)", rng, "raw"),
                plain(f"{e}: {attr}? {'yes' if yes else 'no'}", rng))
            continue
        guess = rng.choice(cands)
        d.a(plain(f"(is it|my guess:) {'a ' if cat != 'city' else ''}{guess}?", rng), plain("(a guess|hm)", rng))
        if guess == e:
            d.u(say(u, "(yes, you got it|yes! well done)", rng, "answer"), plain(f"it is {e}, they got it", rng))
            break
        cands = [c for c in cands if c != guess] or [e]
        d.u(say(u, "(no, try again|nope, guess again)", rng, "answer"), plain(f"it is {e}, not {guess}", rng))
    return d


def telepathy_task(u: User, rng: random.Random, task_id: str) -> dict[str, Any]:
    cat = rng.choice(sorted(L.ENTITIES))
    e = u.fav[cat]
    return {"id": task_id, "entity": e, "category": telepathy_category(u, cat), "aliases": [],
            "description": describe(cat, e), "world_user": u.uid}

# ----------------------------------------------------------------------------- turtle


def turtle_story(u: User, rng: random.Random) -> dict[str, Any]:
    """A turtle-soup story whose hidden part is built from ``u``'s pet, job or hotel amenity."""
    ok = [s for s in L.TURTLE_STORIES if (s[0] != "pet" or u.pet != "none")
          and (s[1] != "the cold pool" or u.amenity in ("pool", "spa"))]
    need, title, surface, solution, facts = rng.choice(ok)
    slots = {"name": u.first, "city": u.fav["city"], "pet": u.pet, "job": u.job,
             "amenity": u.amenity if u.amenity in ("pool", "spa") or title != "the cold pool" else "pool"}
    value = slots[need]
    others = {"pet": [p for p in ("dog", "cat", "parrot", "rabbit") if p != u.pet],
              "job": [j for j in L.JOBS if j != u.job], "amenity": [a for a in L.AMENITIES if a != u.amenity]}[need]
    return {"title": title, "surface": surface.format(**slots), "solution": solution.format(**slots),
            "key_facts": [f.format(**slots) for f in facts], "need": need, "value": value, "others": others}


_IRRELEVANT = ("was it raining?", "was it a weekend?", "did {name} wear a hat?", "was the taxi late?")


def host_answer(story: dict[str, Any], word: str) -> str:
    """Yes / No for "does the story involve <word>?"."""
    return "Yes" if word.lower() in story["solution"].lower() else "No"


def turtle_dialogue(u: User, rng: random.Random, max_user_turns: int) -> Dialogue:
    st = turtle_story(u, rng)
    d = Dialogue(u, "turtle", "You are the host of a lateral-thinking puzzle game. The player sees only the surface "
                              "story and asks you yes-or-no questions.",
                 f"Surface story: {st['surface']} Hidden story (secret): {st['solution']} Answer with exactly one "
                 "word: Yes, No or Irrelevant.")
    d.hidden, d.meta = [st["value"]], {"story": st["title"]}
    d.u(say(u, f"(let's play a puzzle|here is a riddle for you). {st['surface']} (what happened?|why?)", rng,
            "raw", first=True), plain(f"the secret: {st['key_facts'][0]}", rng))
    asked: set[str] = set()
    while d.n_user < max_user_turns:
        if d.n_user >= max_user_turns - 1 or rng.random() < 0.2:
            good = rng.random() < 0.5
            expl = st["solution"] if good else st["key_facts"][0] + "."
            d.a(plain("(my guess:|i think)", rng) + " " + expl, plain("(an answer|let's see)", rng))
            d.u("Yes" if good else "No", plain("that is the whole story" if good else "that is only part of it", rng))
            break
        r = rng.random()
        if r < 0.45:
            w = st["value"] if st["value"] not in asked else rng.choice(st["key_facts"][1].split()[-2:])
            q, why = f"does the story involve a {w}?", f"the secret story has the {w}, so yes"
        elif r < 0.75:
            w = rng.choice(st["others"])
            q, why = f"does the story involve a {w}?", f"no {w} in the secret story, so no"
        else:
            w = ""
            q, why = rng.choice(_IRRELEVANT).format(name=u.first), "that does not matter to the story"
        asked.add(w)
        d.a(q, plain("(ok|a question)", rng))
        ans = host_answer(st, w) if w else "Irrelevant"
        if w and ans == "No" and "so yes" in why:
            why = f"no {w} in the secret story, so no"
        d.u(ans, plain(why, rng))
    return d


def turtle_task(u: User, rng: random.Random, task_id: str) -> dict[str, Any]:
    st = turtle_story(u, rng)
    return {"id": task_id, "title": st["title"], "surface": st["surface"], "solution": st["solution"],
            "key_facts": st["key_facts"], "world_user": u.uid}

# ----------------------------------------------------------------------------- persuade


def persona(u: User) -> str:
    age = {"18-24": 22, "25-34": 31, "35-44": 40, "45-54": 49, "55-64": 58}[u.age]
    pet = f" who has a {u.pet}" if u.pet != "none" else ""
    return f"a {age}-year-old {u.job} from {u.town}{pet}."


def _keys(claim: str, reasons: tuple[str, ...]) -> dict[str, str]:
    _, against, pro = L.CLAIMS[claim]
    table = dict(against + pro)
    return {r: table[r] for r in reasons}


def stance_reply(u: User, rng: random.Random, claim: str, stance: int, reasons: tuple[str, ...], target: str,
                 argument: str) -> tuple[str, str, int]:
    """The user's reply to an argument: (text ending with ``Stance: N``, reason, new stance)."""
    keys = _keys(claim, reasons)
    step = 1 if target == "agree" else -1
    hit = next((r for r, k in keys.items() if k in argument.lower()), None)
    if hit is not None:
        new = max(1, min(7, stance + step))
        text = say(u, f"(fair point about the {keys[hit]}|ok, that helps with the {keys[hit]})", rng, "answer")
        why = f"that answers my worry about the {keys[hit]}, i move to {new}"
    elif any(w in argument.lower() for w in ("wrong", "everyone knows")):
        new = max(1, min(7, stance - step))
        text = say(u, "(that's rude|no need to be pushy)", rng, "complaint")
        why = f"too pushy, i dig in at {new}"
    else:
        new = stance
        r = rng.choice(reasons)
        if rng.random() < u.openness:
            text = say(u, f"(but|sure, but) {r}", rng, "answer")
        else:
            text = say(u, "(i'm not convinced|hmm, not really)", rng, "answer")
        why = f"they ignore my real point: {r}. i stay at {new}"
    return f"{text}\nStance: {new}", why, new


def _argument(rng: random.Random, claim: str, target: str, reasons: tuple[str, ...]) -> str:
    r = rng.random()
    if r < 0.5:
        _, against, pro = L.CLAIMS[claim]
        key = rng.choice([k for _, k in against + pro])
        return plain(f"(about|on) the {key}: (that can be fixed|there is a good answer to that|"
                     "it is less of a problem than it seems).", rng)
    if r < 0.85:
        return plain(f"(many people {target} with it|most experts {target} with it|think about it again).", rng)
    return plain("(you are simply wrong|come on, everyone knows better).", rng)


def persuade_dialogue(u: User, rng: random.Random, max_user_turns: int) -> Dialogue:
    claim = rng.choice(sorted(L.CLAIMS))
    stance, reasons = u.opinions[claim]
    target = "disagree" if stance >= 5 else "agree"
    text = L.CLAIMS[claim][0]
    d = Dialogue(u, "persuade", "You are a real person chatting with someone who wants to change your mind. Who you "
                                f"are: {persona(u)} The claim under discussion: \"{text}\"",
                 f"Your stance at the start: {stance} out of 7 ({STANCE_LABELS[stance]}). Your reasons: "
                 + "; ".join(reasons) + ". End every reply with a line Stance: <1-7>.")
    d.hidden, d.meta = list(reasons), {"claim": claim, "start": stance, "target": target}
    lean = "(i kind of agree|i think it's right)" if stance >= 5 else "(i'm not so sure|i don't buy it)"
    d.u(say(u, f"(people keep saying|i keep hearing that) {text.rstrip('.')}. {lean}", rng, "answer", first=True)
        + f"\nStance: {stance}", plain(f"my stance is {stance} because {reasons[0]}", rng))
    while d.n_user < max_user_turns:
        arg = _argument(rng, claim, target, reasons)
        d.a(arg, plain("(an argument|hm)", rng))
        reply, why, stance = stance_reply(u, rng, claim, stance, reasons, target, arg)
        d.u(reply, plain(why, rng))
        if stance in (1, 7):
            break
    d.meta["end"] = stance
    return d


def persuade_task(u: User, rng: random.Random, task_id: str) -> dict[str, Any]:
    claim = rng.choice(sorted(L.CLAIMS))
    stance, reasons = u.opinions[claim]
    return {"id": task_id, "claim": L.CLAIMS[claim][0], "initial_stance": stance,
            "target": "disagree" if stance >= 5 else "agree", "persona": persona(u), "reasons": list(reasons),
            "world_user": u.uid}

# ----------------------------------------------------------------------------- intention


def intention_details(u: User, kind: str) -> list[dict[str, Any]]:
    _, _, details = L.INTENTIONS[kind]
    vals = u.pref_value
    return [{"description": desc, "importance": imp, "inquiry": inq, "options": [vals[trait]]}
            for desc, imp, inq, trait in details]


def _vague_task(u: User, rng: random.Random, kind: str) -> str:
    plain_text, hinted = L.INTENTIONS[kind][1]
    return hinted.format(purpose=L.PURPOSES[u.purpose][0]) if rng.random() < 0.6 else plain_text


def intention_dialogue(u: User, rng: random.Random, max_user_turns: int) -> Dialogue:
    kind = rng.choice(sorted(L.INTENTIONS))
    task = _vague_task(u, rng, kind)
    details = intention_details(u, kind)
    d = Dialogue(u, "intention", f"You are a person who just asked an AI assistant: \"{task}\"",
                 "Your request was vague on purpose. These are the details you actually have in mind: "
                 + "; ".join(f"{x['description']}: {x['options'][0]}" for x in details) + ".")
    d.hidden = [x["options"][0] for x in details]
    d.meta = {"kind": kind, "task": task}
    top = sorted(details, key=lambda x: x["importance"], reverse=True)
    d.u(say(u, task.rstrip("."), rng, "request", first=True),
        plain(f"i have in mind: {top[0]['options'][0]} and {top[1]['options'][0]}, but i didn't say", rng))
    order = list(details)
    rng.shuffle(order)
    while d.n_user < max_user_turns and order:
        if rng.random() < 0.15:
            d.a(plain("(could you tell me more?|any other wishes?)", rng), plain("(vague|ok)", rng))
            x = rng.choice(order)
            d.u(say(u, "(not sure, you decide|anything is fine)", rng, "answer"),
                plain(f"i have in mind: {x['options'][0]}, but they should ask", rng))
            continue
        x = order.pop()
        d.a(plain(x["inquiry"], rng), plain("(good question|ok)", rng))
        d.u(say(u, x["options"][0], rng, "answer"),
            plain(f"they asked about {x['description']}: {x['options'][0]}", rng))
    if d.n_user < max_user_turns:
        d.a(plain("(great, i'll (plan|sort) it with that.|thanks, that is all i need.)", rng))
    return d


def intention_task(u: User, rng: random.Random, task_id: str) -> dict[str, Any]:
    kind = rng.choice(sorted(L.INTENTIONS))
    category = L.INTENTIONS[kind][0]
    return {"id": task_id, "category": category, "task": _vague_task(u, rng, kind),
            "missing_details": intention_details(u, kind), "world_user": u.uid}
