"""Learned orchestrator (Puppeteer): the REINFORCE math against hand-computed values, learning on a synthetic
environment whose optimal policy is known, the agent pool, caching by (agent, prompt), and whole runs (a fake
chat backend; the embedded model on one problem)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from orchestry.algorithms.orchestrator import (
    MovingAverageBaseline,
    OrchestratorPolicy,
    Reinforce,
    Trajectory,
    action_mask,
    discounted_returns,
    reinforce_loss,
    step_rewards,
)
from orchestry.config import SamplingParams, TrainOrchestratorParams
from orchestry.llm.backends import ChatResult
from orchestry.llm.cost import FREE
from orchestry.problems import make_problem
from orchestry.sandbox import Sandbox
from orchestry.tasks.agent_pool import AGENTS, EpisodeState, ModelAgent, make_agents
from orchestry.training.orchestrator import Episode, FixedPipeline, run_orchestrator, transition_counts

REPO = Path(__file__).resolve().parents[1]


# ---- the math, by hand ------------------------------------------------------------------------------------------
def test_step_rewards_and_discounted_returns_by_hand() -> None:
    # costs 1 and 5, r = 2, lambda = 0.1: R = [-0.1, -0.5, 2 - 0.1 * 6]
    rewards = step_rewards([1.0, 5.0], 2.0, 0.1)
    assert rewards == pytest.approx([-0.1, -0.5, 1.4])
    # gamma 0.9: G2 = 1.4, G1 = -0.5 + 0.9 * 1.4 = 0.76, G0 = -0.1 + 0.9 * 0.76 = 0.584
    assert discounted_returns(rewards, 0.9) == pytest.approx([0.584, 0.76, 1.4])
    assert discounted_returns(rewards, 1.0) == pytest.approx([0.8, 0.9, 1.4])
    assert step_rewards([], 3.0, 0.5) == [3.0]  # terminate at once: R_0 = r


def test_moving_average_baseline_by_hand() -> None:
    b = MovingAverageBaseline(momentum=0.5)
    # first batch: b_t is the batch mean (t0: (1 + 3) / 2 = 2, t1: 2)
    assert b.advantages([[1.0, 2.0], [3.0]]) == [[-1.0, 0.0], [1.0]]
    assert b.values == {0: 2.0, 1: 2.0}
    # second batch: advantages use the baseline before the update, then b0 = 0.5 * 2 + 0.5 * 4, b1 = 0.5 * 2 + 0
    assert b.advantages([[4.0, 0.0, 5.0]]) == [[2.0, -2.0, 0.0]]  # t2 unseen: its own batch mean
    assert b.values == {0: 3.0, 1: 1.0, 2: 5.0}


def test_action_mask_terminate_masked_before_min_and_forced_after_max() -> None:
    as_list = lambda m: m.tolist()  # noqa: E731
    assert as_list(action_mask(0, 3, min_steps=1, max_steps=3)) == [True, True, True, False]
    assert as_list(action_mask(1, 3, min_steps=1, max_steps=3)) == [True, True, True, True]
    assert as_list(action_mask(3, 3, min_steps=1, max_steps=3)) == [False, False, False, True]
    assert as_list(action_mask(0, 3, 1, 3, available=[False, True, False])) == [False, True, False, False]
    assert as_list(action_mask(0, 3, 1, 3, available=[False] * 3)) == [False, False, False, True]


def test_masked_policy_and_reinforce_loss_by_hand() -> None:
    policy = OrchestratorPolicy(obs_dim=4, n_actions=3, hidden=8)  # last layer zero: uniform over allowed
    obs = torch.randn(2, 4)
    masks = torch.tensor([[True, True, False], [True, True, True]])
    probs = policy.distribution(obs, masks).probs
    assert torch.allclose(probs, torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]]))
    traj = Trajectory(obs, masks, torch.tensor([0, 2]), [0.0, 0.0])
    loss, stats = reinforce_loss(policy, [traj], [[1.0, -2.0]], entropy_coef=0.1)
    # -(1/2) (1 * log 1/2 + (-2) * log 1/3); entropies log 2 and log 3
    policy_loss = -(1.0 * math.log(0.5) + (-2.0) * math.log(1 / 3)) / 2
    entropy = (math.log(2) + math.log(3)) / 2
    assert stats["policy_loss"] == pytest.approx(policy_loss)
    assert stats["entropy"] == pytest.approx(entropy)
    assert loss.item() == pytest.approx(policy_loss - 0.1 * entropy)
    loss.backward()  # masked -inf logits give finite gradients
    assert all(torch.isfinite(p.grad).all() for p in policy.parameters() if p.grad is not None)
    with pytest.raises(ValueError, match="at least one allowed action"):
        policy(obs, torch.zeros(2, 3, dtype=torch.bool))


# ---- learning on a synthetic environment -------------------------------------------------------------------------
SOLVES = {0: (True, 1.0), 1: (True, 5.0), 2: (False, 1.0)}  # agent -> (solves the task, cost per call)
TERMINATE = 3


def _synthetic_episodes(learner: Reinforce, n: int, lam: float, gen, greedy=False, max_steps=3):
    """Agent 0 solves at cost 1, agent 1 at cost 5, agent 2 never; r = 1 if solved. State: step, solved, cost."""
    out = []
    for _ in range(n):
        solved, cost, t, costs = 0.0, 0.0, 0, []
        obs, masks, acts = [], [], []
        while True:
            o = torch.tensor([[t / max_steps, solved, cost / 10]])
            m = action_mask(t, 3, 0, max_steps).unsqueeze(0)
            a = int(learner.act(o, m, gen, greedy)[0])
            obs.append(o[0]), masks.append(m[0]), acts.append(a)
            if a == TERMINATE:
                break
            ok, c = SOLVES[a]
            solved = max(solved, float(ok))
            cost += c
            costs.append(c)
            t += 1
        out.append(
            Trajectory(
                torch.stack(obs), torch.stack(masks), torch.tensor(acts), step_rewards(costs, solved, lam)
            )
        )
    return out


_TRAINED: dict[float, Reinforce] = {}


def _train_synthetic(lam: float, updates: int = 150, seed: int = 0) -> Reinforce:
    """Seeded REINFORCE, 150 updates of 16 episodes (robust over seeds 0-4 at both lambdas when written)."""
    if lam not in _TRAINED:
        torch.manual_seed(seed)
        learner = Reinforce(OrchestratorPolicy(3, 4, 32), learning_rate=0.01, gamma=1.0, entropy_coef=0.05)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(updates):
            learner.update(_synthetic_episodes(learner, 16, lam, gen))
        _TRAINED[lam] = learner
    return _TRAINED[lam]


def test_reinforce_learns_the_cheap_solver_then_terminates() -> None:
    """lambda = 0.05: agent 0 then terminate returns 1 - 2 * 0.05 = 0.9 (agent 1: 0.5; agent 0 three times: 0.7)."""
    learner = _train_synthetic(lam=0.05)
    probe = torch.tensor([[0.0, 0.0, 0.0], [1 / 3, 1.0, 0.1]])  # start; after agent 0 solved at cost 1
    masks = torch.stack([action_mask(0, 3, 0, 3), action_mask(1, 3, 0, 3)])
    probs = learner.policy.distribution(probe, masks).probs
    assert probs[0, 0] > 0.8, (
        probs
    )  # the solver that costs 1, not the one that costs 5 nor the one that never solves
    assert probs[1, TERMINATE] > 0.8, probs  # and stop once solved
    (ep,) = _synthetic_episodes(learner, 1, 0.05, None, greedy=True)
    assert ep.actions.tolist() == [0, TERMINATE]


def test_higher_cost_lambda_terminates_earlier() -> None:
    """lambda = 0.6: solving with agent 0 returns 1 - 2 * 0.6 < 0, so stopping at once (return 0) is optimal."""
    cheap, dear = _train_synthetic(lam=0.05), _train_synthetic(lam=0.6)
    length = lambda lr: len(_synthetic_episodes(lr, 1, 0.0, None, greedy=True)[0].actions) - 1  # noqa: E731
    assert length(cheap) == 1
    assert length(dear) == 0


# ---- the agent pool --------------------------------------------------------------------------------------------
INC = make_problem(
    {"task_id": "T/inc", "entry_point": "inc", "prompt": 'def inc(x):\n    """Return x + 1."""\n',
     "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n"}
)  # fmt: skip
DOUBLE = make_problem(
    {"task_id": "T/double", "entry_point": "double", "prompt": 'def double(x):\n    """Return 2 * x."""\n',
     "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n"}
)  # fmt: skip


def test_adding_an_agent_is_one_small_class() -> None:
    class Shouter(ModelAgent):
        name = "shouter_test"
        system = "You shout."

        def user_prompt(self, state):
            return f"Shout about {state.problem.entry_point}."

        def apply(self, state, text):
            state.review = text.upper()

    try:
        pool = make_agents(["helper", "main", "shouter_test"], {"main": 3.0})
        assert [a.name for a in pool] == ["helper", "main", "shouter_test"] and pool[1].call_cost == 3.0
        s = EpisodeState(INC)
        pool[2].apply(s, "hey")
        assert s.review == "HEY" and pool[2].user_prompt(s) == "Shout about inc."
    finally:
        AGENTS.pop("shouter_test", None)
    with pytest.raises(
        ValueError, match="unknown agent 'nope'.*known: fixer, helper, main, reviewer, tester"
    ):
        make_agents(["nope"])
    with pytest.raises(ValueError, match="not in the pool"):
        make_agents(["helper"], {"tester": 1.0})


def test_noop_actions_are_masked(tmp_path) -> None:
    """An agent asked its last prompt again (answers are cached by agent and prompt) or the tester on tested code
    could not change the state: masked."""
    from orchestry.training.orchestrator import OrchestratorEnv

    env = OrchestratorEnv(
        make_agents(["helper", "main", "tester"]), None, None, None, min_steps=0, max_steps=4
    )
    s = EpisodeState(INC)
    assert env.mask(s).tolist() == [True, True, False, True]  # no main yet: no tester
    s.last_prompts["main"] = env.agents[1].user_prompt(s)
    s.main = "def inc(x): return x"
    assert env.mask(s).tolist() == [True, False, True, True]  # main again: the same prompt
    s.helper = "def aux(x): return x + 1"
    assert env.mask(s).tolist() == [True, True, True, True]  # main's prompt now shows aux: it may act again
    s.test, s.tested = {"passed": 0, "total_asserts": 2}, (s.helper, s.main)
    assert env.mask(s).tolist() == [True, True, False, True]  # the current code is tested


def test_pipelines_cycles_and_transitions() -> None:
    loop = FixedPipeline("loop", ("main", "tester", "fixer", "tester"), stop_when_passed=True)
    s = EpisodeState(INC)
    assert loop.next(s) == "main"
    s.main, s.steps = "m", []
    s.test, s.tested = {"passed": 2, "total_asserts": 2}, ("", "m")
    assert loop.next(s) == "terminate"  # all asserts passed on the current code
    ep = Episode("x", EpisodeState(INC), 0.0, {}, [0.0])
    from orchestry.tasks.agent_pool import Step

    ep.state.steps = [Step("main"), Step("tester"), Step("fixer"), Step("tester"), Step("terminate")]
    assert ep.has_cycle and ep.agents == ["main", "tester", "fixer", "tester"]
    t = transition_counts([ep], ["main", "tester", "fixer"])
    assert t["start"]["main"] == 1 and t["tester"]["fixer"] == 1 and t["fixer"]["tester"] == 1
    assert t["tester"]["terminate"] == 1 and sum(map(sum, (r.values() for r in t.values()))) == 5


# ---- whole runs ------------------------------------------------------------------------------------------------
class FakeChat:
    """A chat backend answering by role: correct helper/main/fixer code for the crafted problems; counts calls."""

    backend, model, price, batched = "fake", "fake-coder", FREE, True

    def __init__(self):
        self.calls = 0

    def identity(self) -> dict:
        return {"backend": self.backend, "model": self.model}

    def preflight(self) -> None:
        return None

    def complete_batch(self, requests):
        self.calls += len(requests)
        out = []
        for r in requests:
            user = r.messages[-1][1]
            fn = "inc" if "inc(" in user else "double"
            body = "x + 1" if fn == "inc" else "2 * x"
            if "helper function named `aux`" in user:
                text = f"```python\ndef aux(x):\n    return {body}\n```"
            elif "code reviewer" in (r.system or ""):
                text = "Looks fine."
            elif "Fix this solution" in user:
                text = (
                    f"```python\ndef {fn}(x):\n    y = aux(x)\n    return y if y is not None else {body}\n```"
                )
            else:  # main: a wrong first draft that calls aux
                text = f"```python\ndef {fn}(x):\n    y = aux(x)\n    return y - 1\n```"
            out.append(
                ChatResult(text, prompt_tokens=len(user) // 4, completion_tokens=len(text) // 4, usd=0.0)
            )
        return out


class FakeEncoder:
    """A deterministic hash embedding (the real encoder is exercised in the embedded-model test)."""

    dim = 8

    def encode(self, texts):
        rows = []
        for t in texts:
            h = hashlib.sha256(t.encode()).digest()
            rows.append([b / 255.0 for b in h[: self.dim]])
        return torch.tensor(rows, dtype=torch.float32)

    def close(self) -> None:
        return None


def _fake_run(
    tmp_path: Path, chat: FakeChat, out: str = "out", human: dict | None = None, **overrides
) -> dict:
    from orchestry.llm.cache import CachedChat, ResponseCache
    from orchestry.llm.clients import Clients
    from orchestry.llm.cost import CostTracker

    cfg = TrainOrchestratorParams(
        **{
            "num_episodes": 8,
            "episodes_per_update": 4,
            "max_problems": 2,
            "max_problems_eval": 2,
            **overrides,
        }
    )
    tracker = CostTracker(budget_usd=cfg.budget_usd)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    clients = Clients(CachedChat(chat, cache, tracker), tracker, cache, 64, 0.8, 0.95)
    return run_orchestrator(
        cfg, SamplingParams(), [INC, DOUBLE], [DOUBLE, INC], lambda: Sandbox(max_workers=1),
        tmp_path / out, tmp_path / out / "policy", clients=clients, encoder=FakeEncoder(), progress=False,
        overrides=human,
    )  # fmt: skip


def test_whole_run_with_a_fake_backend_reuses_answers_by_agent_and_prompt(tmp_path) -> None:
    chat = FakeChat()
    summary = _fake_run(tmp_path, chat)
    first_calls = chat.calls
    assert 0 < first_calls <= summary["cost"]["calls"] + summary["cost"]["cached_calls"]
    assert summary["cost"]["cached_calls"] > 0  # repeated states (same agent, same prompt) within the run
    ev = summary["eval"]
    assert ev["status"] == "done" and set(ev["methods"]) == {
        "learned",
        "helper_main",
        "all_in_order",
        "test_fix_loop",
    }
    loop = ev["methods"]["test_fix_loop"]
    assert loop["success_rate"]["mean"] == 1.0  # main's wrong draft, the tester's report, the fixer's fix
    # helper, main, tester, fixer, tester: stops once the tester sees every assert pass (the tester acted twice)
    assert loop["length"] == 5 and loop["cycle_share"] == 1.0
    assert ev["methods"]["helper_main"]["success_rate"]["mean"] == 0.0
    diff = ev["learned_minus"]["helper_main"]["reward"]["mean"]  # paired over problems
    assert diff == pytest.approx(
        ev["methods"]["learned"]["reward"]["mean"] - ev["methods"]["helper_main"]["reward"]["mean"]
    )
    hm = ev["methods"]["helper_main"]
    assert (
        hm["tokens"]["mean"] > 0 and hm["tokens"]["ci_low"] <= hm["tokens"]["mean"] <= hm["tokens"]["ci_high"]
    )
    out = tmp_path / "out"
    with open(out / "eval_episodes.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 4 and {r["method"] for r in rows} == set(ev["methods"])
    with open(out / "train_episodes.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    assert json.loads((out / "policy" / "policy.json").read_text())["actions"][-1] == "terminate"
    assert (out / "policy" / "policy.pt").stat().st_size > 1000
    # the same run again: every answer comes from the cache (by agent and prompt), the same numbers
    again = _fake_run(tmp_path, chat, out="again")
    assert chat.calls == first_calls and again["cost"]["calls"] == 0
    assert again["eval"]["methods"] == ev["methods"]


def test_a_human_override_of_a_training_episode_changes_the_summary(tmp_path) -> None:
    """Issue 55, item 2: an ``oe-`` override (as ``orchestry override`` writes it, from the episode's
    transcripts.jsonl record) replaces that training episode's task reward before the update; the summary counts
    it, and an id that no training episode of the run has is counted as unknown."""
    from orchestry.overrides import Override, orchestrator_episode_id

    chat = FakeChat()
    base = _fake_run(tmp_path, chat)
    assert base["overrides"] == {"read": 0, "applied": 0, "applied_ids": [], "unknown": 0, "unknown_ids": []}
    records = [json.loads(x) for x in (tmp_path / "out" / "transcripts.jsonl").read_text().splitlines()]
    first = next(r for r in records if r["phase"] == "train" and r["episode"] == 0)
    oid = orchestrator_episode_id(first)
    score = 0.0 if first["task_reward"] > 2 else 4.0  # far from the automatic reward
    human = {
        oid: Override(oid, score, "wrong answer", "ann"),
        "oe-000000000000": Override("oe-000000000000", 1.0),
    }
    again = _fake_run(tmp_path, chat, out="again", human=human)
    assert again["overrides"] == {
        "read": 2, "applied": 1, "applied_ids": [oid], "unknown": 1, "unknown_ids": ["oe-000000000000"],
    }  # fmt: skip
    redo = [json.loads(x) for x in (tmp_path / "again" / "transcripts.jsonl").read_text().splitlines()]
    ep0 = next(r for r in redo if r["phase"] == "train" and r["episode"] == 0)
    assert orchestrator_episode_id(ep0) == oid  # the same episode (cached answers, seeded policy)
    assert ep0["task_reward"] == score and ep0["reward"] == score
    assert ep0["level_reward"]["automatic_total"] == first["reward"]
    assert ep0["level_reward"]["override"]["who"] == "ann"
    # the step rewards follow r: the objective moves by the override minus the automatic reward
    assert ep0["objective"] == pytest.approx(first["objective"] + score - first["task_reward"], abs=1e-5)
    assert (
        again["train"]["first_quarter_objective"]["mean"] != base["train"]["first_quarter_objective"]["mean"]
    )


def test_plots_from_a_fake_run(tmp_path) -> None:
    from orchestry.reporting.plots_orchestrator import plot_orchestrator

    _fake_run(tmp_path, FakeChat())
    paths = plot_orchestrator(tmp_path / "out", tmp_path / "figures", dpi=60)
    assert [p.name for p in paths] == [
        "orchestrator_pareto.png",
        "orchestrator_agents.png",
        "orchestrator_transitions.png",
    ]
    assert all(p.stat().st_size > 5_000 for p in paths)


@pytest.mark.slow
def test_embedded_model_and_real_encoder_on_one_problem(tmp_path) -> None:
    """SmolLM2 (models/base) as every agent, the MiniLM state encoder, the sandbox: 2 train episodes, 1 test problem."""
    from orchestry.problems import read_problems

    if (
        not (REPO / "models/base/model.safetensors").exists()
        or not (REPO / "data/problems/test.jsonl").exists()
    ):
        pytest.skip("models/base or data/problems not prepared")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = TrainOrchestratorParams(
            num_episodes=2, episodes_per_update=2, max_problems=1, max_problems_eval=1, max_tokens=24,
            min_steps=1, max_steps=2, cache_path=str(tmp_path / "c.sqlite"),
            embedding_cache_path=str(tmp_path / "e.sqlite"),
        )  # fmt: skip
        summary = run_orchestrator(
            cfg, SamplingParams(), read_problems(REPO / "data/problems/train.jsonl"),
            read_problems(REPO / "data/problems/test.jsonl"), lambda: Sandbox(max_workers=1), tmp_path / "out",
            tmp_path / "policy", model_path=str(REPO / "models/base"), progress=False,
        )  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert summary["train"]["episodes"] == 2 and summary["eval"]["status"] == "done"
    assert summary["cost"]["tokens"] > 0 and summary["cost"]["usd"] == 0
    learned = summary["eval"]["methods"]["learned"]
    assert 1 <= learned["length"] <= 2 and learned["tokens"]["mean"] > 0
    assert (tmp_path / "policy" / "policy.pt").exists()


def test_progress_bars_for_training_and_evaluation(tmp_path, monkeypatch, capsys) -> None:
    """ORCHESTRY_PROGRESS=1: a training bar (live mean reward per update) and an evaluation bar (episodes done)."""
    from orchestry.llm.cache import CachedChat, ResponseCache
    from orchestry.llm.clients import Clients
    from orchestry.llm.cost import CostTracker

    monkeypatch.setenv("ORCHESTRY_PROGRESS", "1")
    cfg = TrainOrchestratorParams(num_episodes=4, episodes_per_update=2, max_problems=2, max_problems_eval=2)
    tracker = CostTracker(budget_usd=cfg.budget_usd)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    clients = Clients(CachedChat(FakeChat(), cache, tracker), tracker, cache, 64, 0.8, 0.95)
    summary = run_orchestrator(
        cfg, SamplingParams(), [INC, DOUBLE], [DOUBLE, INC], lambda: Sandbox(max_workers=1),
        tmp_path / "out", tmp_path / "out" / "policy", clients=clients, encoder=FakeEncoder(), progress=True,
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "orchestrator: train" in err and "4/4" in err and "reward=" in err and "ret=" in err
    n_eval = 2 * len(summary["eval"]["methods"])  # 2 problems x (learned + each fixed pipeline)
    assert "orchestrator: eval" in err and f"{n_eval}/{n_eval}" in err and "step=" in err
