"""The "Does it work?" check: the measured effect of every phase, with a 95% CI and pass/fail against its target.

Pure functions over already-loaded outputs (the ``report`` flow reads the files, :func:`load_inputs`);
each effect is a small function whose docstring states its target, and returns one entry of
``metrics/report.json``'s ``effects``::

    {"value": float | None, "ci": [lo, hi] | None, "target": str, "passed": bool, "n": int, "unit": str,
     "missing_reason": str | None, ...}

Rules, the same for every effect:

- **CIs** are percentile bootstrap intervals (:func:`bootstrap_ci`, seeded numpy RNG, deterministic), resampling
  the unit named in the entry's ``ci_unit`` (tasks, task × user pairs, conversations, prompts, rollouts, steps).
  With fewer than 2 units there is no honest CI: ``ci`` is ``None`` and ``ci_note`` says why.
- **Targets** written ``>= x`` / ``<= x`` / ``> 0`` are checked on the point value; ``CI excludes 0`` means the
  lower bound is above 0.
- **Missing inputs** give an entry with ``value: None``, ``passed: False`` and ``missing_reason`` — shown, never
  dropped.
- **Identical checkpoints** (same weights by content) are never silently compared: the comparison keeps its
  numbers but gets ``passed: False``, ``identical_to`` and a ``missing_reason`` saying so.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

__all__ = ["N_BOOT", "SEED", "bootstrap_ci", "wilson_ci", "paired_differences", "make_effect", "missing",
           "midtrain_loss_ratio", "midtrain_vs_unigram", "sft_format_rate", "sim_rl_reward_gain",
           "update_reward_gain", "sim_rl_format_failure_end", "format_failures_by_task", "sim_eval_vs",
           "proportion_ci", "agent_vs", "agent_vs_by_gym", "user_matters", "csd_coach_note_rate", "csd_note_use",
           "rank_spread", "EffectInputs", "compute_effects", "weights_sha256", "read_jsonl", "load_inputs",
           "PHASE_OF"]

N_BOOT = 2000
COPY_OK = 0.5     # an in-context copy accuracy at or above this: the simulator can copy (copy_probe)
SEED = 0
Stat = Callable[[np.ndarray], float]

#: The phase each effect measures (the report's first column), in report order.
PHASE_OF = {
    "midtrain_loss_ratio": "midtrain", "midtrain_vs_unigram": "midtrain", "sft_format_rate": "sft",
    "sim_rl_reward_gain": "sim_rl", "sim_rl_format_failure_end": "sim_rl",
    "sim_eval_vs_sft": "sim_eval", "sim_eval_vs_sft_fi": "sim_eval", "sim_eval_vs_base": "sim_eval",
    "sim_eval_vs_base_fi": "sim_eval", "grpo_vs_warm_start_train": "agent_grpo",
    "grpo_vs_warm_start_heldout": "agent_grpo", "user_matters": "agent_eval", "csd_coach_note_rate": "agent_csd",
    "csd_vs_grpo": "agent_csd", "rank_spread": "agent_eval",
}


# ----------------------------------------------------------------------------- statistics
def bootstrap_ci(units: Sequence[Any], stat: Stat = np.mean, *, n_boot: int = N_BOOT, alpha: float = 0.05,
                 seed: int = SEED) -> list[float] | None:
    """Percentile bootstrap CI ``[lo, hi]`` of ``stat`` over ``units`` (rows resampled with replacement).

    ``units`` is a sequence of numbers or of equal-length tuples (a 2-D array: ``stat`` gets the resampled
    rows, e.g. a ratio of column sums). ``None`` with fewer than 2 units. Deterministic for a given ``seed``.
    Worked example: ``[0, 0, 0, 1]`` -> replicate means lie in {0, .25, .5, .75, 1} with probabilities
    .316/.422/.211/.047/.004, so the 2.5% and 97.5% quantiles are 0 and 0.75.
    """
    arr = np.asarray(units, dtype=float)
    if arr.shape[0] < 2:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.shape[0], size=(n_boot, arr.shape[0]))
    reps = np.array([stat(arr[i]) for i in idx], dtype=float)
    reps = reps[np.isfinite(reps)]
    if reps.size == 0:
        return None
    lo, hi = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return [float(lo), float(hi)]


def wilson_ci(k: int, n: int, z: float = 1.959963984540054) -> list[float] | None:
    """Wilson score interval of a proportion ``k / n`` (``None`` when ``n == 0``)."""
    if n <= 0:
        return None
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [max(0.0, mid - half), min(1.0, mid + half)]


def paired_differences(a: Mapping[Hashable, float], b: Mapping[Hashable, float]) -> tuple[list[float], int]:
    """``(a[k] - b[k] for the keys both have, in sorted key order; number of keys only one side has)``."""
    common = sorted(set(a) & set(b), key=str)
    return [float(a[k]) - float(b[k]) for k in common], len(set(a) ^ set(b))


def proportion_ci(k: int, n: int, clusters: Sequence[tuple[float, float]] = ()) -> list[float] | None:
    """CI of a share ``k / n`` whose trials come in ``clusters`` (``(successes, trials)`` each): the hull of the
    cluster bootstrap (it keeps the correlation within a cluster) and the Wilson interval (which, unlike the
    bootstrap, does not collapse to a point when every trial failed or succeeded). E.g. 0 of 64 in 11 prompts:
    the bootstrap gives [0, 0], Wilson [0, 0.057]: the CI is [0, 0.057]."""
    w = wilson_ci(k, n)
    b = bootstrap_ci(clusters, _ratio_of_sums(0, 1)) if len(clusters) >= 2 else None
    if w is None or b is None:
        return w or b
    return [min(w[0], b[0]), max(w[1], b[1])]


def _ratio_of_sums(num: int, den: int) -> Stat:
    return lambda rows: float(rows[:, num].sum() / rows[:, den].sum()) if rows[:, den].sum() else float("nan")


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# ----------------------------------------------------------------------------- entries
def make_effect(value: float | None, ci: list[float] | None, target: str, passed: bool, **extra: Any) -> dict:
    """One ``effects`` entry (see the module docstring)."""
    out = {"value": None if value is None else float(value), "ci": ci, "target": target, "passed": bool(passed),
           "missing_reason": None}
    out.update(extra)
    return out


def missing(target: str, reason: str, **extra: Any) -> dict:
    """An effect whose inputs are absent: shown as missing, never dropped."""
    return make_effect(None, None, target, False, missing_reason=reason, n=0, **extra)


def _flag_identical(e: dict, same_as: str | None, what: str) -> dict:
    """``what``'s final weights equal phase ``same_as``'s: keep the numbers, fail the effect, say why."""
    if same_as:
        e.update(passed=False, identical_to=same_as,
                 missing_reason=f"{what} has the same final weights as {same_as} (sha256): not a comparison")
    return e


def _with_copy_diagnosis(e: dict, sft: Mapping[str, Any] | None) -> dict:
    """Attach the SFT simulator's in-context copy accuracy (``copy_induction_acc`` of ``metrics/sft.json``,
    :func:`mimesis_lab.evals.copy_probe.induction_accuracy`) to a failed simulator-RL effect: a simulator that
    cannot repeat its prompt cannot state its scenario's facts, so the behaviour reward has little to reinforce."""
    acc = (sft or {}).get("copy_induction_acc")
    if isinstance(acc, (int, float)):
        e["sft_copy_induction_acc"] = float(acc)
        if not e.get("passed"):
            chance = (sft or {}).get("copy_induction_chance")
            verdict = (": it cannot repeat what its prompt holds" if acc < COPY_OK else
                       ": it can copy from its prompt, so copying is not what limits this effect")
            e["diagnosis"] = (f"the SFT simulator's in-context copy accuracy is {acc:.2f}"
                              + (f" (chance {chance:.4f})" if isinstance(chance, (int, float)) else "")
                              + verdict + " (mimesis_lab/evals/copy_probe.py)")
    return e


