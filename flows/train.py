"""Prefect flow ``train``: every training phase — user-side mid-training, ThoughtTrace SFT, simulator
RL, the agent's SFT warm start, agent GRPO and its CSD sibling (SPEC §2.1–2.3, §3.2–3.3).

Orchestration only: each phase is a task that launches the phase's recipe (``mimesis_lab.jobs.*``)
as a DeepSpeed job (:mod:`mimesis_lab.train.launch`), attached to its own MLflow child run under one
parent run per flow run, then records the result (metrics, the final Hugging Face folder as an
artifact, a registered model version with the phase as alias: ``mimesis-simulator`` or
``mimesis-agent``) and publishes a markdown artifact with the MLflow link. The parent run is named
after the phase when the flow runs one, ``agent_rl`` when it runs the two agent RL siblings (the DVC stage of
that name), else ``train``.

The siblings ``agent_grpo`` and ``agent_csd`` start from the same agent with the same settings
(``agent_rl``); with ``agent_rl.sibling_jobs: concurrent`` one flow run trains them side by side, two
tasks and two jobs at once, each job with half of the CPU threads (:func:`concurrent_siblings`). On 2
CPU cores the tiny model's jobs leave cores idle (small ops, per-token Python): the pair took 113 s
side by side against 191 s one after the other.

Retries are enabled only for phases with ``resume: auto`` (a retry continues from the last
checkpoint instead of starting over; the job only resumes a checkpoint whose fingerprint — phase
settings, DeepSpeed JSON, input files, code — matches, see
:func:`mimesis_lab.train.checkpoint.run_fingerprint`).

Run: ``python -m flows.train --phases midtrain sft [--params params.yaml]`` (each training DVC
stage runs ``python -m flows.train --phases <stage>``).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("PREFECT_HOME", str(ROOT / ".prefect"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from prefect import flow, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from flows.crashed import claim_flow_run  # noqa: E402
from flows.prefect_api import shared_server  # noqa: E402
from mimesis_lab import tracking  # noqa: E402
from mimesis_lab.config import flatten, load_params, phase_params  # noqa: E402

PHASES = ("midtrain", "sft", "agent_sft", "sim_rl", "agent_grpo", "agent_csd")
#: The sibling phases one flow run may train side by side (``sibling_jobs: concurrent``), and the name of the
#: flow run (and of its DVC stage and MLflow parent run) that trains them together.
SIBLINGS = ("agent_grpo", "agent_csd")
SIBLINGS_NAME = "agent_rl"
REGISTERED_MODEL = "mimesis-simulator"
SUMMARY_KEYS = ("initial_val_loss", "final_val_loss", "steps", "first_reward_raw_mean", "last_reward_raw_mean",
                "first_reward_update_mean", "last_reward_update_mean", "invalid_rollouts_total")


def summary_markdown(phase: str, summary: dict[str, Any], url: str, version: str | None,
                     model_name: str = REGISTERED_MODEL) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items() if not isinstance(v, (dict, list)))
    reg = f"\nRegistered: `{model_name}` version {version} (alias `{phase}`)\n" if version else ""
    return f"# {phase}\n\nMLflow run: [{url}]({url})\n{reg}\n| metric | value |\n|---|---|\n{rows}\n"


#: Phases whose MLflow params share one prefix, so that sibling runs line up row by row in
#: MLflow's compare view (``agent.lr`` for both, ``agent.csd.alpha`` for the CSD run only).
SHARED_PARAM_PREFIX = {"agent_grpo": "agent", "agent_csd": "agent"}


def param_prefix(phase: str) -> str:
    """The MLflow param prefix of ``phase``'s section (the phase name itself, or a shared one)."""
    return SHARED_PARAM_PREFIX.get(phase, phase)


def flow_run_name(phases: list[str]) -> str:
    """The flow run's (and its MLflow parent run's) name: the phase when there is one, ``agent_rl`` for the
    two siblings, else ``train``."""
    if len(phases) == 1:
        return phases[0]
    return SIBLINGS_NAME if sorted(phases) == sorted(SIBLINGS) else "train"


