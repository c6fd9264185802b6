"""Effects over seeds of the whole chain: is a "Does it work?" verdict a property of the recipe or of one draw?

One ``dvc repro`` gives one draw of every effect (:mod:`mimesis_lab.evals.effects`): its CIs resample the
evaluation units (tasks, prompts, rollouts) of *that* run, not the training's own randomness (initialisation,
data order, sampled rollouts). A float-level change of the code moved the default run from 10 to 8 of 15 targets
met while its weights after 30 warm-up steps differed by at most 6e-6 (README "Does it work?"). The ``seeds``
flow (:mod:`flows.seeds`) therefore re-runs the whole training chain with other seeds (the world stays the
same unless asked) and pools the effects here.

Pure functions, no I/O:

- :func:`chain_overrides` / :func:`apply_overrides`: the params of one chain (every training seed set to the
  chain's seed; the world's too with ``vary_world``).
- :func:`check_target`: a target string of :mod:`~mimesis_lab.evals.effects` (``>= 0.9``, ``> 0, CI excludes
  0``, ...) checked on a value and a CI, the same rule the single-run effects apply.
- :func:`clears_target`: whether a whole interval meets a target (a pass of the mean alone is marked as such).
- :func:`t_ci`: the 95% t-interval of a mean over chains (the unit is the chain: a whole re-run).
- :func:`pool_effects`: per effect, every chain's value and verdict, their mean, the t-interval over chains,
  how many chains pass, and the pooled verdict (the target on the mean; ``CI excludes 0`` on the t-interval).
- :func:`identical_chains`: chains whose every effect value is equal (the seed did not take effect).
- :func:`seeds_markdown`: the report ``reports/seeds.md``.
"""
from __future__ import annotations

import copy
import math
import re
import statistics
from typing import Any, Mapping, Sequence

from mimesis_lab.evals.effects import PHASE_OF
from mimesis_lab.evals.report import fmt

__all__ = ["SEED_KEYS", "WORLD_KEYS", "T975", "chain_overrides", "apply_overrides", "check_target", "clears_target",
           "t_ci",
           "pool_effects", "identical_chains", "seeds_markdown"]

#: The training seeds of the chain (``params.yaml`` as written: shared groups hold the phases' seeds):
#: model initialisation and the induction warm-up, the SFT jobs' data order and dropout (mid-training, SFT, the
#: agent's warm start), simulator RL, the warm start's exploratory traces, agent GRPO/CSD.
SEED_KEYS = ("model.seed", "sft_run.seed", "sim_rl.seed", "agent_traces.seed", "agent_rl.seed")
#: The world's seed: another population of users, other conversations, other gym tasks.
WORLD_KEYS = ("world.seed",)

#: Two-sided 95% quantiles of Student's t by degrees of freedom (1.96 beyond 30).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
        29: 2.045, 30: 2.042}