# ----------------------------------------------------------------------------- Stage I
def midtrain_loss_ratio(summary: Mapping[str, Any] | None) -> dict:
    """Final / initial validation loss of user-side mid-training. Target: <= 0.7, and the final loss below the
    add-one unigram of the train split (``midtrain_vs_unigram`` < 0). No CI: per-example losses of the initial
    model are not recorded."""
    target = "<= 0.7 and final < unigram"
    if not summary or not summary.get("initial_val_loss") or summary.get("final_val_loss") is None:
        return missing(target, "metrics/midtrain.json lacks initial_val_loss/final_val_loss", unit="ratio")
    ratio = float(summary["final_val_loss"]) / float(summary["initial_val_loss"])
    uni = summary.get("unigram_val_loss")
    below = uni is not None and float(summary["final_val_loss"]) < float(uni)
    return make_effect(ratio, None, target, ratio <= 0.7 and below, unit="ratio",
                       n=(summary.get("val") or {}).get("examples_out", 0),
                       initial=summary["initial_val_loss"], final=summary["final_val_loss"], unigram=uni,
                       ci_note="per-example losses of the initial model are not recorded")


def midtrain_vs_unigram(summary: Mapping[str, Any] | None) -> dict:
    """Final val loss - loss of an add-one unigram fitted on the train split's target tokens (same tokenizer,
    same loss mask), on the val split's target tokens. Target: < 0. CI: bootstrap over val conversations
    (ratio of summed NLLs) when the per-example losses are recorded."""
    target = "< 0"
    u = (summary or {}).get("unigram") or {}
    per = u.get("per_example") or []
    if per:
        rows = np.asarray(per, dtype=float)          # [model_nll_sum, unigram_nll_sum, n_targets]
        stat = lambda r: float((r[:, 0].sum() - r[:, 1].sum()) / r[:, 2].sum())  # noqa: E731
        value = stat(rows)
        return make_effect(value, bootstrap_ci(rows, stat), target, value < 0, unit="nats/token", n=len(per),
                           ci_unit="val conversation", model_loss=float(rows[:, 0].sum() / rows[:, 2].sum()),
                           unigram_loss=float(rows[:, 1].sum() / rows[:, 2].sum()))
    if summary and summary.get("unigram_val_loss") is not None and summary.get("final_val_loss") is not None:
        value = float(summary["final_val_loss"]) - float(summary["unigram_val_loss"])
        return make_effect(value, None, target, value < 0, unit="nats/token", n=0,
                           ci_note="per-example val losses not recorded")
    return missing(target, "metrics/midtrain.json has no unigram baseline (unigram_val_loss)", unit="nats/token")


def sft_format_rate(summary: Mapping[str, Any] | None) -> dict:
    """Share of sampled replies (``params.sim_rl.rollout`` temperature/top_p/max_new_tokens, fixed seed, validation
    prompts) that are well-formed ``<think>…</think>utterance`` (``parse_reply``). Target: >= 0.9. CI: bootstrap
    over prompts and Wilson over samples (:func:`proportion_ci`)."""
    target = ">= 0.9 (sampled)"
    s = summary or {}
    greedy = s.get("format_think_open_close_rate")
    if s.get("format_sampled_samples"):
        k, n = int(s["format_sampled_well_formed"]), int(s["format_sampled_samples"])
        per = s.get("format_sampled_per_prompt") or []
        return make_effect(k / n, proportion_ci(k, n, per), target, k / n >= 0.9, unit="share", n=n,
                           ci_unit="prompt (bootstrap) and sample (Wilson)" if len(per) >= 2 else "sample (Wilson)",
                           greedy_rate=greedy, prompts=len(per), errors=s.get("format_sampled_error_counts"))
    return missing(target, "metrics/sft.json has no sampled format measurement (format_sampled_*)", unit="share",
                   greedy_rate=greedy)


def _windows(steps: Sequence[int], frac: float = 1 / 3) -> tuple[set[int], set[int]]:
    s = sorted(set(steps))
    k = max(1, int(len(s) * frac))
    return set(s[:k]), set(s[-k:])


