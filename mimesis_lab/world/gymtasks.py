"""Task files of the eight gyms, in the formats their loaders read (``mimesis_lab.envs.gyms.*``).

Each task of a gym with a user side is drawn for one world user (``world_user`` names them; the
loaders ignore the extra key): travel preferences, turtle stories, persuasion stances, intention
details, telepathy entities and tau goals are that user's traits. SearchGym's corpus describes the
world's hotels (the questions ask about hotels in the asking user's favourite city and area);
FunctionGym has no user side and gets seeded random rules.
"""
from __future__ import annotations

import random
from typing import Any

from mimesis_lab.envs.gyms.function import safe_eval
from mimesis_lab.world import lexicon as L
from mimesis_lab.world.games import intention_task, persuade_task, telepathy_task, turtle_task
from mimesis_lab.world.population import User
from mimesis_lab.world.retail import build_db, tau_tasks
from mimesis_lab.world.travel import travel_task

__all__ = ["task_id", "hotel_directory", "search_files", "function_tasks", "gym_files"]


def hotel_directory(rng: random.Random, per_city: int = 4) -> list[dict[str, Any]]:
    """The world's hotel directory (SearchGym corpus): globally unique names, one area and two amenities each."""
    names = [f"{a} {n}" for a in L.HOTEL_ADJ for n in L.HOTEL_NOUN]
    rng.shuffle(names)
    out = []
    for city in L.TRAVEL_CITIES:
        for _ in range(per_city):
            out.append({"name": names.pop(), "city": city, "area": rng.choice(L.AREAS),
                        "price": rng.choice((50, 70, 90, 110, 140, 180)),
                        "amenities": rng.sample(L.AMENITIES, 2)})
    return out


def task_id(gym: str, seed: int, k: int) -> str:
    """``travel-w1234-001``: world ids never collide with the hand-written fixtures' (``travel-1``,
    ``tau-001``…), so a component that reads the wrong task file fails loudly (unknown id)."""
    return f"{gym}-w{seed}-{k:03d}"


def search_files(users: list[User], rng: random.Random, n: int, seed: int = 0
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(passages, tasks): one passage per hotel, city and animal; questions about hotels in the user's city."""
    hotels = hotel_directory(rng)
    passages = []
    for i, h in enumerate(hotels):
        passages.append({"id": f"p{i + 1:03d}", "title": h["name"],
                         "text": f"the {h['name']} is a hotel in {h['city']}, {L.AREA_PHRASE[h['area']][1]}. "
                                 f"a night costs ${h['price']}. it has {' and '.join(h['amenities'])}."})
    for city, attrs in L.ENTITIES["city"].items():
        passages.append({"id": f"p{len(passages) + 1:03d}", "title": city,
                         "text": f"{city} " + (", ".join(a.replace("is ", "is ", 1) for a in attrs) or "is a city") + "."})
    for animal, attrs in L.ENTITIES["animal"].items():
        passages.append({"id": f"p{len(passages) + 1:03d}", "title": animal,
                         "text": f"the {animal} " + (" and ".join(attrs) or "is an animal") + "."})
    tasks = []
    for k in range(n):
        u = users[k % len(users)]
        local = [h for h in hotels if h["city"] == u.fav["city"]]
        h = next((x for x in local if x["area"] == u.area), None) or rng.choice(local)
        if rng.random() < 0.5:
            q, a, al = f"how much is a night at the {h['name']} in {h['city']}?", f"${h['price']}", \
                [str(h["price"]), f"{h['price']} dollars"]
        else:
            q, a, al = f"which city is the {h['name']} hotel in?", h["city"], []
        tasks.append({"id": task_id("search", seed, k + 1), "question": q, "answer": a, "aliases": al, "world_user": u.uid})
    return passages, tasks


def function_tasks(rng: random.Random, n: int, seed: int = 0) -> list[dict[str, Any]]:
    tasks = []
    for k in range(n):
        rule = L.FUNCTION_RULES[k % len(L.FUNCTION_RULES)]
        case = [rng.randint(1, 9) for _ in range(4)]
        tasks.append({"id": task_id("fgym", seed, k + 1), "rule": rule, "test_case": case,
                      "expected_result": float(safe_eval(rule, case))})
    return tasks


def gym_files(users: list[User], seed: int, n: int) -> dict[str, Any]:
    """``{relative path: JSON-able document}`` for every gym file (``n`` tasks per gym)."""
    def rng(name: str) -> random.Random:
        return random.Random(f"{seed}:gym:{name}")

    def per_user(name: str, fn, prefix: str) -> list[dict[str, Any]]:
        r = rng(name)
        picks = [users[i] for i in r.sample(range(len(users)), min(n, len(users)))]
        picks += [r.choice(users) for _ in range(n - len(picks))]
        return [fn(u, r, task_id(prefix, seed, k + 1)) for k, u in enumerate(picks)]

    tau_rng = rng("tau")
    tau_users = [users[i] for i in tau_rng.sample(range(len(users)), min(len(users), max(8, n // 2)))]
    db = build_db(tau_users, tau_rng)
    passages, search = search_files(users, rng("search"), n, seed)
    return {
        "travel/tasks.json": per_user("travel", travel_task, "travel"),
        "turtle/tasks.json": per_user("turtle", turtle_task, "turtle"),
        "function/tasks.json": function_tasks(rng("function"), n, seed),
        "tau/db.json": db,
        "tau/tasks.json": tau_tasks(tau_users, db, tau_rng, n, seed),
        "persuade/tasks.json": per_user("persuade", persuade_task, "persuade"),
        "intention/tasks.json": per_user("intention", intention_task, "intent"),
        "telepathy/tasks.json": per_user("telepathy", telepathy_task, "tele"),
        "search/tasks.json": search,
        "search/passages.jsonl": passages,
    }
