"""ABCD loading, behaviour-task rows (neutral share, balance, determinism) and the grounding check."""
from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from mimesis_lab.abcd import (
    AbcdRecord, base_subflow, build_kwargs, build_task_rows, check_grounding, find_infeasible,
    flow_guideline_leaves, load_abcd, load_guidelines, load_kb, policy_applies, scenario_key, task_row,
)
from mimesis_lab.behaviors import BEHAVIOR_CODES, TAXONOMY
from mimesis_lab.config import BehaviorTasksParams
from mimesis_lab.io import InputFileError, Quarantine

from .conftest import FIXTURES, ROOT, SHARED

KB = {
    "return_size": ["pull-up-account", "validate-purchase", "membership", "enter-details", "update-order"],
    "refund_status": ["pull-up-account", "validate-purchase", "notify-team", "update-order"],
    "recover_username": ["pull-up-account", "verify-identity"],
    "promo_code_invalid": ["pull-up-account", "ask-the-oracle", "membership", "promo-code"],
    "timing": ["search-faq", "search-timing", "select-faq"],
}
GUIDELINES = {
    "Product Defect": {"description": "refunds and returns", "subflows": {
        "Refund Status": {"instructions": ["Check the refund with the team."]},
        "Return Due to Size": {"instructions": ["Returns are only accepted within 90 days of purchase."]}}},
    "Account Access": {"subflows": {"Recover Username": {"instructions": ["The account username cannot be changed."]}}},
    "Purchase Dispute": {"subflows": {"Promo Code Invalid": {"instructions": ["Promo codes expire after 7 days."]}}},
    "Storewide Query": {"subflows": {"Timing FAQ": {"instructions": ["Answer questions about timing."]}}},
}
FLOWS = [("product_defect", "return_size"), ("account_access", "recover_username"),
         ("purchase_dispute", "promo_code_invalid"), ("product_defect", "refund_status"),
         ("storewide_query", "timing_3")]


def scenario(cid: int, flow="product_defect", subflow="return_size", level="bronze") -> dict:
    return {"personal": {"customer_name": f"cust {cid}", "email": f"c{cid}@email.com", "member_level": level,
                         "phone": "(555) 010-0101", "username": f"c{cid}"},
            "order": {"order_id": f"{cid:010d}", "zip_code": "12345", "payment_method": "credit card",
                      "num_products": "1", "street_address": "1 main st", "full_address": "1 main st  x, ny 12345"},
            "product": {"names": ["acme jeans"], "amounts": [40]}, "flow": flow, "subflow": subflow}


def record(cid: int, **kw) -> AbcdRecord:
    return AbcdRecord(cid, "train", cid, "abcd.json", scenario(cid, **kw), [("customer", "hi")])


def records(n: int) -> list[AbcdRecord]:
    return [record(i, flow=FLOWS[i % len(FLOWS)][0], subflow=FLOWS[i % len(FLOWS)][1]) for i in range(1, n + 1)]


P = BehaviorTasksParams()


# --------------------------------------------------------------------------- loading

def test_malformed_records_are_quarantined_with_json_path():
    q = Quarantine()
    recs, n = load_abcd(FIXTURES / "abcd" / "abcd_malformed.json", q)
    assert n == 8
    assert [(r.convo_id, r.split, r.row) for r in recs] == [(101, "train", 1), (201, "dev", 1)]
    expected = [
        (2, "schema: Object missing required field `scenario` - at `$.train[1]`"),
        (3, "schema: Expected `int`, got `str` - at `$.train[2].convo_id`"),
        (4, "schema: Invalid enum value 'bot' - at `$.train[3].original[1][0]`"),
        (5, "duplicate: convo_id 101 already read at `$.train[0]`"),
        (6, "schema: Expected `object`, got `str` - at `$.train[5]`"),
        (2, "schema: Expected `str` of length >= 1 - at `$.dev[1].scenario.flow`"),
    ]
    assert list(zip(q.row, q.reason)) == expected
    assert json.loads(q.raw[3])["convo_id"] == 101 and q.raw[4] == '"not a record"'
    assert all(s.endswith("abcd_malformed.json") for s in q.source_file)
    assert len(q) + len(recs) == n