def chain_overrides(seed: int, vary_world: bool = False) -> dict[str, int]:
    """``{dotted key: seed}`` for one chain: every key of :data:`SEED_KEYS` (and :data:`WORLD_KEYS` when
    ``vary_world``) set to ``seed``."""
    keys = SEED_KEYS + (WORLD_KEYS if vary_world else ())
    return {k: int(seed) for k in keys}


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the params mapping ``data`` (as written in ``params.yaml``) with each dotted key of
    ``overrides`` set. The key must exist (a typo would silently run the default seed): ``KeyError`` naming it."""
    out = copy.deepcopy(dict(data))
    for key, value in overrides.items():
        *path, leaf = key.split(".")
        node: Any = out
        for i, part in enumerate(path):
            if not isinstance(node, dict) or part not in node:
                raise KeyError(f"params has no section {'.'.join(path[:i + 1])!r} (override {key!r})")
            node = node[part]
        if not isinstance(node, dict) or leaf not in node:
            raise KeyError(f"params has no key {key!r}")
        node[leaf] = value
    return out


_COMPARE = re.compile(r"^\s*(<=|>=|<|>)\s*(-?\d+(?:\.\d+)?)")
#: Clauses a target may add after its comparison, and how each is checked. ``final < unigram`` (of
#: ``midtrain_loss_ratio``) is its own effect, ``midtrain_vs_unigram``; ``(sampled)`` names how the value
#: was measured.
_CLAUSES = {"ci excludes 0": lambda ci: ci is not None and ci[0] > 0,
            "and final < unigram": lambda ci: True, "(sampled)": lambda ci: True}


def check_target(target: str, value: float | None, ci: Sequence[float] | None = None) -> bool | None:
    """Whether ``value`` (with its ``ci``) meets ``target``, a target string of the effects: a comparison with a
    number (``>= 0.9``, ``<= 0.2``, ``> 0``, ``< 0``) checked on the value, then optional clauses, ``CI excludes
    0`` meaning the CI's lower bound is above 0. ``None`` when the target cannot be read (an unknown clause), so a
    new target form is noticed rather than guessed; ``False`` for a missing value.

    >>> check_target(">= 0.1, CI excludes 0", 0.12, [0.02, 0.2]), check_target("> 0, CI excludes 0", 0.1, [-0.1, 0.3])
    (True, False)
    """
    m = _COMPARE.match(target or "")
    if not m:
        return None
    rest = target[m.end():].strip().lstrip(",").strip().lower()
    checks = []
    while rest:
        for clause, check in _CLAUSES.items():
            if rest.startswith(clause):
                checks.append(check)
                rest = rest[len(clause):].strip().lstrip(",").strip()
                break
        else:
            return None
    if value is None or not math.isfinite(value):
        return False
    op, x = m.group(1), float(m.group(2))
    ok = {"<=": value <= x, ">=": value >= x, "<": value < x, ">": value > x}[op]
    return bool(ok and all(c(ci) for c in checks))


def clears_target(target: str, ci: Sequence[float] | None) -> bool | None:
    """Whether the whole interval ``ci`` meets ``target``: its lower bound for ``>``/``>=`` targets, its upper
    bound for ``<``/``<=`` (and any clause on ``ci``). ``None`` for an unreadable target; ``False`` without a CI.
    A mean that meets its target while its interval straddles the threshold is a pass of the point estimate
    only: another set of chains may well miss it.

    >>> clears_target("> 0", [0.01, 0.2]), clears_target("> 0", [-0.1, 0.2]), clears_target("<= 0.2", [0.1, 0.19])
    (True, False, True)
    """
    m = _COMPARE.match(target or "")
    if not m:
        return None
    if ci is None:
        return False if check_target(target, 0.0, None) is not None else None
    bound = ci[0] if m.group(1) in (">", ">=") else ci[1]
    return check_target(target, bound, ci)


def t_ci(values: Sequence[float]) -> list[float] | None:
    """95% t-interval ``mean ± t(0.975, n-1) · s / √n`` of ``values`` (``None`` below 2 values). E.g. ``[1, 2,
    3]``: mean 2, s 1, t(2) 4.303 -> ``[2 - 2.484, 2 + 2.484]``."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    s = statistics.stdev(values)
    half = T975.get(n - 1, 1.96) * s / math.sqrt(n)
    return [mean - half, mean + half]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def pool_effects(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pool the ``effects`` of several chains' ``metrics/report.json`` (``{chain label: report}``).

    Per effect (in :data:`PHASE_OF` order, then any other name): ``per_chain`` (``{label: value | None}``),
    ``passed_per_chain``, ``value`` (mean over the chains that measured it), ``sd``, ``min``, ``max``, ``ci``
    (:func:`t_ci`, unit: chain), ``passed_in`` / ``n_chains``, ``missing_in`` (labels without a value) and
    ``passed``: the target (:func:`check_target`) on the mean and the t-interval, and no chain missing; ``None``
    when the target string cannot be read. ``target`` and ``phase`` are the first chain's.
    """
    names = [n for n in PHASE_OF if any(n in (r.get("effects") or {}) for r in reports.values())]
    names += sorted({n for r in reports.values() for n in (r.get("effects") or {})} - set(names))
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        entries = {lab: (r.get("effects") or {}).get(name) for lab, r in reports.items()}
        per = {lab: (e.get("value") if e and _finite(e.get("value")) else None) for lab, e in entries.items()}
        vals = [v for v in per.values() if v is not None]
        first = next((e for e in entries.values() if e), {})
        target = first.get("target", "")
        mean = sum(vals) / len(vals) if vals else None
        ci = t_ci(vals)
        missing = [lab for lab, v in per.items() if v is None]
        verdict = check_target(target, mean, ci)
        if missing and verdict:
            verdict = False
        clears = bool(verdict and clears_target(target, ci))
        sd = statistics.stdev(vals) if len(vals) >= 2 else None
        out[name] = {
            "phase": first.get("phase", PHASE_OF.get(name, "")), "target": target, "value": mean, "ci": ci,
            "ci_unit": "chain (t-interval)", "sd": sd, "min": min(vals) if vals else None,
            "max": max(vals) if vals else None, "per_chain": per,
            "passed_per_chain": {lab: bool(e.get("passed")) if e else False for lab, e in entries.items()},
            "passed_in": sum(1 for e in entries.values() if e and e.get("passed")), "n_chains": len(reports),
            "missing_in": missing, "passed": verdict, "ci_clears_target": clears}
    return out


def identical_chains(reports: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of chains whose effect values are all equal (and at least one is measured): their seeds did not
    change the run, so they are one draw counted twice."""
    def sig(r: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, (e or {}).get("value")) for k, e in (r.get("effects") or {}).items()))

    labs = list(reports)
    pairs = []
    for i, a in enumerate(labs):
        for b in labs[i + 1:]:
            sa = sig(reports[a])
            if sa and any(v is not None for _, v in sa) and sa == sig(reports[b]):
                pairs.append((a, b))
    return pairs


