"""CSD validity check: GRPO vs GRPO + CSD siblings over several seeds, both curves in MLflow.

Two settings on TravelGym (the agent learning-signal configuration, :mod:`scripts.agent_grpo_signal`):

- ``--variant topic`` (default): the scripted user's *private reasoning* lists the task's own hidden
  preferences while its public reply to a vague question stays vague ("Hmm, it depends."); a question
  about a preference's topic (e.g. "What about your budget?") gets that preference, which the gym
  rewards (+0.2 per elicited preference). So the reasoning carries task-specific information the
  public reply lacks, and the (offline, template) coach turns it into a prospective note naming the
  topics without values (the leak validator drops any note with a hidden preference or the answer).
  Notes differ per task, so placebo rows exist. The tiny agent is warm-started on the rewarded
  oracle traces in two forms: (A) a vague question, the vague reply, then search + answer; (B) the
  same with the coach's note as a user message after the vague reply, followed by a question about
  a named topic. So the model has learned to *read* a note (as an instruction-tuned LLM would), but
  without a note it does not ask about topics: the teacher knows something the student does not.
- ``--variant vague``: the earlier setting (one fixed user reasoning for every task).

For each seed the two runs share everything (initial agent, data, seed, batch shape); only
``alpha`` differs (0 → GRPO via the ``agent_grpo`` phase; ``--alpha`` → CSD via ``agent_csd``).
Reported: mean reward over the last ``--window`` steps per run, the mean over seeds per method, and
the per-step curves (MLflow experiment ``csd-validity``: one pair of sibling runs per seed, compare
``reward/mean``).

    python scripts/csd_validity.py --out /tmp/csd_validity [--seeds 11 12 13] [--steps 30] [--variant topic]
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import agent_grpo_signal as sig  # noqa: E402

PRIVATE_REPLY = ("<think>They have not asked about my budget or the location yet; I want something cheap near the "
                 "beach but I will only say it if asked.</think>Hmm, I am not sure, it depends.")


GENERIC_ASK = "What matters most to you for this trip?"
VAGUE = "Hmm, it depends."
_STOP = frozenset("with from that this have must only under over than your about what least more into".split())


def hidden_prefs(system: str) -> list[str]:
    """The ``- …`` lines under "Your private preferences" of TravelGym's user system prompt."""
    out, on = [], False
    for line in system.splitlines():
        if line.startswith("Your private preferences"):
            on = True
        elif on and line.startswith("- "):
            out.append(line[2:].strip())
        elif on:
            break
    return out


def pref_topics(pref: str) -> set[str]:
    """Words that make a question "about" ``pref``: its content words and the coach's category names."""
    from mimesis_lab.judges.coach import CATEGORIES

    words = {w for w in re.findall(r"[a-z][a-z-]{3,}", pref.lower()) if w not in _STOP}
    return words | {name for name, rx in CATEGORIES if rx.search(pref)}


def topic_answer(messages: list[dict]) -> tuple[str, str]:
    """(private reasoning, public reply) of the topic user for the user-side view ``messages``."""
    prefs = hidden_prefs(messages[0]["content"]) if messages else []
    said = " ".join(m["content"] for m in messages if m.get("role") == "assistant")
    remaining = [p for p in prefs if p not in said]
    q = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "").lower()
    hit = next((p for p in remaining if any(re.search(rf"\b{re.escape(t)}", q) for t in pref_topics(p))), None)
    reasoning = ("What I need and have not told them yet: " + "; ".join(remaining) + ". I only say it if they ask "
                 "about it.") if remaining else "They know everything I need."
    return reasoning, (hit.rstrip(".") + ".") if hit else VAGUE


def topic_reply_for(raw: bytes) -> str:
    """The scripted HTTP user of the ``topic`` variant (an OpenAI chat request body in, a reply out)."""
    reasoning, public = topic_answer(json.loads(raw).get("messages") or [])
    return f"<think>{reasoning}</think>{public}"


def coach_note(reasoning: str) -> str | None:
    """The template coach's prospective note for a turn after the vague reply."""
    from mimesis_lab.judges.coach import CoachInput, TemplateCoach

    return TemplateCoach().coach(CoachInput(history=[], reasoning=reasoning, next_utterance=VAGUE)).note