def test_missing_field_in_scenario_is_quarantined(tmp_path):
    sc = scenario(1)
    del sc["product"]
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"convo_id": 1, "scenario": sc, "original": [["customer", "hi"]]}]))
    q = Quarantine()
    recs, n = load_abcd(path, q)
    assert (recs, n) == ([], 1)
    assert q.reason == ["schema: Object missing required field `product` - at `$[0].scenario`"]


def test_plain_list_is_split_all(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"convo_id": 7, "scenario": scenario(7), "original": [["agent", "hi"]]}]))
    recs, n = load_abcd(path, Quarantine())
    assert n == 1 and recs[0].split == "all" and recs[0].row == 1


def test_not_json_is_a_file_error_naming_the_file():
    with pytest.raises(InputFileError, match="abcd_not_json.json"):
        load_abcd(FIXTURES / "abcd" / "abcd_not_json.json", Quarantine())


@pytest.mark.parametrize("doc", ['"text"', "42", '{"train": {"a": 1}}', '{"validation": []}', "{}"])
def test_wrong_document_shape_is_a_file_error(tmp_path, doc):
    path = tmp_path / "weird.json"
    path.write_text(doc)
    with pytest.raises(InputFileError, match="weird.json"):
        load_abcd(path, Quarantine())


def test_kb_and_guidelines_shapes(tmp_path):
    (tmp_path / "kb.json").write_text('{"a": "not a list"}')
    (tmp_path / "g.json").write_text("[]")
    with pytest.raises(InputFileError, match="kb.json"):
        load_kb(tmp_path / "kb.json")
    with pytest.raises(InputFileError, match="g.json"):
        load_guidelines(tmp_path / "g.json")


ABCD_REF = SHARED / "reference-data" / "abcd"


@pytest.mark.skipif(not (ABCD_REF / "sample.json").is_file(), reason="shared ABCD reference data absent")
def test_real_abcd_sample_kb_and_guidelines_load():
    q = Quarantine()
    recs, n = load_abcd(ABCD_REF / "sample.json", q)
    assert n == len(recs) > 0 and len(q) == 0
    kb, g = load_kb(ABCD_REF / "kb.json"), load_guidelines(ABCD_REF / "guidelines.json")
    assert all(base_subflow(r.scenario["subflow"]) in kb for r in recs)
    ret = next(r for r in recs if r.scenario["subflow"] == "return_size")
    kw = find_infeasible(ret.scenario, g)  # real ABCD: bronze members may return within 90 days
    assert kw and "90 days" in kw["policy"] and "Size" in kw["policy_source"]
    rows = build_task_rows(recs, kb, g, P)
    assert len(rows) == len(recs)
    for r, row in zip(recs, rows):
        for b in BEHAVIOR_CODES:
            kwargs = build_kwargs(b, r, kb, g, P)
            if kwargs is not None:
                assert check_grounding(task_row(r, b, kwargs, P), kb, g) is None, (r.convo_id, b, kwargs)


# --------------------------------------------------------------------------- task rows

def test_row_fields():
    rec = record(42)
    row = task_row(rec, "B5", {"withheld_field": "order_id", "withheld_value": "0000000042"}, P)
    assert row["task_id"] == "42-B5" and row["conversation_id"] == "42" and row["user_id"] == "c42"
    assert re.fullmatch(r"[0-9a-f]{16}", row["scenario_key"]) and row["scenario_key"] == scenario_key(rec.scenario)
    assert json.loads(row["scenario"]) == rec.scenario and json.loads(row["behavior_ids"]) == ["B5"]
    assert row["needs_trace"] is True and row["turn_budget"] == 8 and row["data_source"] == "usersim_behavior"
    assert (row["flow"], row["subflow"], row["abcd_split"]) == ("product_defect", "return_size", "train")
    n = task_row(rec, "N", {}, P)
    assert n["task_id"] == "42-N" and n["behavior_ids"] == "[]" and n["kwargs"] == "{}" and n["needs_trace"] is False
    # scenario key is canonical: key order does not matter
    assert scenario_key(dict(reversed(list(rec.scenario.items())))) == row["scenario_key"]


