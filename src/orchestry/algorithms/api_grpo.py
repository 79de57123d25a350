"""API-GRPO: policy optimisation through search, for models reachable only through an API (Orchestry).

Nothing is learned in the weights. One *episode* is a beam search over one problem's multi-agent transcript
(docs/algorithms.md, section 4):

    beam_0 = {empty trajectory}
    for turn t = 1..T (the agent of turn t acts):
        candidates_t = {tau + y : tau in beam_{t-1}, y ~ pi_agent(. | prompt(tau)), k samples each}
        V(c) for every candidate c                              # centralised value estimator
        beam_t = the N = beam_width candidates of highest V    # pruning
    group G = candidates_T (up to N * k complete trajectories)
    R(tau) = V(tau) for tau in G,   A(tau) = R(tau) - mean_G R  # group-relative advantage (GRPO, no std)
    selected = argmax_G A

The value estimator and the samplers are passed in, so this file is only the search. All episodes given to
:func:`beam_search` advance in lockstep: one ``sample`` call and one ``value`` call per turn for all of them,
so a local model samples every pending prompt of a beam step in one batch. Cost per episode is
``k * (1 + N * (T - 1))`` agent calls (the first turn expands the single empty trajectory).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Trajectory:
    """A (partial) transcript: ``turns`` in order, its value ``V`` and the value's parts ``info``."""

    turns: tuple[Any, ...] = ()
    value: float = 0.0
    info: dict = field(default_factory=dict)
    parent: int = -1  # index of the trajectory it extends in the previous beam


@dataclass
class EpisodeSearch:
    """The result of one episode's beam search.

    Attributes:
        group: the final candidates G (complete trajectories), in candidate order.
        advantages: ``A = R - mean R`` over ``group``, same order.
        selected: index in ``group`` of the chosen trajectory (``argmax A``, first on ties).
        beam: indices in ``group`` of the final beam (top N by value).
        history: per turn ``{"turn", "values", "kept"}`` (candidate values and the kept indices).
    """

    group: list[Trajectory]
    advantages: list[float]
    selected: int
    beam: list[int]
    history: list[dict]


def expand(beam_size: int, k: int) -> list[tuple[int, int]]:
    """``(parent, sample_index)`` for every candidate: each of ``beam_size`` parents times k samples.

    ``sample_index = parent * k + j`` (j < k), so candidates of identical parents are still distinct
    samples (and distinct cache entries). Length ``beam_size * k``.
    """
    return [(p, p * k + j) for p in range(beam_size) for j in range(k)]


def prune(values: Sequence[float], beam_width: int, keys: Sequence[Hashable] | None = None) -> list[int]:
    """Indices of the ``beam_width`` candidates of highest value, best first.

    Ties keep candidate order (a stable sort). With ``keys``, a candidate whose key (e.g. its transcript
    text) equals an already kept one is skipped while distinct candidates remain, so the beam is not
    filled with duplicates.

    Returns:
        ``min(beam_width, len(values))`` indices.
    """
    order = sorted(range(len(values)), key=lambda i: -values[i])
    if keys is None:
        return order[:beam_width]
    kept, seen, dupes = [], set(), []
    for i in order:
        if keys[i] in seen:
            dupes.append(i)
            continue
        seen.add(keys[i])
        kept.append(i)
    return (kept + dupes)[:beam_width] if len(kept) < beam_width else kept[:beam_width]


def value_advantages(values: Sequence[float]) -> list[float]:
    """Group-relative advantages of one beam group's trajectory values, ``A_g = V_g - mean(V)`` (the ``mean``
    form of MAGRPO's tensor :func:`orchestry.algorithms.magrpo.group_advantages`, on plain floats)."""
    if not values:
        return []
    mean = sum(values) / len(values)
    return [v - mean for v in values]


Sampler = Callable[[list[tuple[int, Trajectory, int]]], list[Any]]
ValueFn = Callable[[list[tuple[int, Trajectory]], bool], list[tuple[float, dict]]]


def beam_search(
    num_episodes: int,
    num_turns: int,
    k_samples: int,
    beam_width: int,
    sample: Sampler,
    value: ValueFn,
    key: Callable[[Trajectory], Hashable] | None = None,
) -> list[EpisodeSearch]:
    """Run ``num_episodes`` beam searches in lockstep (see the module docstring).

    Args:
        sample: ``[(episode, parent trajectory, sample_index)] -> [turn]``, one new turn per request,
            called once per turn for all episodes.
        value: ``([(episode, candidate)], final) -> [(V, info)]``; ``final`` is True on the last turn.
        key: identity of a candidate for duplicate-aware pruning (``None``: no de-duplication).

    Returns:
        One :class:`EpisodeSearch` per episode.
    """
    beams: list[list[Trajectory]] = [[Trajectory()] for _ in range(num_episodes)]
    histories: list[list[dict]] = [[] for _ in range(num_episodes)]
    groups: list[list[Trajectory]] = [[] for _ in range(num_episodes)]
    kept_last: list[list[int]] = [[] for _ in range(num_episodes)]
    for t in range(num_turns):
        final = t == num_turns - 1
        requests = [
            (e, beams[e][p], s) for e in range(num_episodes) for p, s in expand(len(beams[e]), k_samples)
        ]
        parents = [p for e in range(num_episodes) for p, _ in expand(len(beams[e]), k_samples)]
        new_turns = sample(requests)
        candidates = [
            Trajectory(turns=traj.turns + (turn,), parent=p)
            for (_, traj, _), turn, p in zip(requests, new_turns, parents, strict=True)
        ]
        scored = value([(e, c) for (e, _, _), c in zip(requests, candidates, strict=True)], final)
        for c, (v, info) in zip(candidates, scored, strict=True):
            c.value, c.info = float(v), info
        for e in range(num_episodes):
            mine = [c for (ep, _, _), c in zip(requests, candidates, strict=True) if ep == e]
            values = [c.value for c in mine]
            keep = prune(values, beam_width, [key(c) for c in mine] if key else None)
            histories[e].append({"turn": t, "values": values, "kept": keep})
            beams[e] = [mine[i] for i in keep]
            if final:
                groups[e], kept_last[e] = mine, keep
    out = []
    for e in range(num_episodes):
        adv = value_advantages([c.value for c in groups[e]])
        selected = max(range(len(adv)), key=lambda i: (adv[i], -i)) if adv else -1
        out.append(EpisodeSearch(groups[e], adv, selected, kept_last[e], histories[e]))
    return out
