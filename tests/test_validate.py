"""The `validate` stage: valid tiny outputs pass every suite; each broken case fails loudly."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import polars as pl
import pytest

from mimesis_lab import expectations as X
from stages import validate

PARAMS = """
role_swap:
  mixture: {"data/raw/wildchat/*.jsonl": 1.0, "data/raw/tom/*.jsonl": 2.0}
  no_swap_sources: [tom]
tracking: {enabled: false}
"""

MSG = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
TURN = pl.List(pl.Struct({"role": pl.String, "content": pl.String,
                          "reasons": pl.List(pl.String), "reactions": pl.List(pl.String)}))


def m(*pairs: tuple[str, str]) -> list[dict]:
    return [{"role": r, "content": c} for r, c in pairs]


def role_swap() -> pl.DataFrame:
    return pl.DataFrame({
        "conversation_id": ["h1", "h2"], "user_id": ["ip1", "ip2"], "source": ["wildchat_general", "tom"],
        "source_file": ["data/raw/wildchat/wildchat_general.jsonl", "data/raw/tom/tom.jsonl"], "row": [1, 1],
        "swap": [True, False], "copies": [1, 2],
        "messages": [m(("system", "be a user"), ("assistant", "hi"), ("user", "hello"), ("assistant", "bye")),
                     m(("assistant", "q"), ("user", "a"))],
        "n_messages": [4, 2], "n_target_turns": [2, 1], "model": ["gpt-4", None], "language": ["English", None],
    }, schema_overrides={"messages": MSG, "model": pl.String, "language": pl.String})


def thoughttrace() -> pl.DataFrame:
    def turns(n: int) -> list[dict]:
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"t{i}",
                 "reasons": ["why"] if i % 2 == 0 else [], "reactions": []} for i in range(n)]
    return pl.DataFrame({
        "conversation_id": ["user1_task1_conversation1", "user2_task3_conversation1"],
        "user_id": ["user1", "user2"], "task_id": ["task1", "task3"], "model_name": ["gpt-4o", None],
        "source_file": ["data/raw/thoughttrace/thoughttrace.jsonl"] * 2, "row": [1, 2],
        "system_prompt": ["You are a user…", "You are a user…"],
        "messages": [m(("system", "p"), ("assistant", "<think>why</think>t0"), ("user", "t1"),
                       ("assistant", "<think>why\nnot</think>t2")),
                     m(("system", "p"), ("assistant", "<think></think>t0"), ("user", "t1"))],
        "turns": [turns(3), turns(2)],
        "n_messages": [4, 3], "n_target_turns": [2, 1], "n_turns_without_reasons": [0, 1],
        "include_reactions": [False, False],
    }, schema_overrides={"messages": MSG, "turns": TURN, "model_name": pl.String})


def annotations() -> pl.DataFrame:
    return pl.DataFrame({
        "conversation_id": ["user1_task1_conversation1", "user2_task3_conversation1"],
        "user_id": ["user1", "user2"], "behavior": ["B3", "N"], "turns": [[0, 2], []],
        "quote": ["t0", None], "severity": [2, 1], "rationale": ["cue", None], "annotator": ["rule", "rule"],
    }, schema_overrides={"turns": pl.List(pl.Int64), "quote": pl.String, "rationale": pl.String})


def frequencies() -> pl.DataFrame:
    return pl.DataFrame({"behavior": ["B3", "N"], "name": ["terse", "neutral"], "count": [1, 1],
                         "share": [0.5, 0.5]})


def tasks() -> pl.DataFrame:
    return pl.DataFrame({
        "task_id": ["abcd-1", "abcd-2"], "conversation_id": ["1001", "1002"], "user_id": ["cust1", "cust2"],
        "scenario_key": ["s1", "s2"], "scenario": ['{"flow": "a"}', '{"flow": "b"}'],
        "behavior_ids": ['["B1", "B4"]', "[]"], "kwargs": ['{"x": 1}', "{}"], "flow": ["a", "b"],
        "subflow": ["a1", "b1"], "turn_budget": [8, 8], "data_source": ["usersim_behavior"] * 2,
        "needs_trace": [False, True], "abcd_split": ["train", "dev"],
    })


TRAIN_GYMS = ("travel", "turtle", "function", "tau", "persuade")
HELD_OUT = ("intention", "telepathy", "search")


def gym_rows(split: str) -> pl.DataFrame:
    """One UserRL row per gym allowed in ``split`` (task ids differ per split)."""
    gyms = HELD_OUT if split == "test" else TRAIN_GYMS
    rows = []
    for i, g in enumerate(gyms):
        tid = f"{g}-{split}-1"
        rows.append({
            "data_source": f"interact_{g}", "gym": g, "task_id": tid, "split": split,
            "prompt": m(("system", "you are an agent"), ("user", "help me")), "ability": "interaction",
            "reward_model": json.dumps({"env_name": g, "ground_truth": "x", "id": tid, "style": "rule"}),
            "extra_info": json.dumps({"split": split, "index": i, "need_tools_kwargs": True, "tools_kwargs": {
                "interact_with_env": {"create_kwargs": {"env_name": g, "id": tid}}}}),
        })
    return pl.DataFrame(rows, schema_overrides={"prompt": MSG})


QUARANTINE = pl.DataFrame({"source_file": ["data/raw/wildchat/wildchat_general.jsonl"], "row": [2],
                           "reason": ["malformed JSON: line 2"], "raw": ["{oops"]})


def write_project(root: Path, edit: Callable[[dict], None] | None = None) -> None:
    """Write a tiny consistent set of outputs (``edit`` may break one before writing)."""
    files: dict[str, pl.DataFrame | dict] = {
        "data/processed/role_swap.parquet": role_swap(),
        "data/processed/thoughttrace.parquet": thoughttrace(),
        "data/processed/behavior_annotations.parquet": annotations(),
        "data/processed/behavior_frequencies.parquet": frequencies(),
        "data/processed/behavior_tasks.parquet": tasks(),
    }
    for name, df in (("role_swap", role_swap()), ("thoughttrace", thoughttrace()), ("behavior_tasks", tasks())):
        for split, idx in (("train", [0]), ("val", []), ("test", [1])):
            files[f"data/splits/{name}/{split}.parquet"] = df[idx].with_columns(pl.lit(split).alias("split"))
    for split in ("train", "val", "test"):
        files[f"data/gyms/{split}.parquet"] = gym_rows(split)
    for stage in validate.DATA_STAGES:
        q = QUARANTINE if stage == "role_swap" else QUARANTINE.clear()
        files[f"data/quarantine/{stage}.parquet"] = q
        rows_out = {"role_swap": 2, "thoughttrace": 2, "behaviors": 2, "behavior_tasks": 2, "splits": 6,
                    "gyms": 13}[stage]
        files[f"metrics/{stage}.json"] = {"rows_in": rows_out + q.height, "rows_out": rows_out,
                                          "rows_quarantined": q.height,
                                          "quarantine_by_reason": {"malformed JSON": 1} if q.height else {}}
    files["metrics/gyms.json"]["leaked_task_keys"] = 0
    if edit:
        edit(files)
    (root / "params.yaml").write_text(PARAMS)
    for rel, obj in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(obj, pl.DataFrame):
            obj.write_parquet(path)
        else:
            path.write_text(json.dumps(obj))


@pytest.fixture(scope="module")
def runner() -> validate.Runner:
    return validate.get_runner()  # one great-expectations context for the whole module


def run(root: Path, monkeypatch, capsys, runner, edit=None, suites: tuple[str, ...] = ()) -> tuple[int, dict, str]:
    write_project(root, edit)
    monkeypatch.chdir(root)
    rc = validate.main(["--params", "params.yaml", "--no-track", *(f"--suite={s}" for s in suites)])
    report = json.loads((root / "metrics/validate.json").read_text())
    return rc, report, capsys.readouterr().err


def failures(report: dict) -> list[tuple[str, str, str | None]]:
    return [(name, f["expectation"], f["column"]) for name, s in report["suites"].items() for f in s["failures"]]


def test_valid_outputs_pass_every_suite(tmp_path, monkeypatch, capsys, runner):
    rc, report, err = run(tmp_path, monkeypatch, capsys, runner)
    assert failures(report) == [], err
    assert rc == 0 and report["success"]
    expected = {"role_swap", "role_swap.messages", "thoughttrace", "thoughttrace.messages", "behavior_annotations",
                "behavior_frequencies", "behavior_tasks"}
    expected |= {f"splits/{d}/{s}" for d in ("role_swap", "thoughttrace", "behavior_tasks")
                 for s in ("train", "val", "test")}
    expected |= {f"gyms/{s}" for s in ("train", "val", "test")}
    expected |= {f"{kind}/{st}" for kind in ("quarantine", "metrics") for st in validate.DATA_STAGES}
    assert set(report["suites"]) == expected
    assert report["evaluated"] > 300 and report["failed"] == 0
    for name, suite in report["suites"].items():
        assert suite["success"] and suite["evaluated"] > 0 and suite["failed"] == 0, name
    assert report["suites"]["behavior_annotations"]["skipped"] == {}
    assert report["suites"]["gyms/train"]["skipped"] == {} and report["suites"]["gyms/test"]["rows"] == 3
    assert report["suites"]["splits/role_swap/val"]["rows"] == 0


def _set(path: str, fn: Callable[[pl.DataFrame], pl.DataFrame]) -> Callable[[dict], None]:
    def edit(files: dict) -> None:
        files[path] = fn(files[path])
    return edit


def _non_alternating(df: pl.DataFrame) -> pl.DataFrame:
    msgs = df["messages"].to_list()
    msgs[1] = m(("system", "p"), ("assistant", "<think></think>t0"), ("assistant", "<think></think>t1"))
    return df.with_columns(pl.Series("messages", msgs, dtype=MSG))


def _unknown_role(df: pl.DataFrame) -> pl.DataFrame:
    msgs = df["messages"].to_list()
    msgs[1] = m(("assistant", "q"), ("bot", "a"))
    return df.with_columns(pl.Series("messages", msgs, dtype=MSG))


def _leak(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.lit("ip1").alias("user_id"))


def _accounting(metrics: dict) -> dict:
    return {**metrics, "rows_in": 10}


def _held_out_in_train(df: pl.DataFrame) -> pl.DataFrame:
    return pl.concat([df, gym_rows("test").head(1).with_columns(pl.lit("train").alias("split"))])


def _gym_leak(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(pl.lit("travel-train-1").alias("task_id"))


BROKEN = {
    # name: (edit, suite, expectation, column, text in the message)
    "non_alternating_thoughttrace": (
        _set("data/processed/thoughttrace.parquet", _non_alternating),
        "thoughttrace", "expect_column_values_to_be_in_set", "alternates", "user2_task3_conversation1"),
    "unknown_role": (
        _set("data/processed/role_swap.parquet", _unknown_role),
        "role_swap.messages", "expect_column_values_to_be_in_set", "role", '"bot"'),
    "null_user_id": (
        _set("data/processed/role_swap.parquet", lambda df: df.with_columns(
            pl.when(pl.col("conversation_id") == "h2").then(None).otherwise(pl.col("user_id")).alias("user_id"))),
        "role_swap", "expect_column_values_to_not_be_null", "user_id", "h2"),
    "duplicate_conversation_id": (
        _set("data/processed/role_swap.parquet", lambda df: df.with_columns(pl.lit("h1").alias("conversation_id"))),
        "role_swap", "expect_column_values_to_be_unique", "conversation_id", '"h1"'),
    "unknown_behavior": (
        _set("data/processed/behavior_annotations.parquet",
             lambda df: df.with_columns(pl.Series("behavior", ["B14", "N"]))),
        "behavior_annotations", "expect_column_values_to_be_in_set", "behavior", '"B14"'),
    "leaked_user": (
        _set("data/splits/role_swap/test.parquet", _leak),
        "splits/role_swap/test", "expect_column_values_to_be_in_set", "leaks", "user:ip1"),
    "broken_accounting": (
        _set("metrics/role_swap.json", _accounting),
        "metrics/role_swap", "expect_column_values_to_be_in_set", "accounting_gap", "rows_in == rows_out"),
    "no_think_block": (
        _set("data/processed/thoughttrace.parquet", lambda df: df.with_columns(
            pl.col("messages").list.eval(pl.element().struct.with_fields(
                pl.element().struct.field("content").str.replace(r"^<think>.*?</think>", "")))
            .alias("messages"))),
        "thoughttrace", "expect_column_values_to_be_in_set", "assistant_thinks", "first_bad_assistant"),
    "wrong_split_column": (
        _set("data/splits/thoughttrace/train.parquet", lambda df: df.with_columns(pl.lit("test").alias("split"))),
        "splits/thoughttrace/train", "expect_column_values_to_be_in_set", "split", '"test"'),
    "bad_json_kwargs": (
        _set("data/processed/behavior_tasks.parquet",
             lambda df: df.with_columns(pl.Series("kwargs", ["{x: 1", "{}"]))),
        "behavior_tasks", "expect_column_values_to_be_in_set", "kwargs_is_json", "abcd-1"),
    "extra_column": (
        _set("data/processed/behavior_frequencies.parquet", lambda df: df.with_columns(pl.lit(1).alias("extra"))),
        "behavior_frequencies", "expect_table_columns_to_match_set", "extra", "unexpected ['extra']"),
    "held_out_gym_in_train": (
        _set("data/gyms/train.parquet", _held_out_in_train),
        "gyms/train", "expect_column_values_to_be_in_set", "gym_allowed_in_split", "intention"),
    "training_gym_without_train_rows": (
        _set("data/gyms/train.parquet", lambda df: df.filter(pl.col("gym") != "turtle")),
        "gyms/train", "expect_column_distinct_values_to_contain_set", "gym", "- missing ['turtle']"),
    "gym_task_in_two_splits": (
        _set("data/gyms/val.parquet", _gym_leak),
        "gyms/val", "expect_column_values_to_be_in_set", "in_two_splits", "travel-train-1"),
    "gym_leak_metric": (
        _set("metrics/gyms.json", lambda d: {**d, "leaked_task_keys": 2}),
        "metrics/gyms", "expect_column_values_to_be_between", "leaked_task_keys", "leaked_task_keys == 0"),
    "wrong_row_type": (
        _set("data/quarantine/thoughttrace.parquet", lambda df: df.with_columns(pl.col("row").cast(pl.String))),
        "quarantine/thoughttrace", "expect_column_values_to_be_of_type", "row", "observed"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_output_fails(case, tmp_path, monkeypatch, capsys, runner):
    edit, suite, expectation, column, text = BROKEN[case]
    # Only the affected suite runs (the full stage is run once below with every break at once).
    rc, report, err = run(tmp_path, monkeypatch, capsys, runner, edit, suites=(suite,))
    assert rc == 1 and not report["success"]
    assert (suite, expectation, column) in failures(report), failures(report)
    line = next(ln for ln in err.splitlines() if f"suite `{suite}`" in ln and f"column `{column}`" in ln)
    assert expectation in line and text in line, line
    assert not report["suites"][suite]["success"] and report["suites"][suite]["failed"] >= 1


def test_full_stage_reports_every_break(tmp_path, monkeypatch, capsys, runner):
    def edit_all(files: dict) -> None:
        for edit, *_ in BROKEN.values():
            edit(files)
    rc, report, err = run(tmp_path, monkeypatch, capsys, runner, edit_all)
    assert rc == 1 and not report["success"]
    found = failures(report)
    for case, (_, suite, expectation, column, _) in BROKEN.items():
        assert (suite, expectation, column) in found, case
        assert any(f"suite `{suite}`: {expectation} on column `{column}`" in ln for ln in err.splitlines()), case
    untouched = report["suites"]["behavior_frequencies"], report["suites"]["quarantine/role_swap"]
    assert not untouched[0]["success"] and untouched[1]["success"]
    assert err.strip().splitlines()[-1].startswith("validate: ") and "expectation(s) failed" in err


def test_userrl_rows_may_leave_a_gym_without_rows(tmp_path, monkeypatch, capsys, runner):
    """With gyms.userrl_rows a gym may have no row (none published, or all quarantined: the gyms stage's
    metrics name it in gyms_without_rows): the gyms suites do not require every gym then."""
    write_project(tmp_path, _set("data/gyms/train.parquet", lambda df: df.filter(pl.col("gym") != "travel")))
    (tmp_path / "params.yaml").write_text(PARAMS + "gyms:\n  userrl_rows: rows\n")
    monkeypatch.chdir(tmp_path)
    rc = validate.main(["--params", "params.yaml", "--no-track", "--suite=gyms/train", "--suite=gyms/test"])
    report = json.loads((tmp_path / "metrics/validate.json").read_text())
    assert rc == 0 and failures(report) == [], capsys.readouterr().err


def test_missing_output_and_fail_on_error_off(tmp_path, monkeypatch, capsys, runner):
    def drop(files: dict) -> None:
        del files["data/processed/behavior_tasks.parquet"]
    write_project(tmp_path, drop)
    (tmp_path / "params.yaml").write_text(PARAMS + "validate: {fail_on_error: false}\n")
    monkeypatch.chdir(tmp_path)
    assert validate.main(["--params", "params.yaml", "--no-track", "--suite", "behavior_*"]) == 0
    report = json.loads((tmp_path / "metrics/validate.json").read_text())
    assert failures(report) == [("behavior_tasks", "expect_file_to_exist", None)]
    assert "suite `behavior_tasks`: expect_file_to_exist" in capsys.readouterr().err


def test_bad_params_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "params.yaml").write_text("role_swap: {mixture: {}}\n")
    monkeypatch.chdir(tmp_path)
    assert validate.main(["--params", "params.yaml", "--no-track"]) == 2
    assert "role_swap.mixture" in capsys.readouterr().err


def test_leaked_keys_across_datasets():
    a = pl.DataFrame({"user_id": ["u1", "u2"], "conversation_id": ["c1", "c2"]})
    b = pl.DataFrame({"user_id": ["u3"], "conversation_id": ["c2"], "scenario_key": ["s"]})
    assert sorted(X.leaked_keys([("train", a), ("test", b), ("train", b.with_columns(pl.lit("u9").alias("user_id")))])
                  ) == ["conv:c2", "scenario:s"]