def test_user_id_falls_back_to_customer_name():
    rec = record(1)
    del rec.scenario["personal"]["username"]
    assert task_row(rec, "N", {}, P)["user_id"] == "name:cust 1"


def behaviours(rows):
    return [r["task_id"].split("-")[1] for r in rows]


@pytest.mark.parametrize("n", [1, 14, 30, 61])
def test_neutral_share_and_balance(n):
    rows = build_task_rows(records(n), KB, GUIDELINES, P)
    counts = Counter(behaviours(rows))
    assert counts["N"] == round(n / 3)
    per_b = [counts.get(b, 0) for b in BEHAVIOR_CODES]
    assert max(per_b) - min(per_b) <= 1 and sum(per_b) == n - round(n / 3)
    assert all(json.loads(r["behavior_ids"]) == ([] if b == "N" else [b]) for r, b in zip(rows, behaviours(rows)))


def test_neutral_share_param():
    p = BehaviorTasksParams(neutral_share=0.5, seed=7)
    rows = build_task_rows(records(40), KB, GUIDELINES, p)
    assert Counter(behaviours(rows))["N"] == 20


def test_assignment_is_seeded_and_deterministic():
    recs = records(39)
    a1 = build_task_rows(recs, KB, GUIDELINES, P)
    assert build_task_rows(recs, KB, GUIDELINES, P) == a1
    assert build_task_rows(list(reversed(recs)), KB, GUIDELINES, P) == list(reversed(a1))  # order-independent
    other = build_task_rows(recs, KB, GUIDELINES, BehaviorTasksParams(seed=99))
    assert behaviours(other) != behaviours(a1)


def test_builder_grounds_rows_and_swaps_b4_onto_scenarios_with_a_policy():
    recs = records(60)
    rows = build_task_rows(recs, KB, GUIDELINES, P)
    failures = [(r["task_id"], check_grounding(r, KB, GUIDELINES)) for r in rows]
    assert [f for f in failures if f[1]] == []
    b4 = [(r, json.loads(row["kwargs"])) for r, row in zip(recs, rows) if row["task_id"].endswith("-B4")]
    assert b4 and all(r.scenario["flow"] in ("product_defect", "account_access", "purchase_dispute") for r, _ in b4)
    for r, kw in b4:
        assert kw["policy"] in json.dumps(GUIDELINES)


def test_kwargs_examples():
    rec = record(5)
    kw4 = build_kwargs("B4", rec, KB, GUIDELINES, P)
    assert kw4["policy"] == "Returns are only accepted within 90 days of purchase."
    assert "150 days" in kw4["infeasible_request"] and "Return Due to Size" in kw4["policy_source"]
    promo = build_kwargs("B4", record(6, flow="purchase_dispute", subflow="promo_code_invalid"), KB, GUIDELINES, P)
    assert promo["policy"] == "Promo codes expire after 7 days." and "30 days" in promo["infeasible_request"]
    user = build_kwargs("B4", record(7, flow="account_access", subflow="recover_username"), KB, GUIDELINES, P)
    assert "username" in user["infeasible_request"].lower()
    assert build_kwargs("B4", record(8, flow="storewide_query", subflow="timing_1"), KB, GUIDELINES, P) is None
    kw5 = build_kwargs("B5", rec, KB, GUIDELINES, P)
    assert kw5["withheld_field"] in ("username", "email", "order_id", "member_level", "full_address")
    kw8 = build_kwargs("B8", rec, KB, GUIDELINES, P)
    assert kw8["false_value"] != kw8["true_value"]
    kw6 = build_kwargs("B6", rec, KB, GUIDELINES, P)
    assert kw6["second_subflow"] in KB and kw6["second_subflow"] != "return_size"
    assert base_subflow("timing_4") == "timing"


def test_infeasible_policy_for_other_member_levels_is_not_used():
    g = {"Product Defect": {"subflows": {"Return Due to Size": {"actions": [
        "Gold members: > Unlimited returns", "Bronze members: > return possible within the last 90 days"]}}}}
    assert find_infeasible(scenario(1, level="gold"), g) is None
    assert find_infeasible(scenario(1, level="bronze"), g)["policy"] == "return possible within the last 90 days"