def sim_rl_reward_gain(steps: Sequence[Mapping[str, Any]] | None, rollouts: Sequence[Mapping[str, Any]] | None,
                       task: str = "usersim_behavior") -> dict:
    """Behaviour reward (the judged raw score of the behaviour task's valid rollouts), mean of the last third of
    the steps - mean of the first third. Target: >= 0.1 and CI excludes 0. CI: bootstrap over the rollouts of the
    two windows (each resampled on its own). Without ``rollouts.jsonl``: the per-step ``reward/task/<task>``
    means of ``metrics.jsonl``, no CI."""
    target = ">= 0.1, CI excludes 0"
    vals, first, last, a, b = _task_windows(rollouts, task, "raw")
    if vals:
        value, ci = _window_gain(a, b)
        return make_effect(value, ci, target, value >= 0.1 and ci is not None and ci[0] > 0, unit="reward",
                           n=len(a) + len(b), ci_unit="rollout", first=sum(a) / len(a), last=sum(b) / len(b),
                           first_steps=sorted(first), last_steps=sorted(last), reward="raw judged score",
                           **update_reward_gain(rollouts, task), **behaviour_breakdown(vals, first, last))
    pts = [(int(r["step"]), (r.get("metrics") or {}).get(f"reward/task/{task}")) for r in steps or []
           if r.get("kind") == "train"]
    pts = [(s, float(v)) for s, v in pts if isinstance(v, (int, float)) and math.isfinite(v)]
    if pts:
        first, last = _windows([s for s, _ in pts])
        a, b = _mean([v for s, v in pts if s in first]), _mean([v for s, v in pts if s in last])
        return make_effect(b - a, None, target, False, unit="reward", n=len(pts), ci_note="no rollouts.jsonl: no CI",
                           first=a, last=b)
    return missing(target, f"no {task} rollouts in models/sim_rl (rollouts.jsonl / metrics.jsonl)", unit="reward")


def _task_windows(rollouts: Sequence[Mapping[str, Any]] | None, task: str, field: str
                  ) -> tuple[list[Mapping[str, Any]], set[int], set[int], list[float], list[float]]:
    """The valid rollouts of ``task`` with a number in ``field``, the first and last third of their steps
    (:func:`_windows`), and ``field``'s values in each window (empty lists when none)."""
    vals = [r for r in rollouts or [] if r.get("data_source") == task and r.get("invalid") is None
            and isinstance(r.get(field), (int, float))]
    if not vals:
        return [], set(), set(), [], []
    first, last = _windows([int(r["step"]) for r in vals])
    return (vals, first, last, [float(r[field]) for r in vals if int(r["step"]) in first],
            [float(r[field]) for r in vals if int(r["step"]) in last])


def _window_gain(a: Sequence[float], b: Sequence[float]) -> tuple[float, list[float] | None]:
    """mean(b) - mean(a), with a bootstrap CI (each window resampled on its own; ``None`` under 2 in a window)."""
    value = sum(b) / len(b) - sum(a) / len(a)
    if len(a) < 2 or len(b) < 2:
        return value, None
    rng = np.random.default_rng(SEED)
    reps = [rng.choice(b, len(b)).mean() - rng.choice(a, len(a)).mean() for _ in range(N_BOOT)]
    return value, [float(x) for x in np.quantile(reps, [0.025, 0.975])]


def update_reward_gain(rollouts: Sequence[Mapping[str, Any]] | None, task: str = "usersim_behavior") -> dict:
    """The same windows' gain in the **update reward** (SPEC §2.3: a format failure sets it to 0; what GRPO
    maximises), over every valid rollout of ``task``, those whose format failure left no judged score included.
    Shown beside :func:`sim_rl_reward_gain` (the raw judged score of the rollouts that have one, the issue's
    target), never instead of it: the update reward also rises when fewer rollouts fail the format, so a rise of
    it without one of the judged score is RL repairing the format, not the behaviour.
    ``{}`` when no rollout records ``update_reward``."""
    vals, _, _, a, b = _task_windows(rollouts, task, "update_reward")
    if not vals:
        return {}
    gain, ci = _window_gain(a, b)
    return {"update_reward": {"first": sum(a) / len(a), "last": sum(b) / len(b), "gain": gain, "ci": ci,
                              "n": len(a) + len(b)}}


def behaviour_breakdown(vals: Sequence[Mapping[str, Any]], first: set[int], last: set[int]) -> dict[str, Any]:
    """What moves :func:`sim_rl_reward_gain` (rollouts of the behaviour task with ``labels.behavior``): the
    window means mix neutral tasks (N, a cooperative customer: judged near 1) with behaviour tasks (B1-B13:
    near 0.25 unless the behaviour is enacted), so a window that drew more N tasks scores higher without any
    learning. Returns ``mix_adjusted`` (per behaviour label, last − first window mean, weighted by the first
    window's label counts: the gain at a fixed task mix) with ``mix_adjusted_ci`` (stratified bootstrap: each
    window's rollouts of each label resampled on their own; ``None`` when a cell has fewer than 2),
    ``neutral_share`` and ``behavior_exhibit`` (mean judged ``exhibit`` of the B rollouts) per window, and
    ``groups_with_exhibit_variance`` (share of B-task GRPO groups whose rollouts differ in ``exhibit``: the only
    groups whose advantages can teach the behaviour); ``{}`` without labels."""
    lab = [(int(r["step"]), (r.get("labels") or {}).get("behavior"), float(r["raw"]),
            (r.get("components") or {}).get("exhibit"), r.get("group_id")) for r in vals]
    if not lab or any(x[1] is None for x in lab):
        return {}

    def window(steps: set[int]) -> dict[str, list[float]]:
        by: dict[str, list[float]] = {}
        for st, b, raw, _, _ in lab:
            if st in steps:
                by.setdefault(b, []).append(raw)
        return by

    fa, la = window(first), window(last)
    both = sorted(b for b in fa if b in la)
    w = sum(len(fa[b]) for b in both)
    adj = (sum(len(fa[b]) * (_mean(la[b]) - _mean(fa[b])) for b in both) / w) if w else None
    adj_ci = None
    if w and all(len(fa[b]) >= 2 and len(la[b]) >= 2 for b in both):
        # stratified bootstrap: every (window, label) cell resampled on its own, the weights held fixed
        rng = np.random.default_rng(SEED)
        cells = [(len(fa[b]), np.asarray(fa[b]), np.asarray(la[b])) for b in both]
        reps = [sum(n * (rng.choice(y, len(y)).mean() - rng.choice(x, len(x)).mean()) for n, x, y in cells) / w
                for _ in range(N_BOOT)]
        adj_ci = [float(x) for x in np.quantile(reps, [0.025, 0.975])]

    def exhibit(steps: set[int]) -> float | None:
        xs = [float(e) for st, b, _, e, _ in lab if st in steps and b != "N" and isinstance(e, (int, float))]
        return _mean(xs) if xs else None

    groups: dict[tuple, list[float]] = {}
    for st, b, _, e, g in lab:
        if b != "N" and isinstance(e, (int, float)):
            groups.setdefault((st, g), []).append(float(e))
    multi = [v for v in groups.values() if len(v) > 1]
    n_first, n_last = sum(len(v) for v in fa.values()), sum(len(v) for v in la.values())
    return {"mix_adjusted": adj, "mix_adjusted_ci": adj_ci, "mix_adjusted_labels": len(both),
            "neutral_share": [len(fa.get("N", [])) / n_first if n_first else None,
                              len(la.get("N", [])) / n_last if n_last else None],
            "behavior_exhibit": [exhibit(first), exhibit(last)],
            "groups_with_exhibit_variance": (sum(1 for v in multi if max(v) - min(v) > 1e-9) / len(multi)
                                             if multi else None), "behavior_groups": len(multi)}


