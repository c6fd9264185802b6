"""TelepathyGym expert: narrow the user's category down with yes/no questions, then guess.

The agent is told only the category ("I am thinking of a city"). The expert brings general
knowledge — :data:`KNOWLEDGE`, a small table of well-known entities per kind with a few facts each,
the kind of knowledge an LLM agent has: famous landmarks, people and works, and everyday animals,
dishes and cities by the traits anyone knows them by (fur, flight, spicy, by the sea…). It is a
table of candidates, not of answers: which one the user has in mind it learns only from the
user's replies. It plays twenty questions with it: it keeps a score per candidate of the
categories that fit the one named, asks the fact that splits the best-scored
candidates most evenly ("Is it from Africa?"), and after each answer raises the candidates the
answer fits (``Yes``: those with the fact; ``No``: those without it, a little). "I'm not sure"
changes nothing; that fact is asked once more in other words. The category text is evidence too:
a candidate it speaks of (its name or one of its facts: "a food i love as a thai fan" → a Thai dish)
starts a point ahead. It guesses the best-scored candidate once it leads clearly or the questions run
out; a wrong guess drops that candidate and the game goes on, for at most :data:`MAX_GUESSES`
guesses. An entity outside the table cannot be
found (the trace is then unrewarded and dropped).

Exploring, it may ask a fact at random first, or guess before the leader is clear.

Facts are phrased so that their content words are the fact itself ("Is it from Africa?"), never
the category's own words, which are true of every candidate.
"""
from __future__ import annotations

import re
from typing import Generator

from mimesis_lab.envs.gyms.experts.base import Action, Expert
from mimesis_lab.envs.gyms.text import shared, words

__all__ = ["TelepathyExpert", "KNOWLEDGE"]

