"""One population of users with latent, consistent traits (drawn once per seed).

Every dataset of the world is drawn from this population: a user's preferences, writing
style, patience and behaviour propensities are the same in their mid-training chats, their
ThoughtTrace conversations, their ABCD support scenarios and the gym tasks where they are the
user. Public context correlates with hidden preferences: the trip ``purpose`` a user mentions
predicts the hotel area and amenity they care about (:data:`lexicon.PURPOSES` weights), a pet
owner usually wants pet friendly rooms, a cuisine fan's favourite food is mostly of that cuisine.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from mimesis_lab.behaviors import BEHAVIOR_CODES
from mimesis_lab.world import lexicon as L

__all__ = ["User", "sample_population", "weighted"]


def weighted(rng: random.Random, weights: dict[str, float]) -> str:
    keys = list(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]


@dataclass(frozen=True)
class User:
    uid: str                      # one id everywhere: WildChat hashed_ip, ThoughtTrace user, ABCD username
    first: str
    last: str
    # survey profile (ThoughtTrace survey_answers)
    age: str
    gender: str
    education: str
    job: str
    frequency: str
    survey_purposes: tuple[str, ...]
    # contact facts (ABCD scenario, tau db)
    email: str
    phone: str
    street: str
    town: str
    state: str
    zip_code: str
    pin: str
    card_last_four: str
    member_level: str
    payment_method: str
    # writing style (persistent within the user)
    casing: str                   # lower | sentence
    polite: int                   # 0 none, 1 please/thanks, 2 very polite
    punct: str                    # "" | "." | "..."
    verbosity: int                # 0 terse, 1 normal, 2 chatty
    greeting: str                 # "" | hi | hey | hello
    abbrev: bool                  # pls / thx / u
    # dispositions
    patience: int                 # user turns before they push or leave
    openness: float               # P(state a hidden preference directly when first asked)
    behaviors: dict[str, float] = field(default_factory=dict)  # B1..B13 -> propensity (0 = never)
    # preferences
    purpose: str = "city"
    price_max: int = 100
    area: str = "centre"
    amenity: str = "wifi"
    cuisine: str = "italian"
    food_price: int = 25
    companions: str = "alone"
    transport: str = "train"
    pet: str = "none"
    colour: str = "blue"
    size: str = "M"
    fav: dict[str, str] = field(default_factory=dict)          # animal/food/city -> entity
    opinions: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)  # claim -> (stance, reasons)
    gift_budget: int = 40
    gift_kind: str = "backpack"

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"

    @property
    def full_address(self) -> str:
        """ABCD style: street, two spaces, ``town, st zip``."""
        return f"{self.street}  {self.town}, {self.state} {self.zip_code}"

    @property
    def pref_value(self) -> dict[str, str]:
        """Trait name -> the words a user says for it (used by intention details)."""
        return {"fav_city": self.fav["city"], "price": f"under ${self.price_max} a night",
                "companions": {"alone": "just me", "partner": "my partner", "kids": "my kids",
                               "friends": "two friends"}[self.companions],
                "transport": f"by {self.transport}", "cuisine": self.cuisine,
                "food_price": f"about ${self.food_price}", "area": L.AREA_PHRASE[self.area][1],
                "amenity": L.AMENITY_PHRASE[self.amenity], "colour": self.colour,
                "gift_budget": f"up to ${self.gift_budget}", "gift_kind": f"a {self.gift_kind}"}

    def top_behaviors(self) -> list[str]:
        return sorted((b for b, p in self.behaviors.items() if p > 0), key=lambda b: -self.behaviors[b])

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["opinions"] = {k: [s, list(r)] for k, (s, r) in self.opinions.items()}
        return d


_COMPANIONS = {"work": {"alone": 8, "friends": 1}, "family": {"kids": 8, "partner": 2},
               "beach": {"partner": 4, "friends": 4, "kids": 2}, "romantic": {"partner": 9, "alone": 1},
               "backpacking": {"friends": 5, "alone": 5}, "city": {"partner": 4, "friends": 3, "alone": 3}}


def _opinion(rng: random.Random, claim: str, u: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    """Side from the user's traits where one predicts it; stance 2-3 (against) or 5-6 (for)."""
    side_for = {
        "pets": u["pet"] != "none",
        "tax": u["budget"] == 2 if u["budget"] != 1 else rng.random() < 0.5,
        "transit": u["transport"] == "train" if u["transport"] != "plane" else rng.random() < 0.5,
        "online": "Shopping" in u["survey_purposes"] or rng.random() < 0.3,
        "cleaning": rng.random() < 0.5,
        "flights": u["transport"] == "train" if u["transport"] != "car" else rng.random() < 0.5,
    }[claim]
    _, against, pro = L.CLAIMS[claim]
    pool = pro if side_for else against
    reasons = tuple(r for r, _ in rng.sample(pool, min(2, len(pool))))
    stance = rng.choice((5, 6)) if side_for else rng.choice((2, 3))
    return stance, reasons