@pytest.mark.parametrize("sentence,leaf,binds", [
    ("Returns are only accepted within 90 days of purchase for non-gold members (silver, bronze and guest)", None,
     {"silver", "bronze", "guest"}),
    ("Policy: 90-day return window for everyone except gold members.", None, {"silver", "bronze", "guest"}),
    ("Policy: only gold and silver members can have fees waived.", None, {"bronze", "guest"}),
    ("Unexpected fees can be waived only for gold and silver members", None, {"bronze", "guest"}),
    ("Do not promise a username change, not even for gold members.", None, {"gold", "silver", "bronze", "guest"}),
    ("returns within 90 days, standard fees apply", "Bronze and guest: returns within 90 days, standard fees apply",
     {"bronze", "guest"}),
    ("return possible within the last 90 days", "Bronze members: > return possible within the last 90 days",
     {"bronze"}),
    ("Bronze and Guest members cannot get an extension", None, {"bronze", "guest"}),
    ("The account username cannot be changed.", None, {"gold", "silver", "bronze", "guest"}),
])
def test_policy_member_level_applicability(sentence, leaf, binds):
    got = {lv for lv in ("gold", "silver", "bronze", "guest") if policy_applies(sentence, leaf or sentence, lv)}
    assert got == binds
    assert policy_applies(sentence, leaf or sentence, "") == (len(binds) == 4)  # unknown level: only universal rules


def test_policy_lines_first_and_only_the_own_subflow():
    g = {"Order Issue": {"subflows": {
        "Manage Cancel": {"actions": ["Never reveal account information before verification succeeds"],
                          "instructions": ["Policy: orders that have already shipped cannot be cancelled."]},
        "Status Delivery Time": {"instructions": ["Policy: free next-day upgrades are only given to orders that are "
                                                  "past the 7 business day delivery window."]}}}}
    kw = find_infeasible(scenario(1, flow="order_issue", subflow="manage_cancel"), g)
    assert kw["policy"].startswith("Policy: orders that have already shipped") and "Cancel my order" in \
        kw["infeasible_request"]
    assert find_infeasible(scenario(1, flow="order_issue", subflow="status_quantity"), g) is not None  # no match: flow
    g2 = {"Order Issue": {"subflows": {"Manage Cancel": {"instructions": ["Cancel orders."]},
                                       "Status Delivery Time": g["Order Issue"]["subflows"]["Status Delivery Time"]}}}
    assert find_infeasible(scenario(1, flow="order_issue", subflow="manage_cancel"), g2) is None


def test_guideline_leaves_prefer_the_matching_subflow():
    leaves = flow_guideline_leaves(GUIDELINES, "product_defect", "return_size")
    assert leaves[0][0].endswith("Return Due to Size/instructions")
    assert flow_guideline_leaves(GUIDELINES, "no_such_flow") == []


# --------------------------------------------------------------------------- grounding failures

def grounded(b: str, rec: AbcdRecord | None = None, **changes) -> str | None:
    rec = rec or record(5)
    kw = build_kwargs(b, rec, KB, GUIDELINES, P)
    assert kw is not None
    kw.update(changes)
    return check_grounding(task_row(rec, b, kw, P), KB, GUIDELINES)


def test_grounding_passes_for_built_rows():
    assert all(grounded(b) is None for b in BEHAVIOR_CODES)
    assert check_grounding(task_row(record(5), "N", {}, P), KB, GUIDELINES) is None


def test_withheld_field_not_in_scenario():
    assert "not in the scenario" in grounded("B5", withheld_field="account_pin", withheld_value="1234")
    assert "not in the scenario" in grounded("B3", withheld_field="")
    assert "is not the scenario's" in grounded("B3", withheld_field="order_id", withheld_value="999")


