"""The comparison report (SPEC §4): "Does it work?" first (the effects of :mod:`mimesis_lab.evals.effects`
against their targets), then paper Table 2 shape, simulator benchmarks, plots.

Pure functions from the ``sim_eval`` / ``agent_eval`` summaries (their JSON shapes are documented
in :mod:`mimesis_lab.evals.sim_eval` and :mod:`mimesis_lab.evals.agent_eval`) to markdown, CSV
rows (DVC plots) and PNG files (MLflow artifacts). Invalid cells are printed as ``invalid (n)``,
never as 0; a missing value is ``–``.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["fmt", "effects_markdown", "SYNTHETIC_NOTE", "table2_markdown", "per_gym_markdown", "sim_markdown",
           "training_curves", "curve_rows", "per_gym_rows", "fi_rows", "write_csv", "write_plots", "headline",
           "report_markdown"]

FI_DIMS = ("persona", "style", "technical_competency", "information_flow", "pacing")
SIM_COLUMNS = (("fi", "FI"), ("d1", "D1"), ("d2", "D2"), ("d3", "D3"), ("d4", "D4"), ("ece", "ECE"),
               ("usi5", "USI5"), ("turing_distance", "Turing dist. ↓"))


def fmt(v: Any, digits: int = 2) -> str:
    """A number for a table; ``None``/NaN -> ``–``."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        return f"{v:.{digits}f}"
    return str(v)