def _behaviors(rng: random.Random) -> dict[str, float]:
    """30% easy users (no behaviour); the rest have a primary and a secondary behaviour."""
    if rng.random() < 0.3:
        return {}
    first, second = rng.sample(BEHAVIOR_CODES, 2)
    return {first: round(rng.uniform(0.5, 0.9), 2), second: round(rng.uniform(0.2, 0.5), 2)}


def sample_population(seed: int, n: int) -> list[User]:
    """``n`` users, deterministic in ``seed``."""
    rng = random.Random(f"{seed}:population")
    names = rng.sample([(f, l) for f in L.FIRST_NAMES for l in L.LAST_NAMES], n) if n <= 320 else \
        [(rng.choice(L.FIRST_NAMES), rng.choice(L.LAST_NAMES)) for _ in range(n)]
    users = []
    for i, (first, last) in enumerate(names):
        town = rng.choice(sorted(L.HOME_TOWNS))
        state, zip_prefix, area_code = L.HOME_TOWNS[town]
        purpose = rng.choice(sorted(L.PURPOSES))
        _, area_w, amen_w, shift = L.PURPOSES[purpose]
        budget = rng.choice((0, 1, 2))  # low, mid, high
        band = max(0, min(len(L.PRICE_BANDS) - 1, 2 * budget + rng.choice((0, 1)) + (shift > 0) - (shift < 0)))
        pet = rng.choices(L.PETS, weights=(5, 3, 2))[0]
        amenity = "pet friendly" if pet != "none" and rng.random() < 0.3 else weighted(rng, amen_w)
        cuisine = rng.choice(L.CUISINES)
        survey = tuple(sorted(rng.sample(L.SURVEY_PURPOSES, 2)))
        transport = rng.choice(L.TRANSPORT)
        traits = {"pet": pet, "budget": budget, "transport": transport, "survey_purposes": survey}
        r = rng.random()  # a cuisine fan's favourite food: mostly its signature dish
        fav_food = L.CUISINE_FOODS[cuisine][0] if r < 0.6 else rng.choice(L.CUISINE_FOODS[cuisine]) if r < 0.8 \
            else rng.choice(sorted(L.ENTITIES["food"]))
        fav_animal = pet if pet != "none" and rng.random() < 0.5 else rng.choice(sorted(L.ENTITIES["animal"]))
        users.append(User(
            uid=f"user{i + 1:04d}", first=first, last=last,
            age=rng.choice(L.AGES), gender=rng.choice(L.GENDERS), education=rng.choice(L.EDUCATION),
            job=rng.choice(L.JOBS), frequency=rng.choice(L.FREQUENCY), survey_purposes=survey,
            email=f"{first}.{last}{rng.randint(10, 99)}@email.com",
            phone=f"({area_code}) {rng.randint(200, 999)}-{rng.randint(1000, 9999)}",
            street=f"{rng.randint(10, 9999)} {rng.choice(L.STREETS)} {rng.choice(L.STREET_TYPES)}",
            town=town, state=state, zip_code=f"{zip_prefix}{rng.randint(10, 99)}",
            pin=f"{rng.randint(1000, 9999)}", card_last_four=f"{rng.randint(1000, 9999)}",
            member_level=rng.choices(L.MEMBER_LEVELS, weights=(2, 4, 3, 2))[0],
            payment_method=rng.choice(L.PAYMENT_METHODS),
            casing=rng.choices(("lower", "sentence"), weights=(55, 45))[0],
            polite=rng.choices((0, 1, 2), weights=(4, 4, 2))[0],
            punct=rng.choices(("", ".", "..."), weights=(45, 40, 15))[0],
            verbosity=rng.choices((0, 1, 2), weights=(35, 40, 25))[0],
            greeting=rng.choices(("", "hi", "hey", "hello"), weights=(4, 3, 2, 1))[0],
            abbrev=rng.random() < 0.25,
            patience=rng.choice((2, 3, 4, 5)), openness=round(rng.uniform(0.2, 0.8), 2),
            behaviors=_behaviors(rng),
            purpose=purpose, price_max=L.PRICE_BANDS[band], area=weighted(rng, area_w), amenity=amenity,
            cuisine=cuisine, food_price=L.FOOD_PRICES[budget], companions=weighted(rng, _COMPANIONS[purpose]),
            transport=transport, pet=pet, colour=rng.choice(L.COLOURS), size=rng.choice(L.SIZES),
            fav={"animal": fav_animal, "food": fav_food, "city": rng.choice(L.TRAVEL_CITIES)},
            opinions={c: _opinion(rng, c, traits) for c in L.CLAIMS},
            gift_budget=L.GIFT_BUDGETS[budget], gift_kind=rng.choice(L.GIFT_KINDS),
        ))
    return users
