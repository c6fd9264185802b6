"""CSD leak validator: private facts of every bundled gym task, and note matching (phrases, plurals,
numbers as numbers, the 60 % rule for long facts, formulas)."""
from __future__ import annotations

import pytest

from mimesis_lab.envs.gyms.registry import ALL_GYMS, load_tasks
from mimesis_lab.judges.leak import LeakValidator, find_leaks, private_facts, tokens

TASKS = {g: load_tasks(g) for g in ALL_GYMS}
GENERIC = "Ask about their preferences (budget, location, amenities, dates) before searching or answering."


@pytest.mark.parametrize("gym", ALL_GYMS)
def test_every_bundled_task_has_private_facts_and_generic_note_is_clean(gym):
    for tid, task in TASKS[gym].items():
        facts = private_facts(gym, task)
        assert facts, f"{gym}/{tid}: no private facts"
        assert all(isinstance(f, str) and f.strip() for f in facts)
        assert find_leaks(GENERIC, facts) == [], f"{gym}/{tid}"
        assert private_facts(f"interact_{gym}", task) == facts


def test_unknown_gym():
    with pytest.raises(ValueError, match="no private-fact rule"):
        private_facts("chess", {})


def test_travel_hidden_preferences_budget_and_best_option():
    task = TASKS["travel"]["travel-1"]
    facts = private_facts("travel", task)
    best = next(o for o in task["options"] if o["id"] == task["best_id"])
    assert best["name"] in facts and task["best_id"] in facts
    assert "budget" not in facts   # a category word alone is never a fact
    v = LeakValidator(facts)
    assert v.check("Note: the user wants somewhere close to the beach.")
    assert v.check("Their budget is $150 a night.") and "150" in v.check("Keep it under 150.0 per night.")
    assert v.check(f"Recommend {best['name']}.") and v.check(f"Pick {task['best_id']} now.")
    assert v.check("They are travelling with their dogs.")   # plural of keyword 'dog'
    assert v.check(GENERIC) == []
    assert v.check("Ask whether price matters and answer their question first.") == []
    assert v.check("Costs 1500 euros.") == []   # 150 does not match 1500


def test_travel_stated_preferences_are_public():
    task = {"request": "I need a hotel with a pool.", "best_id": "X1",
            "options": [{"id": "X1", "name": "Blue Inn", "tags": ["pool"]}],
            "preferences": [{"text": "Has a pool", "keywords": ["pool"], "check": {"tag": "pool"}, "stated": True},
                            {"text": "Quiet street", "keywords": ["quiet", "pool"], "check": {"tag": "quiet"}}]}
    facts = private_facts("travel", task)
    assert "Has a pool" not in facts and "pool" not in facts   # stated, or already in the public request
    assert {"Quiet street", "quiet", "X1", "Blue Inn"} <= set(facts)


def test_turtle_distinctive_solution_words():
    task = TASKS["turtle"]["turtle-1"]
    facts = private_facts("turtle", task)
    assert "hiccups" in facts and "bartender" not in facts and "gun" not in facts   # surface words are public
    v = LeakValidator(facts)
    assert v.check("Maybe he had a hiccup.")
    assert v.check("Ask whether the bartender and the gun matter.") == []


def test_telepathy_search_function_persuade_intention_tau():
    tele = TASKS["telepathy"]["tele-1"]
    assert find_leaks(f"It is the {tele['entity']}!", private_facts("telepathy", tele))
    s = TASKS["search"]["search-001"]
    assert s["answer"] in find_leaks(f"The answer is {s['answer']}.", private_facts("search", s))
    f = TASKS["function"]["fgym-1"]
    ff = private_facts("function", f)
    assert find_leaks("the rule is a+b*c - d", ff) and find_leaks("the result is 9.0", ff)
    assert find_leaks("ask for the test case", ff) == []
    p = TASKS["persuade"]["persuade-001"]
    pf = private_facts("persuade", p)
    assert find_leaks("They think free transit means higher local taxes someone must pay.", pf)   # 60 % rule
    assert find_leaks("Address their concerns about cost.", pf) == []
    it = TASKS["intention"]["intent-001"]
    itf = private_facts("intention", it)
    assert find_leaks("They want to go to the mountains by train.", itf)
    assert find_leaks("Budget is under $300.", itf) and find_leaks("Ask who travels with them.", itf) == []
    tau = TASKS["tau"]["tau-001"]
    assert find_leaks("They no longer needed it.", private_facts("tau", tau))


def test_number_normalisation():
    assert tokens("$150, 150.0 and 1,000 or 2.50") == ["150", "150", "and", "1000", "or", "2.5"]
    for note in ("$150", "150", "150.0", "costs 150.00 total"):
        assert find_leaks(note, ["150"]) == ["150"], note
    assert find_leaks("1500 or 15", ["150"]) == []
    assert find_leaks("about 2.5 stars", ["2.50"]) == ["2.50"]


def test_plural_tolerance_and_whole_words():
    assert find_leaks("two beaches nearby", ["beach"]) == ["beach"]
    assert find_leaks("a dog", ["dogs"]) == ["dogs"]
    assert find_leaks("bus passes", ["bus pass"]) == ["bus pass"]
    assert find_leaks("the beachfront", ["beach"]) == []   # whole words only
    assert find_leaks("the PET FRIENDLY one", ["pet friendly"]) == ["pet friendly"]
    assert find_leaks("friendly pets", ["pet friendly"]) == []   # phrase order matters for short facts


def test_long_fact_sixty_percent_rule():
    fact = "Junior staff learn by overhearing experienced colleagues"   # 6 content words
    assert find_leaks("colleagues who are experienced help junior staff", [fact]) == [fact]   # 4/6
    assert find_leaks("junior colleagues", [fact]) == []   # 2/6


def test_validator_drops_generic_facts():
    v = LeakValidator(["budget", "the", "preferences", "ok", "Casa Azul"])
    assert v.facts == ["Casa Azul"]
    assert v.check("Ask about their preferences and budget.") == []
    assert v.check("casa azul") == ["Casa Azul"]


def test_short_core_facts_and_tau_identity():
    gold = TASKS["search"]["search-011"]
    assert gold["answer"] in private_facts("search", gold)
    assert find_leaks("The symbol is Au.", private_facts("search", gold)) == [gold["answer"]]
    assert find_leaks("Ask about their preferences.", private_facts("search", gold)) == []
    tau = TASKS["tau"]["tau-011"]
    facts = private_facts("tau", tau)
    assert tau["user_id"] in facts and any(f.startswith("#W") for f in facts)
    assert find_leaks("Their order is #W1006.", facts) and find_leaks("Ask for the order id.", facts) == []
