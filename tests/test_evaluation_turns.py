"""evaluate.turns: multi-turn policies are evaluated in the episode they were trained in (later turns get the
sandbox's feedback; samples that passed stop)."""

import pytest

from orchestry.config import SamplingParams
from orchestry.evaluation.agents import later_turns
from orchestry.evaluation.baselines import run_method
from orchestry.generators.compositional import generate
from orchestry.problems import make_problem
from orchestry.sandbox import Sandbox


@pytest.fixture
def sandbox():
    with Sandbox(timeout_s=2.0) as sb:
        yield sb


def test_later_turns_rerun_only_failed_samples_and_add_up_tokens(saved_agents, sandbox) -> None:
    model, tok, _, _ = saved_agents
    problems = [make_problem(g.record) for g in generate(2, 2, seed=0)]
    sampling = SamplingParams(max_completion_length=8)
    first = run_method(
        "magrpo", problems, model, tok, sandbox, sampling, 2, 0, 8, adapters=True, progress=False
    )
    assert not any(r["pass"] for r in first)  # a random tiny model passes nothing
    first[0] = {**first[0], "pass": True}  # pretend sample 0 passed: it must stop after turn 1
    out = later_turns(first, problems, model, tok, sandbox, sampling, 0, 8, turns=3, adapters=True)
    assert [r["turns_run"] for r in out] == [1, 3, 3, 3]
    assert out[0] == {**first[0], "turns_run": 1}
    for a, b in zip(first[1:], out[1:], strict=True):
        assert b["task_id"] == a["task_id"] and b["sample"] == a["sample"]
        assert b["completion_tokens"] > a["completion_tokens"]  # three turns of tokens
    assert later_turns(first, problems, model, tok, sandbox, sampling, 0, 8, turns=1, adapters=True) == [
        {**r, "turns_run": 1} for r in first
    ]


def test_the_base_pair_from_the_bare_model_is_the_base_pair_with_the_adapters_off(
    saved_agents, sandbox
) -> None:
    """`evaluate_base` samples the base pair from the bare base model; before that stage existed `evaluate` sampled
    it from the trained peft model with the adapters off, right before the trained pair. Both give the same
    records (seconds aside), also over two turns, and the trained pair alone is what it is after the base pair."""
    from peft import PeftModel

    from orchestry.config import IntervalsParams
    from orchestry.evaluation.agents import evaluate_agents
    from orchestry.llm.loading import load_model

    _, _, base, adapters = saved_agents
    bare, tok = load_model(base)
    trained, _ = load_model(base)
    trained = PeftModel.from_pretrained(trained, str(adapters / "helper"), adapter_name="helper")
    trained.load_adapter(str(adapters / "main"), adapter_name="main")
    trained.eval()
    problems = [make_problem(g.record) for g in generate(2, 2, seed=0)]
    sampling = SamplingParams(max_completion_length=16)

    def run(model, pairs):
        out = evaluate_agents(problems, model, tok, sandbox, sampling, 2, 0, 8, IntervalsParams(resamples=100),
                              progress=False, turns=2, pairs=pairs)  # fmt: skip
        return {
            name: [{k: v for k, v in r.items() if "seconds" not in k} for r in recs] for name, recs, _ in out
        }

    both = run(trained, ("magrpo", "base"))
    assert list(both) == ["base", "magrpo"]  # PAIRS order, whatever order they are named in
    assert run(bare, ("base",)) == {"base": both["base"]}
    assert run(trained, ("magrpo",)) == {"magrpo": both["magrpo"]}
    assert [r["main"] for r in both["base"]] != [r["main"] for r in both["magrpo"]]  # the adapters matter
    with pytest.raises(ValueError, match="unknown pair"):
        run(trained, ("trained",))
    with pytest.raises(ValueError, match="needs a peft model"):  # not the base model's samples named magrpo
        run(bare, ("magrpo",))
