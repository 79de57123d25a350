"""Runs whose process died (SIGKILL, the OOM killer, a power cut): found and ended KILLED.

A process that cannot end its run leaves it RUNNING; every run records its process (tags ``orchestry.process.*``:
pid, host, start time; :func:`process_tags`) and the next stage that starts, of this execution or another, ends
KILLED each RUNNING run of the experiment whose process on this host is certainly gone (:func:`process_gone`),
with the tag :data:`STALE_TAG` saying who found it and why (:func:`mark_stale_runs`). Runs of other hosts are left
as they are.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

log = logging.getLogger("orchestry.tracking.runs")  # one logger for every part of the MLflow tracking

#: Tags of every run :func:`~orchestry.tracking.runs.stage_run` opens, and of a parent run each time a stage marks it RUNNING: the process
#: that holds the run RUNNING (:func:`process_tags`).
PID_TAG = "orchestry.process.pid"
HOST_TAG = "orchestry.process.host"
START_TAG = "orchestry.process.start_time"
PID_NAMESPACE_TAG = "orchestry.process.pid_namespace"
#: Tag of a run :func:`mark_stale_runs` ended KILLED: who did it, and why.
STALE_TAG = "orchestry.stale"


def _pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[4026531836]`` on Linux; ``None`` elsewhere): two containers may share
    a host name and a store, not their PIDs."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_tags() -> dict[str, str]:
    """:data:`PID_TAG`, :data:`HOST_TAG`, :data:`START_TAG` (the process's start time, seconds since the epoch:
    tells a reused PID from the process that held the run) and, on Linux, :data:`PID_NAMESPACE_TAG` of this
    process."""
    import psutil

    tags = {
        PID_TAG: str(os.getpid()),
        HOST_TAG: socket.gethostname(),
        START_TAG: repr(psutil.Process().create_time()),
    }
    ns = _pid_namespace()
    if ns:
        tags[PID_NAMESPACE_TAG] = ns
    return tags


def process_gone(pid: int, start_time: float | None) -> str | None:
    """Why process ``pid`` of this machine, started at ``start_time`` (:func:`process_tags`; ``None``: unknown), is
    certainly gone: no such process, a zombie, or the PID now belongs to a process started at another time;
    ``None`` when it may be alive (it is, or it cannot be told)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return f"process {pid} exited (a zombie)"
        created = proc.create_time()
    except psutil.NoSuchProcess:
        return f"process {pid} no longer alive"
    except psutil.Error:  # e.g. AccessDenied: it exists, its owner is another user
        return None
    if start_time is not None and abs(created - start_time) > 0.01:
        return f"process {pid} no longer alive (the pid now belongs to a process started at {created:.2f})"
    return None


def mark_stale_runs(
    client: Any, experiment_id: str, by: str, keep: set[str] | frozenset = frozenset()
) -> list[str]:
    """End KILLED every RUNNING run of ``experiment_id`` whose process is certainly gone: its :func:`process_tags`
    name this host (and PID namespace) and :func:`process_gone` says so, and (a parent run) no child of it is
    still RUNNING. The run gets an end time (now) and :data:`STALE_TAG` = ``marked KILLED by <by> (pid <pid> on
    <host>): process <pid> on <host> no longer alive``. Runs of other hosts, runs without the tags (opened before
    they existed, or not by :func:`~orchestry.tracking.runs.stage_run`) and runs in ``keep`` are left as they are; a failure is logged,
    never raised (the stage that starts matters more).

    Args:
        client: an ``mlflow.MlflowClient`` of the store.
        by: who marks them (the stage that starts), for the tag.
        keep: run ids never to mark (the parent this process has just marked RUNNING).

    Returns:
        the ids of the runs marked KILLED.
    """
    try:
        me = process_tags()
        host, ns = me[HOST_TAG], me.get(PID_NAMESPACE_TAG)
        running = client.search_runs(
            [experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=50000
        )
        # stage runs first: a parent is stale only once none of its children is RUNNING
        running.sort(key=lambda r: "mlflow.parentRunId" not in r.data.tags)
        killed: list[str] = []
        elsewhere = 0
        for r in running:
            tags, run_id = r.data.tags, r.info.run_id
            if run_id in keep or PID_TAG not in tags:
                continue
            if tags.get(HOST_TAG) != host or (ns and tags.get(PID_NAMESPACE_TAG, ns) != ns):
                elsewhere += 1
                continue
            if any(
                c.data.tags.get("mlflow.parentRunId") == run_id and c.info.run_id not in killed
                for c in running
            ):
                continue
            try:
                start = float(tags[START_TAG]) if START_TAG in tags else None
                why = process_gone(int(tags[PID_TAG]), start)
            except ValueError:
                continue
            if why is None:
                continue
            reason = f"marked KILLED by {by} (pid {me[PID_TAG]} on {host}): {why} on {host}"
            client.set_tag(run_id, STALE_TAG, reason)
            client.set_terminated(run_id, status="KILLED")
            log.warning("MLflow run %s (%s) was RUNNING: %s", run_id, tags.get("stage", "pipeline"), reason)
            killed.append(run_id)
        if elsewhere:
            log.info(
                "%d RUNNING MLflow run(s) of other hosts left as they are (no process to check)", elsewhere
            )
        return killed
    except Exception as e:  # noqa: BLE001
        log.warning("could not look for stale MLflow runs (%s: %s)", type(e).__name__, e)
        return []
