"""CSD validity check: GRPO vs GRPO + CSD siblings over several seeds, both curves in MLflow.

Two settings on TravelGym (the agent learning-signal configuration, :mod:`scripts.agent_grpo_signal`):

- ``--variant topic`` (default): the scripted user's *private reasoning* lists the task's own hidden
  preferences while its public reply to a vague question stays vague ("Hmm, it depends."); a question
  about a preference's topic (e.g. "What about your budget?") gets that preference, which the gym
  rewards (+0.2 per elicited preference). So the reasoning carries task-specific information the
  public reply lacks, and the (offline, template) coach turns it into a prospective note naming the
  topic categories without values (the leak validator drops any note with a hidden preference or the
  answer). Notes differ per task, so placebo rows exist. An episode is the vague question and one
  more turn (``--max-turns 2``), so the reward is the elicitation reward alone: which topic the
  agent asks about after the vague reply.

  The tiny agent is warm-started (:func:`topic_traces`) on (A) the vague question, the vague reply
  and a question about *every* topic category, whatever the task — without a note it picks a topic
  blind to the task — and (B) the same with the task's coach note as a user message after the vague
  reply, followed by a question about a category the note names. A 2-layer model does not learn
  to copy an arbitrary category out of a note (``--warm-notes instruction``: the teacher then
  ignores the note, measured), so (B) uses the training tasks' own notes: the teacher — the same
  actor with the note in context — asks the right topic, the student does not. The summary's
  ``teacher_probe`` measures that on the initial agent: the sdar gate (``sigmoid(5 (t - p))``, the
  placebo note from another task) on right- vs wrong-topic tokens.
- ``--variant vague``: the earlier setting (one fixed user reasoning for every task).

For each seed the two runs share everything (initial agent, data, seed, batch shape); only
``alpha`` differs (0 → GRPO via the ``agent_grpo`` phase; ``--alpha`` → CSD via ``agent_csd``).
Reported: mean reward over the last ``--window`` steps per run, the mean over seeds per method, and
the per-step curves (MLflow experiment ``csd-validity``: one pair of sibling runs per seed, compare
``reward/mean``).

    python scripts/csd_validity.py --out /tmp/csd_validity [--seeds 11 12 13] [--steps 40] [--alpha 0.3]
"""
from __future__ import annotations

import argparse
import copy
import functools
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


def _play(row: dict, tasks: dict, steps: list) -> dict | None:
    """Play ``steps`` (``(choice, content)`` agent turns and ``str`` user messages) through the real
    TravelGym with the topic user; the trace if it earned a reward."""
    import random as _random

    from mimesis_lab.envs.gyms.base import ScriptedUser
    from mimesis_lab.envs.gyms.registry import gym_for_row

    gym = gym_for_row(row, tasks, user=ScriptedUser(lambda msgs: topic_answer(msgs)[1]), rng=_random.Random(0),
                      max_steps=16)
    messages = [dict(m) for m in row["prompt"]]
    first = gym.reset()
    if first:
        messages.append({"role": "tool", "content": first})
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
    if sum(rewards) <= 0:
        return None
    return {"messages": messages, "rewards": rewards, "total_reward": sum(rewards), "gym": "travel",
            "task_id": str(row["reward_model"]["id"])}


def note_for_task(row: dict, tasks: dict) -> tuple[str | None, list[str]]:
    """(the template coach's note after the vague reply, the topic categories it names) for ``row``."""
    import random as _random

    from mimesis_lab.envs.gyms.base import ScriptedUser
    from mimesis_lab.envs.gyms.registry import gym_for_row
    from mimesis_lab.judges.coach import TemplateCoach

    gym = gym_for_row(row, tasks, user=ScriptedUser(lambda msgs: VAGUE), rng=_random.Random(0), max_steps=16)
    gym.reset()
    reasoning = topic_answer([{"role": "system", "content": gym.user_system_prompt()},
                              {"role": "user", "content": GENERIC_ASK}])[0]
    return coach_note(reasoning), TemplateCoach.categories(reasoning)