def concurrent_siblings(params: Any, phases: list[str], world_size: int | None = None,
                        cores: int | None = None) -> dict[str, int]:
    """Sibling phase -> its job's CPU threads, for the siblings this flow run trains side by side: both of
    :data:`SIBLINGS` asked for and both sections saying ``sibling_jobs: concurrent``; ``{}`` otherwise (every
    phase then runs alone, with every thread). Each job gets ``cores // (2 * world_size)`` threads (at
    least 1), so the two jobs' ranks together use the cores once."""
    if not all(p in phases for p in SIBLINGS):
        return {}
    cfgs = {p: phase_params(params, p) for p in SIBLINGS}
    if any(getattr(c, "sibling_jobs", "sequential") != "concurrent" for c in cfgs.values()):
        return {}
    cores = cores or os.cpu_count() or 1
    return {p: max(1, cores // (len(SIBLINGS) * (world_size or c.world_size))) for p, c in cfgs.items()}


def retryable(task: Any, task_run: Any, state: Any) -> bool:
    """Retry only failures a retry can fix: a job that exits with status 2 stopped on a clear
    user-facing error (bad params, a missing ``init_from``, a checkpoint that cannot be resumed), which
    would fail the same way again; anything else (a killed or crashed job) resumes from its checkpoint."""
    from mimesis_lab.train.launch import LaunchError

    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - an unreadable state: keep the retry policy
        return True
    return not (isinstance(exc, LaunchError) and exc.returncode == 2)


def _create_phase_run(params: Any, phase: str, cfg: Any, params_path: str, parent_run_id: str | None,
                      env: dict[str, str]) -> str | None:
    """The phase's MLflow child run (its params, tags and config files); adds the job's MLflow variables to
    ``env``. None when tracking is off."""
    if not params.tracking.enabled:
        return None
    tracking.mark_killed_runs(params.tracking, phase)      # runs a SIGKILL left RUNNING -> FAILED
    run_id = tracking.create_run(
        params.tracking, phase, parent_run_id,
        params={**flatten(cfg, f"{param_prefix(phase)}."), **flatten(params.model, "model."), "phase": phase},
        tags={"mimesis.phase": phase, "mimesis.kind": "train", **tracking.provenance(phase)},
    )
    env.update(tracking.tracking_env(params.tracking, run_id))
    c, _ = tracking.client(params.tracking)
    for f in (params_path, cfg.deepspeed_config):
        c.log_artifact(run_id, f, "config")
    return run_id


#: Jobs started ahead by :func:`prestart_first_job` (phase -> :class:`~mimesis_lab.train.launch.PendingJob`).
_PRESTARTED: dict[str, Any] = {}


def prestart_first_job(params: Any, params_path: str, phases: list[str], world_size: int | None) -> None:
    """Start the first phase's ``direct`` job now, so that its imports overlap the flow's Prefect and MLflow
    set-up (:func:`mimesis_lab.train.launch.prestart`); :func:`train_phase` releases it."""
    from mimesis_lab.train.launch import prestart

    phase = next(p for p in PHASES if p in phases)
    cfg = phase_params(params, phase)
    env = dict(os.environ)
    threads = concurrent_siblings(params, phases, world_size).get(phase)
    if threads is not None:                    # its threads are fixed when torch is imported: set them now
        env["OMP_NUM_THREADS"] = str(threads)
    try:
        pending = prestart(phase, params_path, world_size or cfg.world_size, cfg.launcher, env)
    except (OSError, ValueError) as e:        # an optimisation only: train_phase starts the job itself
        print(f"[train] {phase}: could not start the job ahead ({e}); starting it when its run exists")
        return
    if pending is not None:
        _PRESTARTED[phase] = pending


def cancel_prestarted() -> None:
    while _PRESTARTED:
        _PRESTARTED.popitem()[1].cancel()


#: What the flow imports after a phase's job (its evaluation of the final model), imported while the job runs.
AFTER_JOB_IMPORTS = {
    "midtrain": ("mimesis_lab.evals.loss_baseline", "torch", "mimesis_lab.models", "mimesis_lab.tokenizer",
                 "mimesis_lab.train.data"),
    "sft": ("mimesis_lab.evals.think_format", "mimesis_lab.models", "mimesis_lab.tokenizer",
            "mimesis_lab.rollout.backends", "mimesis_lab.envs.output_format"),
}


def import_in_background(modules: tuple[str, ...]) -> None:
    """Import ``modules`` on a daemon thread (about 3 s of torch and transformers on 2 cores), while the main
    thread waits on the job; an import error surfaces where the module is used, as without this."""
    import importlib
    import threading

    def work() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001
                return

    threading.Thread(target=work, name="after-job-imports", daemon=True).start()


@task(name="train_phase", log_prints=True)
def train_phase(phase: str, params_path: str, parent_run_id: str | None,
                world_size: int | None = None, threads: int | None = None) -> dict[str, Any]:
    """Launch one training phase as a DeepSpeed job attached to an MLflow child run; ``threads``: the job's
    ``OMP_NUM_THREADS`` (a sibling trained side by side), else the launcher's default."""
    from mimesis_lab.train.launch import launch

    params = load_params(params_path)
    cfg = phase_params(params, phase)
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    pending = _PRESTARTED.pop(phase, None)      # the job, already importing (prestart_first_job), if any
    try:
        run_id = _create_phase_run(params, phase, cfg, params_path, parent_run_id, env)
    except BaseException:
        if pending is not None:
            pending.cancel()
        raise
    ws = world_size or cfg.world_size
    Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
    import_in_background(AFTER_JOB_IMPORTS.get(phase, ()))
    try:
        launch(phase, params_path, ws, cfg.launcher, env, log_path=Path(cfg.output_dir) / "job.log",
               pending=pending)
    except BaseException:
        if run_id:
            tracking.client(params.tracking)[0].set_terminated(run_id, "FAILED")
        raise
    final = Path(cfg.output_dir) / "final"
    summary = json.loads((final / "training_summary.json").read_text())
    summary = {"phase": phase, "world_size": ws, **summary}
    t_eval = time.perf_counter()
    if phase == "sft":  # does the simulator think before it speaks? (validation prompts: greedy, and sampled
        from mimesis_lab.evals.think_format import evaluate_folder   # as simulator RL samples)

        # greedy on the first 150 prompts (one generate call each); sampled on every prompt (batched)
        fmt = evaluate_folder(final, cfg.val, params.sim_rl.rollout if params.sim_rl else None, seed=cfg.seed,
                              history=cfg.history, max_prompts=150)
        summary.update({f"format_{k}": v for k, v in fmt.items() if k not in ("examples", "sampled")})
        summary["format_examples"] = fmt["examples"]
        summary.update({f"format_sampled_{k}": v for k, v in (fmt.get("sampled") or {}).items()})
    if phase == "midtrain":  # below the add-one unigram of the same targets? (the report's midtrain_vs_unigram)
        from mimesis_lab.evals.loss_baseline import unigram_baseline

        summary["unigram"] = unigram_baseline(final, cfg)
        summary["unigram_val_loss"] = summary["unigram"]["val_loss"]
    if phase in ("sft", "midtrain"):   # can it repeat what its context holds? (the simulator's facts need it)
        from mimesis_lab.evals.copy_probe import induction_accuracy
        from mimesis_lab.models import load_model

        probe = induction_accuracy(load_model(final))
        summary.update({"copy_induction_acc": probe["acc"], "copy_induction_chance": probe["chance"]})
        # the flow's own evaluation of the final model (bench_overhead: work)
        summary["final_eval_wall_time_s"] = round(time.perf_counter() - t_eval, 3)
    version = None
    url = ""
    if run_id:
        c, _ = tracking.client(params.tracking)
        c.log_artifacts(run_id, str(final), "model")
        for k, v in summary.items():
            if (k.startswith(("format_", "first_", "last_", "unigram_", "copy_")) or k.endswith("_total")) \
                    and isinstance(v, (int, float)) and not isinstance(v, bool):
                c.log_metric(run_id, k, float(v))
        rollouts = Path(cfg.output_dir) / "rollouts.jsonl"
        if phase in ("sim_rl", "agent_grpo", "agent_csd") and rollouts.is_file():
            c.log_artifact(run_id, str(rollouts), "rollouts")
        model_name = params.tracking.agent_model if phase.startswith("agent") else params.tracking.simulator_model
        version = tracking.register_model(params.tracking, run_id, "model", model_name, phase,
                                          description=f"{phase} final weights")
        c.set_terminated(run_id, "FINISHED")
        url = tracking.run_url(params.tracking, run_id)
        summary["mlflow_run_id"] = run_id
        summary["registered_version"] = version
    metrics_file = Path("metrics") / f"{phase}.json"
    metrics_file.parent.mkdir(parents=True, exist_ok=True)
    metrics_file.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
    model_name = params.tracking.agent_model if phase.startswith("agent") else params.tracking.simulator_model
    create_markdown_artifact(markdown=summary_markdown(phase, summary, url, version, model_name),
                             key=f"{phase.replace('_', '-')}-summary", description=f"{phase} final metrics")
    return summary


def _wait_all(running: dict[str, Any]) -> dict[str, Any]:
    """Wait for every submitted phase (a failure of one does not stop the other, whose checkpoints stay
    resumable), then return their results in order or raise the first failure; empties ``running``."""
    for fut in running.values():
        fut.wait()
    try:
        return {phase: fut.result() for phase, fut in running.items()}
    finally:
        running.clear()


@flow(name="train", log_prints=True)
def train_flow(phases: list[str], params_path: str = "params.yaml", world_size: int | None = None) -> dict[str, Any]:
    """Train ``phases`` (any subset of :data:`PHASES`, run in that order); returns each phase's summary."""
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        raise ValueError(f"unknown phase(s) {unknown or phases}; expected a non-empty subset of {PHASES}")
    flow_name = flow_run_name(phases)
    params = load_params(params_path)
    if not _PRESTARTED:                                        # run from a deployment, not from main()
        prestart_first_job(params, params_path, phases, world_size)
    try:
        claim_flow_run()                                           # flow runs a SIGKILL left RUNNING -> CRASHED
        parent = None
        if params.tracking.enabled:
            parent = tracking.create_run(params.tracking, flow_name, tags={
                "mimesis.kind": "flow", "mimesis.phases": ",".join(phases), **tracking.provenance(flow_name)})
        results: dict[str, Any] = {}
        together = concurrent_siblings(params, phases, world_size)
        try:
            running: dict[str, Any] = {}           # siblings submitted side by side, not yet waited for
            for phase in [p for p in PHASES if p in phases]:
                retries = 2 if phase_params(params, phase).resume == "auto" else 0
                run_phase = train_phase.with_options(retries=retries, retry_delay_seconds=5,
                                                     retry_condition_fn=retryable)
                if phase in together:
                    running[phase] = run_phase.submit(phase, params_path, parent, world_size, together[phase])
                    continue
                results.update(_wait_all(running))
                results[phase] = run_phase(phase, params_path, parent, world_size)
            results.update(_wait_all(running))
        except BaseException:
            if parent:
                tracking.client(params.tracking)[0].set_terminated(parent, "FAILED")
            raise
        if parent:
            c, _ = tracking.client(params.tracking)
            for phase, s in results.items():
                for k in SUMMARY_KEYS:
                    if isinstance(s.get(k), (int, float)):
                        c.log_metric(parent, f"{phase}.{k}", float(s[k]))
            c.set_terminated(parent, "FINISHED")
            url = tracking.run_url(params.tracking, parent)
            body = "\n".join(f"- **{p}**: " + ", ".join(f"{k}={s.get(k)}" for k in SUMMARY_KEYS if k in s)
                             for p, s in results.items())
            create_markdown_artifact(markdown=f"# {flow_name} flow\n\nMLflow parent run: [{url}]({url})\n\n{body}\n",
                                     key=f"{flow_name.replace('_', '-')}-flow-summary", description="training summary")
    finally:
        cancel_prestarted()                                    # a job no phase released (a failure before it)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="flows.train")
    ap.add_argument("--phases", nargs="+", required=True, choices=PHASES)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--world-size", type=int, default=None, help="override the phases' world_size")
    args = ap.parse_args(argv)
    try:   # the first job imports while the Prefect server is reached and the flow run and MLflow runs are made
        prestart_first_job(load_params(args.params), args.params, args.phases, args.world_size)
    except Exception as e:  # noqa: BLE001 - bad params: the flow run reports them
        print(f"[train] no job started ahead: {e}")
    try:
        with shared_server():       # one Prefect API server for the whole dvc repro (flows/prefect_api.py)
            train_flow(phases=args.phases, params_path=args.params, world_size=args.world_size)
    finally:
        cancel_prestarted()         # a job the flow never released (it failed before its launch)
    return 0


if __name__ == "__main__":
    from mimesis_lab.fast_exit import exit_now   # a finished run skips the interpreter teardown

    exit_now(main())
