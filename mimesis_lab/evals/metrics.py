"""Simulator and agent evaluation metrics (SPEC §4; DESIGN §4 contracts).

Pure functions: plain Python sequences / mappings in, floats / dicts out, no I/O.
Every function validates its inputs and raises ``ValueError`` rather than guessing:
a missing judgement, a NaN statistic or an invalid cell is never silently read as 0.

Contents
--------
- :func:`fidelity_index`        RealUserSim PT3 Fidelity Index (paper eq. 14).
- :func:`dice`                  tau-USI per-feature Dice similarity (eq. 15).
- :func:`dice_mean`             one USI dimension D = mean Dice over its features.
- :func:`ece`                   tau-USI success calibration error over difficulty bins.
- :func:`usi5`                  tau-USI five-term mean (eq. 16).
- :func:`turing_distance`       SimulatorArena ``|a - 50|``.
- :func:`mean_and_rank`         agent evaluation Mean and Mean Rank (MR) per eval user.
- :func:`mean_and_rank_report`  the same plus ranks and the environments excluded as invalid.
- :func:`cluster_bootstrap_ci`  Fidelity Index CI by cluster bootstrap over user ids.
- :func:`mean_and_stderr`       SOUL-Index mean ± standard error over evaluation seeds.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from numbers import Real
from typing import Any, Hashable, Mapping, NamedTuple, Sequence

import numpy as np

#: The five RealUserSim PT3 judge dimensions (SPEC §4.1), in the paper's order.
PT3_DIMENSIONS: tuple[str, ...] = (
    "persona", "style", "technical_competency", "interaction_flow", "pacing",
)


# ----------------------------------------------------------------------------- helpers
def _is_invalid(x: Any) -> bool:
    """``None`` or a float NaN: an invalid (missing / failed) value."""
    return x is None or (isinstance(x, Real) and not isinstance(x, bool) and math.isnan(float(x)))


def _finite(x: Any, what: str, allow_bool: bool = False) -> float:
    """``x`` as a finite float, else ``ValueError`` naming ``what`` (bools only if allowed)."""
    if isinstance(x, (bool, np.bool_)):
        if allow_bool:
            return float(x)
        raise ValueError(f"{what}: expected a number, got the bool {x!r}")
    if not isinstance(x, Real):
        raise ValueError(f"{what}: expected a real number, got {x!r}")
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{what}: expected a finite number, got {x!r}")
    return v


# ------------------------------------------------------------------ RealUserSim PT3 (FI)
def fidelity_index(matches: Mapping[str, Sequence[int | bool]]) -> tuple[dict[str, float], float]:
    r"""RealUserSim PT3 per-dimension scores and Fidelity Index, in percent (paper eq. 14).

    .. math::
        \mathrm{score}_d = \frac{100}{N}\sum_{j=1}^{N} m_{j,d}, \qquad
        \mathrm{FI} = \frac{1}{|D|}\sum_{d\in D} \mathrm{score}_d

    ``matches[d][j] = m_{j,d} ∈ {0, 1}``: did the simulated user turns of example ``j``
    match the original user on dimension ``d`` (persona, style, technical competency,
    interaction/information flow, pacing — :data:`PT3_DIMENSIONS`; any keys are accepted).
    Bools and 0.0/1.0 are accepted. ``N`` is the number of evaluated examples and is the
    same for every dimension: lists of different lengths mean some judgements were dropped,
    which is an error (a failed judgement must be resolved upstream, not skipped or zeroed).

    Returns ``(per_dim, fi)``: ``per_dim`` maps each dimension (input order) to its score.
    Raises ``ValueError`` naming the dimension on an empty list, a value outside {0, 1}
    (including ``None``/NaN), or unequal lengths.
    """
    if not matches:
        raise ValueError("fidelity_index: no dimensions given")
    per_dim: dict[str, float] = {}
    lengths: dict[str, int] = {}
    for dim, vals in matches.items():
        vals = list(vals)
        if not vals:
            raise ValueError(f"fidelity_index: dimension {dim!r} has no judgements")
        total = 0
        for j, m in enumerate(vals):
            if isinstance(m, (bool, np.bool_)):
                m = int(m)
            if _is_invalid(m) or not isinstance(m, Real) or float(m) not in (0.0, 1.0):
                raise ValueError(f"fidelity_index: dimension {dim!r}, example {j}: "
                                 f"match must be 0 or 1, got {m!r}")
            total += int(m)
        lengths[dim] = len(vals)
        per_dim[dim] = 100.0 * total / len(vals)
    if len(set(lengths.values())) > 1:
        raise ValueError(f"fidelity_index: dimensions judged on different numbers of examples "
                         f"(N must be shared): {lengths}")
    return per_dim, sum(per_dim.values()) / len(per_dim)


# ---------------------------------------------------------------------------- tau-USI
def dice(sim: float, human: float) -> float:
    r"""Dice similarity of a simulator statistic and the human one, in percent (eq. 15).

    .. math:: \mathrm{Dice}(M_m, H_m) = 100\cdot\frac{2\min(M_m, H_m)}{M_m + H_m}

    for non-negative statistics ``sim = M_m`` and ``human = H_m`` of behaviour feature ``m``;
    both 0 → 100 (identical). Range [0, 100]; 100 = identical, 0 = one of them is 0.
    Raises ``ValueError`` on a negative, NaN/None or infinite statistic.
    """
    m = _finite(sim, "dice(sim)")
    h = _finite(human, "dice(human)")
    if m < 0 or h < 0:
        raise ValueError(f"dice: statistics must be non-negative, got sim={sim!r}, human={human!r}")
    if m == 0 and h == 0:
        return 100.0
    return 100.0 * 2.0 * min(m, h) / (m + h)


def dice_mean(sim_stats: Mapping[str, float], human_stats: Mapping[str, float]) -> float:
    r"""One USI behaviour dimension: ``D = (1/|F|) Σ_{m∈F} Dice(M_m, H_m)``, in percent.

    ``sim_stats`` / ``human_stats`` map feature name → statistic; they must have the same
    (non-empty) set of features, otherwise ``ValueError`` lists the mismatch.
    """
    if not sim_stats:
        raise ValueError("dice_mean: no features given")
    if set(sim_stats) != set(human_stats):
        raise ValueError(f"dice_mean: feature sets differ: only sim {sorted(set(sim_stats) - set(human_stats))}, "
                         f"only human {sorted(set(human_stats) - set(sim_stats))}")
    return sum(dice(sim_stats[f], human_stats[f]) for f in sim_stats) / len(sim_stats)


def ece(sim_success: Sequence[float], human_success: Sequence[float],
        bins: Sequence[Hashable]) -> float:
    r"""Success calibration error of a user simulator over difficulty bins (tau-USI).

    .. math::
        \mathrm{ECE} = \sum_b \frac{n_b}{n}\,\bigl|\overline{succ}_{sim}(b)
                       - \overline{succ}_{human}(b)\bigr|

    Input convention (one entry per **task**, the three sequences aligned):

    - ``sim_success[i]``: the agent's outcome on task ``i`` against the simulated user —
      0/1, or a success rate in [0, 1] when the task was run several times;
    - ``human_success[i]``: the **same agent's** outcome on task ``i`` against the human
      user (reference trajectories), 0/1 or a rate in [0, 1];
    - ``bins[i]``: the difficulty-bin label of task ``i`` (any hashable).

    ``n_b`` = number of tasks in bin ``b``, ``n`` = number of tasks;
    ``succ_sim(b)`` / ``succ_human(b)`` = mean of the task outcomes in bin ``b``.
    The result is a fraction in [0, 1] (lower = closer to human), as used by
    :func:`usi5` through ``(1 - ECE)*100``. Missing (None/NaN) or out-of-range outcomes and
    unequal lengths raise ``ValueError``: a task without a human or simulated outcome must
    be removed (and reported) by the caller, never counted as a failure.
    """
    n = len(bins)
    if n == 0:
        raise ValueError("ece: no tasks given")
    if len(sim_success) != n or len(human_success) != n:
        raise ValueError(f"ece: sim_success ({len(sim_success)}), human_success ({len(human_success)}) "
                         f"and bins ({n}) must be aligned per task")
    sums: dict[Hashable, list[float]] = {}
    for i, (s, h, b) in enumerate(zip(sim_success, human_success, bins)):
        sv = _finite(s, f"ece: sim_success[{i}]", allow_bool=True)
        hv = _finite(h, f"ece: human_success[{i}]", allow_bool=True)
        if not (0.0 <= sv <= 1.0 and 0.0 <= hv <= 1.0):
            raise ValueError(f"ece: task {i}: outcomes must lie in [0, 1], got sim={s!r}, human={h!r}")
        acc = sums.setdefault(b, [0.0, 0.0, 0])
        acc[0] += sv
        acc[1] += hv
        acc[2] += 1
    return sum((nb / n) * abs(ss / nb - hs / nb) for ss, hs, nb in sums.values())


def usi5(d1: float, d2: float, d3: float, d4: float, ece: float) -> float:
    r"""tau-USI five-term score (eq. 16): ``USI5 = mean(D1, D2, D3, D4, (1 - ECE)*100)``.

    ``d1..d4`` are the behaviour-dimension scores in percent ([0, 100], e.g. from
    :func:`dice_mean`): D1 tone/length/politeness, D2 information disclosure amount and
    per-turn placement, D3 clarification behaviour, D4 reaction to agent errors.
    ``ece`` is a **fraction** in [0, 1] (from :func:`ece`); passing a percentage such as
    6.9 raises ``ValueError``. (The original USI adds a survey-based evaluative term for a
    6-term mean; the paper has no survey, hence five terms.)
    """
    ds = []
    for name, d in (("d1", d1), ("d2", d2), ("d3", d3), ("d4", d4)):
        v = _finite(d, f"usi5({name})")
        if not 0.0 <= v <= 100.0:
            raise ValueError(f"usi5: {name} must be a percentage in [0, 100], got {d!r}")
        ds.append(v)
    e = _finite(ece, "usi5(ece)")
    if not 0.0 <= e <= 1.0:
        raise ValueError(f"usi5: ece must be a fraction in [0, 1], got {ece!r}")
    return (sum(ds) + (1.0 - e) * 100.0) / 5.0


# ------------------------------------------------------------------- SimulatorArena
def turing_distance(accuracy_pct: float) -> float:
    r"""SimulatorArena Turing distance ``|a - 50|`` (0..50, lower = harder to tell apart).

    ``accuracy_pct = a`` is the judge's human-vs-generated classification accuracy in
    percent; outside [0, 100] (or NaN) raises ``ValueError``.
    """
    a = _finite(accuracy_pct, "turing_distance(accuracy_pct)")
    if not 0.0 <= a <= 100.0:
        raise ValueError(f"turing_distance: accuracy must be a percentage in [0, 100], got {accuracy_pct!r}")
    return abs(a - 50.0)


# --------------------------------------------------------- agent evaluation (SPEC §4.2)
@dataclass(frozen=True)
class RankReport:
    """Result of :func:`mean_and_rank_report`.

    ``mean[method]`` and ``mean_rank[method]`` are computed over ``environments`` only;
    ``ranks[method][env]`` holds the per-environment ranks (1 = best, ties averaged);
    ``excluded[env]`` lists the methods whose cell in ``env`` was invalid (None/NaN).
    """
    mean: dict[str, float]
    mean_rank: dict[str, float]
    ranks: dict[str, dict[str, float]]
    environments: list[str]
    excluded: dict[str, list[str]]


def _average_ranks(values: Mapping[str, float]) -> dict[str, float]:
    """Rank 1 = highest value; equal values share the average of their positions."""
    order = sorted(values, key=lambda k: -values[k])
    ranks: dict[str, float] = {}
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        avg = (i + 1 + j + 1) / 2.0  # positions i+1 .. j+1
        for k in order[i:j + 1]:
            ranks[k] = avg
        i = j + 1
    return ranks


def mean_and_rank_report(scores: Mapping[str, Mapping[str, float | None]]) -> RankReport:
    r"""Mean and Mean Rank (MR) of methods over environments, with invalid cells reported.

    ``scores[method][env]`` is the score of ``method`` in environment ``env`` (higher is
    better) for one evaluation user. Over the set :math:`E` of **valid** environments:

    .. math::
        \mathrm{Mean}(k) = \frac{1}{|E|}\sum_{e\in E} s_{k,e}, \qquad
        \mathrm{MR}(k) = \frac{1}{|E|}\sum_{e\in E} \mathrm{rank}_e(k)

    where :math:`\mathrm{rank}_e` ranks the methods by :math:`s_{\cdot,e}` descending
    (1 = best) and tied methods share the average of their positions. Mean and MR can
    pick different winners (SPEC §4.2); report both.

    Invalid cells (SPEC §4.2 "invalid interactions are not zeros"): a ``None`` or NaN value
    marks a simulator failure (e.g. the user model refused the role). It is never read as
    0. Instead the whole environment is **excluded for every method**, so Mean and MR stay
    paired comparisons over one common set of environments; the excluded environments and
    the methods with invalid cells there are returned in ``excluded``.

    Raises ``ValueError`` when there are no methods, when methods do not cover exactly the
    same environments, on a non-numeric or infinite value, or when no valid environment
    remains.
    """
    if not scores:
        raise ValueError("mean_and_rank: no methods given")
    methods = list(scores)
    envs = list(scores[methods[0]])
    if not envs:
        raise ValueError(f"mean_and_rank: method {methods[0]!r} has no environments")
    env_set = set(envs)
    for m in methods[1:]:
        other = set(scores[m])
        if other != env_set:
            raise ValueError(f"mean_and_rank: method {m!r} has environments differing from "
                             f"{methods[0]!r}: missing {sorted(map(str, env_set - other))}, "
                             f"extra {sorted(map(str, other - env_set))}")
    excluded: dict[str, list[str]] = {}
    for e in envs:
        for m in methods:
            v = scores[m][e]
            if _is_invalid(v):
                excluded.setdefault(e, []).append(m)
            else:
                _finite(v, f"mean_and_rank: scores[{m!r}][{e!r}]")
    valid = [e for e in envs if e not in excluded]
    if not valid:
        raise ValueError(f"mean_and_rank: every environment has an invalid cell: {excluded}")
    ranks: dict[str, dict[str, float]] = {m: {} for m in methods}
    for e in valid:
        for m, r in _average_ranks({m: float(scores[m][e]) for m in methods}).items():
            ranks[m][e] = r
    mean = {m: sum(float(scores[m][e]) for e in valid) / len(valid) for m in methods}
    mean_rank = {m: sum(ranks[m].values()) / len(valid) for m in methods}
    return RankReport(mean=mean, mean_rank=mean_rank, ranks=ranks,
                      environments=valid, excluded=excluded)


def mean_and_rank(scores: Mapping[str, Mapping[str, float | None]]
                  ) -> tuple[dict[str, float], dict[str, float]]:
    r"""``(mean, mean_rank)`` per method over environments (DESIGN §4 contract).

    ``Mean(k) = (1/|E|) Σ_e s_{k,e}``; ``MR(k) = (1/|E|) Σ_e rank_e(k)`` with rank 1 = the
    highest score in environment ``e`` and ties sharing the average rank. Lower MR is better.

    Same semantics as :func:`mean_and_rank_report` (which also returns the per-environment
    ranks and the excluded environments). If any cell is invalid (None/NaN), its
    environment is excluded for all methods and a ``UserWarning`` names it — use
    :func:`mean_and_rank_report` to record the exclusions.
    """
    rep = mean_and_rank_report(scores)
    if rep.excluded:
        warnings.warn(f"mean_and_rank: environments excluded for all methods because of invalid "
                      f"cells (simulator failure, not agent failure): {rep.excluded}", stacklevel=2)
    return rep.mean, rep.mean_rank


# ------------------------------------------------------------------ uncertainty
class ClusterBootstrapCI(NamedTuple):
    """Point estimate, percentile CI bounds and bootstrap standard error."""
    estimate: float
    low: float
    high: float
    se: float


def cluster_bootstrap_ci(values: Sequence[float], clusters: Sequence[Hashable],
                         n_boot: int = 1000, alpha: float = 0.05,
                         seed: int = 0) -> ClusterBootstrapCI:
    r"""Percentile confidence interval of a mean by cluster bootstrap (resample clusters).

    ``values[i]`` is the value of example ``i`` and ``clusters[i]`` its cluster (for the
    Fidelity Index: the user id ``user_ip``/``hashed_ip``, so several conversations of one
    user move together). With :math:`K` distinct clusters, cluster sums :math:`S_c` and
    sizes :math:`n_c`, each replicate :math:`r` draws :math:`K` clusters
    :math:`c_1..c_K` with replacement and computes the pooled example mean

    .. math:: \hat\theta^{(r)} = \frac{\sum_k S_{c_k}}{\sum_k n_{c_k}}

    The estimate is the plain mean of ``values``; ``low``/``high`` are the
    :math:`\alpha/2` and :math:`1-\alpha/2` quantiles of the replicates; ``se`` is their
    sample standard deviation (ddof=1). For the FI pass per-conversation values
    ``100 * mean_d m_{j,d}`` (their mean equals FI, all dimensions sharing N); for one
    dimension pass ``100 * m_{j,d}``.

    Deterministic for a given ``seed`` and input order (clusters are indexed by first
    appearance, never by hash order). Raises ``ValueError`` on unequal lengths, missing /
    non-finite values, fewer than 2 clusters (no honest CI), ``n_boot < 2`` or
    ``alpha`` outside (0, 1).
    """
    n = len(values)
    if n == 0 or len(clusters) != n:
        raise ValueError(f"cluster_bootstrap_ci: need aligned non-empty values ({n}) and clusters ({len(clusters)})")
    if not (isinstance(n_boot, int) and n_boot >= 2):
        raise ValueError(f"cluster_bootstrap_ci: n_boot must be an integer >= 2, got {n_boot!r}")
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"cluster_bootstrap_ci: alpha must lie in (0, 1), got {alpha!r}")
    vals = [_finite(v, f"cluster_bootstrap_ci: values[{i}]") for i, v in enumerate(values)]
    index: dict[Hashable, int] = {}
    for c in clusters:
        index.setdefault(c, len(index))
    k = len(index)
    if k < 2:
        raise ValueError("cluster_bootstrap_ci: need at least 2 clusters for a cluster bootstrap")
    sums = np.zeros(k)
    counts = np.zeros(k)
    for v, c in zip(vals, clusters):
        sums[index[c]] += v
        counts[index[c]] += 1
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, k, size=(n_boot, k))
    reps = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    lo, hi = np.quantile(reps, [alpha / 2.0, 1.0 - alpha / 2.0])
    return ClusterBootstrapCI(estimate=float(np.mean(vals)), low=float(lo), high=float(hi),
                              se=float(np.std(reps, ddof=1)))


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float]:
    r"""Mean ± standard error over evaluation seeds (SOUL-Index: seeds 0 1 2).

    .. math:: \bar x = \frac1n\sum_i x_i, \qquad
              \mathrm{SE} = \frac{s}{\sqrt n},\quad s = \sqrt{\tfrac{1}{n-1}\sum_i (x_i-\bar x)^2}

    This is the spread of the *evaluation* seeds, not a training-seed variance nor a 95% CI.
    A missing seed score (None/NaN) raises ``ValueError`` rather than being dropped, so
    an aggregate with missing values never replaces a complete one; fewer than 2 values
    also raise (the standard error is undefined).
    """
    xs = []
    for i, v in enumerate(values):
        if _is_invalid(v):
            raise ValueError(f"mean_and_stderr: value {i} is missing ({v!r})")
        xs.append(_finite(v, f"mean_and_stderr: values[{i}]"))
    if len(xs) < 2:
        raise ValueError(f"mean_and_stderr: need at least 2 values, got {len(xs)}")
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return mean, math.sqrt(var) / math.sqrt(len(xs))