def test_infeasible_request_without_conflicting_policy():
    # a policy sentence that is not in this flow's guidelines
    assert "not in the guidelines" in grounded("B4", policy="Refunds are never allowed.")
    # the sentence exists but the request does not touch it
    assert "does not touch" in grounded("B4", infeasible_request="Change my phone number to a new one.")
    # the request is within the policy's limit
    assert "within the policy's 90-day limit" in grounded(
        "B4", infeasible_request="Accept a return of my jeans: I bought it 30 days ago.")
    # a non-restrictive sentence of the flow (and the builder finds no policy for this subflow)
    rec = record(9, subflow="refund_status")
    assert build_kwargs("B4", rec, KB, GUIDELINES, P) is None
    row = task_row(rec, "B4", {"infeasible_request": "Check the refund with the team right now.",
                               "policy": "Check the refund with the team.", "policy_source": "x"}, P)
    assert "no restriction" in check_grounding(row, KB, GUIDELINES)
    # a flow with no policy at all
    rec = record(8, flow="storewide_query", subflow="timing_1")
    row = task_row(rec, "B4", {"infeasible_request": "Give me free shipping forever.",
                               "policy": "Returns are only accepted within 90 days of purchase.",
                               "policy_source": "x"}, P)
    assert "not in the guidelines of flow 'storewide_query'" in check_grounding(row, KB, GUIDELINES)


def test_false_premise_that_is_true():
    rec = record(5)
    reason = grounded("B8", rec, premise_field="member_level", true_value="bronze", false_value="bronze",
                      false_premise="I'm a bronze member.")
    assert "does not contradict" in reason
    assert "is not the scenario's" in grounded("B8", rec, premise_field="member_level", true_value="gold",
                                               false_value="silver", false_premise="I'm a silver member.")


def test_unknown_or_same_second_subflow():
    assert "not a kb subflow" in grounded("B6", second_subflow="teleport_order")
    assert "is the current subflow" in grounded("B6", second_subflow="return_size")


def test_other_grounding_failures():
    assert "does not contradict" in grounded("B11", contradicted_field="order_id", original_value="0000000005",
                                             contradicting_value="0000000005")
    assert "not kb actions" in grounded("B7", ruled_out_actions=["promo-code"])
    assert "at least 3" in grounded("B12", requests=["a", "b"])
    row = task_row(record(5), "B9", {}, P)
    assert "miss ['pressure']" in check_grounding(row, KB, GUIDELINES)
    bad = dict(task_row(record(5), "N", {}, P), behavior_ids='["B99"]')
    assert "behavior_ids" in check_grounding(bad, KB, GUIDELINES)
    assert "neutral row" in check_grounding(dict(task_row(record(5), "N", {}, P), kwargs='{"a": 1}'), KB, GUIDELINES)


# --------------------------------------------------------------------------- bundled fixtures

RAW = ROOT / "data" / "raw" / "abcd"


@pytest.mark.skipif(not (RAW / "abcd_v1.1.json").is_file(), reason="bundled ABCD fixtures not written yet")
def test_bundled_fixtures_ground_most_rows():
    q = Quarantine()
    recs, n = load_abcd(RAW / "abcd_v1.1.json", q)
    kb, g = load_kb(RAW / "kb.json"), load_guidelines(RAW / "guidelines.json")
    assert len(q) == 0 and n == len(recs)
    rows = build_task_rows(recs, kb, g, P)
    failed = [(r["task_id"], check_grounding(r, kb, g)) for r in rows if check_grounding(r, kb, g)]
    assert len(failed) <= 0.1 * len(rows), failed
    b4 = [json.loads(r["kwargs"]) for r in rows if r["task_id"].endswith("-B4")]
    assert b4 and all(kw["policy"] and kw["infeasible_request"] for kw in b4)
    assert set(TAXONOMY) - {"N"} <= {r["task_id"].split("-")[1] for r in rows}


# --------------------------------------------------------------------------- as released; kb coverage

import gzip  # noqa: E402
from pathlib import Path  # noqa: E402

from mimesis_lab.abcd import kb_reason  # noqa: E402
from mimesis_lab.judges.abcd_agent import ABCDSupportAgent  # noqa: E402
from stages.behavior_tasks import playable  # noqa: E402

#: the shared reference data, relative to the repo (../shared/reference-data)
REF = ROOT.parent / "shared" / "reference-data" / "abcd"
needs_ref = pytest.mark.skipif(not (REF / "sample.json").is_file(), reason="shared ABCD reference data absent")