def instruction_notes(rng, subsets: int = 3) -> list[tuple[str, list[str]]]:
    """Notes in the template coach's ``unmet`` wording naming topic categories chosen *without regard
    to any task*: every single category, then ``subsets`` random sets of 2–4 (in coach order)."""
    from mimesis_lab.judges.coach import CATEGORIES, NOTES

    names = [n for n, _ in CATEGORIES]
    sets = [[n] for n in names]
    for _ in range(subsets):
        pick = set(rng.sample(names, rng.randint(2, 4)))
        sets.append([n for n in names if n in pick])
    return [(NOTES["unmet"].format(cats=f" ({', '.join(c)})"), c) for c in sets]


def topic_traces(rows: list[dict], plain_copies: int = 2, subsets: int = 3, seed: int = 0,
                 task_note_copies: int = 0, instruction: bool = True) -> list[dict]:
    """Warm-start traces of the ``topic`` variant, played through the real TravelGym.

    (A) ``plain_copies`` times, for every task and every coach topic category: a vague question, the
    vague reply, a question about that category (whatever the task), then the oracle search + answer —
    so without a note the agent asks about *some* topic, chosen without regard to the task (what RL
    has to improve);
    (B) for every task, coaching notes each followed by a question about one of the categories the
    note names: with ``instruction``, notes in the coach's wording naming categories chosen at random
    (:func:`instruction_notes`) — instruction following without being taught which topic pays for
    which task (a 2-layer model does not learn it: its teacher ignores the note); with
    ``task_note_copies``, the task's own coach note (built from the user's private reasoning, as in
    the live post-pass) that many times — so the teacher, the same actor with the note in context,
    asks the right topic while the student, without it, does not."""
    import random as _random

    from mimesis_lab.envs.gyms.registry import load_tasks
    from mimesis_lab.judges.coach import CATEGORIES

    rng = _random.Random(seed)
    tasks = {"travel": load_tasks("travel")}
    out = []
    for row in rows:
        task = tasks["travel"].get(str(row["reward_model"]["id"]))
        oracle = sig.travel_oracle_actions(task) if task else []
        if not oracle:
            continue
        ask = ("action", GENERIC_ASK)
        for cat, _ in CATEGORIES:
            t = _play(row, tasks, [ask, ("action", f"What about your {cat}?"), *oracle])
            if t:
                out += [dict(t, noted=False)] * plain_copies
        notes = instruction_notes(rng, subsets) if instruction else []
        own, own_cats = note_for_task(row, tasks)
        if task_note_copies and own and own_cats:
            notes += [(own, own_cats)] * task_note_copies
        for note, cats in notes:
            for cat in cats:
                t = _play(row, tasks, [ask, note, ("action", f"What about your {cat}?"), *oracle])
                if t:
                    out.append(dict(t, noted=True))
    return out


WARM_NOTES = {
    # the training tasks' own coach notes (10 copies each): the teacher learns what a note means here
    "task": {"task_note_copies": 10, "instruction": False},
    # notes naming random categories only: the teacher must read the note (tiny models do not learn it)
    "instruction": {"task_note_copies": 0, "instruction": True},
    "both": {"task_note_copies": 3, "instruction": True},
}


