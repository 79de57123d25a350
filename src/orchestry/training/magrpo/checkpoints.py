"""MAGRPO checkpoints: both adapters, both AdamW states, the step log and the samples (and the ``reinforce``
estimator's running baseline, the ``critic`` estimator's value networks and Adam states), written crash-safely.

A checkpoint is written crash-safely (:func:`save_checkpoint`): files go to ``<dir>.new``, are
fsynced, ``manifest.json`` (size and SHA-256 of every file) is written last, then ``<dir>`` is renamed to
``<dir>.old``, ``<dir>.new`` to ``<dir>``, and ``<dir>.old`` is removed. A kill at any point leaves a complete
checkpoint in one of the three directories; loading takes the newest complete one that fits the run and
ignores an incomplete one with a log line.

A checkpoint is resumed only when it fits the run: the same ``train_magrpo`` params (``num_steps`` aside), the same
``resume_key`` (code, data, other params) and ``next_step <= num_steps``.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import logging
import os
import re
import shutil
from pathlib import Path

import torch

from orchestry.training.magrpo.common import Trainer, new_optimizers
from orchestry.training.magrpo.sampling import curriculum_order

log = logging.getLogger("orchestry.magrpo")

CHECKPOINT_FILES = ("state.pt", "trainer.json", "samples.jsonl")
# written last: a checkpoint without it, or with a file that differs from it, is incomplete
MANIFEST = "manifest.json"


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (created, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> dict:
    """Write ``data`` to ``path`` and fsync it; returns its manifest entry (bytes, sha256)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint (``None``: it is): a missing or unreadable manifest, a
    missing file, or a file whose size or SHA-256 differs from the manifest's."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST} (the save was cut short, or an older format)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable {MANIFEST} ({e})"
    for name in CHECKPOINT_FILES:
        if name not in files:
            return f"{MANIFEST} does not list {name}"
    for name, entry in files.items():
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != entry.get("bytes") or _sha256_file(f) != entry.get("sha256"):
            return f"{name} differs from {MANIFEST} (truncated or changed)"
    return None


def _sibling(tr: Trainer, suffix: str) -> Path:
    return tr.checkpoint_dir.with_name(tr.checkpoint_dir.name + suffix)


def _swap_in(tr: Trainer, new: Path) -> None:
    """Make the complete checkpoint ``new`` the checkpoint: ``dir`` -> ``dir.old``, ``new`` -> ``dir``,
    then remove ``dir.old``. Until the second rename the previous checkpoint stays whole in ``dir`` or
    ``dir.old``; after it, ``dir`` is the new one."""
    ckpt, old = tr.checkpoint_dir, _sibling(tr, ".old")
    if ckpt.exists() or ckpt.is_symlink():
        if old.exists():
            shutil.rmtree(old)  # left by a killed save; ``dir`` is at least as new
        os.rename(ckpt, old)
    os.rename(new, ckpt)
    _fsync_dir(ckpt.parent)
    if old.exists():
        shutil.rmtree(old)


def _finish_interrupted_save(tr: Trainer) -> None:
    """Complete what a killed save left half done, so that its checkpoint is not lost by this save.

    A complete ``dir.new`` is newer than ``dir`` (it is swapped in); ``dir`` missing with a complete
    ``dir.old`` is put back.
    """
    new, old = _sibling(tr, ".new"), _sibling(tr, ".old")
    if new.is_dir() and checkpoint_problem(new) is None:
        _swap_in(tr, new)
    elif not tr.checkpoint_dir.exists() and old.is_dir() and checkpoint_problem(old) is None:
        os.rename(old, tr.checkpoint_dir)
        _fsync_dir(tr.checkpoint_dir.parent)


