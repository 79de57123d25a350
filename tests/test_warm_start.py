"""The supervised warm start (train_magrpo.warm_start_epochs): the reference decompositions it trains on are
correct helper/main pairs (real sandbox, real level reward), the loss it minimises falls and touches only the
agent's own adapter, and the trainer runs it once before MAGRPO, saves the warm-started pair and keeps its
figures across a resume. Tiny random Llama with the embedded tokenizer."""

from __future__ import annotations

import pytest
import torch

from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.generators.compositional import delegated_decomposition, generate, reference_decomposition
from orchestry.llm.loading import attach_adapters
from orchestry.llm.logprobs import completion_logprobs
from orchestry.problems import load_problems, make_problem
from orchestry.rewards.code import level_rewards
from orchestry.training.magrpo import AGENTS
from orchestry.training.magrpo.trainer import MAGRPOTrainer
from orchestry.training.magrpo.warm_start import (
    _batch,
    _tokenize,
    resolved_epochs,
    warm_start,
    warm_start_examples,
)


@pytest.fixture(scope="module")
def sandbox():
    from orchestry.sandbox import Sandbox

    with Sandbox(timeout_s=3.0) as sb:
        yield sb


def _generated(n, difficulty=(1, 2, 3), seed=0):
    return [make_problem(g.record, g.record["task_id"]) for g in generate(n, list(difficulty), seed=seed)]


def test_reference_decompositions_pass_and_the_main_calls_aux(sandbox):
    problems = _generated(30)
    pairs = [reference_decomposition(p.prompt, p.aux_spec, p.canonical_solution) for p in problems]
    helpers = [f"```python\n{a}```" for a, _ in pairs]
    mains = [f"```python\n{m}```" for _, m in pairs]
    results = level_rewards(problems, helpers, mains, sandbox)
    assert all(r.passed == r.total_asserts > 0 for r in results), [r.reasons for r in results if not r.passed]
    assert all(r.aux_called for r in results)
    assert all(r.cooperation > 0 for r in results)  # the gated bonus: main calls aux and passes
    # the main alone (without the helper's aux) fails: the split really puts a step in aux
    alone = level_rewards(problems, [""] * len(problems), mains, sandbox)
    assert not any(r.passed for r in alone)


def test_delegated_decompositions_pass_with_aux_doing_all_and_the_main_only_returning_it(sandbox):
    problems = _generated(30)
    pairs = [delegated_decomposition(p.prompt, p.aux_spec, p.canonical_solution) for p in problems]
    results = level_rewards(problems, [f"```python\n{a}```" for a, _ in pairs],
                            [f"```python\n{m}```" for _, m in pairs], sandbox)  # fmt: skip
    assert all(r.passed == r.total_asserts > 0 for r in results), [r.reasons for r in results if not r.passed]
    assert all(r.aux_called for r in results)
    for p, (aux_code, main_code) in zip(problems, pairs, strict=True):
        assert main_code.split("\n")[1:] == [
            f"    r = aux({p.canonical_solution.split()[2]})",
            "    return r",
            "",
        ]
        assert aux_code.startswith("def aux(") and p.canonical_solution in aux_code  # the whole solution
    # aux alone is the answer: the main's body does nothing but call it
    alone = level_rewards(problems, [""] * len(problems), [f"```python\n{m}```" for _, m in pairs], sandbox)
    assert not any(r.passed for r in alone)
    with pytest.raises(ValueError, match="solution shape"):
        delegated_decomposition(problems[0].prompt, problems[0].aux_spec, "    return 1\n")


def test_problems_without_a_reference_decomposition_are_refused_by_task_id(embedded_tokenizer):
    humaneval = load_problems("humaneval")[:2]
    with pytest.raises(ValueError, match="HumanEval/0.*compositional"):
        warm_start_examples(humaneval, embedded_tokenizer)
    bad = _generated(1)[0]
    with pytest.raises(ValueError, match="solution shape"):
        reference_decomposition(bad.prompt, bad.aux_spec, "    return 1\n")


@pytest.mark.parametrize("plain_targets", ["delegate", "reference"])
def test_plain_prompts_add_a_pair_under_the_prompts_of_problems_without_a_decomposition(
    embedded_tokenizer, plain_targets
):
    problems = _generated(3, difficulty=(2, 3))
    spec = warm_start_examples(problems, embedded_tokenizer)
    both = warm_start_examples(problems, embedded_tokenizer, plain_prompts=True, plain_targets=plain_targets)
    for agent in AGENTS:
        assert len(both[agent]) == 2 * len(spec[agent]) == 6
        assert both[agent][0::2] == spec[agent]  # the spec-prompt pair first, unchanged
        for p, (spec_prompt, spec_target), (plain_prompt, plain_target) in zip(
            problems, both[agent][0::2], both[agent][1::2], strict=True
        ):
            pair = (delegated_decomposition if plain_targets == "delegate" else reference_decomposition)(
                p.prompt, p.aux_spec, p.canonical_solution
            )
            assert plain_target == f"```python\n{pair[AGENTS.index(agent)]}```"
            assert (plain_target == spec_target) == (
                plain_targets == "reference"
            )  # 2+ steps: the splits differ
            assert plain_prompt != spec_prompt
            assert "def aux(" in spec_prompt and "def aux(" not in plain_prompt  # no aux_spec shown
    helper_plain = both["helper"][1][0]
    assert (
        "Write a helper function named `aux`" in helper_plain and problems[0].prompt.strip() in helper_plain
    )
    assert "`aux(...)` written by a teammate is already defined" in both["main"][1][0]