def _behaviour_note(e: dict) -> str | None:
    """A failed :func:`sim_rl_reward_gain` in words, from :func:`behaviour_breakdown`'s fields."""
    if e.get("passed") or e.get("mix_adjusted") is None:
        return None
    ns, ex, gv = e["neutral_share"], e["behavior_exhibit"], e.get("groups_with_exhibit_variance")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    ci = e.get("mix_adjusted_ci")
    ci_txt = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else ""
    note = (f"at the first window's task mix the gain is {e['mix_adjusted']:+.3f}{ci_txt} (neutral tasks "
            f"{fmt(ns[0])} -> {fmt(ns[1])} of the rollouts); the judged exhibit of the behaviour tasks went "
            f"{fmt(ex[0])} -> {fmt(ex[1])}")
    if gv is not None:
        note += (f", and {100 * gv:.0f}% of their {e['behavior_groups']} groups differ in exhibit (the rest give "
                 f"the behaviour no advantage to learn from)")
    u = e.get("update_reward")
    if u:
        uci = f" [{u['ci'][0]:+.3f}, {u['ci'][1]:+.3f}]" if u.get("ci") else ""
        note += (f"; the update reward (a format failure scores 0: what GRPO maximises) went {u['first']:.3f} -> "
                 f"{u['last']:.3f} ({u['gain']:+.3f}{uci})")
    return note


def sim_rl_format_failure_end(steps: Sequence[Mapping[str, Any]] | None,
                              rollouts: Sequence[Mapping[str, Any]] | None) -> dict:
    """Share of valid rollouts (all tasks) with a format failure in the last third of the simulator-RL steps.
    Target: <= 0.2. CI: Wilson over those rollouts. The share depends on the task mix (the tasks fail the format
    at very different rates), so ``by_task`` gives each task's share and rollouts in the first and last window,
    also written as the effect's ``diagnosis``."""
    target = "<= 0.2"
    vals = [r for r in rollouts or [] if r.get("invalid") is None]
    if vals:
        first, last = _windows([int(r["step"]) for r in vals])
        w = [r for r in vals if int(r["step"]) in last]
        k = sum(1 for r in w if (r.get("format_failures") or 0) > 0)
        by_task = format_failures_by_task(vals, first, last)
        return make_effect(k / len(w), wilson_ci(k, len(w)), target, k / len(w) <= 0.2, unit="share", n=len(w),
                           ci_unit="rollout", last_steps=sorted(last), by_task=by_task,
                           diagnosis="by task, first -> last window (rollouts): " + "; ".join(
                               f"{t} {v['first']:.2f} -> {v['last']:.2f} ({v['n_first']}/{v['n_last']})"
                               for t, v in by_task.items() if v["n_first"] and v["n_last"]))
    pts = [(int(r["step"]), (r.get("metrics") or {}).get("format_failure_rate")) for r in steps or []
           if r.get("kind") == "train"]
    pts = [(s, float(v)) for s, v in pts if isinstance(v, (int, float))]
    if pts:
        _, last = _windows([s for s, _ in pts])
        v = _mean([x for s, x in pts if s in last])
        return make_effect(v, None, target, v <= 0.2, unit="share", n=len(last), ci_note="no rollouts.jsonl: no CI")
    return missing(target, "no simulator-RL rollouts or metrics (models/sim_rl)", unit="share")


def format_failures_by_task(vals: Sequence[Mapping[str, Any]], first: set[int], last: set[int]) -> dict[str, dict]:
    """Per task (``data_source``): share of rollouts with a format failure in the ``first`` and ``last`` steps
    (``None`` where the window has none) and their counts ``n_first``, ``n_last``."""
    out: dict[str, dict] = {}
    for task in sorted({str(r.get("data_source")) for r in vals}):
        row: dict[str, Any] = {}
        for name, steps in (("first", first), ("last", last)):
            w = [r for r in vals if str(r.get("data_source")) == task and int(r["step"]) in steps]
            row[name] = sum(1 for r in w if (r.get("format_failures") or 0) > 0) / len(w) if w else None
            row[f"n_{name}"] = len(w)
        out[task] = row
    return out


