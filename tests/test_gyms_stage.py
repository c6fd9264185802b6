"""The `gyms` data stage: UserRL rows of the eight agent gyms, split train/val (training gyms) and test
(held-out gyms), bad tasks quarantined one by one, and its great-expectations suites."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from mimesis_lab import config as C
from mimesis_lab.envs.gyms import registry
from mimesis_lab.io import InputFileError
from stages import gyms as G
from stages import validate
from stages.common import write_result
from tests.conftest import ROOT

RAW = ROOT / "data" / "raw" / "gyms"
SPLITS = ("train", "val", "test")


def _params_text(tasks: dict[str, str], extra: str = "") -> str:
    lines = ["role_swap:", '  mixture: {"data/raw/chats/*.jsonl": 1.0}', "tracking: {enabled: false}", "gyms:",
             "  tasks:"]
    lines += [f"    {g}: {p}" for g, p in tasks.items()]
    return "\n".join(lines) + "\n" + extra


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A tmp project (cwd) with a copy of the bundled task files and a params.yaml pointing at them."""
    shutil.copytree(RAW, tmp_path / "raw" / "gyms")
    tasks = {g: f"raw/gyms/{g}/tasks.json" for g in registry.ALL_GYMS}
    (tmp_path / "params.yaml").write_text(_params_text(tasks))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(project: Path) -> tuple[G.StageResult, dict]:
    params = C.load_params(project / "params.yaml")
    result = G.build(params)
    frames = {Path(p).stem: result.frame(p) for p in result.outputs}
    metrics = write_result(G.STAGE, result)
    return frames, metrics


def _edit(project: Path, gym: str, fn) -> None:
    path = project / "raw" / "gyms" / gym / "tasks.json"
    path.write_text(json.dumps(fn(json.loads(path.read_text()))))


def test_counts_and_split_rules(project):
    frames, m = _run(project)
    n = {g: len(registry.load_tasks(g, project / "raw" / "gyms" / g / "tasks.json")) for g in registry.ALL_GYMS}
    assert m["rows_in"] == sum(n.values()) == m["rows_out"] and m["rows_quarantined"] == 0
    assert m["rows_in"] == m["rows_out"] + m["rows_quarantined"]
    for g in registry.TRAIN_GYMS:
        n_val = max(1, round(0.15 * n[g]))
        assert m["per_gym"][g] == {"tasks_in": n[g], "train": n[g] - n_val, "val": n_val, "test": 0,
                                   "quarantined": 0, "quarantine_by_reason": {}}, g
    for g in registry.HELD_OUT_GYMS:
        assert m["per_gym"][g] == {"tasks_in": n[g], "train": 0, "val": 0, "test": n[g], "quarantined": 0,
                                   "quarantine_by_reason": {}}, g
    assert m["sizes"] == {s: frames[s].height for s in SPLITS}
    assert m["sizes"] == {"train": 61, "val": 10, "test": 44}   # the bundled task files
    assert m["leaked_task_keys"] == 0 and m["held_out_gyms"] == list(registry.HELD_OUT_GYMS)

    # held-out gyms only in test, training gyms only in train/val, >= 1 train and >= 1 val task each
    assert set(frames["test"]["gym"]) == set(registry.HELD_OUT_GYMS)
    for s in ("train", "val"):
        assert set(frames[s]["gym"]) == set(registry.TRAIN_GYMS), s
    # no task in two splits; ids, sources and the JSON columns agree
    keys = [set(zip(frames[s]["data_source"], frames[s]["task_id"])) for s in SPLITS]
    assert sum(len(k) for k in keys) == len(set().union(*keys)) == m["rows_out"]
    for s in SPLITS:
        df = frames[s]
        assert df.schema["prompt"] == G.PROMPT and (df["split"] == s).all()
        for i, r in enumerate(df.iter_rows(named=True)):
            info, rm = json.loads(r["extra_info"]), json.loads(r["reward_model"])
            assert r["data_source"] == f"interact_{r['gym']}" and r["ability"] == "interaction"
            assert info["tools_kwargs"]["interact_with_env"]["create_kwargs"]["id"] == r["task_id"] == rm["id"]
            assert info["split"] == s and info["index"] == i and r["prompt"][0]["role"] == "system"
    for s in SPLITS:
        assert pl.read_parquet(project / "data" / "gyms" / f"{s}.parquet").equals(frames[s])
    assert pl.read_parquet(project / "data" / "quarantine" / "gyms.parquet").height == 0
    assert json.loads((project / "metrics" / "gyms.json").read_text())["rows_out"] == 115


def test_split_is_seeded(project):
    a, _ = _run(project)
    b, _ = _run(project)
    assert all(a[s].equals(b[s]) for s in SPLITS)
    (project / "params.yaml").write_text((project / "params.yaml").read_text() + "  seed: 7\n")
    c, _ = _run(project)
    assert set(c["val"]["task_id"]) != set(a["val"]["task_id"])
    assert c["val"].height == a["val"].height and c["test"].equals(a["test"])