def test_auto_warm_starts_generated_problems_only():
    from orchestry.params_file import parse_params
    from orchestry.training.magrpo.warm_start import AUTO_WARM_START_EPOCHS, resolved_epochs

    generated, humaneval = _generated(3), load_problems("humaneval")[:2]
    auto = TrainMagrpoParams(warm_start_epochs="auto")
    assert resolved_epochs(auto, generated) == AUTO_WARM_START_EPOCHS == 2
    assert resolved_epochs(auto, humaneval) == 0
    assert resolved_epochs(auto, generated + humaneval) == 0  # every problem needs its decomposition
    assert resolved_epochs(auto, []) == 0
    assert (
        resolved_epochs(
            TrainMagrpoParams(warm_start_epochs="auto", workflow="writer_tester_fixer"), generated
        )
        == 0
    )
    assert resolved_epochs(TrainMagrpoParams(warm_start_epochs=2), generated) == 2
    assert resolved_epochs(TrainMagrpoParams(warm_start_epochs=0), generated) == 0
    # auto never refuses a source: HumanEval training simply runs without a warm start
    assert parse_params({"prepare": {"source": "humaneval"}, "train_magrpo": {"warm_start_epochs": "auto"}})
    assert TrainMagrpoParams(warm_start_epochs=" AUTO ").warm_start_epochs == "auto"
    for bad in (True, -1, 101, "four", 2.5):
        with pytest.raises(ValueError, match="auto or a whole number"):
            TrainMagrpoParams(warm_start_epochs=bad)


def test_params_reject_warm_start_outside_helper_main():
    with pytest.raises(ValueError, match="warm_start_epochs needs workflow helper_main"):
        TrainMagrpoParams(workflow="writer_tester_fixer", warm_start_epochs=1)
    with pytest.raises(ValueError):
        TrainMagrpoParams(warm_start_epochs=-1)
    assert TrainMagrpoParams(workflow="writer_tester_fixer", warm_start_epochs="auto")  # auto: 0 there


def _target_logprob(model, tok, pairs, agent):
    model.set_adapter(agent)
    model.eval()
    with torch.no_grad():
        ids, mask, P = _batch(tok, _tokenize(tok, pairs))
        _, tok_lp, tmask = completion_logprobs(model, ids, mask, P)
    return float(tok_lp.sum() / tmask.sum())


def test_warm_start_lowers_each_agents_loss_on_its_own_targets_only(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread, only_adapters_changed
):
    tok = embedded_tokenizer
    problems = _generated(6, (1, 2))
    model = attach_adapters(tiny_llama(len(tok)), AGENTS, r=4, alpha=8, seed=0)
    cfg = TrainMagrpoParams(
        warm_start_epochs=6, warm_start_lr=5e-2, warm_start_batch=3, warm_start_plain_prompts=False
    )
    trainer = MAGRPOTrainer(model, tok, problems, None, cfg, SamplingParams(), tmp_path / "ck")
    examples = warm_start_examples(problems, tok)
    assert [t.count("aux(") for _, t in examples["main"]] == [1] * 6  # the main's targets call aux once
    assert all(t.startswith("```python\ndef aux(") and t.endswith("```") for _, t in examples["helper"])
    before = {a: _target_logprob(model, tok, examples[a], a) for a in AGENTS}
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    stats = warm_start(trainer, False, resolved_epochs(cfg, problems))
    only_adapters_changed(model, base_before, lora_before, AGENTS)
    after = {a: _target_logprob(model, tok, examples[a], a) for a in AGENTS}
    for a in AGENTS:
        assert after[a] > before[a] + 0.05, (a, before[a], after[a])
        assert stats[f"loss/{a}/last"] < stats[f"loss/{a}/first"] - 0.05
    assert stats["examples"] == 6 and stats["steps"] == 2 * 6 * 2  # agents x epochs x batches