# ----------------------------------------------------------------------------- simulator evaluation
def _behavior_by_task(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for r in records:
        if r.get("type") == "rollout" and r.get("kind") == "behavior" and not r.get("excluded") \
                and isinstance(r.get("raw"), (int, float)):
            by.setdefault(str(r["task_id"]), []).append(float(r["raw"]))
    return {k: sum(v) / len(v) for k, v in by.items()}


def _fi_by_conversation(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    return {str(r["conversation_id"]): 100.0 * sum(int(bool(m)) for m in r["matches"].values()) / len(r["matches"])
            for r in records if r.get("type") == "fidelity_judgement" and r.get("matches")}


def sim_eval_vs(records: Mapping[str, Sequence[Mapping[str, Any]]] | None, sim: str, other: str, metric: str,
                same_as: str | None = None) -> dict:
    """The trained simulator ``sim`` minus the baseline ``other`` on ``metric`` (``behavior``: mean judged
    behaviour reward per held-out ABCD task, seeds averaged; ``fi``: FI per held-out conversation), paired over
    tasks / conversations (``eval/sim_eval/<sim>/records.jsonl``). Target: > 0. CI: bootstrap over the pairs."""
    target = "> 0"
    unit = "reward" if metric == "behavior" else "FI points"
    if not records or sim not in records or other not in records:
        return missing(target, f"eval/sim_eval has no records for {sim!r} and {other!r}", unit=unit)
    by = _behavior_by_task if metric == "behavior" else _fi_by_conversation
    d, unpaired = paired_differences(by(records[sim]), by(records[other]))
    if not d:
        return missing(target, f"no {metric} scores that pair {sim!r} with {other!r}", unit=unit)
    value = sum(d) / len(d)
    e = make_effect(value, bootstrap_ci(d), target, value > 0, unit=unit, n=len(d), unpaired=unpaired,
                    ci_unit="task" if metric == "behavior" else "conversation")
    return _flag_identical(e, same_as, f"the simulator {sim!r}")


# ----------------------------------------------------------------------------- agents
def _pair_key(r: Mapping[str, Any]) -> tuple:
    """What pairs two agents' rollouts: ``(user, gym, task_id, attempt)``."""
    return r["user"], r["gym"], str(r["task_id"]), int(r.get("attempt") or 0)


def _agent_scores(rollouts: Sequence[Mapping[str, Any]], agent: str, gyms: set[str] | None = None
                  ) -> dict[tuple, float]:
    """``{(user, gym, task_id, attempt): total_reward}`` of ``agent``'s scored rollouts (invalid ones left out,
    :func:`~mimesis_lab.evals.agent_eval.classify`)."""
    from mimesis_lab.evals.agent_eval import classify

    return {_pair_key(r): float(r.get("total_reward") or 0.0)
            for r in rollouts if r.get("agent") == agent and (gyms is None or r.get("gym") in gyms)
            and classify(dict(r)) != "invalid"}


def _agent_turns(rollouts: Sequence[Mapping[str, Any]], agent: str) -> dict[tuple, float]:
    """``{(user, gym, task_id, attempt): n_turns}`` of ``agent``'s rollouts (the keys of :func:`_agent_scores`)."""
    return {_pair_key(r): float(r["n_turns"])
            for r in rollouts if r.get("agent") == agent and isinstance(r.get("n_turns"), (int, float))}


def agent_vs(rollouts: Sequence[Mapping[str, Any]] | None, agent: str | None, other: str | None,
             gyms: Sequence[str] | None, target: str = "> 0, CI excludes 0", need_ci: bool = True,
             same_as: str | None = None) -> dict:
    """``agent`` - ``other`` episode reward, paired over (evaluation user, gym, task, attempt) on ``gyms``
    (``eval/agent_eval/rollouts.jsonl``). GRPO vs warm start: target > 0 with the CI excluding 0, on the
    training and the held-out gyms separately; CSD vs GRPO: target >= 0 (point value). CI: bootstrap over the
    task × user pairs."""
    if not rollouts or not agent or not other:
        return missing(target, "eval/agent_eval/rollouts.jsonl or the agent names are missing", unit="reward")
    gs = set(gyms) if gyms is not None else None
    mine, theirs = _agent_scores(rollouts, agent, gs), _agent_scores(rollouts, other, gs)
    d, unpaired = paired_differences(mine, theirs)
    if not d:
        return missing(target, f"no valid rollouts pair {agent!r} with {other!r} on gyms {sorted(gs or [])}",
                       unit="reward")
    value = sum(d) / len(d)
    ci = bootstrap_ci(d)
    passed = value > 0 and ci is not None and ci[0] > 0 if need_ci else value >= 0
    by_gym = agent_vs_by_gym(mine, theirs, _agent_turns(rollouts, agent), _agent_turns(rollouts, other))
    e = make_effect(value, ci, target, passed, unit="reward", n=len(d), unpaired=unpaired, ci_unit="task × user",
                    gyms=sorted(gs) if gs else None, by_gym=by_gym, diagnosis=_by_gym_note(by_gym, agent, other))
    return _flag_identical(e, same_as, f"the agent {agent!r}")


def agent_vs_by_gym(a: Mapping[tuple, float], b: Mapping[tuple, float], turns_a: Mapping[tuple, float] | None = None,
                    turns_b: Mapping[tuple, float] | None = None) -> dict[str, dict]:
    """What an :func:`agent_vs` difference rests on: per gym, the pairs (``n``), both sides' mean rewards and the
    mean difference, and ``zero``: every paired rollout of both agents scored 0 (the gym cannot tell them apart).
    ``a`` / ``b``: :func:`_agent_scores` (keys ``(user, gym, task_id, attempt)``). With ``turns_a`` / ``turns_b``
    (:func:`_agent_turns`): ``turns``, both sides' mean episode length over the pairs, since a gym that charges a
    step (IntentionGym) also pays an agent that stops asking sooner."""
    out: dict[str, dict] = {}
    for k in sorted(set(a) & set(b), key=str):
        g = out.setdefault(k[1], {"n": 0, "a": 0.0, "b": 0.0, "zero": True, "ta": 0.0, "tb": 0.0, "nt": 0})
        g["n"] += 1
        g["a"] += a[k]
        g["b"] += b[k]
        g["zero"] = g["zero"] and a[k] == 0 and b[k] == 0
        if turns_a is not None and turns_b is not None and k in turns_a and k in turns_b:
            g["ta"] += turns_a[k]
            g["tb"] += turns_b[k]
            g["nt"] += 1
    return {gym: {"n": g["n"], "a": g["a"] / g["n"], "b": g["b"] / g["n"], "diff": (g["a"] - g["b"]) / g["n"],
                  "zero": g["zero"], **({"turns": [g["ta"] / g["nt"], g["tb"] / g["nt"]]} if g["nt"] else {})}
            for gym, g in out.items()}


def _by_gym_note(by_gym: Mapping[str, Mapping[str, Any]], agent: str, other: str) -> str:
    def turns(v: Mapping[str, Any]) -> str:      # named only where the episode lengths differ
        t = v.get("turns")
        return f"; {t[0]:.1f} vs {t[1]:.1f} turns" if t and abs(t[0] - t[1]) >= 0.5 else ""

    moved = [f"{g} {v['diff']:+.3f} ({v['a']:.2f} vs {v['b']:.2f}, n {v['n']}{turns(v)})" for g, v in by_gym.items()
             if not v["zero"]]
    zero = [g for g, v in by_gym.items() if v["zero"]]
    note = f"by gym, {agent} - {other}: " + ("; ".join(moved) if moved else "no gym scores above 0")
    return note + (f"; every rollout scored 0 on {', '.join(zero)}" if zero else "")


def user_matters(rollouts: Sequence[Mapping[str, Any]] | None, agent: str | None) -> dict:
    """Does the evaluation user change the outcome? For ``agent``, the per-user mean rewards over the tasks every
    user played (users may play different numbers of tasks: ``agent_eval.users.<u>.tasks_per_gym``); value = the
    mean paired difference between the highest- and the lowest-scoring user over those tasks (the spread).
    Target: > 0 with the CI excluding 0 (at least two users give different scores). CI: bootstrap over tasks."""
    target = "> 0, CI excludes 0"
    if not rollouts or not agent:
        return missing(target, "eval/agent_eval/rollouts.jsonl is missing", unit="reward")
    by_user: dict[str, dict[tuple, float]] = {}
    for (u, g, t, k), v in _agent_scores(rollouts, agent).items():
        by_user.setdefault(u, {})[(g, t, k)] = v
    if len(by_user) < 2:
        return missing(target, f"agent {agent!r} has valid rollouts with fewer than 2 evaluation users",
                       unit="reward", users=sorted(by_user))
    shared = set.intersection(*(set(v) for v in by_user.values()))
    if not shared:
        return missing(target, f"the evaluation users {sorted(by_user)} share no task", unit="reward")
    by_user = {u: {k: x for k, x in v.items() if k in shared} for u, v in by_user.items()}
    means = {u: sum(v.values()) / len(v) for u, v in by_user.items()}
    hi, lo = max(means, key=lambda u: (means[u], u)), min(means, key=lambda u: (means[u], u))
    if hi == lo:
        lo = sorted(u for u in means if u != hi)[0]
    d, _ = paired_differences(by_user[hi], by_user[lo])
    if not d:
        return missing(target, f"users {hi!r} and {lo!r} share no task", unit="reward")
    value = sum(d) / len(d)
    ci = bootstrap_ci(d)
    return make_effect(value, ci, target, value > 0 and ci is not None and ci[0] > 0, unit="reward", n=len(d),
                       ci_unit="task", agent=agent, users=means, pair=[hi, lo])


def csd_coach_note_rate(steps: Sequence[Mapping[str, Any]] | None) -> dict:
    """Share of the turns CSD selected for coaching where the coach wrote a note: sum ``csd/coach_ok`` / sum
    ``csd/turns_selected`` over the training steps (``models/agent_csd/metrics.jsonl``). Target: >= 0.3. CI:
    bootstrap over steps (ratio of sums) and Wilson over turns (:func:`proportion_ci`)."""
    target = ">= 0.3"
    rows = [((r.get("metrics") or {}).get("csd/coach_ok"), (r.get("metrics") or {}).get("csd/turns_selected"))
            for r in steps or [] if r.get("kind") == "train"]
    rows = [(float(a), float(b)) for a, b in rows if isinstance(a, (int, float)) and isinstance(b, (int, float))]
    den = sum(b for _, b in rows)
    if not den:
        return missing(target, "models/agent_csd/metrics.jsonl has no step with selected turns (csd/turns_selected)",
                       unit="share")
    ok = sum(a for a, _ in rows)
    return make_effect(ok / den, proportion_ci(int(ok), int(den), rows), target, ok / den >= 0.3, unit="share",
                       n=int(den), ci_unit="step (bootstrap) and turn (Wilson)", steps=len(rows))


def rank_spread(agent_summary: Mapping[str, Any] | None) -> dict:
    """Max - min overall Mean Rank over the methods (``eval/agent_eval/summary.json``): do the methods differ at
    all? Target: > 0. CI: bootstrap over the (user, gym) columns the MR averages (gyms with an invalid cell left
    out, as in the summary), ranks recomputed per column."""
    from mimesis_lab.evals.metrics import mean_and_rank_report

    target = "> 0"
    mr = ((agent_summary or {}).get("overall") or {}).get("mean_rank") or {}
    mr = {m: float(v) for m, v in mr.items() if isinstance(v, (int, float))}
    if len(mr) < 2:
        return missing(target, "eval/agent_eval/summary.json has fewer than 2 methods with an overall MR",
                       unit="rank")
    cells = agent_summary.get("cells") or {}
    methods = sorted(mr)
    table = {m: {f"{u}/{g}": (c or {}).get("score") for u, by_gym in (cells.get(m) or {}).items()
                 for g, c in by_gym.items()} for m in methods}
    cols: list[list[float]] = []
    try:
        rep = mean_and_rank_report(table)
        cols = [[rep.ranks[m][e] for m in methods] for e in rep.environments]
    except ValueError:       # cells absent or every column invalid: the summary's MR still stands, no CI
        pass
    stat = lambda rows: float(rows.mean(axis=0).max() - rows.mean(axis=0).min())  # noqa: E731
    value = max(mr.values()) - min(mr.values())
    return make_effect(value, bootstrap_ci(cols, stat), target, value > 0, unit="rank", n=len(cols),
                       ci_unit="user × gym", mean_rank=mr)


# ----------------------------------------------------------------------------- all together
@dataclass
class EffectInputs:
    """Everything the effects read, already loaded (``None`` = absent). Agent / simulator names are those of
    ``agent_eval.agents`` / ``sim_eval.simulators``; ``identical`` maps a phase to the phase whose final weights it
    equals (``{"sim_rl": "sft"}``)."""

    midtrain: dict | None = None
    sft: dict | None = None
    sim_rl_steps: list | None = None
    sim_rl_rollouts: list | None = None
    sim_records: dict | None = None
    agent_summary: dict | None = None
    agent_rollouts: list | None = None
    csd_steps: list | None = None
    grpo_steps: list | None = None
    sims: dict = field(default_factory=lambda: {"trained": "mimesis", "sft": "sft", "base": "base"})
    agents: dict = field(default_factory=lambda: {"agent_sft": "base", "agent_grpo": "grpo", "agent_csd": "csd"})
    train_gyms: list | None = None
    identical: dict = field(default_factory=dict)


def user_guidance(steps: Sequence[Mapping[str, Any]] | None) -> str | None:
    """What the format grammar did to the training user over an agent RL run (``user/guided_*`` of its
    ``metrics.jsonl``, :mod:`mimesis_lab.rollout.think_guide`), as a sentence for the report, or ``None`` when the
    user decoded freely. Agent effects are read knowing how much of the environment was the grammar."""
    tot = {k: 0.0 for k in ("guided_requests", "guided_replies", "guided_forced_close")}
    for r in steps or []:
        m = r.get("metrics") or {}
        for k in tot:
            v = m.get(f"user/{k}")
            if isinstance(v, (int, float)) and math.isfinite(v):
                tot[k] += v
    n = int(tot["guided_requests"])
    if n <= 0:
        return None
    over, closed = int(tot["guided_replies"]), int(tot["guided_forced_close"])
    return (f"the training user decoded under the format grammar (agent_rl.user.think_format): it overrode the "
            f"simulator's most likely token in {over} of {n} replies ({100 * over / n:.0f}%) and closed {closed} "
            f"think blocks for lack of room (agent_grpo)")


#: :func:`csd_note_use` says the notes "barely steer" the agent while its mean gate is within this of 1/2 (|delta| below
#: about 0.04 nats a token at the default beta 5).
NOTE_GATE_MARGIN = 0.05
#: With the split by kind of note: "barely steer" while the token-weighted mean of |real − placebo| over the kinds is
#: below this (nats a token; the gate margin's equivalent at beta 5).
NOTE_DELTA_MARGIN = 0.04


def csd_note_use(steps: Sequence[Mapping[str, Any]] | None) -> str | None:
    """Does the agent read the coach's notes? From ``models/agent_csd/metrics.jsonl``, token-weighted over the
    steps: ``delta`` = teacher log-prob of the sampled token under the real note − under a placebo note (the CSD
    gate's argument, SPEC §3.3 item 7; ``g = sigmoid(beta * delta)``, 1/2 where the note makes no difference) and
    teacher − student (what putting any note in the context does). A sentence for the ``csd_vs_grpo`` report
    line, or ``None`` without coached tokens with a placebo row: CSD moves the student towards its coached teacher
    only as far as the note, not the placebo, changes what the teacher would say; within :data:`NOTE_GATE_MARGIN`
    of a gate of 1/2 the sentence says the notes barely steer the agent. Where the job logged the split by kind of
    note (``csd/placebo_delta_mean/<kind>`` over ``csd/placebo_tokens/<kind>``), the sentence ends with real −
    placebo per kind, the most coached first, and the verdict reads the kinds instead: notes that steer the teacher
    in opposite directions (up for a reply that takes the recommended action, down for an approach the user turned
    down) cancel in the overall mean, so the verdict is the token-weighted mean of |real − placebo| over the kinds
    against :data:`NOTE_DELTA_MARGIN`."""
    tok = plac = d = g = ts = 0.0
    kinds: dict[str, list[float]] = {}
    for r in steps or []:
        m = r.get("metrics") or {}
        for key, v in m.items():
            if key.startswith("csd/placebo_delta_mean/"):
                k = key.rsplit("/", 1)[1]
                n_k = m.get(f"csd/placebo_tokens/{k}")
                if isinstance(n_k, (int, float)) and n_k > 0 and isinstance(v, (int, float)) and math.isfinite(v):
                    acc = kinds.setdefault(k, [0.0, 0.0])
                    acc[0], acc[1] = acc[0] + n_k, acc[1] + n_k * v
        n, share = m.get("csd/tokens"), m.get("csd/placebo_token_share")
        vals = [m.get(k) for k in ("csd/delta_mean", "csd/gate_mean", "csd/teacher_minus_student")]
        if not isinstance(n, (int, float)) or n <= 0 or not isinstance(share, (int, float)) or share <= 0 \
                or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
            continue
        tok += n
        plac += n * share
        d, g, ts = d + n * vals[0], g + n * vals[1], ts + n * vals[2]
    if tok <= 0:
        return None
    gate = g / tok
    by_kind = ", ".join(f"{k} {v / n:+.3f} ({int(n)})" for k, (n, v) in sorted(kinds.items(), key=lambda kv: -kv[1][0]))
    if kinds:
        spread = sum(abs(v) for _, v in kinds.values()) / sum(n for n, _ in kinds.values())
        by_kind += f"; |real − placebo| weighted over the kinds {spread:.3f} a token"
        barely = spread < NOTE_DELTA_MARGIN
    else:
        barely = abs(gate - 0.5) < NOTE_GATE_MARGIN
    verdict = "barely steer the agent" if barely else "steer the agent"
    return (f"the coach's notes {verdict}: on its {int(tok)} coached tokens ({100 * plac / tok:.0f}% with a placebo "
            f"row) the teacher's log-prob of the sampled token under the real note minus under a placebo note is "
            f"{d / tok:+.3f} a token (gate {gate:.2f}; 0.50 = the note makes no difference), and with a note in the "
            f"context the teacher gives the sampled tokens {ts / tok:+.3f} a token against the student without one "
            f"(agent_csd)" + (by_kind and f"; real − placebo by the note's kind (tokens): {by_kind}"))


def _with_note(e: dict, note: str | None) -> dict:
    if note:
        e["diagnosis"] = f"{e['diagnosis']}; {note}" if e.get("diagnosis") else note
    return e


def _with_behaviour_note(e: dict) -> dict:
    return _with_note(e, _behaviour_note(e))


def compute_effects(x: EffectInputs) -> dict[str, dict]:
    """Every effect of :data:`PHASE_OF`, in that order (each with its ``phase``); the agent effects carry
    :func:`user_guidance` as their diagnosis when the training user was guided."""
    same = x.identical
    warm, grpo, csd = (x.agents.get(k) for k in ("agent_sft", "agent_grpo", "agent_csd"))
    gyms_all = sorted({r["gym"] for r in x.agent_rollouts or []})
    train = [g for g in gyms_all if x.train_gyms is None or g in x.train_gyms]
    held = [g for g in gyms_all if x.train_gyms is not None and g not in x.train_gyms]
    t, s, b = x.sims.get("trained"), x.sims.get("sft"), x.sims.get("base")
    out = {
        "midtrain_loss_ratio": midtrain_loss_ratio(x.midtrain),
        "midtrain_vs_unigram": midtrain_vs_unigram(x.midtrain),
        "sft_format_rate": sft_format_rate(x.sft),
        "sim_rl_reward_gain": _with_behaviour_note(_with_copy_diagnosis(
            _flag_identical(sim_rl_reward_gain(x.sim_rl_steps, x.sim_rl_rollouts), same.get("sim_rl"), "sim_rl"),
            x.sft)),
        "sim_rl_format_failure_end": sim_rl_format_failure_end(x.sim_rl_steps, x.sim_rl_rollouts),
        "sim_eval_vs_sft": sim_eval_vs(x.sim_records, t, s, "behavior", same.get("sim_rl")),
        "sim_eval_vs_sft_fi": sim_eval_vs(x.sim_records, t, s, "fi", same.get("sim_rl")),
        "sim_eval_vs_base": sim_eval_vs(x.sim_records, t, b, "behavior"),
        "sim_eval_vs_base_fi": sim_eval_vs(x.sim_records, t, b, "fi"),
        "grpo_vs_warm_start_train": agent_vs(x.agent_rollouts, grpo, warm, train, same_as=same.get("agent_grpo")),
        "grpo_vs_warm_start_heldout": (agent_vs(x.agent_rollouts, grpo, warm, held, same_as=same.get("agent_grpo"))
                                       if held or not x.agent_rollouts else
                                       missing("> 0, CI excludes 0", "no held-out gym was evaluated", unit="reward")),
        "user_matters": user_matters(x.agent_rollouts, grpo),
        "csd_coach_note_rate": csd_coach_note_rate(x.csd_steps),
        "csd_vs_grpo": agent_vs(x.agent_rollouts, csd, grpo, None, target=">= 0", need_ci=False,
                                same_as=same.get("agent_csd")),
        "rank_spread": rank_spread(x.agent_summary),
    }
    guided = user_guidance(x.grpo_steps)
    for k, e in out.items():
        e["phase"] = PHASE_OF[k]
        if k in ("grpo_vs_warm_start_train", "grpo_vs_warm_start_heldout", "csd_vs_grpo"):
            _with_note(e, guided)
    _with_note(out["csd_vs_grpo"], csd_note_use(x.csd_steps))
    return out


# ----------------------------------------------------------------------------- reading (the flow's side)
def weights_sha256(folder: str | Path) -> str | None:
    """sha256 over the weight files (``*.safetensors`` / ``*.bin``, by name and content) of a checkpoint
    folder; ``None`` when there are none. Equal hashes = identical weights."""
    p = Path(folder)
    files = sorted(f for f in p.glob("*") if f.is_file() and f.suffix in (".safetensors", ".bin")) if p.is_dir() else []
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def read_jsonl(path: str | Path) -> list[dict] | None:
    """The records of a JSON-lines file, or ``None`` when it does not exist."""
    p = Path(path)
    if not p.is_file():
        return None
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def load_inputs(*, midtrain: str | Path, sft: str | Path, sim_rl_dir: str | Path, sim_eval_dir: str | Path,
                agent_eval_dir: str | Path, csd_metrics: str | Path, checkpoints: Mapping[str, str | Path],
                grpo_metrics: str | Path | None = None,
                sims: Mapping[str, str], agents: Mapping[str, str], train_gyms: Sequence[str] | None,
                pairs: Sequence[tuple[str, str]] = (("sim_rl", "sft"), ("agent_grpo", "agent_sft"),
                                                    ("agent_csd", "agent_grpo"))) -> tuple[EffectInputs, dict]:
    """Read every input of :func:`compute_effects`; returns it and ``{phase: weights sha256 | None}``.

    ``checkpoints`` maps phases to their final folders; a pair of ``pairs`` whose hashes are equal (and known) is
    recorded in ``EffectInputs.identical``."""
    sim_dir = Path(sim_eval_dir)
    recs = {n: read_jsonl(sim_dir / n / "records.jsonl") for n in sims.values() if n}
    sha = {ph: weights_sha256(p) for ph, p in checkpoints.items()}
    identical = {a: b for a, b in pairs if sha.get(a) and sha.get(a) == sha.get(b)}
    x = EffectInputs(
        midtrain=_json(Path(midtrain)), sft=_json(Path(sft)),
        sim_rl_steps=read_jsonl(Path(sim_rl_dir) / "metrics.jsonl"),
        sim_rl_rollouts=read_jsonl(Path(sim_rl_dir) / "rollouts.jsonl"),
        sim_records={k: v for k, v in recs.items() if v is not None} or None,
        agent_summary=_json(Path(agent_eval_dir) / "summary.json"),
        agent_rollouts=read_jsonl(Path(agent_eval_dir) / "rollouts.jsonl"),
        csd_steps=read_jsonl(csd_metrics), grpo_steps=read_jsonl(grpo_metrics) if grpo_metrics else None,
        sims=dict(sims), agents=dict(agents),
        train_gyms=list(train_gyms) if train_gyms is not None else None, identical=identical)
    return x, sha
