"""How an agent's rows go through the model in the update: micro-batches of whole problems within a fixed token
budget, the columns they need, and the gradient average over data-parallel processes (``accelerate launch``).
"""

from __future__ import annotations

import os

import torch

from orchestry.llm.loading import adapter_parameters
from orchestry.training.magrpo.common import Rollout


def process_group() -> tuple[int, int]:
    """``(rank, world size)``. Processes started by ``accelerate launch`` (or ``torchrun``) train one model data-
    parallel through accelerate's process group (gloo on CPU, NCCL on GPUs); a lone process is ``(0, 1)``."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # without GPUs: gloo over CPU processes
    return state.process_index, state.num_processes


def barrier() -> None:
    """Wait until every process of a data-parallel run gets here (nothing in a lone process)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()


#: step-record keys summed over the processes (counts); ``seconds*`` take the slowest process, ``problems`` are
#: concatenated in rank order, ``turns_run`` is the most any process ran, every other number is the mean over the
#: processes (rates and means over equally many samples per process: the mean over all of them)
SUMMED = ("tokens/prompt", "tokens/completion", "resample_rollouts", "resampled_groups", "rows_updated/")


def merge_records(records: list[dict]) -> dict:
    """One step record of the whole data-parallel step from each process's record (rank order)."""
    out = dict(records[0])
    for key in {k for r in records for k in r}:
        values = [r[key] for r in records if key in r]
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if key == "problems":
            out[key] = [p for v in values for p in v]
        elif key == "step" or not numbers:
            out[key] = values[0]
        elif key.startswith(SUMMED):
            out[key] = sum(values)
        elif key.startswith("seconds") or key == "turns_run":
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def gather_step(record: dict, samples: list[dict]) -> tuple[dict, list[dict]]:
    """Every process's step record and samples, gathered on every process: the merged record
    (:func:`merge_records`) and all samples in rank order (rank 0's problems first, as a lone process with all
    of them would list them). A data-parallel run's history, samples and checkpoints are the whole run's."""
    from accelerate.utils import gather_object

    gathered = gather_object([(record, samples)])
    return merge_records([r for r, _ in gathered]), [s for _, ss in gathered for s in ss]


def chunk_inputs(ro: Rollout, rows: list[int], chunk: list[int]):
    """Sequences and mask of the rows ``chunk`` (indices into ``rows``), without the columns that are padding
    in every one of them; returns ``(seqs, mask, prompt_width)``."""
    sel = torch.tensor([rows[j] for j in chunk])
    seqs, mask = ro.batch.sequences[sel], ro.batch.attention_mask[sel]
    width = ro.batch.prompt_width
    first = int((mask[:, :width].sum(dim=0) > 0).float().argmax())
    last = int(mask.sum(dim=0).nonzero().max()) + 1
    return seqs[:, first:last], mask[:, first:last], width - first


def active_rows(ro: Rollout) -> list[bool]:
    """``[N*G]``: which samples of ``ro`` this turn generated (later turns skip the samples that passed)."""
    return [True] * (len(ro.problems) * ro.G) if ro.active is None else ro.active.flatten().tolist()


def average_gradients(model, agent: str, n_rows: int, world_size: int) -> int:
    """Average this agent's LoRA gradients over the processes with accelerate's ``reduce`` (one all-reduce).

    Each process's loss is the mean over its own problems, so the average is the loss of all processes'
    problems together, as one process with ``world_size`` times the problems would compute it. Returns
    the number of rows trained on by all processes together (0: every process skips the step).
    """
    from accelerate.utils import reduce

    params = adapter_parameters(model, agent)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    count = torch.tensor([float(n_rows)], device=grads[0].device)
    flat = reduce(torch.cat([g.reshape(-1).float() for g in grads] + [count]), reduction="sum")
    total = int(flat[-1].item())
    offset = 0
    for p in params:
        p.grad = (flat[offset : offset + p.numel()] / world_size).view_as(p).to(p.dtype)
        offset += p.numel()
    return total


def sum_over_processes(values: torch.Tensor, device) -> torch.Tensor:
    """``values`` summed over the data-parallel processes (one all-reduce on ``device``; returned on the CPU): so
    that a statistic of the whole step (the ``reinforce`` baseline's sums and counts) is the same on every
    process. Every process must call it the same number of times, with the same shape."""
    from accelerate.utils import reduce

    return reduce(values.to(device), reduction="sum").cpu()


def micro_batches(ro: Rollout, rows: list[int], keep: list[int], budget: int) -> list[list[int]]:
    """Split kept row indices (into ``rows``) into micro-batches of at most ``budget`` tokens.

    A problem's rows stay together (its prompt is computed once) unless they alone exceed the budget.
    """
    mask = ro.batch.attention_mask
    P = ro.batch.prompt_width
    by_problem: dict[int, list[int]] = {}
    for j in keep:
        by_problem.setdefault(j // ro.G, []).append(j)
    chunks: list[list[int]] = []
    current: list[int] = []
    used = 0
    for members in by_problem.values():
        prompt = int(mask[rows[members[0]], :P].sum())
        # later turns: each row has its own prompt (counted per row, as a prompt of its own)
        lengths = [int(mask[rows[j], P:].sum()) + (0 if ro.shared_prompt else int(mask[rows[j], :P].sum()))
                   for j in members]  # fmt: skip
        if not ro.shared_prompt:
            prompt = 0
        if current and used + prompt + sum(lengths) > budget:
            chunks.append(current)
            current, used = [], 0
        new_problem = True
        for j, n in zip(members, lengths, strict=True):
            cost = n + (prompt if new_problem else 0)
            if current and used + cost > budget:  # this problem alone exceeds the budget: split it
                chunks.append(current)
                current, used, cost = [], 0, n + prompt
            current.append(j)
            used += cost
            new_problem = False
    if current:
        chunks.append(current)
    return chunks