def test_trainer_warm_starts_once_saves_the_pair_and_keeps_its_figures_on_resume(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread
):
    from orchestry.rewards.code import LevelReward

    tok = embedded_tokenizer
    problems = _generated(4, (1, 2))

    def reward(probs, helpers, mains):
        return [LevelReward(structure=len(m) / 1000.0) for m in mains]

    sampling = SamplingParams(max_completion_length=8)

    def trainer(num_steps):
        model = attach_adapters(tiny_llama(len(tok)), AGENTS, r=4, alpha=8, seed=0)
        cfg = TrainMagrpoParams(num_steps=num_steps, problems_per_step=1, num_generations=2, warm_start_epochs=1,
                                warm_start_batch=4, checkpoint_every=1, warm_start_plain_prompts=False)  # fmt: skip
        return MAGRPOTrainer(model, tok, problems, None, cfg, sampling, tmp_path / "ck", reward_fn=reward)

    first = trainer(1)
    first.train(progress=False)
    assert first.warm_start["steps"] == 2
    assert sorted(p.name for p in first.warm_start_dir.iterdir()) == ["helper", "main"]
    saved = (first.warm_start_dir / "main").stat().st_mtime_ns
    resumed = trainer(2)  # resumes step 1 from the checkpoint: no second warm start
    resumed.train(progress=False)
    assert resumed.warm_start == first.warm_start
    assert (resumed.warm_start_dir / "main").stat().st_mtime_ns == saved


def test_warm_start_problems_trains_on_the_first_n_only(embedded_tokenizer, tiny_llama, tmp_path, one_thread):
    tok = embedded_tokenizer
    problems = _generated(4, (1, 2))
    model = attach_adapters(tiny_llama(len(tok)), AGENTS, r=4, alpha=8, seed=0)
    cfg = TrainMagrpoParams(warm_start_epochs=1, warm_start_batch=1, warm_start_problems=3, warm_start_lr=5e-2,
                            warm_start_plain_prompts=True)  # fmt: skip
    trainer = MAGRPOTrainer(model, tok, problems, None, cfg, SamplingParams(), tmp_path / "ck")
    seen = warm_start_examples(problems[:1], tok)["main"]
    before = _target_logprob(model, tok, seen, "main")
    stats = warm_start(trainer, False, resolved_epochs(cfg, problems))
    assert stats["examples"] == 6 and stats["steps"] == 2 * 6  # 3 problems x 2 prompt forms, per agent
    assert stats["epochs"] == 1
    assert _target_logprob(model, tok, seen, "main") > before + 0.05


def test_params_refuse_a_warm_start_on_problems_without_reference_decompositions():
    from orchestry.params_file import ParamsError, parse_params

    with pytest.raises(ParamsError) as e:
        parse_params({"prepare": {"source": "humaneval"}, "train_magrpo": {"warm_start_epochs": 2}})
    assert str(e.value).splitlines()[1] == (
        "  train_magrpo.warm_start_epochs needs prepare.source: compositional (the generated problems' reference "
        "decompositions; got 'humaneval'): set train_magrpo.warm_start_epochs: 0"
    )
    # the default (auto) is accepted on HumanEval: it resolves to 0 epochs there (resolved_epochs, tested above)
    assert parse_params({"prepare": {"source": "humaneval"}}).train_magrpo.warm_start_epochs == "auto"
    assert parse_params({"train_magrpo": {"warm_start_epochs": 2}}).train_magrpo.warm_start_epochs == 2


def test_own_answers_keep_distinct_passing_untruncated_pairs_best_first_up_to_the_cap():
    from orchestry.rewards.code import LevelReward
    from orchestry.training.magrpo.warm_start import select_own_answers

    problems = _generated(3, (1, 2))
    n, cap = 4, 2

    def r(passed, total=1.0, coop=0.0):
        # total = structure + tests + cooperation
        return LevelReward(structure=total - (1.0 if passed else 0.0) - coop, tests=1.0 if passed else 0.0,
                           cooperation=coop, passed=2 if passed else 0, total_asserts=2)  # fmt: skip

    # problem 0: rows 0 (fails), 1 (passes), 2 (passes, cooperating: the higher total), 3 (a repeat of row 1)
    # problem 1: nothing passes; problem 2: rows 8 and 9 pass but 8 was truncated, 10 and 11 pass
    results = [r(False), r(True, 2.0), r(True, 3.0, 1.0), r(True, 2.0),
               r(False), r(False), r(False), r(False),
               r(True, 4.0), r(True, 2.0), r(True, 2.0), r(True, 2.5)]  # fmt: skip
    helpers = [f"h{i}" for i in range(12)]
    mains = [f"m{i}" for i in range(12)]
    helpers[3], mains[3] = helpers[1], mains[1]
    truncated = [False] * 12
    truncated[8] = True
    kept, stats = {}, {"self/passed": 0, "self/kept": 0, "self/cooperating": 0}
    select_own_answers(problems, n, cap, helpers, mains, results, truncated, kept, stats)
    assert kept == {
        problems[0].task_id: [("h2", "m2"), ("h1", "m1")],  # best first, the repeat dropped
        problems[2].task_id: [
            ("h11", "m11"),
            ("h9", "m9"),
        ],  # truncated 8 skipped; 9 before 10 (sampling order)
    }
    assert stats == {"self/passed": 7, "self/kept": 4, "self/cooperating": 1}