# kind -> (words of categories it fits, {entity: [facts, each the end of "Is it …?"]})
KNOWLEDGE: dict[str, tuple[str, dict[str, list[str]]]] = {
    "landmark": ("landmark monument building", {
        "Eiffel Tower": ["in Paris", "made of iron", "a tower", "from the 1880s"],
        "Statue of Liberty": ["in New York", "a statue", "made of copper", "a gift from France"],
        "Great Wall of China": ["in China", "a wall", "built over many centuries", "thousands of kilometres long"],
        "Colosseum": ["in Rome", "an amphitheatre", "from antiquity", "in Italy"],
        "Taj Mahal": ["in India", "a mausoleum", "made of marble", "commissioned by an emperor"],
        "Big Ben": ["in London", "a clock", "a bell", "a tower"],
        "Sydney Opera House": ["in Australia", "an opera house", "by a harbour"],
    }),
    "nature": ("natural feature geography landmark", {
        "Mount Everest": ["a mountain", "the highest", "in Nepal", "in the Himalayas", "on a border"],
        "Amazon River": ["a river", "in South America", "in Brazil", "the largest discharge of water"],
        "Nile": ["a river", "in Africa", "in Egypt", "the longest"],
        "Sahara": ["a desert", "in Africa", "hot and dry"],
        "Grand Canyon": ["a canyon", "in Arizona", "carved by a river"],
        "Niagara Falls": ["a waterfall", "in Canada", "in the United States"],
        "Great Barrier Reef": ["a coral reef", "in Australia", "in the ocean"],
        "Mount Fuji": ["a mountain", "a volcano", "in Japan"],
    }),
    "animal": ("animal creature species pet", {
        "Giraffe": ["from Africa", "the tallest", "with a long neck", "from the savanna"],
        "Elephant": ["from Africa", "the heaviest", "with a trunk", "with tusks"],
        "Lion": ["from Africa", "a big cat", "a predator", "with a mane"],
        "Penguin": ["a bird", "from Antarctica", "a swimmer", "flightless"],
        "Kangaroo": ["from Australia", "a marsupial", "a jumper", "with a pouch"],
        "Blue whale": ["from the ocean", "the largest", "a mammal", "a krill eater"],
        "Giant panda": ["from China", "a bear", "a bamboo eater"],
        # everyday animals, described by the traits anyone knows them by
        "Dog": ["covered in fur", "kept as a pet", "four-legged"],
        "Cat": ["covered in fur", "kept as a pet", "four-legged"],
        "Rabbit": ["covered in fur", "kept as a pet", "four-legged"],
        "Horse": ["covered in fur", "bigger than a dog", "four-legged"],
        "Goat": ["covered in fur", "four-legged"],
        "Parrot": ["able to fly", "kept as a pet"],
        "Owl": ["able to fly"],
        "Dolphin": ["found in water", "bigger than a dog"],
        "Goldfish": ["found in water", "kept as a pet"],
        "Turtle": ["found in water", "kept as a pet", "four-legged"],
    }),
    "person": ("historical figure person people scientist leader", {
        "Albert Einstein": ["a physicist", "known for relativity", "German", "a Nobel laureate"],
        "Isaac Newton": ["a physicist", "known for gravity", "English", "a mathematician"],
        "Marie Curie": ["a physicist", "a chemist", "known for radioactivity", "a woman"],
        "Napoleon Bonaparte": ["an emperor", "French", "a general"],
        "Cleopatra": ["a queen", "Egyptian", "a pharaoh", "a woman"],
        "Abraham Lincoln": ["a president", "American", "known for ending slavery"],
        "Leonardo da Vinci": ["a painter", "Italian", "an inventor"],
    }),
    "food": ("food dish meal cuisine", {
        "Pizza": ["baked", "topped with cheese", "topped with tomato", "from Naples", "made of dough", "Italian",
                  "eaten hot"],
        "Sushi": ["Japanese", "made with rice", "made with raw fish", "from Asia", "seafood"],
        "Burger": ["American", "made with beef", "served in a bun", "made with meat", "eaten hot"],
        "Tacos": ["Mexican", "made with tortillas", "spicy", "made with meat", "eaten hot"],
        "Croissant": ["French", "a pastry", "made with butter"],
        "Pasta": ["Italian", "boiled", "made of noodles", "eaten hot"],
        "Ice cream": ["frozen", "a dessert", "sweet"],
        "Gelato": ["Italian", "frozen", "a dessert", "sweet"],
        "Curry": ["spicy", "made with meat", "eaten hot", "from Asia", "Thai", "Indian"],
        "Ramen": ["Japanese", "made with meat", "eaten hot", "from Asia", "a noodle soup"],
        "Pancakes": ["sweet", "eaten hot", "a breakfast"],
        "Salad": ["vegan", "vegetarian", "made of vegetables"],
    }),
    "character": ("fictional character hero", {
        "Harry Potter": ["a wizard", "a boy", "from Rowling's novels", "a magic user"],
        "Sherlock Holmes": ["a detective", "from London", "from Conan Doyle's stories"],
        "Mickey Mouse": ["a mouse", "from Disney", "a cartoon"],
        "Superman": ["a superhero", "from Krypton", "from comics"],
        "Frodo Baggins": ["a hobbit", "from Tolkien's novels", "a ring bearer"],
        "Batman": ["a superhero", "from Gotham", "from comics"],
    }),
    "instrument": ("musical instrument music", {
        "Guitar": ["with strings", "fretted", "with six strings", "plucked"],
        "Piano": ["with keys", "with hammers", "a keyboard"],
        "Violin": ["with strings", "played with a bow", "held under the chin"],
        "Drum": ["percussion", "hit with sticks"],
        "Trumpet": ["brass", "with valves"],
        "Flute": ["a woodwind", "blown across a hole"],
    }),
    "object": ("everyday object household item thing", {
        "Bicycle": ["a vehicle", "with two wheels", "with pedals", "human-powered"],
        "Umbrella": ["for rain", "foldable"],
        "Toothbrush": ["for teeth", "with bristles"],
        "Chair": ["furniture", "for sitting"],
        "Clock": ["for telling time", "with hands"],
        "Key": ["for locks", "made of metal"],
    }),
    "discovery": ("scientific discovery science invention", {
        "Penicillin": ["an antibiotic", "from Fleming", "from mould", "a medicine"],
        "Gravity": ["from Newton", "about falling"],
        "DNA double helix": ["from Watson and Crick", "about genetics"],
        "X-rays": ["from Röntgen", "radiation", "used for imaging"],
        "Vaccination": ["from Jenner", "against smallpox"],
        "Evolution": ["from Darwin", "about natural selection"],
    }),
    "art": ("work art painting artwork", {
        "Mona Lisa": ["by Leonardo", "a portrait", "in the Louvre"],
        "The Starry Night": ["by Van Gogh", "about the night sky"],
        "The Scream": ["by Munch", "Norwegian"],
        "Guernica": ["by Picasso", "about war"],
        "The Last Supper": ["by Leonardo", "a mural", "in Milan"],
        "David": ["by Michelangelo", "a sculpture", "made of marble"],
        "Girl with a Pearl Earring": ["by Vermeer", "a portrait", "Dutch"],
    }),
    "city": ("city town capital", {
        "Tokyo": ["in Japan", "a capital", "in Asia", "very big"],
        "Paris": ["in France", "a capital", "home to a famous tower", "very old", "very big"],
        "London": ["in England", "a capital", "on the Thames", "very big"],
        "New York": ["in the United States", "full of skyscrapers", "by the sea", "very big"],
        "Rome": ["in Italy", "a capital", "ancient", "very old", "in the south of Europe", "very big"],
        "Sydney": ["in Australia", "by a harbour", "by the sea"],
        "Cairo": ["in Egypt", "a capital", "near the pyramids", "very old", "very big"],
        "Lisbon": ["in Portugal", "a capital", "by the sea", "in the south of Europe", "very old"],
        "Madrid": ["in Spain", "a capital", "in the south of Europe", "very big"],
        "Athens": ["in Greece", "a capital", "by the sea", "in the south of Europe", "very old"],
        "Berlin": ["in Germany", "a capital", "home to a famous tower", "very big"],
        "Prague": ["in Czechia", "a capital", "very old"],
        "Vienna": ["in Austria", "a capital", "very old", "very big"],
    }),
    "game": ("game sport pastime", {
        "Chess": ["played on a board", "with pawns", "a strategy", "for two players"],
        "Monopoly": ["played on a board", "with dice", "about money"],
        "Scrabble": ["played on a board", "about letters"],
        "Poker": ["played with cards", "about betting"],
        "Football": ["played with a ball", "a team sport"],
        "Tennis": ["played with a racket", "played with a ball"],
    }),
    "gadget": ("modern gadget device technology electronic", {
        "Smartphone": ["a phone", "with a touchscreen", "handheld", "mobile"],
        "Laptop": ["a computer", "portable", "with a keyboard"],
        "Tablet": ["with a touchscreen", "handheld", "a computer"],
        "Smartwatch": ["worn on the wrist"],
        "Drone": ["flying", "with a camera"],
        "Headphones": ["worn on the ears", "for music"],
    }),
}


