import polars as pl
import pytest

from mimesis_lab.config import SplitsParams
from mimesis_lab.splits import assign_splits, connected_groups
from stages.common import StageError
from stages.splits import check_no_leak, run_splits


def test_connected_groups_transitive():
    rows = [["user:a", "conv:1"], ["user:b", "conv:2"], ["user:a", "conv:3"],
            ["user:c", "conv:4", "scenario:s"], ["user:d", "conv:5", "scenario:s"], ["user:b", "conv:6"]]
    g = connected_groups(rows)
    assert g[0] == g[2] and g[1] == g[5] and g[3] == g[4]
    assert len({g[0], g[1], g[3]}) == 3
    assert g[0] == "conv:1"              # named by its smallest key
    with pytest.raises(ValueError):
        connected_groups([[]])


def test_assign_splits_deterministic_and_close_to_targets():
    sizes = {f"g{i}": 1 + (i % 3) for i in range(300)}
    fr = {"train": 0.8, "val": 0.1, "test": 0.1}
    a = assign_splits(sizes, fr, seed=1)
    assert a == assign_splits(sizes, fr, seed=1)
    assert a != assign_splits(sizes, fr, seed=2)
    total = sum(sizes.values())
    for split, f in fr.items():
        got = sum(n for g, n in sizes.items() if a[g] == split)
        assert abs(got / total - f) < 0.02


def _ds(path, rows, scenario=False):
    df = pl.DataFrame(rows, schema=["conversation_id", "user_id"] + (["scenario_key"] if scenario else []),
                      orient="row")
    df.write_parquet(path)
    return str(path)


def test_stage_keeps_users_conversations_scenarios_in_one_split(in_tmp):
    a = _ds(in_tmp / "a.parquet", [(f"c{i}", f"u{i % 7}") for i in range(60)])
    b = _ds(in_tmp / "b.parquet", [(f"t{i}", f"u{i % 5}") for i in range(20)])          # same users as a
    c = _ds(in_tmp / "c.parquet", [(f"x{i}", f"cust{i}", f"s{i % 4}") for i in range(16)], scenario=True)
    cfg = SplitsParams(datasets={"a": a, "b": b, "c": c}, seed=5, output_dir="out")
    r = run_splits(cfg)
    assert r.rows_in == r.rows_out == 96
    where = {}
    for path, df in r.outputs.items():
        split = path.rsplit("/", 1)[1].removesuffix(".parquet")
        assert set(df["split"].to_list()) <= {split}
        for col in ("user_id", "conversation_id", "scenario_key"):
            if col in df.columns:
                for v in df[col].to_list():
                    assert where.setdefault((col, v), split) == split
    assert r.extra["groups"] == 7 + 4
    assert sum(r.extra["sizes"]["a"].values()) == 60


def test_null_keys_quarantined_and_missing_dataset(in_tmp):
    a = _ds(in_tmp / "a.parquet", [("c1", "u1"), ("c2", None)])
    r = run_splits(SplitsParams(datasets={"a": a}, output_dir="out"))
    assert r.rows_out == 1 and r.quarantine.reason == ["missing key: null ['user_id']"]
    assert r.quarantine.row == [2]
    from mimesis_lab.io import InputFileError
    with pytest.raises(InputFileError, match="nope.parquet: dataset 'x' not found"):
        run_splits(SplitsParams(datasets={"x": str(in_tmp / "nope.parquet")}))


def test_check_no_leak_detects_leak():
    outs = {"d/a/train.parquet": pl.DataFrame({"user_id": ["u1"], "conversation_id": ["c1"]}),
            "d/b/test.parquet": pl.DataFrame({"user_id": ["u1"], "conversation_id": ["c2"]})}
    with pytest.raises(StageError, match="leak: user:u1 is in splits 'train' and 'test'"):
        check_no_leak(outs)


def test_assign_splits_balances_each_stratum():
    # stratum "small" has few groups; a global-only balance can leave its test split empty
    sizes = {f"big{i}": {"big": 10} for i in range(40)}
    sizes.update({f"small{i}": {"small": 1} for i in range(20)})
    sizes.update({f"both{i}": {"big": 2, "small": 1} for i in range(5)})
    a = assign_splits(sizes, {"train": 0.8, "val": 0.1, "test": 0.1}, seed=0)
    for stratum in ("big", "small"):
        tot = sum(v.get(stratum, 0) for v in sizes.values())
        for split, f in {"train": 0.8, "val": 0.1, "test": 0.1}.items():
            got = sum(v.get(stratum, 0) for g, v in sizes.items() if a[g] == split)
            assert abs(got / tot - f) <= 0.08, (stratum, split, got, tot)
