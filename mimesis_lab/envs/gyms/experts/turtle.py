"""TurtleGym expert: test the twists the surface story suggests with yes/no questions, then explain
the story with the twists the host confirmed.

The hidden story is the host's; the host answers only Yes / No / Irrelevant. The expert brings two
kinds of general knowledge, the knowledge an LLM agent brings to "turtle soup":

- :data:`TWISTS`, the twists of *classic* puzzles (the man who asks for a glass of water, the car
  pushed to a hotel…), each a yes/no question, the explanation it implies and the surface words
  that suggest it;
- :data:`HUNCHES`, *generic* twists that are not tied to any puzzle — the usual hidden reasons
  behind an odd choice: a pet, work, a friend, someone falling sick, the time of day, noise,
  training, shopping, a rule… Each is a question about one concept ("Does the story involve a
  pet?"), the clause it adds to the explanation, filled with the story's protagonist as the surface
  names them, and the surface words that make it worth asking (its associations: a noisy room
  suggests noise or a pet, an unused booking someone else). A confirmed hunch may open a follow-up
  (:data:`KINDS`: which pet? which job?), asked after the next explanation (so an episode of a few
  turns still explains what it found) until the host says ``Yes``.

It asks the twists and hunches whose cue words the surface story or its title contains, the
strongly suggested ones (two cue words or more) first; a classic twist only when two of its cue
words are there (one shared word, "hotel", does not make a story that puzzle). Only what the host answers ``Yes`` goes into
the explanation; ``No`` and ``Irrelevant`` are dropped. After the strongly suggested ones it
``answer``s with the surface story and the confirmed clauses; when the feedback says the explanation
is incomplete and turns are left, it tests the weakly suggested ones and answers again. With nothing
confirmed it still answers with the surface story (which earns nothing, and the trace is dropped).

Exploring, it may ask a tier in another order or explain after the first half of the strongly
suggested ones, then ask the rest and explain again (the gym pays each improvement).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Generator

from mimesis_lab.envs.gyms.experts.base import Action, Expert
from mimesis_lab.envs.gyms.text import shared, words

__all__ = ["TurtleExpert", "Twist", "TWISTS", "HUNCHES", "KINDS", "protagonist"]


@dataclass(frozen=True)
class Twist:
    question: str
    explanation: str
    cues: str       # surface words that make the twist worth asking
    kind: str = ""  # a confirmed twist opens this follow-up (:data:`KINDS`)


TWISTS: tuple[Twist, ...] = (
    # a drink, a scare
    Twist("Did the man have hiccups?", "The man had hiccups and asked for water to cure them.",
          "water glass bar bartender drink thank gun"),
    Twist("Did the gun give him a fright?",
          "The bartender pulled the gun to give him a fright; the scare cured his hiccups, so he no longer needed "
          "the water.", "gun bartender water thank happily"),
    Twist("Was the gun a toy?", "The gun was only a toy.", "gun shoots"),
    Twist("Was the man a robber?", "The man was a robber.", "gun bar masked"),
    # games
    Twist("Is he playing a board game?", "He is playing the board game Monopoly.", "hotel car bankrupt money"),
    Twist("Is the car a game token?", "His car is just a token piece in the game.", "car hotel bankrupt pushes"),
    Twist("Did he land on a hotel he could not pay the rent for?",
          "He landed on a property with a hotel owned by another player and cannot pay the rent, so he is bankrupt.",
          "hotel bankrupt"),
    Twist("Did his car run out of fuel?", "His car ran out of fuel.", "car pushes"),
    Twist("Is he playing baseball?", "The man is a baseball player running the bases.", "home left turns masked"),
    Twist("Is home the home plate?", "He comes back to home plate on the baseball field.", "home left turns returns"),
    Twist("Are the masked men the catcher and the umpire?", "The two masked men are the catcher and the umpire.",
          "masked men home"),
    # bodies and places
    Twist("Is the man very short?", "The man is very short.", "elevator floor rainy walks seventh tenth"),
    Twist("Can he only reach the button for the seventh floor?",
          "He cannot reach the higher elevator buttons, only the button for the seventh floor.",
          "elevator floor seventh"),
    Twist("Does he use his umbrella on rainy days?",
          "On rainy days he carries an umbrella and presses the button for his floor with it.",
          "rainy elevator days"),
    Twist("Does he want the exercise?", "He walks the last floors for the exercise.", "walks floor stairs"),
    Twist("Did he jump from an airplane?", "He jumped from an airplane as a skydiver.",
          "dead field package footprints empty"),
    Twist("Is the package his parachute?",
          "The unopened package is his parachute, which failed to open, and he fell to his death.",
          "package unopened field"),
    Twist("Was he struck by lightning?", "He was struck by lightning.", "dead field empty"),
    Twist("Was he in a hot air balloon?", "He was in a hot air balloon that was losing height.",
          "field naked match matchstick dead"),
    Twist("Did they throw out their clothes to lose weight?",
          "They threw out everything, even their clothes, to lose weight.", "naked field"),
    Twist("Did they draw matches to decide who had to jump?",
          "They drew matches, and the one who drew the short burnt match had to jump to save the others.",
          "match matchstick burnt half"),
    Twist("Is the cabin part of an airplane?", "The cabin is the cabin of a small airplane.",
          "cabin woods bodies"),
    Twist("Did a plane crash?", "The plane crashed in the woods.", "cabin woods bodies dead"),
    Twist("Are the bodies the pilot and a passenger?", "The two bodies are the pilot and the passenger.",
          "bodies cabin two"),
    Twist("Did they freeze to death?", "They froze to death.", "cabin woods dead"),
    # who they really are
    Twist("Are they triplets?", "They are triplets: a third sibling was also delivered on the same day.",
          "twins born mother same day girls"),
    Twist("Was one of them adopted?", "One of them was adopted.", "mother born girls"),
    Twist("Are Romeo and Juliet fish?", "Romeo and Juliet are goldfish, not people.",
          "romeo juliet water glass dead floor"),
    Twist("Did the cat knock over their bowl?",
          "The cat knocked their fishbowl off the shelf; the bowl broke and the fish died without water.",
          "cat shelf glass water broken"),
    Twist("Did the wind blow through the window?", "The wind blew through the open window.", "window open"),
    Twist("Is the man a lighthouse keeper?", "The man is a lighthouse keeper who switched off the lighthouse light.",
          "lights turns bed died devastated"),
    Twist("Did a ship crash in the dark?",
          "Without the light a ship crashed into the rocks in the dark and many people drowned.",
          "lights died morning devastated"),
    Twist("Was there a power outage?", "There was a power outage.", "lights turns"),
    Twist("Is the surgeon the boy's mother?", "The surgeon is the boy's mother: the surgeon is a woman, not a man.",
          "surgeon son father boy operate"),
    Twist("Is the surgeon his stepfather?", "The surgeon is his stepfather.", "surgeon father son"),
    Twist("Is the woman a photographer?", "She is a photographer and she took a photograph of her husband.",
          "shoots husband hangs water"),
    Twist("Did she develop the photo in water and hang it to dry?",
          "She developed the photo in water and hung it up to dry.", "water hangs holds under"),
    Twist("Is her husband a ghost?", "Her husband is a ghost.", "husband dinner dead"),
    Twist("Was the poison in the ice?", "The poison was frozen in the ice cubes.", "punch poisoned drinks party"),
    Twist("Did he drink before the ice melted?",
          "He drank the punch early, before the ice melted, and the melting ice released the poison later.",
          "punch early leaves poisoned"),
    Twist("Did he take an antidote?", "He took an antidote.", "poisoned fine"),
    # anywhere
    Twist("Was it all a dream?", "It was all a dream.", "dead wakes morning"),
)


# Generic twists: ``{name}`` is the story's protagonist as the surface names them ("grace", "the man").
HUNCHES: tuple[Twist, ...] = (
    Twist("Does the story involve a pet?", "{name} travels with a pet.",
          "hotel room night home house flat left checkout glad noisy noisiest quiet walk garden", kind="pet"),
    Twist("Does the story involve {name}'s work?", "It was about {name}'s work.",
          "early morning breakfast paid every day suitcase tools flew trip business office never uniform",
          kind="job"),
    Twist("Did it happen at dawn?", "{name} started at dawn.", "early morning breakfast sunrise night alarm ate"),
    Twist("Was something too late?", "Something opened too late.",
          "early breakfast never ate missed clock waited time"),
    Twist("Does the story involve a friend?", "{name} booked it for a friend who needed it.",
          "picked booked unused never used key gift present bought for two"),
    Twist("Was someone sick?", "Someone got sick and stayed home.",
          "never used unused empty cancelled missed stayed hospital doctor medicine"),
    Twist("Does the story involve noise?", "The noise calmed them down.",
          "noisiest noisy loud quiet silent night sleep room"),
    Twist("Did {name} go to buy something?", "{name} went to buy something.",
          "empty suitcase bag shop shopping market paid money flew trip", kind="goods"),
    Twist("Is {name} training for something?", "{name} trains: it was all about training.",
          "cold warm pool gym complained sport race run runner fit"),
    Twist("Does the story involve swimming?", "{name} swims every day: swimming in cold water.",
          "pool cold warm water sea beach lake river complained"),
    Twist("Was something not allowed?", "The place did not allow it.",
          "left checkout glad rule banned hotel forbidden"),
    Twist("Did {name} move somewhere else?", "{name} moved to another place.",
          "left checkout glad one night after go"),
    Twist("Does the story involve money?", "Money was the problem.", "paid price cost expensive cheap bankrupt"),
    Twist("Does the story involve a child?", "A child was part of it.", "family room kids toy school"),
    Twist("Does the story involve an allergy?", "Someone had an allergy.", "food ate eat breakfast pet sneeze"),
    Twist("Was someone afraid?", "Someone was afraid.", "dark night alone screamed ran"),
    Twist("Was it a gift?", "It was a gift.", "present birthday wrapped box bought"),
)
#: follow-ups: after a confirmed hunch of this kind, which one is it?
KINDS: dict[str, tuple[str, ...]] = {
    "pet": ("dog", "cat", "parrot", "rabbit", "hamster", "goldfish"),
    "job": ("nurse", "teacher", "engineer", "student", "designer", "chef", "lawyer", "driver", "doctor", "farmer"),
    "goods": ("tools", "clothes", "books", "food", "gifts", "furniture"),
}
_KIND_CLAUSE = {"pet": "The pet is a {value}: {name} travels with a {value}.",
                "job": "{name} works as a {value}.",
                "goods": "{name} went to buy {value}: the {value} were for it."}


def protagonist(surface: str) -> str:
    """Who the surface story is about, as it names them: its first word, after an article or a number
    when it opens with one ("grace paid…" → "grace", "A man walks…" → "the man", "Two girls…" → "the girls")."""
    m = re.match(r"\s*(?:(a|an|the|two|three|four)\s+)?([A-Za-z][\w'-]*)", surface, re.IGNORECASE)
    if not m:
        return "the protagonist"
    return f"the {m.group(2).lower()}" if m.group(1) else m.group(2)


class TurtleExpert(Expert):
    gym = "turtle"

    def policy(self) -> Generator[Action, str, None]:
        request = self.view.request
        surface = request.split("Surface:", 1)[-1].split("\n")[0].strip()
        title = request.split("Title:", 1)[-1].split("\n")[0] if "Title:" in request else ""
        name = protagonist(surface)
        sw = words(surface) | words(title)
        pool = [Twist(t.question.format(name=name), t.explanation.format(name=name), t.cues, t.kind)
                for t in TWISTS + HUNCHES]
        cues = {t: len(shared(words(t.cues), sw)) for t in pool}
        for t in pool[:len(TWISTS)]:    # a classic puzzle is recognised by two of its marks, never by one
            cues[t] = cues[t] if cues[t] >= 2 else 0
        # the strongly suggested twists first (two cue words or more), then the rest
        tiers = [[t for t in pool if cues[t] >= 2], [t for t in pool if cues[t] == 1]]
        for tier in tiers:
            tier.sort(key=lambda t: -cues[t])
            if self.coin(0.5):
                self.explore.shuffle(tier)
        if self.coin(0.4) and len(tiers[0]) > 1:   # exploring: explain after the first half, then go on
            half = len(tiers[0]) // 2
            tiers = [tiers[0][:half], tiers[0][half:], tiers[1]]
        confirmed: list[str] = []
        pending: list[str] = []      # kinds of confirmed hunches, asked after the next explanation
        answered = 0
        for tier in tiers:
            for twist in tier:
                if self.turns_left <= 1:
                    break
                reply = yield ("action", twist.question)
                if _yes(reply):
                    confirmed.append(twist.explanation)
                    pending += [twist.kind] if twist.kind else []
            for ask_kinds in (False, True):
                while ask_kinds and pending:
                    kind = pending.pop(0)
                    for value in KINDS[kind]:    # which one? until the host says yes
                        if self.turns_left <= 1:
                            break
                        if _yes((yield ("action", f"Does the story involve a {value}?"))):
                            confirmed.append(_KIND_CLAUSE[kind].format(name=name, value=value))
                            break
                if len(confirmed) > answered and self.turns_left >= 1:
                    answered = len(confirmed)
                    obs = yield ("answer", f"What really happened: {surface} " + " ".join(confirmed))
                    if "captures the whole" in obs:
                        return
        if not answered:
            yield ("answer", f"What really happened: {surface}")


def _yes(reply: str) -> bool:
    return reply.strip().lower().startswith("yes")
