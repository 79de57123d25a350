"""Stages DVC did not run in an execution, linked to the runs that made their outputs.

Stages DVC did not run (``dvc exp run -S plot.dpi=100`` runs only ``plot``: the others are unchanged or restored
from DVC's run cache) have no run in the execution. So that the execution still lands complete, every stage run of
a ``dvc.yaml`` stage, when it ends FINISHED, (1) tags itself ``outputs_digest`` (:func:`outputs_digest` of its
stage's ``cache: false`` outputs, the small report files) and (2) links each upstream stage of it that did not run
in this execution: the parent run gets the tag ``cached_run.<stage>`` (``@`` written ``_at_``) = the id of the
newest FINISHED run of that stage whose ``outputs_digest`` is the digest of the outputs on disk, i.e. the run that
made them (:func:`link_cached_stages`). Only upstream stages are linked, whose outputs are final when a stage that
depends on them runs; ``plot`` depends on every stage, so its run links them all. ``orchestry compare`` reads a
cached stage's metrics from the linked run (:func:`orchestry.reporting.compare.executions`). The stage graph comes
from DVC (:func:`dvc_stages`), kept in ``<root>/.orchestry/dvc_stages.json`` while ``dvc.yaml`` and
``params.yaml`` are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from orchestry.tracking.metric_names import metric_name

log = logging.getLogger("orchestry.tracking.runs")  # one logger for every part of the MLflow tracking

#: Tag of a stage run: :func:`outputs_digest` of its stage's uncached outputs as the run left them.
OUTPUTS_TAG = "outputs_digest"
#: Prefix of the parent-run tags that link a stage which did not run in the execution to the run that made its
#: outputs (:func:`cached_run_tag`).
CACHED_RUN_PREFIX = "cached_run."


def cached_run_tag(stage: str) -> str:
    """The parent-run tag that links ``stage`` (DVC's name, e.g. ``evaluate``, or ``name@item`` of a matrix stage)
    to the run that made its outputs: ``cached_run.<stage>``, ``@`` written ``_at_`` (MLflow rejects ``@`` in tag
    names)."""
    return CACHED_RUN_PREFIX + metric_name(stage)


#: Version of the stage-graph cache's format (:func:`dvc_stages`); a new one makes every saved graph stale.
STAGE_GRAPH_FORMAT = 1


def _stage_graph_key(root: Path) -> str | None:
    """The key of ``<root>/dvc.yaml``'s stage graph: SHA-256 of the cache format, DVC's version, ``root`` relative
    to the working directory and the bytes of ``dvc.yaml`` and ``params.yaml`` (the only file DVC interpolates
    ``${...}`` and matrices from when ``dvc.yaml`` names no ``vars``). ``None`` (do not cache) when ``dvc.yaml``
    names ``vars`` anywhere (other files may feed it) or is not a mapping."""
    import yaml
    from dvc import __version__ as dvc_version

    def names_vars(node: Any) -> bool:  # top level, a stage, a foreach's ``do``: anywhere
        if isinstance(node, dict):
            return "vars" in node or any(names_vars(v) for v in node.values())
        return isinstance(node, list) and any(names_vars(v) for v in node)

    text = (root / "dvc.yaml").read_bytes()
    doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(doc, dict) or names_vars(doc):
        return None
    params = root / "params.yaml"
    # DVC names stages relative to the working directory (``addressing``): the key holds where it is asked from
    where = os.path.relpath(root)
    h = hashlib.sha256(f"{STAGE_GRAPH_FORMAT}\0{dvc_version}\0{where}\0".encode())
    for part in (text, params.read_bytes() if params.is_file() else b"<none>"):
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


def _read_dvc_stages(root: Path) -> dict[str, tuple[list[str], set[str]]]:
    """:func:`dvc_stages` computed by DVC itself (its repository index: ~1.3 s on the project's pipeline)."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # edges run from a stage to the stages it depends on
        commands = {s for s in repo.index.stages if s.cmd}  # not the stages of .dvc files (no run to link)
        return {
            s.addressing: (
                sorted(os.path.relpath(o.fs_path, root) for o in s.outs if not o.use_cache),
                {u.addressing for u in nx.descendants(graph, s) if u in commands},
            )
            for s in commands
        }


def dvc_stages(root: str | Path = ".") -> dict[str, tuple[list[str], set[str]]]:
    """The stages of ``<root>/dvc.yaml`` as DVC reads them (matrix stages expanded): stage name -> (its
    ``cache: false`` outputs, paths relative to ``root``; the names of the stages with a command it depends on,
    transitively). ``{}`` when there is no ``dvc.yaml``.

    Every stage run asks this when it ends (:func:`link_cached_stages`) and DVC's index takes ~1.3 s to build, so
    the answer is kept in ``<root>/.orchestry/dvc_stages.json`` under :func:`_stage_graph_key` (the bytes of
    ``dvc.yaml`` and ``params.yaml``, DVC's version and where it is asked from) and read from there while the key
    holds; an unreadable or
    stale file is recomputed and replaced (written whole to a temporary file, then renamed: parallel stages never
    read half of one)."""
    root = Path(root).resolve()
    if not (root / "dvc.yaml").is_file():
        return {}
    key = _stage_graph_key(root)
    cache = root / ".orchestry" / "dvc_stages.json"
    if key is not None:
        try:
            saved = json.loads(cache.read_text())
            if saved["key"] == key:
                return {name: (list(outs), set(up)) for name, (outs, up) in saved["stages"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            pass
    stages = _read_dvc_stages(root)
    if key is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
            doc = {"key": key, "stages": {n: [outs, sorted(up)] for n, (outs, up) in sorted(stages.items())}}
            tmp.write_text(json.dumps(doc, indent=1))
            os.replace(tmp, cache)
        except OSError as e:  # a read-only checkout: compute again next time
            log.info("could not keep the stage graph in %s (%s)", cache, e)
    return stages


def outputs_digest(paths: list[str], root: str | Path = ".") -> str | None:
    """SHA-256 (hex) of the names and bytes of ``paths`` (files, or folders: every file in them) under ``root``;
    ``None`` when ``paths`` is empty or one is missing."""
    root = Path(root)
    h = hashlib.sha256()
    if not paths:
        return None
    for rel in sorted(paths):
        p = root / rel
        if not p.exists():
            return None
        for f in sorted(p.rglob("*")) if p.is_dir() else [p]:
            if f.is_file():
                h.update(f.relative_to(root).as_posix().encode() + b"\0")
                h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def link_cached_stages(
    client: Any, experiment_id: str, parent_id: str, run_id: str, stage: str
) -> dict[str, str]:
    """At the end of stage run ``run_id`` of ``stage``: tag it :data:`OUTPUTS_TAG` and link every upstream stage
    that did not run in this execution (no child of ``parent_id``) to the newest FINISHED run of that stage whose
    outputs are the ones on disk (tag :func:`cached_run_tag` on the parent). Nothing happens for a stage that is
    not in ``./dvc.yaml``; a failure is logged, never raised (the stage's results are what matters).

    Returns:
        ``{stage: linked run id}``.
    """
    try:
        stages = dvc_stages()
        if stage not in stages:
            return {}
        outs, upstream = stages[stage]
        digest = outputs_digest(outs)
        if digest:
            client.set_tag(run_id, OUTPUTS_TAG, digest)
        children = client.search_runs(
            [experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_id}'", max_results=5000
        )
        ran = {c.data.tags.get("stage") for c in children}
        links = {}
        for up in sorted(upstream - ran):
            d = outputs_digest(stages[up][0])
            if d is None:
                continue
            made_them = (
                f"tags.stage = '{up}' and tags.{OUTPUTS_TAG} = '{d}' and attributes.status = 'FINISHED'"
            )
            found = client.search_runs(
                [experiment_id],
                filter_string=made_them,
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
            if found:
                links[up] = found[0].info.run_id
                client.set_tag(parent_id, cached_run_tag(up), links[up])
            else:
                log.info("%s: no FINISHED MLflow run of stage %s made its outputs on disk", stage, up)
        return links
    except Exception as e:  # noqa: BLE001
        log.warning("%s: could not link the stages DVC did not run (%s: %s)", stage, type(e).__name__, e)
        return {}
