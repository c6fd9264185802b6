"""Prefect flow runs left RUNNING by a killed process are set to CRASHED on the next start.

A flow run's state is reported by the process that runs it; a process killed with SIGKILL (or a machine
going down) leaves the run ``RUNNING`` for ever, in the UI and for the concurrency limits. The flows
call :func:`claim_flow_run` first thing:

1. the current flow run gets the tag ``mimesis-proc:<host>:<pid>:<start>`` naming this process
   (:func:`mimesis_lab.tracking.process_identity`; the start time tells a reused pid apart);
2. every other ``RUNNING`` flow run tagged by a process of this host that is gone
   (:func:`mimesis_lab.tracking.process_alive`) is set to ``CRASHED`` (forced, with a message naming
   the process), and so are its task runs still ``RUNNING``.

Runs without the tag (older ones, deployment runs a Prefect runner watches itself) and runs of other
hosts are left alone. A subflow tags itself only: a parent run may live in another process
(``run_deployment``). The MLflow side is :func:`mimesis_lab.tracking.mark_killed_runs`.
"""
from __future__ import annotations

import logging
import socket
from typing import Any

from mimesis_lab.tracking import process_alive, process_identity

__all__ = ["PROCESS_TAG", "claim_flow_run", "crash_dead_flow_runs", "process_tag"]

PROCESS_TAG = "mimesis-proc:"
log = logging.getLogger(__name__)


def process_tag() -> str:
    """``mimesis-proc:<host>:<pid>:<start>`` of this process."""
    me = process_identity()
    return f"{PROCESS_TAG}{me['mimesis.host']}:{me['mimesis.pid']}:{me['mimesis.pid_started']}"


def _dead_process(tags: list[str], host: str) -> str | None:
    """``"<pid>"`` when ``tags`` name a process of ``host`` that is gone, else ``None``."""
    for tag in tags:
        if not tag.startswith(PROCESS_TAG):
            continue
        tag_host, pid, started = tag[len(PROCESS_TAG):].rsplit(":", 2)
        if tag_host == host and pid.isdigit() and not process_alive(int(pid), started):
            return pid
    return None


def crash_dead_flow_runs(client: Any, keep: str | None = None) -> list[str]:
    """Set ``CRASHED`` every ``RUNNING`` flow run (but ``keep``) whose tagged process is gone from this host,
    and its ``RUNNING`` task runs; returns the flow run ids."""
    from prefect.client.schemas.filters import (
        FlowRunFilter, FlowRunFilterId, FlowRunFilterState, FlowRunFilterStateType, TaskRunFilter,
        TaskRunFilterState, TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    host = socket.gethostname()
    running = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])))
    dead, offset = [], 0
    while True:
        page = client.read_flow_runs(flow_run_filter=running, limit=200, offset=offset)
        dead += [(str(r.id), pid) for r in page if str(r.id) != keep and (pid := _dead_process(r.tags, host))]
        if len(page) < 200:
            break
        offset += 200
    for run_id, pid in dead:
        note = f"process {pid} on {host} was gone (killed?) when the next flow run started"
        client.set_flow_run_state(run_id, Crashed(message=note), force=True)
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])),
            task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(
                any_=[StateType.RUNNING]))))
        for t in tasks:
            client.set_task_run_state(t.id, Crashed(message=note), force=True)
    return [run_id for run_id, _ in dead]


def claim_flow_run() -> list[str]:
    """Tag the current flow run with this process and crash the flow runs of dead processes (module
    docstring); returns the crashed ids. Outside a flow run it only crashes. Bookkeeping only: an API
    error is logged, never raised into the flow."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    current = flow_run.id
    try:
        with get_client(sync_client=True) as client:
            if current:
                tags = list(client.read_flow_run(current).tags)
                tag = process_tag()
                if tag not in tags:
                    client.update_flow_run(current, tags=[*tags, tag])
            crashed = crash_dead_flow_runs(client, keep=str(current) if current else None)
    except Exception as e:  # noqa: BLE001 - a bookkeeping failure must not fail the flow
        log.warning("could not tag this flow run or crash the flow runs of dead processes: %s: %s",
                    type(e).__name__, e)
        return []
    if crashed:
        log.warning("set %d flow run(s) of dead processes to CRASHED: %s", len(crashed), ", ".join(crashed))
    return crashed
