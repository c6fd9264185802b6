"""A seeded synthetic world: one population of users from which every raw dataset is drawn.

README
======

What it is
----------
``python -m mimesis_lab.world --out DIR --seed 1234`` (or :func:`generate_world`) writes, in the
exact formats the existing stages read, the raw inputs of the whole pipeline:

=================================================  ===========================================
``chats/{wildchat_travel,wildchat_shopping,         WildChat-1M style chats (mid-training; the
wildchat_games,tom_social}.jsonl``                  last is a no-swap theory-of-mind source)
``thoughttrace/thoughttrace.jsonl``                 ThoughtTrace (survey, task, reasons, reactions)
``abcd/abcd_v1.1.json``, ``kb.json``,               ABCD v1.1 scenarios + manual (12 subflows)
``guidelines.json``
``gyms/<gym>/tasks.json`` (+ ``tau/db.json``,       the eight gyms' task files
``search/passages.jsonl``)
``world/manifest.json``, ``population.jsonl``,      provenance and the latent truth (no stage reads
``thoughttrace_meta.jsonl``                         these; tests and analyses do)
=================================================  ===========================================

Why
---
The hand-written fixtures have no structure a tiny model can learn (issue 15). The world does:

1. **One population** (:mod:`.population`): each user has latent, consistent traits — hotel
   price ceiling, area and amenity, cuisine, companions, pet, favourite animal/food/city, colour,
   opinions with reasons, member level, payment method; a writing style (casing, politeness,
   punctuation, verbosity, greeting, abbreviations); patience and openness; propensities for the
   behaviours B1–B13. Chats, ThoughtTrace, ABCD and every gym task with a user side are drawn from
   the same users (one id, ``user0042``, is the WildChat ``hashed_ip``, the ThoughtTrace user and
   the ABCD username, so the splits stage keeps a user in one split across datasets).
2. **Learnable** (:mod:`.style`, :mod:`.lexicon`): a closed vocabulary and a templated-but-varied
   grammar; the user's reply depends on what the assistant asked, style persists within a user.
   With the default seed ≥ 99% of validation BPE tokens occur in training.
3. **Public context predicts hidden preferences**: the trip purpose in a travel request predicts
   the hotel area and amenity; a food lover's cuisine predicts their favourite food.
4. **Reasoning carries what the reply withholds**: "i want it under $80 but i won't say it yet" →
   "something cheap-ish"; a follow-up question gets the number. The coach has something to teach.
5. **Behaviours are enacted part of the time**: ThoughtTrace support chats are conditioned (in the
   expectation, with the behaviour task's own instruction text and grounded kwargs) on a behaviour
   or neutral, and enact it with probability ``enact_rate`` against the project's scripted ABCD
   agent; the project's rule judge scores ~60% of them as exhibiting it.
6. **Short**: reasons ~3–15 words, messages ~1–20 words, 2–6 user turns.
7. **Gym tasks from the same users**, in the loaders' formats, playable by the oracles and by the
   world's own user policy (:mod:`.users`).

:mod:`.measure` measures these properties on the written files; ``tests/test_world.py`` asserts them.

It is synthetic
---------------
Everything here is invented by templates: it demonstrates the *mechanism* of MIMESIS (a simulator
learns how these users talk, think and behave; agents trained against it meet the same users), not
the paper's effect sizes. Numbers measured on it say nothing about real users.
"""
from typing import Any

from mimesis_lab.world.params import WorldParams

__all__ = ["WorldParams", "generate_world"]


def generate_world(params: WorldParams, out_dir: Any) -> dict[str, int]:
    """Draw the world of ``params.seed`` and write it under ``out_dir`` (:func:`mimesis_lab.world.generate.generate_world`).

    Imported on call, so that reading the ``world`` params section (``mimesis_lab.config``) does not load
    the generators (and, through them, the scripted support agent) into every stage."""
    from mimesis_lab.world.generate import generate_world as _generate

    return _generate(params, out_dir)