def _verdict(e: Mapping[str, Any]) -> str:
    v = e.get("passed")
    if v:
        return "PASS" if e.get("ci_clears_target") else "PASS (mean only)"
    return "**FAIL**" if v is False else "unreadable target"


def chain_wall(c: Mapping[str, Any]) -> str:
    """A chain's wall-time cell: its last run's time, and when its ledger (``flows/seeds.py: run_ledger``) holds
    more than one run, all of them: ``2 (3 runs: 1652 s in all, 1 interrupted, at 2 commits)`` — a resumed chain's
    last run may have re-run nothing; the interrupted runs' time is not counted."""
    n, k, m = int(c.get("runs") or 0), int(c.get("interrupted_runs") or 0), int(c.get("commits") or 0)
    if n + k > 1:
        return (f"{fmt(c.get('wall_s'), 0)} ({n + k} runs: {fmt(c.get('wall_s_all'), 0)} s in all"
                + (f", {k} interrupted" if k else "") + (f", at {m} commits" if m > 1 else "") + ")")
    return fmt(c.get("wall_s"), 0)


def seeds_markdown(pooled: Mapping[str, Mapping[str, Any]], chains: Sequence[Mapping[str, Any]],
                   identical: Sequence[tuple[str, str]] = (), *, commit: str = "", vary_world: bool = False) -> str:
    """``reports/seeds.md``: the chains (seed, status, wall time, targets met), then one row per effect with every
    finished chain's value (✗: that chain misses the target), the mean, the t-interval over chains, the number of
    chains passing and the pooled verdict; chains that did not finish are listed with their reason."""
    labels = [c["label"] for c in chains if c.get("status") == "ok"]
    what = "training seeds and the world's seed" if vary_world else "training seeds (same world)"
    lines = ["# Effects over seeds of the whole chain", "",
             f"Each chain is a whole `dvc repro` of the training and evaluation stages with other {what}"
             + (f", at commit `{commit[:12]}`" if commit else "") + ". A single run's CIs resample its evaluation "
             "units; here the unit is the chain, so the interval includes the training's own randomness (t-interval, "
             "95%). The evaluation sets are the same in every chain unless the world varies. Pooled verdict: the "
             "target on the mean (and `CI excludes 0` on the interval over chains); `PASS (mean only)`: the mean "
             "meets the target but the interval over chains straddles it, so the effect is not established; ✗ marks "
             "a chain that misses it.",
             "", "| Chain | Seed | Status | Wall time (s) | Targets met |", "|---|---|---|---|---|"]
    for c in chains:
        met = c.get("targets_met")
        lines.append(f"| {c['label']} | {c.get('seed', '–')} | {c.get('status')} | {chain_wall(c)} | "
                     f"{'–' if met is None else f'{met[0]} of {met[1]}'} |")
    for a, b in identical:
        lines += ["", f"- ⚠ **Identical chains:** `{a}` and `{b}` gave the same value for every effect: their seeds did "
                      "not change the run (one draw counted twice)."]
    n_pass = sum(1 for e in pooled.values() if e.get("passed"))
    n_clear = sum(1 for e in pooled.values() if e.get("passed") and e.get("ci_clears_target"))
    lines += ["", f"Pooled over {len(labels)} chains: {n_pass} of {len(pooled)} targets met, {n_clear} of them with "
                  "the whole interval over chains on the target's side.", "",
              "| Phase | Effect | " + " | ".join(labels) + " | Mean | 95% CI (chains) | Target | Chains passing "
              "| Pooled |", "|---|---|" + "---|" * len(labels) + "---|---|---|---|---|"]
    for name, e in pooled.items():
        cells = []
        for lab in labels:
            v = e["per_chain"].get(lab)
            cells.append(fmt(v, 3) + ("" if e["passed_per_chain"].get(lab) else " ✗"))
        ci = e.get("ci")
        ci_s = f"[{fmt(ci[0], 3)}, {fmt(ci[1], 3)}]" if ci else "–"
        lines.append(f"| {e.get('phase', '')} | `{name}` | " + " | ".join(cells) + f" | {fmt(e.get('value'), 3)} | {ci_s} "
                     f"| {e.get('target', '')} | {e['passed_in']} of {e['n_chains']} | {_verdict(e)} |")
    failed = [c for c in chains if c.get("status") != "ok"]
    if failed:
        lines += ["", "Chains that did not finish (not pooled):"]
        lines += [f"- `{c['label']}`: {c.get('status')}: {c.get('reason', '')}" for c in failed]
    return "\n".join(lines) + "\n"