def _best(values: Mapping[str, Any], lower: bool = False) -> set[str]:
    nums = {k: v for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    if len(nums) < 2 or len(set(nums.values())) == 1:   # nothing to single out when all are tied
        return set()
    target = (min if lower else max)(nums.values())
    return {k for k, v in nums.items() if v == target}


SYNTHETIC_NOTE = (
    "**Read this first.** The default data is a seeded synthetic world (`mimesis_lab/world`: one population of "
    "users from which every raw input is drawn), and the default models are tiny and trained for minutes on CPU. "
    "This miniature shows the mechanism end to end, not the paper's effect sizes; a failing target says which "
    "phase does not yet do its job here. Run the same pipeline on real data and checkpoints (`configs/paper/`) to "
    "test the claims.")

EFFECT_LABELS = {
    "midtrain_loss_ratio": "final / initial val loss",
    "midtrain_vs_unigram": "final val loss − unigram loss",
    "sft_format_rate": "well-formed `<think>…</think>utterance` (sampled)",
    "sim_rl_reward_gain": "behaviour reward, last − first window",
    "sim_rl_format_failure_end": "format failures, last window",
    "sim_eval_vs_sft": "behaviour reward, MIMESIS − SFT simulator",
    "sim_eval_vs_sft_fi": "FI, MIMESIS − SFT simulator",
    "sim_eval_vs_base": "behaviour reward, MIMESIS − base simulator",
    "sim_eval_vs_base_fi": "FI, MIMESIS − base simulator",
    "grpo_vs_warm_start_train": "GRPO − warm start, training gyms",
    "grpo_vs_warm_start_heldout": "GRPO − warm start, held-out gyms",
    "user_matters": "evaluation user changes the score (max − min user)",
    "csd_coach_note_rate": "coach wrote a note, share of selected turns",
    "csd_vs_grpo": "CSD − GRPO",
    "rank_spread": "overall MR, max − min over methods",
}


def _result(e: Mapping[str, Any]) -> str:
    if e.get("identical_to"):
        return "**FAIL** (identical weights)"
    if e.get("value") is None:
        return "**MISSING**"
    return "PASS" if e.get("passed") else "**FAIL**"


def effects_markdown(effects: Mapping[str, Mapping[str, Any]], identical: Mapping[str, str] | None = None) -> str:
    """The "Does it work?" section: one row per effect (phase, value, 95% CI, target, n, PASS/FAIL/MISSING), the
    identical-checkpoint flags and the notes (missing inputs, CIs that cannot be computed)."""
    lines = ["## Does it work?", "", SYNTHETIC_NOTE, ""]
    for a, b in (identical or {}).items():
        lines.append(f"- ⚠ **Identical checkpoints:** the final weights of `{a}` equal those of `{b}` (sha256 of the "
                     f"weight files): `{a}` changed nothing, and the effects that compare them are marked FAIL.")
    if identical:
        lines.append("")
    passed = sum(1 for e in effects.values() if e.get("passed"))
    absent = sum(1 for e in effects.values() if e.get("value") is None)
    lines += [f"{passed} of {len(effects)} targets met, {absent} missing. 95% CIs are percentile bootstraps over "
              "the unit named in the notes (seeded, deterministic).", "",
              "| Phase | Effect | Value | 95% CI | Target | n | Result |", "|---|---|---|---|---|---|---|"]
    notes = []
    for name, e in effects.items():
        ci = e.get("ci")
        ci_s = f"[{fmt(ci[0], 3)}, {fmt(ci[1], 3)}]" if ci else "–"
        lines.append(f"| {e.get('phase', '')} | {EFFECT_LABELS.get(name, name)} (`{name}`) | {fmt(e.get('value'), 3)} "
                     f"| {ci_s} | {e.get('target')} | {e.get('n', '–')} | {_result(e)} |")
        why = [e[k] for k in ("missing_reason", "ci_note") if e.get(k)]
        if e.get("ci_unit") and ci:
            why.append(f"CI unit: {e['ci_unit']}")
        if e.get("diagnosis"):
            why.append(str(e["diagnosis"]))
        if why:
            notes.append(f"- `{name}`: " + "; ".join(why) + ".")
    return "\n".join(lines + ([""] + notes if notes else []))


def table2_markdown(agent: Mapping[str, Any]) -> str:
    """Methods × evaluation users, Mean and MR per user and overall (paper Table 2 shape).

    Mean is higher-better, MR lower-better; the best per column is bold. Both are shown because
    they can disagree (SPEC §4.2)."""
    users = list(agent.get("per_user", {}))
    methods = list(agent.get("overall", {}).get("mean", {}))
    head = "| Method | " + " | ".join(f"{u} Mean | {u} MR" for u in users) + " | **Overall Mean** | **Overall MR** |"
    sep = "|---|" + "---|---|" * len(users) + "---|---|"
    cols: list[tuple[dict[str, Any], bool]] = []
    for u in users:
        cols.append((agent["per_user"][u].get("mean", {}), False))
        cols.append((agent["per_user"][u].get("mean_rank", {}), True))
    cols.append((agent["overall"].get("mean", {}), False))
    cols.append((agent["overall"].get("mean_rank", {}), True))
    lines = [head, sep]
    for m in methods:
        cells = []
        for values, lower in cols:
            s = fmt(values.get(m))
            cells.append(f"**{s}**" if m in _best(values, lower) else s)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(c: Mapping[str, Any] | None) -> str:
    if not c:
        return "–"
    if c.get("status") == "invalid" or c.get("score") is None:
        return f"invalid ({c.get('invalid', 0)}/{c.get('rollouts', 0)})"
    extra = f" ({c['invalid']} inv.)" if c.get("invalid") else ""
    return fmt(c.get("score")) + extra


def per_gym_markdown(agent: Mapping[str, Any]) -> str:
    """One table per evaluation user: gyms × methods (TravelGym also micro_avg / micro_max)."""
    cells = agent.get("cells", {})
    methods = list(cells)
    users = list(next(iter(cells.values()), {}))
    out = []
    for u in users:
        gyms = list(cells[methods[0]].get(u, {})) if methods else []
        out.append(f"#### Evaluation user `{u}`\n")
        out.append("| Gym | " + " | ".join(methods) + " |")
        out.append("|---|" + "---|" * len(methods))
        for g in gyms:
            row = [_cell(cells[m].get(u, {}).get(g)) for m in methods]
            out.append(f"| {g} | " + " | ".join(row) + " |")
            if g == "travel":
                for k in ("micro_avg", "micro_max"):
                    vals = [fmt((cells[m].get(u, {}).get(g) or {}).get(k)) for m in methods]
                    out.append(f"| travel {k} | " + " | ".join(vals) + " |")
        out.append("")
    return "\n".join(out)


def sim_markdown(sim: Mapping[str, Any]) -> str:
    """Simulators × benchmarks (FI with CI, D1–D4, ECE, USI5, Turing distance, behaviour, SOUL)."""
    sims = sim.get("simulators", {})
    head = "| Simulator | " + " | ".join(lbl for _, lbl in SIM_COLUMNS) + " | Behaviour reward | SOUL (± s.e.) |"
    lines = [head, "|---|" + "---|" * (len(SIM_COLUMNS) + 2)]
    for name, s in sims.items():
        row = []
        for key, _ in SIM_COLUMNS:
            v = fmt(s.get(key))
            if key == "fi" and s.get("fi_ci"):
                lo, hi = s["fi_ci"]
                v += f" [{fmt(lo, 1)}, {fmt(hi, 1)}]"
            row.append(v)
        b = s.get("behavior") or {}
        soul = s.get("soul") or {}
        row.append(f"{fmt(b.get('reward'))} ± {fmt(b.get('reward_se'))}")
        row.append(f"{fmt(soul.get('mean'))} ± {fmt(soul.get('se'))}")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append("Fidelity per dimension (%):\n")
    lines.append("| Simulator | " + " | ".join(FI_DIMS) + " |")
    lines.append("|---|" + "---|" * len(FI_DIMS))
    for name, s in sims.items():
        per = s.get("fi_per_dim") or {}
        lines.append(f"| {name} | " + " | ".join(fmt(per.get(d), 1) for d in FI_DIMS) + " |")
    lines.append("")
    lines.append("Failures (counted, excluded from the scores):\n")
    lines.append("| Simulator | judge failures | parse failures | invalid |")
    lines.append("|---|---|---|---|")
    for name, s in sims.items():
        c = s.get("counts") or {}
        inv = c.get("invalid") or {}
        inv_s = ", ".join(f"{k}: {v}" for k, v in inv.items() if v) or "0"
        lines.append(f"| {name} | {c.get('judge_failures', 0)} | {c.get('parse_failures', 0)} | {inv_s} |")
    return "\n".join(lines)


def training_curves(paths: Mapping[str, str | Path], key: str = "reward/mean") -> dict[str, list[tuple[int, float]]]:
    """``{method: [(step, value), ...]}`` from each training run's ``metrics.jsonl`` (train records)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for method, p in paths.items():
        f = Path(p)
        if not f.is_file():
            continue
        pts = []
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            v = (r.get("metrics") or {}).get(key)
            if r.get("kind") == "train" and isinstance(v, (int, float)) and math.isfinite(v):
                pts.append((int(r.get("step", len(pts) + 1)), float(v)))
        out[method] = pts
    return out


def curve_rows(curves: Mapping[str, Sequence[tuple[int, float]]]) -> list[dict[str, Any]]:
    return [{"method": m, "step": s, "reward": v} for m, pts in curves.items() for s, v in pts]


def per_gym_rows(agent: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (method, user, gym); invalid cells carry ``score`` empty and ``status`` invalid."""
    rows = []
    for m, by_user in agent.get("cells", {}).items():
        for u, by_gym in by_user.items():
            for g, c in by_gym.items():
                rows.append({"method": m, "user": u, "gym": g, "score": c.get("score"),
                             "status": c.get("status"), "invalid": c.get("invalid", 0)})
    return rows


def fi_rows(sim: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"simulator": n, "dimension": d, "score": (s.get("fi_per_dim") or {}).get(d)}
            for n, s in sim.get("simulators", {}).items() for d in FI_DIMS]


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(fields))
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    return path


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(out_dir: str | Path, sim: Mapping[str, Any] | None, agent: Mapping[str, Any] | None,
                curves: Mapping[str, Sequence[tuple[int, float]]]) -> list[Path]:
    """PNG plots: training reward curves (GRPO vs CSD), per-gym bars per evaluation user, FI per
    dimension. Invalid cells are drawn as hatched empty bars labelled ``invalid``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if any(curves.values()):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for m, pts in curves.items():
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", ms=3, label=m)
        ax.set_xlabel("training step")
        ax.set_ylabel("mean reward")
        ax.set_title("Agent training reward")
        ax.legend()
        written.append(_save(plt, fig, out / "reward_curves.png"))
    if agent and agent.get("cells"):
        cells = agent["cells"]
        methods = list(cells)
        users = list(cells[methods[0]])
        fig, axes = plt.subplots(len(users), 1, figsize=(8, 2.8 * len(users)), squeeze=False)
        for ax, u in zip(axes[:, 0], users):
            gyms = list(cells[methods[0]][u])
            width = 0.8 / max(1, len(methods))
            for i, m in enumerate(methods):
                for j, g in enumerate(gyms):
                    c = cells[m][u].get(g) or {}
                    x = j + i * width
                    if c.get("score") is None:
                        ax.bar(x, 0.02, width, color="none", edgecolor="grey", hatch="//")
                        ax.text(x, 0.03, "invalid", rotation=90, fontsize=6, ha="center", va="bottom")
                    else:
                        ax.bar(x, c["score"], width, color=f"C{i}", label=m if j == 0 else None)
            ax.set_xticks([j + width * (len(methods) - 1) / 2 for j in range(len(gyms))], gyms, fontsize=7)
            ax.set_title(f"evaluation user: {u}", fontsize=9)
            ax.set_ylabel("score")
            ax.legend(fontsize=7)
        written.append(_save(plt, fig, out / "per_gym.png"))
    if sim and sim.get("simulators"):
        sims = sim["simulators"]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / max(1, len(sims))
        for i, (n, s) in enumerate(sims.items()):
            per = s.get("fi_per_dim") or {}
            ax.bar([j + i * width for j in range(len(FI_DIMS))], [per.get(d) or 0.0 for d in FI_DIMS], width,
                   label=n, color=f"C{i}")
        ax.set_xticks([j + width * (len(sims) - 1) / 2 for j in range(len(FI_DIMS))],
                      [d.replace("_", "\n") for d in FI_DIMS], fontsize=7)
        ax.set_ylabel("match %")
        ax.set_title("Fidelity per dimension")
        ax.legend(fontsize=7)
        written.append(_save(plt, fig, out / "fi_dims.png"))
    return written


def headline(sim: Mapping[str, Any] | None, agent: Mapping[str, Any] | None) -> dict[str, float]:
    """Flat headline numbers for ``metrics/report.json`` (finite values only)."""
    out: dict[str, float] = {}
    for n, s in ((sim or {}).get("simulators") or {}).items():
        for k in ("fi", "usi5", "ece", "turing_distance"):
            if isinstance(s.get(k), (int, float)):
                out[f"sim.{n}.{k}"] = float(s[k])
    ov = (agent or {}).get("overall") or {}
    for kind in ("mean", "mean_rank"):
        for m, v in (ov.get(kind) or {}).items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[f"agent.{m}.{kind}"] = float(v)
    if agent:
        out["agent.invalid_cells"] = float((agent.get("counts") or {}).get("invalid_cells", 0))
    return out


def tasks_by_user_line(agent: Mapping[str, Any]) -> str | None:
    """One line naming how many tasks a gym each evaluation user played (``settings.tasks_by_user``), or None
    when every user played the same tasks."""
    by_user = ((agent.get("settings") or {}).get("tasks_by_user")) or {}
    counts = {u: sorted(set(g.values())) for u, g in by_user.items() if g}
    if len({tuple(c) for c in counts.values()}) <= 1:
        return None

    def span(c: list[int]) -> str:
        return str(c[0]) if len(c) == 1 else f"{c[0]}–{c[-1]}"
    return ("Tasks a gym, per evaluation user (each user plays the first of the same ordered list, so the users "
            "share their first tasks): " + ", ".join(f"`{u}` {span(c)}" for u, c in counts.items()) + ".")


def report_markdown(sim: Mapping[str, Any] | None, agent: Mapping[str, Any] | None,
                    curves: Mapping[str, Sequence[tuple[int, float]]], links: Mapping[str, str] | None = None,
                    plots: Sequence[str] = (), effects: Mapping[str, Mapping[str, Any]] | None = None,
                    identical: Mapping[str, str] | None = None) -> str:
    """The whole report; the "Does it work?" section (:func:`effects_markdown`) comes first."""
    parts = ["# MIMESIS comparison report", ""]
    if effects is not None:
        parts += [effects_markdown(effects, identical), ""]
    if links:
        parts += ["MLflow: " + ", ".join(f"[{k}]({v})" for k, v in links.items()), ""]
    if agent:
        c = agent.get("counts") or {}
        parts += ["## Agents across evaluation users (Table 2 shape)", "",
                  "Mean: mean score over gyms (higher is better). MR: mean rank over gyms (1 = best). "
                  "A gym where any method's cell is invalid (the evaluation user failed or refused) is left "
                  "out of that user's Mean and MR for every method, so the comparison stays paired.", "",
                  table2_markdown(agent), "",
                  *([line, ""] if (line := tasks_by_user_line(agent)) else []),
                  f"Rollouts: {c.get('rollouts', 0)} ({c.get('from_cache', 0)} from cache, {c.get('run', 0)} run), "
                  f"invalid rollouts: {c.get('invalid', 0)}, invalid cells: {c.get('invalid_cells', 0)}.", "",
                  "### Per gym", "", per_gym_markdown(agent), ""]
    if curves and any(curves.values()):
        parts += ["## Training reward (GRPO vs CSD)", ""]
        for m, pts in curves.items():
            if pts:
                k = max(1, len(pts) // 3)
                first = sum(v for _, v in pts[:k]) / k
                last = sum(v for _, v in pts[-k:]) / k
                parts.append(f"- {m}: {len(pts)} steps, mean reward first {k} steps {fmt(first, 3)} → "
                             f"last {k} steps {fmt(last, 3)}")
        parts.append("")
    if sim:
        parts += ["## Simulator benchmarks", "",
                  f"Judge: `{sim.get('judge')}`; fixed assistant: `{sim.get('assistant')}`; discriminator: "
                  f"`{sim.get('discriminator')}`. {sim.get('note', '')}", "", sim_markdown(sim), ""]
    if plots:
        parts += ["## Plots", ""] + [f"![{Path(p).stem}](plots/{Path(p).name})" for p in plots] + [""]
    return "\n".join(parts)