_UNSURE = re.compile(r"\s*(i'?m not sure|not sure|hmm|i don'?t know)", re.IGNORECASE)
MAX_GUESSES = 3   # guessing down the whole list is not a strategy worth teaching


def _question(fact: str) -> str:
    return f"Is it {fact}?"


class TelepathyExpert(Expert):
    gym = "telepathy"

    def policy(self) -> Generator[Action, str, None]:
        m = re.search(r"I am thinking of an? (.+?)\.", self.view.request)
        category = m.group(1) if m else self.view.request
        cw = words(category)
        fitting = [kind for kind, (cues, _) in KNOWLEDGE.items() if shared(words(cues), cw)] or list(KNOWLEDGE)
        facts: dict[str, set[str]] = {}
        told: set[str] = set()       # entities the category text itself speaks of ("food i love as a thai fan")
        extra = cw - {w for kind in fitting for w in words(KNOWLEDGE[kind][0])}
        for kind in fitting:
            for entity, fs in KNOWLEDGE[kind][1].items():
                facts.setdefault(entity, set()).update(f for f in fs if not shared(words(f), cw))
                if any(shared(words(x), extra) for x in (entity, *fs)):
                    told.add(entity)
        score = {e: (1.0 if e in told else 0.0) for e in facts}
        asked: set[str] = set()
        again: set[str] = set()      # facts asked twice after an unsure reply
        guesses = 0
        guess_at = 1.0 if self.coin(0.3) else 2.0          # exploring: guess on a thinner lead
        if self.coin(0.4):                                 # exploring: a fact at random first
            f = self.explore.choice(sorted({f for fs in facts.values() for f in fs}))
            asked.add(f)
            _update(score, facts, f, (yield ("action", _question(f))))
        while score and self.turns_left > 0:
            ranked = sorted(score, key=lambda e: (-score[e], e))   # ties: alphabetical, never the table's order
            lead = score[ranked[0]] - (score[ranked[1]] if len(ranked) > 1 else -99)
            top = [e for e in ranked if score[e] >= score[ranked[0]] - 1]
            options = [f for f in sorted({f for e in top for f in facts[e]}) if f not in asked
                       and 0 < sum(f in facts[e] for e in top) < len(top)]
            if lead >= guess_at or not options or self.turns_left <= MAX_GUESSES - guesses:
                if guesses >= MAX_GUESSES:
                    return
                guesses += 1
                yield ("answer", ranked[0])
                del score[ranked[0]]
                continue
            f = min(options, key=lambda f: abs(sum(f in facts[e] for e in top) - len(top) / 2))
            asked.add(f)
            reply = yield ("action", _question(f))
            if _UNSURE.match(reply) and f not in again and self.turns_left > MAX_GUESSES - guesses + 1:
                again.add(f)         # an unsure reply: the same fact once more, in other words
                reply = yield ("action", f"Sorry, let me ask again: would you say it is {f}?")
            _update(score, facts, f, reply)


def _update(score: dict[str, float], facts: dict[str, set[str]], fact: str, reply: str) -> None:
    r = reply.strip().lower()
    if r.startswith("yes"):
        for e in score:
            score[e] += 2.0 if fact in facts[e] else -1.0
    elif r.startswith("no"):
        for e in score:
            score[e] += -1.0 if fact in facts[e] else 0.5