def topic_traces(rows: list[dict]) -> list[dict]:
    """Warm-start traces (A) and (B) of the ``topic`` variant, played through the real TravelGym."""
    import random as _random

    from mimesis_lab.envs.gyms.base import ScriptedUser
    from mimesis_lab.envs.gyms.experts import expert_actions
    from mimesis_lab.envs.gyms.registry import gym_for_row, load_tasks
    from mimesis_lab.judges.coach import TemplateCoach

    tasks = {"travel": load_tasks("travel")}
    out = []
    for row in rows:
        task = tasks["travel"].get(str(row["reward_model"]["id"]))
        oracle = expert_actions("travel", task) if task else None
        if not oracle:
            continue
        for noted in (False, True):
            user = ScriptedUser(lambda msgs: topic_answer(msgs)[1])
            gym = gym_for_row(row, tasks, user=user, rng=_random.Random(0), max_steps=16)
            messages = [dict(m) for m in row["prompt"]]
            first = gym.reset()
            if first:
                messages.append({"role": "tool", "content": first})
            steps: list[tuple[str, str] | str] = [("action", GENERIC_ASK)]
            if noted:
                reasoning = topic_answer([{"role": "system", "content": gym.user_system_prompt()},
                                          {"role": "user", "content": GENERIC_ASK}])[0]
                note = coach_note(reasoning)
                cats = TemplateCoach.categories(reasoning)
                if not note or not cats:
                    continue
                steps += [note, ("action", f"What about your {cats[0]}?")]
            steps += list(oracle)
            rewards = []
            for st in steps:
                if isinstance(st, str):
                    messages.append({"role": "user", "content": st})
                    continue
                choice, content = st
                messages.append({"role": "assistant", "content": f"[{choice}] {content}"})
                res = gym.step(choice, content)
                rewards.append(float(res.reward))
                if res.done:
                    break
                messages.append({"role": "tool", "content": f"{res.observation}\nReward: {res.reward:g}"})
            if sum(rewards) > 0:
                out.append({"messages": messages, "rewards": rewards, "total_reward": sum(rewards), "gym": "travel",
                            "task_id": str(row["reward_model"]["id"]), "noted": noted})
    return out


def csd_section(grpo: dict, alpha: float, out_dir: str) -> dict:
    sec = copy.deepcopy(grpo)
    sec.update(output_dir=out_dir, csd={"alpha": alpha, "beta": 5.0, "placebo": True, "placebo_min_pool": 8,
                                         "turns_per_trajectory": 2, "require_reply": False, "skip_gyms": [],
                                         "leak_check": True, "max_teacher_tokens": 2304,
                                         "coach": {"kind": "template", "style": "prospective"}})
    return sec


def run_pair(out: Path, seed: int, steps: int, uri: str, experiment: str, variant: str = "topic",
             alpha: float = 0.01) -> dict:
    work = out / f"seed{seed}"
    if variant == "topic":
        p = sig.build(work, steps=steps, tracking_uri=uri, experiment=experiment, seed=seed, traces_fn=topic_traces)
        reply_for = topic_reply_for
    else:
        sig.USER_REPLY = PRIVATE_REPLY
        p = sig.build(work, steps=steps, tracking_uri=uri, experiment=experiment, seed=seed, ask=True)
        reply_for = None
    params = yaml.safe_load(p.read_text())
    if variant == "topic":   # vague question, targeted question, search, answer
        params["agent_grpo"]["rollout"].update(max_turns=4, max_new_tokens=16)
    params["agent_csd"] = csd_section(params["agent_grpo"], alpha, str(work / "agent_csd"))
    p.write_text(yaml.safe_dump(params, sort_keys=False))
    res = {}
    for phase in ("agent_grpo", "agent_csd"):
        r = sig.run(p, work, timeout=3600, phase=phase, reply_for=reply_for)
        if r.returncode != 0:
            raise SystemExit(f"seed {seed} {phase} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        res[phase] = curve(work / phase)
    return res


def curve(run_dir: Path) -> list[float]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["metrics"].get("reward/mean", 0.0) for r in recs if r.get("kind") == "train"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--tracking-uri", default=None, help="default: <out>/mlflow.db")
    ap.add_argument("--experiment", default="csd-validity")
    ap.add_argument("--variant", choices=["topic", "vague"], default="topic")
    ap.add_argument("--alpha", type=float, default=0.01, help="CSD weight of the agent_csd runs")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = args.tracking_uri or f"sqlite:///{out / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{(Path.cwd() / uri[len('sqlite:///'):]).resolve()}"
    results = {}
    for seed in args.seeds:
        results[seed] = run_pair(out, seed, args.steps, uri, args.experiment, args.variant, args.alpha)
        tail = {k: sum(v[-args.window:]) / len(v[-args.window:]) for k, v in results[seed].items()}
        print(f"seed {seed}: last-{args.window} mean reward GRPO {tail['agent_grpo']:.3f} CSD {tail['agent_csd']:.3f}",
              flush=True)
    summary = {}
    for phase in ("agent_grpo", "agent_csd"):
        tails = [sum(r[phase][-args.window:]) / len(r[phase][-args.window:]) for r in results.values()]
        summary[phase] = {"mean_last_window": sum(tails) / len(tails), "per_seed": tails}
    summary["csd_minus_grpo"] = summary["agent_csd"]["mean_last_window"] - summary["agent_grpo"]["mean_last_window"]
    (out / "summary.json").write_text(json.dumps({"summary": summary, "curves": results}, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