def teacher_probe(model_dir: Path, beta: float = 5.0) -> dict:
    """On the agent in ``model_dir``: per task with a topic note, P(a right topic) for the student
    (no note) and the teacher (the task's note); and the sdar gate ``sigmoid(beta * (t - p))`` on
    the topic token, the placebo being every other task's (different) note — weighted by the student's
    probability of sampling that topic, split into right and wrong topics."""
    import math

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mimesis_lab.envs.gyms.registry import load_tasks
    from mimesis_lab.judges.coach import CATEGORIES

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    tasks = {"travel": load_tasks("travel")}
    rows = [sig.decode_row(r) for r in sig.travel_rows()]
    notes = {r["task_id"]: note_for_task(r, tasks) for r in rows}
    cats = [n for n, _ in CATEGORIES]
    cat_ids = {c: tok(" " + c, add_special_tokens=False)["input_ids"][0] for c in cats}

    def topic_logp(messages: list[dict]) -> dict[str, float]:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "[action] What about your"
        with torch.no_grad():
            logits = model(torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])).logits[0, -1]
        lp = torch.log_softmax(logits.float(), -1)
        return {c: lp[i].item() for c, i in cat_ids.items()}

    right, wrong, per_task = [0.0, 0.0], [0.0, 0.0], {}
    for row in rows:
        note, named = notes[row["task_id"]]
        if not note or not named:
            continue
        hist = [dict(m) for m in row["prompt"]] + [{"role": "assistant", "content": f"[action] {GENERIC_ASK}"},
                                                   {"role": "tool", "content": f"{VAGUE}\nReward: 0"}]
        s = topic_logp(hist)
        t = topic_logp(hist + [{"role": "user", "content": note}])
        per_task[row["task_id"]] = {"named": named, "p_right_student": sum(math.exp(s[c]) for c in named),
                                    "p_right_teacher": sum(math.exp(t[c]) for c in named)}
        for other, (pnote, _) in notes.items():
            if other == row["task_id"] or not pnote or pnote == note:
                continue
            p = topic_logp(hist + [{"role": "user", "content": pnote}])
            for c in cats:
                acc = right if c in named else wrong
                g = 1.0 / (1.0 + math.exp(-beta * (t[c] - p[c])))
                acc[0] += math.exp(s[c]) * g
                acc[1] += math.exp(s[c])
    return {"gate_right_topic": right[0] / right[1], "gate_wrong_topic": wrong[0] / wrong[1], "tasks": per_task}


def csd_section(grpo: dict, alpha: float, out_dir: str) -> dict:
    sec = copy.deepcopy(grpo)
    sec.update(output_dir=out_dir, csd={"alpha": alpha, "beta": 5.0, "placebo": True, "placebo_min_pool": 8,
                                         "turns_per_trajectory": 2, "require_reply": False, "skip_gyms": [],
                                         "leak_check": True, "max_teacher_tokens": 2304,
                                         "coach": {"kind": "template", "style": "prospective"}})
    return sec