def save_checkpoint(tr: Trainer, next_step: int) -> None:
    """Write adapters, optimizer states and logs crash-safely; ``next_step`` is where a resume starts.

    The files go to ``<dir>.new`` and are fsynced, ``manifest.json`` last; then the new directory is swapped
    in (:func:`_swap_in`). The previous checkpoint is kept until the new one is complete, so a kill at any
    point leaves the last complete checkpoint for :func:`load_checkpoint`.
    """
    tr.checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
    _finish_interrupted_save(tr)
    tmp = _sibling(tr, ".new")
    if tmp.exists():
        shutil.rmtree(tmp)  # an incomplete leftover of a killed save
    tmp.mkdir()
    state = {
        "adapters": {
            a: {
                n: p.detach().clone()
                for n, p in tr.model.named_parameters()
                if "lora_" in n and f".{a}." in n
            }
            for a in tr.agents
        },
        "optimizers": {a: o.state_dict() for a, o in tr.optimizers.items()},
    }
    if getattr(tr, "critic", None) is not None:  # advantage critic
        state["critic"] = tr.critic.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    meta = {
        "next_step": next_step,
        "config": tr.cfg.model_dump(),
        "resume_key": tr.resume_key,
        "history": tr.history,
        "curriculum": tr.curriculum,
        "warm_start": tr.warm_start,
        "world_size": tr.world_size,
        "reward_baseline": tr.reward_baseline,
    }
    files = {
        "state.pt": _write_synced(tmp / "state.pt", buf.getvalue()),
        "trainer.json": _write_synced(tmp / "trainer.json", json.dumps(meta).encode()),
        "samples.jsonl": _write_synced(
            tmp / "samples.jsonl", "".join(json.dumps(x) + "\n" for x in tr.samples).encode()
        ),
    }
    _write_synced(tmp / MANIFEST, json.dumps({"next_step": next_step, "files": files}).encode())
    _fsync_dir(tmp)
    _swap_in(tr, tmp)


def why_unfit(tr: Trainer, info: dict) -> str | None:
    """Why a complete checkpoint's ``trainer.json`` cannot be resumed by this run (``None``: it can)."""
    mine = {k: v for k, v in tr.cfg.model_dump().items() if k != "num_steps"}
    theirs = {k: v for k, v in info.get("config", {}).items() if k != "num_steps"}
    if theirs != mine:
        changed = sorted(
            k for k in set(mine) | set(theirs) if mine.get(k, "<unset>") != theirs.get(k, "<unset>")
        )
        return f"made with other train_magrpo params ({', '.join(changed)})"
    if int(info.get("world_size", 1)) != tr.world_size:  # the processes' problem slices would not match
        return f"made by {info.get('world_size', 1)} process(es), not {tr.world_size}"
    if info.get("resume_key", "") != tr.resume_key:
        return "made with other code, data or params of the stage's other sections"
    if tr.cfg.curriculum != "none" and not info.get("curriculum"):
        return "without the curriculum this run needs"
    next_step = int(info["next_step"])
    if next_step > tr.cfg.num_steps:
        return (
            f"a longer run's (next_step {next_step} > num_steps {tr.cfg.num_steps}); a shorter run is "
            "trained afresh, never cut from a longer one"
        )
    return None


def restore(tr: Trainer, folder: Path) -> tuple[list[dict], list[dict]]:
    """Copy ``folder``'s adapters and optimizer states into the trainer; returns (history, samples).

    Raises whatever reading or applying fails with, leaving the model and optimizers as they were.
    """
    state = torch.load(folder / "state.pt", weights_only=False, map_location="cpu")
    params = dict(tr.model.named_parameters())
    for a in tr.agents:
        for n, t in state["adapters"][a].items():
            if n not in params or params[n].shape != t.shape:
                raise ValueError(f"adapter weight {n} does not fit the model")
    before = {n: p.detach().clone() for n, p in params.items() if "lora_" in n}
    critic = getattr(tr, "critic", None)
    critic_before = copy.deepcopy(critic.state_dict()) if critic is not None else None
    try:
        with torch.no_grad():
            for a in tr.agents:
                for n, t in state["adapters"][a].items():
                    params[n].copy_(t)
                tr.optimizers[a].load_state_dict(state["optimizers"][a])
        if critic is not None:
            critic.load_state_dict(state["critic"])
    except BaseException:
        with torch.no_grad():
            for n, t in before.items():
                params[n].copy_(t)
        tr.optimizers = new_optimizers(tr.model, tr.agents, tr.cfg)
        if critic is not None:
            critic.load_state_dict(critic_before)
        raise
    history = json.loads((folder / "trainer.json").read_text())["history"]
    with open(folder / "samples.jsonl") as f:
        samples = [json.loads(line) for line in f if line.strip()]
    return history, samples


