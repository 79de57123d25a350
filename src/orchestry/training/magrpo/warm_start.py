"""Supervised warm start of the helper/main pair on the generated problems' reference decompositions.

Group-relative RL only reinforces what the policy samples. On the generated problems the 135M main agent calls
the helper's ``aux`` in 0-2 % of its samples whatever the prompt says (reports/experiments/learnable_default_v3),
so the gated cooperation bonus is never sampled and MAGRPO cannot raise it. The standard remedy is a short
supervised phase before RL (the "cold start" of DeepSeek-R1, arXiv 2501.12948, section 2.3.1; SFT then RL in
InstructGPT, arXiv 2203.02155): here each agent is trained for ``warm_start_epochs`` epochs with the next-token
loss on its part of every train problem's reference solution
(:func:`orchestry.generators.compositional.reference_decomposition`): the helper writes the first primitive as
``aux``, the main calls ``aux`` and applies the rest. Only train problems are used; the test split's
compositions never occur in them, so a warm-started pair that passes test problems has learned to combine,
not memorised answers.

The loss of a batch is the mean over its target tokens of -log pi(y_t | prompt, y_<t), with the prompt the agent
sees in training (:meth:`orchestry.problems.Problem.helper_prompt` / ``main_prompt``, chat format) and the target
the code block the policy would write (`````python ... `````). Each agent has its own AdamW (``warm_start_lr``),
separate from the MAGRPO optimizers, whose moments start at zero after the warm start.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import random
import time
from dataclasses import replace

import torch

from orchestry.config import TrainMagrpoParams
from orchestry.generators.compositional import delegated_decomposition, reference_decomposition
from orchestry.llm.frozen import cast_once
from orchestry.llm.loading import adapter_parameters
from orchestry.llm.local import chat_prompt
from orchestry.llm.logprobs import completion_logprobs
from orchestry.numerics import bf16_autocast
from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, Problem
from orchestry.rewards.code import level_rewards
from orchestry.training.magrpo.common import BASE, SELF_DISTILL_SEED, Trainer
from orchestry.training.magrpo.rollouts import generate_rows

log = logging.getLogger(__name__)

# warm_start_epochs: auto on generated problems: 2 epochs of both prompt forms at lr 5e-4 (the compute of
# reports/experiments/warm_start's 4 epochs of one form; docs/algorithms.md section 3a)
AUTO_WARM_START_EPOCHS = 2
#: problems per ``generate`` call when sampling the base pair's own answers (2 agents x warm_start_self_samples rows each)
SELF_BATCH_PROBLEMS = 8


#: task ids of the beginner family (:mod:`orchestry.generators.beginner`): generated problems that name no
#: decomposition (plain prompts); their warm-start targets are :func:`plain_delegate_targets`
BEGINNER_PREFIX = "Beginner/"


def plain_delegate_targets(p: Problem) -> tuple[str, str]:
    """``(aux code, main code)`` for a problem that names no decomposition: ``aux`` takes the entry point's
    parameters and runs its canonical solution (the whole answer, in the solution's own shape), the main returns
    ``aux(<its arguments>)``::

        def aux(n: int) -> int:               def digit_sum(n: int) -> int:
            return sum(int(c) for c in str(n))    return aux(n)

    Raises:
        ValueError: no ``def <entry point>(`` line in the prompt, or no canonical solution; names the task id.
    """
    sig = next((ln for ln in p.prompt.split("\n") if ln.startswith(f"def {p.entry_point}(")), "")
    if not sig or not p.canonical_solution.strip():
        raise ValueError(
            f"{p.task_id}: no def line for {p.entry_point} in the prompt, or no canonical solution"
        )
    try:
        args = ast.parse(sig + "\n    pass\n").body[0].args
    except SyntaxError as e:
        raise ValueError(f"{p.task_id}: the def line does not parse: {e}") from None
    names = [a.arg for a in args.posonlyargs + args.args]
    aux_code = "def aux(" + sig.split("(", 1)[1] + "\n" + p.canonical_solution.rstrip("\n") + "\n"
    return aux_code, f"{sig}\n    return aux({', '.join(names)})\n"


def is_beginner(p: Problem) -> bool:
    """A generated problem of the beginner family (no named decomposition): :data:`BEGINNER_PREFIX`."""
    return p.task_id.startswith(BEGINNER_PREFIX) and not p.aux_spec


def has_reference_decomposition(p: Problem) -> bool:
    """Whether ``p`` is a generated problem whose reference solution splits into ``aux`` + main."""
    try:
        reference_decomposition(p.prompt, p.aux_spec, p.canonical_solution)
    except ValueError:
        return False
    return True


def resolved_epochs(cfg: TrainMagrpoParams, problems: list[Problem]) -> int:
    """The warm start's epochs: ``cfg.warm_start_epochs``, with ``auto`` resolved to
    :data:`AUTO_WARM_START_EPOCHS` when the workflow is helper_main and every problem has a reference
    decomposition (:func:`has_reference_decomposition`), else 0 (HumanEval, MBPP, any other problem file); 0 when
    ``init_adapters`` names saved adapters to start from."""
    if cfg.init_adapters:  # MAGRPO starts from saved adapters instead
        return 0
    if cfg.warm_start_epochs != "auto":
        return int(cfg.warm_start_epochs)
    ok = (
        cfg.workflow == "helper_main"
        and problems
        and all(has_reference_decomposition(p) or is_beginner(p) for p in problems)
    )
    return AUTO_WARM_START_EPOCHS if ok else 0


def warm_start_examples(
    problems: list[Problem],
    tokenizer,
    plain_prompts: bool = False,
    plain_targets: str = "delegate",
    own_answers: dict[str, list[tuple[str, str]]] | None = None,
) -> dict[str, list[tuple[str, str]]]:
    """``{"helper": [(chat prompt, target)], "main": [...]}``, one pair per problem, in problem order.

    A problem of the beginner family (:func:`is_beginner`: generated, no named decomposition) gives one pair under
    its own (plain) prompts, :func:`plain_delegate_targets`, whatever ``plain_prompts`` says.
    With ``plain_prompts`` each problem gives a second pair, after the first, under the prompts the agents see
    on a problem that names no decomposition (``aux_spec`` empty: HumanEval, MBPP, any ``--problems`` file),
    where the helper is asked for "a helper named aux that would be useful" and the main is told only that
    ``aux(...)`` exists. Without it the pair learns the split only in the spec-prompt format and, on other
    problems, the helper copies the entry point's signature instead of writing ``aux``. ``plain_targets``
    picks that pair's targets: ``delegate`` (:func:`~orchestry.generators.compositional.delegated_decomposition`:
    ``aux`` computes the whole answer, the main returns it), ``reference`` (the spec pair's targets again) or
    ``self``: the base pair's own passing answers ``own_answers[task_id]`` (:func:`own_passing_answers`), as
    many pairs as were kept for the problem (none for a problem the base pair never solved), verbatim.

    Raises:
        ValueError: a problem has no reference decomposition (not generated: ``prepare.source: compositional``
            makes them); the message names its task id.
    """
    plain_split = {"delegate": delegated_decomposition, "reference": reference_decomposition}.get(
        plain_targets
    )
    if plain_split is None and plain_targets != "self":
        raise ValueError(f"plain_targets must be delegate, reference or self, got {plain_targets!r}")
    if plain_targets == "self" and plain_prompts and own_answers is None:
        raise ValueError("plain_targets self needs own_answers (own_passing_answers)")
    out: dict[str, list[tuple[str, str]]] = {"helper": [], "main": []}
    for p in problems:
        if is_beginner(p):  # a plain problem already: its one pair, aux doing the whole answer
            aux_code, main_code = plain_delegate_targets(p)
            out["helper"].append(
                (chat_prompt(tokenizer, p.helper_prompt(), HELPER_SYSTEM), f"```python\n{aux_code}```")
            )
            out["main"].append(
                (chat_prompt(tokenizer, p.main_prompt(), MAIN_SYSTEM), f"```python\n{main_code}```")
            )
            continue
        try:
            aux_code, main_code = reference_decomposition(p.prompt, p.aux_spec, p.canonical_solution)
        except ValueError as e:
            raise ValueError(
                f"train_magrpo.warm_start_epochs needs generated problems (prepare.source: compositional): "
                f"{p.task_id}: {e}; set train_magrpo.warm_start_epochs: 0 to train on other problems"
            ) from None
        out["helper"].append(
            (chat_prompt(tokenizer, p.helper_prompt(), HELPER_SYSTEM), f"```python\n{aux_code}```")
        )
        out["main"].append(
            (chat_prompt(tokenizer, p.main_prompt(), MAIN_SYSTEM), f"```python\n{main_code}```")
        )
        if plain_prompts:
            plain = replace(p, aux_spec="")
            if plain_split is None:
                targets = list(own_answers.get(p.task_id, []))
            else:
                aux_code, main_code = plain_split(p.prompt, p.aux_spec, p.canonical_solution)
                targets = [(f"```python\n{aux_code}```", f"```python\n{main_code}```")]
            for helper_text, main_text in targets:
                out["helper"].append(
                    (chat_prompt(tokenizer, plain.helper_prompt(), HELPER_SYSTEM), helper_text)
                )
                out["main"].append((chat_prompt(tokenizer, plain.main_prompt(), MAIN_SYSTEM), main_text))
    return out


def own_passing_answers(
    tr: Trainer, problems: list[Problem]
) -> tuple[dict[str, list[tuple[str, str]]], dict]:
    """The base pair's own passing answers to ``problems`` under plain prompts: rejection-sampled
    self-distillation targets (STaR, arXiv 2203.14465; rejection-sampling fine-tuning, arXiv 2308.01825).

    For every problem, with its ``aux_spec`` removed (the prompts of HumanEval, MBPP or any problem file), the bare
    base model (adapters off) samples ``cfg.warm_start_self_samples`` joint (helper, main) answers under the run's
    sampling params, in batches of :data:`SELF_BATCH_PROBLEMS` problems (one ``generate`` call each, seeded from
    ``cfg.seed``); each pair is scored with the level reward in the sandbox. A pair is kept when every assert
    passes and neither completion hit ``max_completion_length``; exact repeats are dropped; at most
    ``cfg.warm_start_self_per_problem`` are kept per problem, highest joint reward first (a cooperating pair, main
    calling ``aux``, earns more), ties in sampling order. The targets are the completions as sampled, so the pair
    is trained on its own style, not on the generator's ``r = ...`` chain.

    Returns:
        ``({task_id: [(helper completion, main completion)]}, stats)`` with stats ``self/samples``, ``self/passed``
        (pairs passing every assert), ``self/kept``, ``self/problems`` (problems with at least one kept pair),
        ``self/cooperating`` (kept pairs whose main calls ``aux`` and earns the cooperation level), ``self/seconds``,
        ``self/tokens/completion``.
    """
    t0 = time.time()
    n = tr.cfg.warm_start_self_samples
    cap = tr.cfg.warm_start_self_per_problem
    limit = tr.sampling.max_completion_length
    plain = [replace(p, aux_spec="") for p in problems]
    kept: dict[str, list[tuple[str, str]]] = {}
    stats = {"self/samples": 0, "self/passed": 0, "self/kept": 0, "self/cooperating": 0,
             "self/tokens/completion": 0}  # fmt: skip
    for k, at in enumerate(range(0, len(plain), SELF_BATCH_PROBLEMS)):
        chunk = plain[at : at + SELF_BATCH_PROBLEMS]
        prompts: list[str] = []
        for p in chunk:
            hp = chat_prompt(tr.tokenizer, p.helper_prompt(), HELPER_SYSTEM)
            mp = chat_prompt(tr.tokenizer, p.main_prompt(), MAIN_SYSTEM)
            prompts += [hp] * n + [mp] * n
        batch = generate_rows(
            tr, prompts, [BASE] * len(prompts), tr.cfg.seed * 1_000_003 + k + SELF_DISTILL_SEED
        )
        stats["self/tokens/completion"] += sum(i.completion_tokens for i in batch.items)
        samples = [
            (p, batch.items[(j * 2) * n + g], batch.items[(j * 2 + 1) * n + g])
            for j, p in enumerate(chunk)
            for g in range(n)
        ]
        truncated = [h.completion_tokens >= limit or m.completion_tokens >= limit for _, h, m in samples]
        helpers, mains = [s[1].text for s in samples], [s[2].text for s in samples]
        probs = [s[0] for s in samples]
        if tr.reward_fn is not None:
            results = tr.reward_fn(probs, helpers, mains)
        else:
            results = level_rewards(probs, helpers, mains, tr.sandbox, truncated=truncated)
        stats["self/samples"] += len(samples)
        select_own_answers(chunk, n, cap, helpers, mains, results, truncated, kept, stats)
    stats["self/problems"] = len(kept)
    stats["self/seconds"] = time.time() - t0
    log.info(
        "self-distillation targets: %d of %d base pairs pass, %d kept on %d of %d problems (%d cooperating), %.0f s",
        stats["self/passed"], stats["self/samples"], stats["self/kept"], len(kept), len(problems),
        stats["self/cooperating"], stats["self/seconds"],
    )  # fmt: skip
    return kept, stats


def select_own_answers(
    problems: list[Problem],
    n: int,
    cap: int,
    helpers: list[str],
    mains: list[str],
    results: list,
    truncated: list[bool],
    kept: dict[str, list[tuple[str, str]]],
    stats: dict,
) -> None:
    """:func:`own_passing_answers`' rejection step for one batch: ``problems[j]``'s samples are rows
    ``j * n .. j * n + n - 1`` of ``helpers``/``mains``/``results`` (:class:`~orchestry.rewards.code.LevelReward`)/
    ``truncated``. Appends to ``kept[task_id]`` at most ``cap`` distinct ``(helper, main)`` pairs that pass every
    assert and were not truncated, highest ``total`` first (sampling order breaks ties), and counts
    ``self/passed``, ``self/kept``, ``self/cooperating`` in ``stats``."""
    for j, p in enumerate(problems):
        passing = []
        for g in range(n):
            i = j * n + g
            if results[i].all_passed:
                stats["self/passed"] += 1
                if not truncated[i]:
                    passing.append((-results[i].total, g, i))
        seen: set[tuple[str, str]] = set()
        for _, _, i in sorted(passing):
            pair = (helpers[i], mains[i])
            if pair in seen or len(seen) >= cap:
                continue
            seen.add(pair)
            kept.setdefault(p.task_id, []).append(pair)
            stats["self/kept"] += 1
            stats["self/cooperating"] += int(results[i].cooperation > 0)


def _tokenize(tokenizer, pairs: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """Token ids of each ``(prompt, target)``, without special tokens (the chat prompt carries its own)."""
    return [
        (
            tokenizer(p, add_special_tokens=False)["input_ids"],
            tokenizer(t, add_special_tokens=False)["input_ids"],
        )
        for p, t in pairs
    ]


def _batch(tokenizer, tokens: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(ids [B, P+T], mask, P)`` of tokenized ``(prompt, target)`` pairs (:func:`_tokenize`): prompts left-padded
    to P, targets right-padded to T."""
    P, T = max(len(p) for p, _ in tokens), max(len(t) for _, t in tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(tokens), P + T), pad, dtype=torch.long)
    mask = torch.zeros((len(tokens), P + T), dtype=torch.long)
    for i, (p, t) in enumerate(tokens):
        ids[i, P - len(p) : P] = torch.tensor(p)
        ids[i, P : P + len(t)] = torch.tensor(t)
        mask[i, P - len(p) : P + len(t)] = 1
    return ids, mask, P


def warm_start(tr: Trainer, bf16: bool, epochs: int) -> dict:
    """Train each agent's adapter on its reference parts of ``tr.problems`` (module docstring): all of them, or
    the first ``cfg.warm_start_problems``.

    ``epochs`` epochs (the trainer passes :func:`resolved_epochs`), batches of ``cfg.warm_start_batch`` examples in
    a seeded order per epoch (``cfg.seed``), one clipped (``max_grad_norm``) AdamW step per batch. Every process of a data-parallel run
    trains the same examples in the same order, so their adapters stay equal.

    Args:
        bf16: the update runs under bf16 autocast (:func:`orchestry.numerics.resolve_bf16`, as MAGRPO's update).

    Returns:
        ``{"epochs", "seconds", "examples", "steps", "loss/<agent>/first", "loss/<agent>/last"}``: the mean token loss
        (nats) of each agent's first and last epoch.

    Raises:
        ValueError: a train problem has no reference decomposition (:func:`warm_start_examples`).
    """
    cfg = tr.cfg
    t0 = time.time()
    problems = list(tr.problems)[: cfg.warm_start_problems or None]
    own, own_stats = None, {}
    if cfg.warm_start_plain_prompts and cfg.warm_start_plain_targets == "self":
        tr.model.eval()
        own, own_stats = own_passing_answers(tr, problems)
    examples = warm_start_examples(
        problems, tr.tokenizer, cfg.warm_start_plain_prompts, cfg.warm_start_plain_targets, own
    )
    out: dict = {"epochs": epochs, "examples": len(examples["main"]), "steps": 0, **own_stats}
    tr.model.train()
    # bf16: one cast of each frozen weight for the whole warm start (no decoding in between), not two per pass
    casts = cast_once(tr.model, torch.bfloat16) if bf16 else contextlib.nullcontext()
    with casts:
        _train_agents(tr, examples, epochs, bf16, out)
    out["seconds"] = time.time() - t0
    return out


def _train_agents(tr: Trainer, examples: dict, epochs: int, bf16: bool, out: dict) -> None:
    """:func:`warm_start`'s loop: each agent's epochs of clipped AdamW steps, the losses into ``out``."""
    cfg = tr.cfg
    for agent in tr.agents:
        params = adapter_parameters(tr.model, agent)
        opt = torch.optim.AdamW(params, lr=cfg.warm_start_lr, weight_decay=cfg.weight_decay)
        tr.model.set_adapter(agent)
        rng = random.Random(cfg.seed)
        pairs = _tokenize(tr.tokenizer, examples[agent])  # once per agent, not per epoch
        for epoch in range(epochs):
            order = list(range(len(pairs)))
            rng.shuffle(order)
            total, tokens = 0.0, 0
            for at in range(0, len(order), cfg.warm_start_batch):
                ids, mask, P = _batch(tr.tokenizer, [pairs[j] for j in order[at : at + cfg.warm_start_batch]])
                with bf16_autocast(tr.model, bf16):
                    _, tok_lp, tmask = completion_logprobs(tr.model, ids, mask, P)
                n = float(tmask.sum())
                loss = -tok_lp.sum() / n
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                opt.step()
                total, tokens = total + float(loss.detach()) * n, tokens + int(n)
                out["steps"] += 1
            mean = total / max(tokens, 1)
            if epoch == 0:
                out[f"loss/{agent}/first"] = mean
            out[f"loss/{agent}/last"] = mean
            log.info("warm start %s epoch %d/%d: loss %.3f", agent, epoch + 1, epochs, mean)
        opt.zero_grad(set_to_none=True)