def test_self_targets_train_the_plain_prompts_on_the_own_answers_verbatim(embedded_tokenizer):
    tok = embedded_tokenizer
    problems = _generated(3, (1, 2))
    own = {problems[1].task_id: [("```python\ndef aux(s):\n    return s\n```", "MAIN A"), ("H B", "MAIN B")]}
    ex = warm_start_examples(problems, tok, plain_prompts=True, plain_targets="self", own_answers=own)
    spec = warm_start_examples(problems, tok)
    # every problem keeps its spec-prompt pair; only problem 1 adds plain-prompt pairs, its own answers verbatim
    assert len(ex["main"]) == 3 + 2
    assert [t for _, t in ex["main"]] == [spec["main"][0][1], spec["main"][1][1], "MAIN A", "MAIN B",
                                         spec["main"][2][1]]  # fmt: skip
    assert ex["main"][2][0] != spec["main"][1][0] and "aux(" in ex["main"][2][0]  # the plain main prompt
    with pytest.raises(ValueError, match="own_answers"):
        warm_start_examples(problems, tok, plain_prompts=True, plain_targets="self")


def test_own_passing_answers_samples_every_problem_and_drops_truncated_pairs(
    embedded_tokenizer, tiny_llama, tmp_path, one_thread
):
    from orchestry.rewards.code import LevelReward
    from orchestry.training.magrpo.warm_start import own_passing_answers

    tok = embedded_tokenizer
    problems = _generated(3, (1, 2))
    model = attach_adapters(tiny_llama(len(tok)), AGENTS, r=4, alpha=8, seed=0)
    cfg = TrainMagrpoParams(warm_start_plain_targets="self", warm_start_self_samples=3)
    seen = []

    def reward(probs, helpers, mains):  # every pair "passes": only truncation can drop it
        seen.extend(p.aux_spec for p in probs)
        return [LevelReward(tests=1.0, passed=1, total_asserts=1) for _ in mains]

    sampling = SamplingParams(max_completion_length=4)  # the random model never closes a block in 4 tokens
    tr = MAGRPOTrainer(model, tok, problems, None, cfg, sampling, tmp_path / "ck", reward_fn=reward)
    kept, stats = own_passing_answers(tr, problems)
    assert seen == [""] * 9  # 3 problems x 3 samples, all under plain prompts
    assert stats["self/samples"] == 9 and stats["self/passed"] == 9
    assert kept == {} and stats["self/kept"] == 0  # every pair hit the token limit


def _beginner(n, seed=0):
    from orchestry.generators.beginner import beginner_problems, split_templates

    train, _ = split_templates(seed)
    return [make_problem(r, r["task_id"]) for r in beginner_problems(n, seed, train)]


def test_beginner_problems_warm_start_on_aux_doing_the_whole_answer_which_passes(sandbox, embedded_tokenizer):
    from orchestry.training.magrpo.warm_start import is_beginner, plain_delegate_targets

    problems = _beginner(24)
    assert all(is_beginner(p) for p in problems)
    pairs = [plain_delegate_targets(p) for p in problems]
    results = level_rewards(problems, [f"```python\n{a}```" for a, _ in pairs],
                            [f"```python\n{m}```" for _, m in pairs], sandbox)  # fmt: skip
    assert all(r.all_passed for r in results), [r.reasons for r in results if not r.all_passed]
    assert all(r.aux_called for r in results)
    for p, (aux_code, main_code) in zip(problems, pairs, strict=True):
        assert aux_code.startswith("def aux(") and p.canonical_solution.rstrip("\n") in aux_code
        assert (
            main_code.startswith(f"def {p.entry_point}(") and main_code.count("\n") == 2
        )  # def + return aux(...)
    # mixed with generated problems: spec pairs for those, one plain pair per beginner problem
    mixed = _generated(3, (1, 2)) + problems[:2]
    ex = warm_start_examples(mixed, embedded_tokenizer, plain_prompts=False)
    assert len(ex["main"]) == 5
    assert ex["main"][3][1] == f"```python\n{pairs[0][1]}```"
    assert resolved_epochs(TrainMagrpoParams(), mixed) == 2  # auto: every problem is generated
    he = load_problems("humaneval")[:1]
    assert resolved_epochs(TrainMagrpoParams(), mixed + he) == 0  # a problem from a file: no warm start
    with pytest.raises(ValueError, match="no def line"):
        from dataclasses import replace

        plain_delegate_targets(replace(problems[0], prompt="no signature here\n"))