def test_json_gz_reads_like_json(tmp_path):
    doc = {"train": [{"convo_id": 1, "scenario": scenario(1), "original": [["customer", "hi"]]}]}
    (tmp_path / "abcd_v1.1.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    (tmp_path / "abcd.json").write_text(json.dumps(doc))
    a, b = load_abcd(tmp_path / "abcd_v1.1.json.gz", Quarantine()), load_abcd(tmp_path / "abcd.json", Quarantine())
    assert a[1] == b[1] == 1 and a[0][0].scenario == b[0][0].scenario
    (tmp_path / "broken.json.gz").write_bytes(gzip.compress(b'{"train": [')[:-6])
    with pytest.raises(InputFileError, match=r"broken.json.gz: not a valid gzip file"):
        load_abcd(tmp_path / "broken.json.gz", Quarantine())


def test_subflow_absent_from_kb_is_quarantined_not_a_keyerror():
    kb = {k: v for k, v in KB.items() if k != "refund_status"}
    recs = [record(1), record(2, subflow="refund_status"), record(3, flow="storewide_query", subflow="timing_3")]
    q = Quarantine()
    kept, rejected = playable(recs, kb, GUIDELINES, q)
    assert [r.convo_id for r in kept] == [1, 3] and rejected == {"unknown subflow": 1}
    assert q.row == [2] and q.reason[0].startswith("unknown subflow: scenario subflow 'refund_status'")
    assert json.loads(q.raw[0])["convo_id"] == 2
    assert kb_reason(recs[2], kb) is None                      # timing_3 -> timing
    with pytest.raises(KeyError):                               # what the stage now keeps from the agent
        ABCDSupportAgent(recs[1].scenario, kb, GUIDELINES, "product_defect", "refund_status")


def _bundled_abcd_kb_cover(abcd: Path, kb: Path) -> None:
    q = Quarantine()
    recs, n = load_abcd(abcd, q)
    kb_ = load_kb(kb)
    assert n > 0 and len(q) == 0
    assert [r.convo_id for r in recs if kb_reason(r, kb_)] == []


def test_bundled_kb_covers_every_bundled_subflow(tmp_path):
    """data/raw/abcd and the world's manual (what `world` writes to data/world/abcd): every scenario's
    subflow is a kb subflow."""
    from mimesis_lab.world import support
    from mimesis_lab.world.abcd_manual import FLOW_OF, KB as WORLD_KB

    _bundled_abcd_kb_cover(ROOT / "data/raw/abcd/abcd_v1.1.json", ROOT / "data/raw/abcd/kb.json")
    assert set(FLOW_OF) <= set(WORLD_KB) and set(support.SUBFLOWS) <= set(WORLD_KB)


@needs_ref
@pytest.mark.parametrize("kb_dir", ["reference", "bundled"])
def test_real_abcd_sample_runs_or_is_quarantined(tmp_path, kb_dir):
    """The real sample (as released: gzip) with the real kb: every conversation plays to the end with the
    scripted agent fed the customer's real turns; with our bundled kb (22 subflows) the two whose
    subflow it lacks are quarantined with the reason, never a KeyError."""
    gz = tmp_path / "abcd_v1.1.json.gz"
    gz.write_bytes(gzip.compress((REF / "sample.json").read_bytes()))
    base = REF if kb_dir == "reference" else ROOT / "data/raw/abcd"
    kb, g = load_kb(base / "kb.json"), load_guidelines(base / "guidelines.json")
    q = Quarantine()
    recs, n = load_abcd(gz, q)
    kept, rejected = playable(recs, kb, g, q)
    assert n == 3 and len(kept) + len(q) == n
    if kb_dir == "reference":
        assert len(kept) == 3 and not rejected
    else:
        assert sorted(r.scenario["subflow"] for r in kept) == ["return_size"]
        assert rejected == {"unknown subflow": 2} and all(r.startswith("unknown subflow:") for r in q.reason)
        assert {json.loads(raw)["scenario"]["subflow"] for raw in q.raw} == {"refund_status", "timing_4"}
    for r in kept:
        agent = ABCDSupportAgent(r.scenario, kb, g, r.scenario["flow"], r.scenario["subflow"])
        agent.opening()
        for speaker, text in r.original:
            if speaker == "customer":
                assert agent.reply(text)
        if kb_dir == "reference":
            assert agent.finished and agent.actions_done == kb[base_subflow(r.scenario["subflow"])]