def load_checkpoint(tr: Trainer) -> int:
    """Restore the newest complete checkpoint that fits this run; returns the step to start from (0: none).

    Candidates, newest first: ``<dir>.new`` (complete only when a save was killed just before its swap),
    ``<dir>``, ``<dir>.old`` (a save killed during its swap). An incomplete one, or one of other params,
    code or data, or of a longer run (``next_step > num_steps``), is skipped with a log line saying why.
    """
    for folder in (_sibling(tr, ".new"), tr.checkpoint_dir, _sibling(tr, ".old")):
        if not folder.is_dir():
            continue
        problem = checkpoint_problem(folder)
        if problem is not None:
            log.warning("ignoring incomplete checkpoint %s: %s", folder, problem)
            continue
        info = json.loads((folder / "trainer.json").read_text())
        unfit = why_unfit(tr, info)
        if unfit is not None:
            log.warning("checkpoint in %s is %s; not resuming it", folder, unfit)
            continue
        try:
            order = curriculum_order(tr.problems, info.get("curriculum"))  # before any state is restored
            tr.history, tr.samples = restore(tr, folder)
        except Exception as e:
            log.warning(
                "checkpoint in %s could not be loaded (%s: %s); not resuming it",
                folder,
                type(e).__name__,
                e,
            )
            continue
        if order is not None:
            tr.order, tr.curriculum = order, info["curriculum"]
        tr.warm_start = info.get("warm_start")
        tr.reward_baseline = dict(info.get("reward_baseline") or {})
        return int(info["next_step"])
    if any(f.exists() for f in (_sibling(tr, ".new"), tr.checkpoint_dir, _sibling(tr, ".old"))):
        log.warning(
            "no checkpoint in %s fits this run (see above); starting from scratch (num_steps %d)",
            tr.checkpoint_dir,
            tr.cfg.num_steps,
        )
    return 0


def load_init_adapters(tr: Trainer, folder: str | Path) -> dict:
    """Copy saved adapters into the trainer's (``train_magrpo.init_adapters``): ``folder/<agent>`` is a peft folder
    (``adapter_model.safetensors``) per agent, of the same LoRA shape (r, alpha, target modules) as this run.

    Returns ``{"init_adapters": folder, "init_adapters_sha256": <digest of the agents' weight files, 12 hex>}``,
    what the run logs in place of the warm start's figures.

    Raises:
        FileNotFoundError: an agent's folder or weight file is missing (names it).
        ValueError: the saved weights do not fit this run's adapters (a missing or extra tensor, another shape).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load

    folder = Path(folder)
    digest = hashlib.sha256()
    for a in tr.agents:
        path = folder / a / "adapter_model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(
                f"init_adapters: no {path} (one peft folder per agent: {', '.join(tr.agents)})"
            )
        data = path.read_bytes()  # read once: hashed and loaded from the same bytes
        digest.update(data)
        state = load(data)
        # peft saves ``...lora_A.weight`` for the parameter ``...lora_A.<agent>.weight``
        expected = {
            re.sub(rf"\.(lora_\w+)\.{re.escape(a)}\.", r".\1.", n): tuple(p.shape)
            for n, p in tr.model.named_parameters()
            if f".{a}." in n and "lora_" in n
        }
        saved = {k: tuple(v.shape) for k, v in state.items()}
        wrong = sorted(k for k in expected.keys() & saved.keys() if expected[k] != saved[k])
        if saved.keys() != expected.keys() or wrong:
            missing, extra = sorted(expected.keys() - saved.keys()), sorted(saved.keys() - expected.keys())
            shapes = [f"{k}: saved {saved[k]}, this run {expected[k]}" for k in wrong[:1]]
            raise ValueError(
                f"init_adapters: {path} does not fit agent {a}'s adapter ({len(saved)} tensors saved, "
                f"{len(expected)} expected; missing {missing[:2]}, unexpected {extra[:2]}, other shapes {shapes})"
            )
        set_peft_model_state_dict(tr.model, state, adapter_name=a)
    return {"init_adapters": str(folder), "init_adapters_sha256": digest.hexdigest()[:12]}


def save_adapters(tr: Trainer, out_dir: str | Path) -> list[Path]:
    """Save each agent's adapter as a standard peft folder ``out_dir/<agent>``."""
    out_dir = Path(out_dir)
    paths = []
    for a in tr.agents:
        shutil.rmtree(out_dir / a, ignore_errors=True)
        tr.model.save_pretrained(str(out_dir / "_tmp"), selected_adapters=[a])
        src = out_dir / "_tmp" / a if (out_dir / "_tmp" / a).exists() else out_dir / "_tmp"
        shutil.move(str(src), str(out_dir / a))
        shutil.rmtree(out_dir / "_tmp", ignore_errors=True)
        _sorted_module_lists(out_dir / a / "adapter_config.json")
        paths.append(out_dir / a)
    return paths


def _sorted_module_lists(config: Path) -> None:
    """peft writes ``target_modules`` (a set in memory) in the process's string-hash order, which changes from run
    to run: the same adapter got another file hash in every ``dvc repro``. Sorted here, so the same weights give
    the same folder."""
    if not config.exists():
        return
    data = json.loads(config.read_text())
    for key in ("target_modules", "modules_to_save", "exclude_modules"):
        if isinstance(data.get(key), list) and all(isinstance(v, str) for v in data[key]):
            data[key] = sorted(data[key])
    config.write_text(json.dumps(data, indent=2, sort_keys=True))  # peft's own layout