def test_bad_tasks_are_quarantined_one_by_one(project):
    def travel(tasks: list) -> list:
        del tasks[1]["options"]          # rejected by the travel loader (which rejects the whole file)
        del tasks[2]["request"]          # loads, but build_rows raises
        return tasks

    def turtle(tasks: list) -> list:
        return tasks + [dict(tasks[0], title="again")]   # duplicate id

    def tau(tasks: list) -> list:
        tasks[0]["db_path"] = "raw/gyms/tau/missing-db.json"   # the gym cannot be constructed
        return tasks

    _edit(project, "travel", travel)
    _edit(project, "turtle", turtle)
    _edit(project, "tau", tau)
    frames, m = _run(project)
    q = pl.read_parquet(project / "data" / "quarantine" / "gyms.parquet")
    got = {(r["source_file"], r["row"]): r["reason"] for r in q.iter_rows(named=True)}
    assert set(got) == {("raw/gyms/travel/tasks.json", 2), ("raw/gyms/travel/tasks.json", 3),
                        ("raw/gyms/turtle/tasks.json", 14), ("raw/gyms/tau/tasks.json", 1)}
    travel2 = got[("raw/gyms/travel/tasks.json", 2)]
    assert travel2.startswith("malformed task: travel task 'travel-2': ValueError: raw/gyms/travel/tasks.json")
    assert got[("raw/gyms/travel/tasks.json", 3)] == "build: travel task 'travel-3': KeyError: 'request'"
    assert got[("raw/gyms/turtle/tasks.json", 14)] == ("duplicate: turtle task 'turtle-1': the id is already used "
                                                        "by entry 1")
    assert got[("raw/gyms/tau/tasks.json", 1)].startswith("gym: tau task 'tau-001': InputFileError") and "missing-db.json" in got[("raw/gyms/tau/tasks.json", 1)]
    assert json.loads(q.filter(pl.col("row") == 2)["raw"][0])["id"] == "travel-2"
    assert m["quarantine_by_reason"] == {"build": 1, "duplicate": 1, "gym": 1, "malformed task": 1}
    assert m["rows_quarantined"] == 4 and m["rows_in"] == 116 and m["rows_in"] == m["rows_out"] + 4
    assert m["per_gym"]["travel"]["quarantined"] == 2 and m["per_gym"]["travel"]["tasks_in"] == 13
    assert m["per_gym"]["travel"]["quarantine_by_reason"] == {"build": 1, "malformed task": 1}
    assert m["per_gym"]["tau"]["quarantine_by_reason"] == {"gym": 1}
    # the other travel tasks survive (with their search paths intact for the per-entry load of search/tau)
    all_rows = pl.concat([frames[s] for s in SPLITS])
    travel_ids = set(all_rows.filter(pl.col("gym") == "travel")["task_id"])
    assert len(travel_ids) == 11 and not travel_ids & {"travel-2", "travel-3"}
    assert all_rows.filter(pl.col("gym") == "turtle").height == 13
    assert all_rows.filter(pl.col("gym") == "tau").height == 15


def test_per_entry_load_keeps_sibling_files(project):
    """A malformed search entry forces the per-entry load; the others still find passages.jsonl."""
    _edit(project, "search", lambda t: [{"id": "search-bad"}] + t)
    frames, m = _run(project)
    assert m["per_gym"]["search"] == {"tasks_in": 17, "train": 0, "val": 0, "test": 16, "quarantined": 1,
                                      "quarantine_by_reason": {"malformed task": 1}}
    q = pl.read_parquet(project / "data" / "quarantine" / "gyms.parquet")
    assert q["reason"].to_list()[0].startswith("malformed task: search task 'search-bad'")


def test_search_tasks_without_a_corpus_are_a_file_error(project):
    """Search tasks (Bamboogle's questions) without gyms.search_corpus and without a passages.jsonl beside
    them: one file-level error naming the file and the key to set, not one quarantined row per task."""
    folder = project / "bamboogle"
    folder.mkdir()
    (folder / "q.json").write_text(json.dumps([{"id": "b1", "question": "Who?", "answer": "Ada"}]))
    text = (project / "params.yaml").read_text().replace("raw/gyms/search/tasks.json", "bamboogle/q.json")
    (project / "params.yaml").write_text(text)
    with pytest.raises(InputFileError, match=r"bamboogle/q.json: the search tasks have no corpus: no "
                                             r"gyms.search_corpus is set and .*passages.jsonl .*does not exist; set "
                                             r"gyms.search_corpus"):
        G.build(C.load_params(project / "params.yaml"))
    (folder / "passages.jsonl").write_text(json.dumps({"id": "p1", "title": "Ada", "text": "Ada it was."}) + "\n")
    frames, m = _run(project)
    assert m["per_gym"]["search"]["test"] == 1 and m["rows_quarantined"] == 0