def run_pair(out: Path, seed: int, steps: int, uri: str, experiment: str, variant: str = "topic",
             alpha: float = 0.01, sft_steps: int = 300, warm_notes: str = "task", turns: int = 2,
             max_turns: int = 2, init_from: Path | None = None, prompts: int = 8, rollouts: int = 4) -> dict:
    work = out / f"seed{seed}"
    if variant == "topic":
        p = sig.build(work, steps=steps, tracking_uri=uri, experiment=experiment, seed=seed,
                      traces_fn=functools.partial(topic_traces, **WARM_NOTES[warm_notes]), sft_steps=sft_steps,
                      init_from=init_from, prompts=prompts, rollouts=rollouts)
        reply_for = topic_reply_for
    else:
        sig.USER_REPLY = PRIVATE_REPLY
        p = sig.build(work, steps=steps, tracking_uri=uri, experiment=experiment, seed=seed, ask=True,
                      sft_steps=sft_steps, prompts=prompts, rollouts=rollouts)
        reply_for = None
    params = yaml.safe_load(p.read_text())
    if variant == "topic":   # vague question, targeted question[, search, answer]
        params["agent_grpo"]["rollout"].update(max_turns=max_turns, max_new_tokens=16)
    params["agent_csd"] = csd_section(params["agent_grpo"], alpha, str(work / "agent_csd"))
    params["agent_csd"]["csd"]["turns_per_trajectory"] = turns
    p.write_text(yaml.safe_dump(params, sort_keys=False))
    res = {}
    for phase in ("agent_grpo", "agent_csd"):
        r = sig.run(p, work, timeout=3600, phase=phase, reply_for=reply_for)
        if r.returncode != 0:
            raise SystemExit(f"seed {seed} {phase} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        res[phase] = curve(work / phase)
    if variant == "topic":
        res["teacher_probe"] = teacher_probe(Path(init_from) if init_from else work / "init")
    return res


def curve(run_dir: Path) -> list[float]:
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["metrics"].get("reward/mean", 0.0) for r in recs if r.get("kind") == "train"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--tracking-uri", default=None, help="default: <out>/mlflow.db")
    ap.add_argument("--experiment", default="csd-validity")
    ap.add_argument("--variant", choices=["topic", "vague"], default="topic")
    ap.add_argument("--alpha", type=float, default=0.3,
                    help="CSD weight of the agent_csd runs (the pipeline default is 0.01, tuned for LLMs; at 1.0 the "
                         "tiny agent's CSD term swamps the GRPO term)")
    ap.add_argument("--sft-steps", type=int, default=3000, help="warm-start steps of the tiny agent")
    ap.add_argument("--warm-notes", choices=sorted(WARM_NOTES), default="task",
                    help="which coaching notes the warm start shows the agent (topic variant)")
    ap.add_argument("--turns", type=int, default=1, help="CSD turns_per_trajectory")
    ap.add_argument("--prompts", type=int, default=8, help="prompts (groups) per step")
    ap.add_argument("--rollouts", type=int, default=4, help="rollouts per prompt (GRPO group size, >= 2)")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="a local Hugging Face checkpoint (e.g. an instruction-tuned model, which reads notes "
                         "natively) as the initial agent instead of the warm-started tiny one (topic variant)")
    ap.add_argument("--max-turns", type=int, default=2,
                    help="agent turns per episode (topic variant): 2 = the vague and the targeted question, so "
                         "the reward is the elicitation reward alone; 4 adds the search and the answer")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    from mimesis_lab.tracking import resolve_tracking_uri

    uri = resolve_tracking_uri(args.tracking_uri or f"sqlite:///{out / 'mlflow.db'}", Path.cwd())
    results, probes = {}, {}
    for seed in args.seeds:
        res = run_pair(out, seed, args.steps, uri, args.experiment, args.variant, args.alpha,
                       args.sft_steps, args.warm_notes, args.turns, args.max_turns, args.init_from,
                       args.prompts, args.rollouts)
        if "teacher_probe" in res:
            probes[seed] = res.pop("teacher_probe")
        results[seed] = res
        tail = {k: sum(v[-args.window:]) / len(v[-args.window:]) for k, v in res.items()}
        print(f"seed {seed}: last-{args.window} mean reward GRPO {tail['agent_grpo']:.3f} CSD {tail['agent_csd']:.3f}",
              flush=True)
    summary = {}
    for phase in ("agent_grpo", "agent_csd"):
        tails = [sum(r[phase][-args.window:]) / len(r[phase][-args.window:]) for r in results.values()]
        means = [sum(r[phase]) / len(r[phase]) for r in results.values()]
        summary[phase] = {"mean_last_window": sum(tails) / len(tails), "per_seed": tails,
                          "mean_all_steps": sum(means) / len(means), "per_seed_all_steps": means}
    summary["csd_minus_grpo"] = summary["agent_csd"]["mean_last_window"] - summary["agent_grpo"]["mean_last_window"]
    summary["seeds_csd_ahead"] = sum(c > g for c, g in zip(summary["agent_csd"]["per_seed"],
                                                              summary["agent_grpo"]["per_seed"]))
    summary["config"] = {k: getattr(args, k) for k in ("seeds", "steps", "window", "variant", "alpha", "sft_steps",
                                                       "warm_notes", "turns", "max_turns", "prompts", "rollouts")}
    summary["config"]["init_from"] = str(args.init_from) if args.init_from else None
    if probes:
        summary["teacher_probe"] = {s: {k: v for k, v in p.items() if k != "tasks"} for s, p in probes.items()}
    (out / "summary.json").write_text(json.dumps({"summary": summary, "curves": results, "teacher_probe": probes},
                                                 indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
