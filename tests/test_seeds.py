"""Effects over seeds of the whole chain (mimesis_lab/evals/seeds.py, flows/seeds.py): targets, the t-interval,
pooling by hand, the chain's params, and a real clone of this project prepared as a chain."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mimesis_lab.config import load_params, parse_params, yaml_load
from mimesis_lab.evals import effects as E
from mimesis_lab.evals import seeds as S

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- targets
@pytest.mark.parametrize("target,value,ci,want", [
    (">= 0.9 (sampled)", 0.9, None, True),
    (">= 0.9 (sampled)", 0.899, [0.85, 0.95], False),
    ("<= 0.2", 0.2, None, True),
    ("<= 0.2", 0.21, None, False),
    ("> 0", 0.0, None, False),
    ("< 0", -0.1, None, True),
    ("> 0, CI excludes 0", 0.1, [0.01, 0.2], True),
    ("> 0, CI excludes 0", 0.1, [0.0, 0.2], False),     # the bound must be above 0
    ("> 0, CI excludes 0", 0.1, None, False),            # no CI: not shown to exclude 0
    (">= 0.1, CI excludes 0", 0.09, [0.05, 0.13], False),
    ("<= 0.7 and final < unigram", 0.21, None, True),   # the unigram clause is its own effect
    (">= 0.3", None, None, False),                       # missing value
    (">= 0.3", float("nan"), None, False),
])
def test_check_target_by_hand(target, value, ci, want):
    assert S.check_target(target, value, ci) is want


@pytest.mark.parametrize("target", ["about 0.5", "> 0 on most users", ""])
def test_check_target_unreadable_is_none(target):
    assert S.check_target(target, 1.0, [0.5, 1.5]) is None


def test_every_effect_target_is_readable():
    """Every target the report writes (all effects missing still carry theirs) is one check_target reads: a new
    target form fails here instead of being pooled as unreadable."""
    effects = E.compute_effects(E.EffectInputs())
    assert set(effects) == set(E.PHASE_OF)
    for name, e in effects.items():
        assert S.check_target(e["target"], 0.0, [0.0, 0.0]) is not None, (name, e["target"])


@pytest.mark.parametrize("target,ci,want", [
    ("> 0", [0.01, 0.2], True), ("> 0", [-0.1, 0.2], False), ("> 0", [0.0, 0.2], False),
    (">= 0.3", [0.3, 0.6], True), (">= 0.3", [0.2, 0.6], False),
    ("<= 0.2", [0.1, 0.2], True), ("<= 0.2", [0.1, 0.21], False), ("< 0", [-2.4, -2.2], True),
    ("> 0, CI excludes 0", [0.01, 0.2], True), ("> 0", None, False), ("about 1", [0, 1], None),
])
def test_clears_target_by_hand(target, ci, want):
    assert S.clears_target(target, ci) is want


# ----------------------------------------------------------------------------- t-interval
def test_t_ci_by_hand():
    lo, hi = S.t_ci([1.0, 2.0, 3.0])            # mean 2, s 1, t(0.975, 2) = 4.303, half = 4.303 / sqrt(3)
    assert lo == pytest.approx(2 - 4.303 / math.sqrt(3)) and hi == pytest.approx(2 + 4.303 / math.sqrt(3))
    lo, hi = S.t_ci([0.5, 0.5])                  # no spread: a point
    assert lo == hi == 0.5
    assert S.t_ci([1.0]) is None and S.t_ci([]) is None


# ----------------------------------------------------------------------------- pooling
def _rep(**effects):
    return {"effects": {k: {"value": v, "ci": ci, "target": t, "passed": p, "phase": E.PHASE_OF.get(k, "x")}
                        for k, (v, ci, t, p) in effects.items()}}


def test_pool_effects_by_hand():
    reports = {
        "a": _rep(sft_format_rate=(0.8, [0.7, 0.9], ">= 0.9 (sampled)", False),
                  user_matters=(0.1, [0.05, 0.15], "> 0, CI excludes 0", True)),
        "b": _rep(sft_format_rate=(1.0, [0.9, 1.0], ">= 0.9 (sampled)", True),
                  user_matters=(0.3, [0.2, 0.4], "> 0, CI excludes 0", True)),
        "c": _rep(sft_format_rate=(0.9, [0.85, 0.95], ">= 0.9 (sampled)", True),
                  user_matters=(None, None, "> 0, CI excludes 0", False)),
    }
    p = S.pool_effects(reports)
    assert list(p) == ["sft_format_rate", "user_matters"]          # PHASE_OF order
    f = p["sft_format_rate"]
    assert f["value"] == pytest.approx(0.9) and f["sd"] == pytest.approx(0.1)
    half = 4.303 * 0.1 / math.sqrt(3)
    assert f["ci"] == pytest.approx([0.9 - half, 0.9 + half])
    assert f["passed_in"] == 2 and f["n_chains"] == 3 and f["missing_in"] == []
    assert f["passed"] is True                                       # >= 0.9 on the mean 0.9
    assert f["ci_clears_target"] is False                            # ... but the interval reaches 0.79
    assert f["per_chain"] == {"a": 0.8, "b": 1.0, "c": 0.9}
    assert f["passed_per_chain"] == {"a": False, "b": True, "c": True}
    assert f["min"] == 0.8 and f["max"] == 1.0 and f["ci_unit"].startswith("chain")
    u = p["user_matters"]
    assert u["value"] == pytest.approx(0.2) and u["missing_in"] == ["c"]
    # mean 0.2, s = 0.1414, t(1) = 12.706: the interval includes 0, and a chain misses the effect: FAIL
    assert u["ci"][0] < 0 and u["passed"] is False and u["passed_in"] == 2


def test_pool_effects_ci_excludes_zero_on_chains():
    reps = {k: _rep(user_matters=(v, [v - 0.01, v + 0.01], "> 0, CI excludes 0", True))
            for k, v in {"a": 0.10, "b": 0.11, "c": 0.12}.items()}
    u = S.pool_effects(reps)["user_matters"]
    assert u["ci"][0] > 0 and u["passed"] is True and u["ci_clears_target"] is True


def test_identical_chains_flagged():
    a = _rep(sft_format_rate=(0.8, None, ">= 0.9", False))
    b = _rep(sft_format_rate=(0.8, None, ">= 0.9", False))
    c = _rep(sft_format_rate=(0.7, None, ">= 0.9", False))
    assert S.identical_chains({"a": a, "b": b, "c": c}) == [("a", "b")]
    none = _rep(sft_format_rate=(None, None, ">= 0.9", False))
    assert S.identical_chains({"x": none, "y": none}) == []          # nothing measured: nothing to compare


def test_seeds_markdown_rows():
    reports = {"s1": _rep(sft_format_rate=(0.8, None, ">= 0.9", False)),
               "s2": _rep(sft_format_rate=(1.0, None, ">= 0.9", True))}
    chains = [{"label": "s1", "seed": 1, "status": "ok", "wall_s": 700.0, "targets_met": [0, 1]},
              {"label": "s2", "seed": 2, "status": "ok", "wall_s": 710.0, "targets_met": [1, 1]},
              {"label": "s3", "seed": 3, "status": "failed", "reason": "dvc repro exited 1"}]
    md = S.seeds_markdown(S.pool_effects(reports), chains, [("s1", "s2")], commit="abcdef0123456789")
    assert "| `sft_format_rate` | 0.800 ✗ | 1.000 | 0.900 |" in md
    assert "| 1 of 2 | PASS (mean only) |" in md and "abcdef012345" in md   # t(1) interval: [-0.37, 2.17]
    assert "`s3`: failed: dvc repro exited 1" in md and "Identical chains" in md
    assert "Pooled over 2 chains: 1 of 1 targets met, 0 of them with the whole interval" in md


def test_chain_wall_counts_every_run_of_a_resumed_chain(tmp_path):
    from flows.seeds import record_run, run_ledger

    assert run_ledger(tmp_path) == {"wall_s_all": 0, "runs": 0, "interrupted_runs": 0, "commits": 0}
    record_run(tmp_path, {"commit": "c0", "event": "start", "t": 1.0})
    record_run(tmp_path, {"commit": "c0", "event": "end", "t": 1.0, "wall_s": 900.0, "rc": 0})
    one = run_ledger(tmp_path)
    assert S.chain_wall({"wall_s": 900.0, **one}) == "900"                             # one run: its own time
    record_run(tmp_path, {"commit": "c1", "event": "start", "t": 2.0})             # killed: never ends
    record_run(tmp_path, {"commit": "c1", "event": "start", "t": 3.0})
    record_run(tmp_path, {"commit": "c1", "event": "end", "t": 3.0, "wall_s": 300.0, "rc": 1})
    record_run(tmp_path, {"commit": "c1", "event": "start", "t": 4.0})
    record_run(tmp_path, {"commit": "c1", "event": "end", "t": 4.0, "wall_s": 2.0, "rc": 0})
    runs = run_ledger(tmp_path)
    assert runs == {"wall_s_all": 1202.0, "runs": 3, "interrupted_runs": 1, "commits": 2}
    assert S.chain_wall({"wall_s": 2.0, **runs}) == "2 (4 runs: 1202 s in all, 1 interrupted, at 2 commits)"
    assert S.chain_wall({"wall_s": None}) == "–"                                       # the workspace chain


# ----------------------------------------------------------------------------- the chain's params
def test_chain_params_valid_and_seeded():
    from flows.seeds import chain_params

    data = yaml_load((ROOT / "params.yaml").read_text())
    out = chain_params(data, 77, vary_world=False, root=ROOT, experiment="exp-x")
    p = parse_params(out)
    assert p.model.seed == 77 and p.sim_rl.seed == 77 and p.agent_traces.seed == 77
    assert p.sft.seed == 77 and p.midtrain.seed == 77 and p.agent_grpo.seed == 77 and p.agent_csd.seed == 77
    assert p.world.seed == load_params(ROOT / "params.yaml").world.seed        # the world stays
    assert parse_params(chain_params(data, 77, vary_world=True, root=ROOT, experiment="e")).world.seed == 77
    t = p.tracking
    assert t.experiment == "exp-x" and t.simulator_model.endswith("-seeds") and t.agent_model.endswith("-seeds")
    assert t.tracking_uri == "sqlite:///" + str((ROOT / "mlflow/mlflow.db").resolve())
    assert Path(t.artifact_location).is_absolute()
    assert data["model"]["seed"] != 77                                          # the input is not modified


def test_apply_overrides_rejects_unknown_keys():
    with pytest.raises(KeyError, match="midtrian"):
        S.apply_overrides({"midtrain": {"seed": 1}}, {"midtrian.seed": 2})
    with pytest.raises(KeyError, match="midtrain.sed"):
        S.apply_overrides({"midtrain": {"seed": 1}}, {"midtrain.sed": 2})


def test_prepare_chain_real_clone(tmp_path):
    """A real clone of this project's HEAD: DVC cache shared with this project, params seeded and valid; a second
    call keeps the clone (a re-run of the flow resumes), at another commit it moves the clone there."""
    from flows.seeds import _git, prepare_chain

    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    commit = _git(ROOT, "rev-parse", "HEAD")
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    dest = tmp_path / "seed-5"
    prepare_chain(ROOT, dest, commit, 5, vary_world=False, experiment="e", env=env)
    assert _git(dest, "rev-parse", "HEAD") == commit
    assert load_params(dest / "params.yaml").sim_rl.seed == 5
    cache = subprocess.run([sys.executable, "-m", "dvc", "cache", "dir"], cwd=dest, capture_output=True,
                           text=True, check=True).stdout.strip()
    want = subprocess.run([sys.executable, "-m", "dvc", "cache", "dir"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert Path(cache).resolve() == Path(want).resolve()
    marker = dest / "kept.txt"
    marker.write_text("x")
    lock = dest / "dvc.lock"                      # the chain's own outputs: tracked files that differ from HEAD
    lock.write_text(lock.read_text() + "# this chain's lock\n")
    prepare_chain(ROOT, dest, commit, 6, vary_world=False, experiment="e", env=env)
    assert marker.exists() and load_params(dest / "params.yaml").sim_rl.seed == 6
    # an earlier commit's clone is moved to the asked commit, its outputs (untracked files) kept
    try:
        parent = _git(ROOT, "rev-parse", "HEAD~1")
    except subprocess.CalledProcessError:
        pytest.skip("a shallow checkout: no parent commit to move the clone to")
    prepare_chain(ROOT, dest, parent, 7, vary_world=False, experiment="e", env=env)
    assert _git(dest, "rev-parse", "HEAD") == parent and marker.exists()
    assert lock.read_text().endswith("# this chain's lock\n")     # not the commit's lock
    prepare_chain(ROOT, dest, commit, 8, vary_world=False, experiment="e", env=env)
    assert _git(dest, "rev-parse", "HEAD") == commit and load_params(dest / "params.yaml").sim_rl.seed == 8


def test_workspace_commit_refuses_modified_tracked_files(tmp_path):
    from flows.seeds import ChainError, workspace_commit

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.txt").write_text("1")
    subprocess.run(["git", "-C", str(tmp_path), "add", "a.txt"], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a"],
                   check=True)
    head = workspace_commit(tmp_path)
    assert len(head) == 40
    (tmp_path / "a.txt").write_text("2")
    with pytest.raises(ChainError, match="a.txt"):
        workspace_commit(tmp_path)
    assert workspace_commit(tmp_path, allow_dirty=True) == head


def test_repool_rewrites_pooled_and_report(tmp_path):
    """``--repool``: the chains recorded in metrics/seeds.json pooled again, no chain run (a failed chain stays
    listed, not pooled)."""
    import json

    from flows.seeds import repool

    eff = lambda v: {"sft_format_rate": {"value": v, "ci": None, "target": ">= 0.9", "passed": v >= 0.9}}  # noqa: E731
    rec = {"commit": "c0ffee", "vary_world": False, "pooled": {}, "identical_chains": [], "chains": [
        {"label": "a", "seed": 1, "status": "ok", "wall_s": 1.0, "targets_met": [0, 1], "effects": eff(0.8)},
        {"label": "b", "seed": 2, "status": "ok", "wall_s": 1.0, "targets_met": [1, 1], "effects": eff(1.0)},
        {"label": "c", "seed": 3, "status": "failed", "reason": "boom", "effects": None}]}
    out, md = tmp_path / "seeds.json", tmp_path / "seeds.md"
    out.write_text(json.dumps(rec))
    res = repool(out, md)
    assert res["pooled"]["sft_format_rate"]["value"] == pytest.approx(0.9)
    assert json.loads(out.read_text())["pooled"]["sft_format_rate"]["n_chains"] == 2
    text = md.read_text()
    assert "`c`: failed: boom" in text and "| 0.800 ✗ | 1.000 | 0.900 |" in text
    # the command line, with another pair of files (a --vary-world run keeps its own)
    from flows.seeds import main

    out2, md2 = tmp_path / "world.json", tmp_path / "world.md"
    out2.write_text(json.dumps(rec))
    assert main(["--repool", "--output", str(out2), "--report", str(md2)]) == 0
    assert md2.read_text() == text and json.loads(out2.read_text())["pooled"] == json.loads(out.read_text())["pooled"]


def test_workspace_chain_needs_an_up_to_date_workspace(tmp_path):
    """The workspace's own run counts as a chain only when `dvc status` is clean (a real DVC repository)."""
    import json

    from flows.seeds import workspace_chain

    def run(*cmd):
        subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True)

    run("git", "init", "-q")
    run(sys.executable, "-m", "dvc", "init", "-q")
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "report.json").write_text(json.dumps(
        {"effects": {"sft_format_rate": {"value": 0.8, "ci": None, "target": ">= 0.9", "passed": False}}}))
    (tmp_path / "in.txt").write_text("a")
    (tmp_path / "dvc.yaml").write_text("stages:\n  copy:\n    cmd: cp in.txt out.txt\n    deps: [in.txt]\n"
                                       "    outs: [out.txt]\n")
    run(sys.executable, "-m", "dvc", "repro", "-q")
    c = workspace_chain(tmp_path, 42)
    assert c["status"] == "ok" and c["seed"] == 42 and c["label"] == "seed-42 (workspace)"
    assert c["targets_met"] == [0, 1]
    (tmp_path / "in.txt").write_text("b")                   # a stage out of date: its report is not this recipe's
    c = workspace_chain(tmp_path, 42)
    assert c["status"] == "failed" and "copy" in c["reason"] and "dvc repro" in c["reason"]