def test_missing_task_file_names_the_file(project, capsys):
    text = (project / "params.yaml").read_text().replace("raw/gyms/telepathy/tasks.json", "raw/nowhere/tasks.json")
    (project / "params.yaml").write_text(text)
    with pytest.raises(InputFileError, match="raw/nowhere/tasks.json"):
        G.build(C.load_params(project / "params.yaml"))
    assert G.main(G.STAGE, G.build, lambda p: p.gyms, ["--no-track"]) == 2
    assert "raw/nowhere/tasks.json" in capsys.readouterr().err
    (project / "raw" / "gyms" / "turtle" / "tasks.json").write_text("[{oops")
    text = text.replace("raw/nowhere/tasks.json", "raw/gyms/telepathy/tasks.json")
    (project / "params.yaml").write_text(text)
    with pytest.raises(InputFileError, match="raw/gyms/turtle/tasks.json: not a JSON task file"):
        G.build(C.load_params(project / "params.yaml"))


def test_training_gym_needs_two_tasks(project):
    _edit(project, "persuade", lambda t: t[:1])
    with pytest.raises(G.StageError, match="training gym 'persuade' has 1 usable task"):
        G.build(C.load_params(project / "params.yaml"))


def test_params_section():
    base = {"role_swap": {"mixture": {"x.jsonl": 1.0}}}
    p = C.parse_params(base)   # an old params file without the section validates
    assert p.gyms.train_gyms == list(registry.TRAIN_GYMS) and p.gyms.held_out_gyms == registry.HELD_OUT_GYMS
    assert p.gyms.tasks == {g: None for g in registry.ALL_GYMS} and p.gyms.val_fraction == 0.15
    default = C.load_params(ROOT / "params.yaml").gyms     # the default pipeline plays the world's tasks
    assert default.tasks == {g: f"data/world/gyms/{g}/tasks.json" for g in registry.ALL_GYMS}
    # and evaluates half of them (30 of the world's 60 a training gym: agent effects with power)
    assert default.val_fraction == 0.5
    assert default.model_copy(update={"tasks": p.gyms.tasks, "val_fraction": 0.15}) == p.gyms
    with pytest.raises(C.ConfigError, match=r"`gyms.tasks`.*unknown gym"):
        C.parse_params({**base, "gyms": {"tasks": {"travle": None}}}, "params.yaml")
    with pytest.raises(C.ConfigError, match=r"`gyms.train_gyms`"):
        C.parse_params({**base, "gyms": {"train_gyms": ["travel", "chess"]}}, "params.yaml")
    with pytest.raises(C.ConfigError, match=r"`gyms.val_fraction`"):
        C.parse_params({**base, "gyms": {"val_fraction": 1.0}}, "params.yaml")
    with pytest.raises(C.ConfigError, match=r"unknown key `gyms.sead`"):
        C.parse_params({**base, "gyms": {"sead": 1}}, "params.yaml")


@pytest.fixture(scope="module")
def runner() -> validate.Runner:
    return validate.get_runner()


def _suites(project: Path, runner) -> dict:
    params = C.load_params(project / "params.yaml")
    return validate.validate_all(params, runner, only=["gyms/*", "*/gyms"])["suites"]


def test_suites_pass_on_output_and_fail_on_corruption(project, runner):
    _run(project)
    suites = _suites(project, runner)
    assert set(suites) == {"gyms/train", "gyms/val", "gyms/test", "quarantine/gyms", "metrics/gyms"}
    for name, s in suites.items():
        assert s["success"] and s["evaluated"] > 0 and s["skipped"] == {}, (name, s["failures"])

    train = project / "data" / "gyms" / "train.parquet"
    test = pl.read_parquet(project / "data" / "gyms" / "test.parquet")
    held_out_row = test.head(1).with_columns(pl.lit("train").alias("split"))
    pl.concat([pl.read_parquet(train), held_out_row]).write_parquet(train)
    suites = _suites(project, runner)
    bad = {(f["expectation"], f["column"]) for f in suites["gyms/train"]["failures"]}
    assert ("expect_column_values_to_be_in_set", "gym_allowed_in_split") in bad
    assert ("expect_column_values_to_be_in_set", "in_two_splits") in bad          # also still in test
    assert ("expect_column_values_to_be_in_set", "in_two_splits") in {
        (f["expectation"], f["column"]) for f in suites["gyms/test"]["failures"]}
    assert ("expect_column_values_to_be_in_set", "extra_info_split_matches") in bad
    assert not suites["metrics/gyms"]["success"]   # rows_out no longer matches the files
    assert suites["gyms/val"]["success"]
