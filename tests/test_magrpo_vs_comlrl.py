"""Same learning signal as the authors' library: our MAGRPO advantage and update against CoMLRL 1.4.3's own code.

CoMLRL's ``MAGRPOTrainer._compute_advantages`` and ``_update_from_samples`` (which calls its
``_compute_loss_with_gradients``) are run on a fixed batch of prompts, completions and joint rewards, next to
our ``group_advantages`` and ``MAGRPOTrainer.update``; both train the same LoRA adapters of one tiny random Llama
with plain SGD (lr 1), so the parameter change IS the gradient and any difference in scale shows.

Two differences of token bookkeeping were found in CoMLRL 1.4.3's ``_compute_loss_with_gradients`` (the math --
advantage, -(1/G) sum_g A_g log pi(y_g), mean over the problems of an update -- is the same):

1. it never scores the last token of a completion: it feeds ``prompt + completion[:-1]`` and keeps the logits
   ``[P-1:-1]``, i.e. T-1 predictions for T tokens (usually the EOS, or the 128th token, goes unscored);
2. it scores the padding after a completion's EOS (its completions are the rows of the padded ``generate``
   output; pad = EOS for this model), so a completion that ended early is trained towards more EOS tokens.

Ours scores every completion token up to and including the first EOS. The tests give CoMLRL one throwaway
token after each completion (and cut the padding after EOS) to show that the rest is identical.

Skipped when ``comlrl`` is not installed (it is the optional ``bench`` extra; ``make test`` does not install it).
"""

import pytest
import torch

comlrl_magrpo = pytest.importorskip(
    "comlrl.trainers.reinforce.magrpo",
    reason="comlrl (optional `bench` extra) is not installed: pip install -c constraints.txt 'comlrl==1.4.3'",
)

from orchestry.algorithms.magrpo import group_advantages  # noqa: E402
from orchestry.config import SamplingParams, TrainMagrpoParams  # noqa: E402
from orchestry.llm.loading import adapter_parameters, attach_adapters  # noqa: E402
from orchestry.llm.local import Generation, GenerationBatch  # noqa: E402
from orchestry.problems import load_problems  # noqa: E402
from orchestry.rewards.code import LevelReward  # noqa: E402
from orchestry.training.magrpo import AGENTS, Rollout  # noqa: E402
from orchestry.training.magrpo.trainer import MAGRPOTrainer  # noqa: E402

VOCAB = 64
PAD = EOS = 0  # as in the embedded model: the pad token is the end-of-text token
G = 4


pytestmark = pytest.mark.usefixtures("one_thread")


def _comlrl_stub(mode: str = "mean", normalize: bool = False, buffer: int = 1):
    """A CoMLRL MAGRPOTrainer without its __init__ (which loads models): only the state the math reads."""
    t = object.__new__(comlrl_magrpo.MAGRPOTrainer)
    t.args = comlrl_magrpo.MAGRPOConfig(
        num_turns=1,
        rollout_buffer_size=buffer,
        advantage_normalization=normalize,
        advantage_mode=mode,
        eval_interval=0,
    )
    t.advantage_mode = mode
    return t


@pytest.mark.parametrize("mode", ["mean", "max", "rloo", "raw"])
def test_advantages_equal_comlrl(mode):
    rewards = torch.tensor([[0.0, 1.5, 0.4, 4.0], [1.0, 1.0, 1.0, 1.0], [0.5, 0.0, 0.0, 2.5]])
    ours = group_advantages(rewards, mode)
    theirs = torch.stack([_comlrl_stub(mode)._compute_advantages(r.clone()) for r in rewards])
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_mean_std_equals_comlrl_advantage_normalization():
    """CoMLRL's default ``advantage_normalization=True`` is our ``mean_std`` mode (the paper's is ``mean``)."""
    rewards = torch.tensor([[0.0, 1.5, 0.4, 4.0], [0.5, 0.0, 0.0, 2.5]])
    t = _comlrl_stub("mean", normalize=True)
    theirs = []
    for r in rewards:  # the normalisation CoMLRL applies inside _compute_loss_with_gradients
        a = t._compute_advantages(r.clone())
        theirs.append((a - a.mean()) / a.std(unbiased=False).clamp(min=1e-6))
    assert torch.allclose(group_advantages(rewards, "mean_std"), torch.stack(theirs), atol=1e-4)


def _batch(prompts: list[list[list[int]]], completions: list[list[list[list[int]]]]):
    """Our rollout layout [problem][agent][g] with left-padded prompts and right-padded completions."""
    rows, masks = [], []
    width = max(len(p) for per_problem in prompts for p in per_problem)
    T = max(len(c) for per_problem in completions for per_agent in per_problem for c in per_agent)
    for n, per_problem in enumerate(prompts):
        for a, prompt in enumerate(per_problem):
            for c in completions[n][a]:
                pad_p, pad_c = width - len(prompt), T - len(c)
                rows.append([PAD] * pad_p + prompt + c + [PAD] * pad_c)
                # our mask: real prompt tokens, completion tokens up to and including the first EOS
                comp_mask = []
                ended = False
                for tok in c + [PAD] * pad_c:
                    comp_mask.append(0 if ended else 1)
                    ended = ended or tok == EOS
                masks.append([0] * pad_p + [1] * len(prompt) + comp_mask)
    items = [Generation("", 0, 0, i) for i in range(len(rows))]
    return GenerationBatch(torch.tensor(rows), torch.tensor(masks), width, items, 0.0)


def _fixed_data(seed: int = 0, early_eos: bool = False):
    g = torch.Generator().manual_seed(seed)
    n_problems = 2
    prompts = [[torch.randint(3, VOCAB, (5 + 2 * n + a,), generator=g).tolist() for a in range(2)] for n in range(n_problems)]  # fmt: skip
    completions = [[[torch.randint(3, VOCAB, (6,), generator=g).tolist() for _ in range(G)] for _ in range(2)] for _ in range(n_problems)]  # fmt: skip
    if early_eos:  # one completion per agent ends early: EOS then padding
        for a in range(2):
            completions[0][a][1] = completions[0][a][1][:3] + [EOS, PAD, PAD]
    # problem 1's group has two rows with zero advantage (ours skips them, CoMLRL does not)
    rewards = torch.tensor([[0.0, 1.5, 0.4, 4.0], [0.0, 2.0, 1.0, 1.0]])
    return prompts, completions, rewards


def _ours_delta(model, prompts, completions, rewards):
    problems = load_problems()[: len(prompts)]
    cfg = TrainMagrpoParams(
        num_generations=G,
        problems_per_step=len(prompts),
        bf16_update=False,
        max_grad_norm=1e9,
        weight_decay=0.0,
    )
    trainer = MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/nonexistent")
    trainer.optimizers = {a: torch.optim.SGD(adapter_parameters(model, a), lr=1.0) for a in AGENTS}
    details = [LevelReward().to_dict() for _ in range(rewards.numel())]
    ro = Rollout(problems, _batch(prompts, completions), rewards, details, G)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    trainer.update(ro)
    return {n: p.detach() - before[n] for n, p in model.named_parameters() if "lora_" in n}


def _comlrl_delta(
    model, prompts, completions, rewards, cut_after_eos: bool = False, extra_token: bool = True
):
    """CoMLRL's update; ``extra_token`` appends one throwaway token that its loss does not score (see above)."""
    n_problems = len(prompts)
    t = _comlrl_stub("mean", normalize=False, buffer=n_problems)
    t.agents = [model, model]
    t.optimizers = [torch.optim.SGD(adapter_parameters(model, a), lr=1.0) for a in AGENTS]
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    for a_idx, agent in enumerate(AGENTS):
        model.set_adapter(agent)  # CoMLRL trains whatever model it is given: here, this agent's adapter
        samples = []
        for n in range(n_problems):
            comps = completions[n][a_idx]
            if cut_after_eos:
                comps = [c[: c.index(EOS) + 1] if EOS in c else c for c in comps]
            if extra_token:
                comps = [c + [5] for c in comps]
            data = {
                "prompt_input_ids": torch.tensor([prompts[n][a_idx]]),
                "completion_input_ids": [[torch.tensor(c) for c in comps]],
            }
            samples.append(comlrl_magrpo.NodeSample(a_idx, 0, data, rewards[n].tolist(), 0.0, 0.0, n))
        t._update_from_samples(a_idx, samples)
    return {n: p.detach() - before[n] for n, p in model.named_parameters() if "lora_" in n}


def _two_models(tiny_llama):
    a = attach_adapters(tiny_llama(VOCAB, seed=3), AGENTS, r=4, alpha=8, seed=1)
    b = attach_adapters(tiny_llama(VOCAB, seed=3), AGENTS, r=4, alpha=8, seed=1)
    b.load_state_dict(a.state_dict())
    for m in (a, b):  # lora_B starts at zero, so lora_A would get no gradient: make both non-zero
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.linspace(-0.05, 0.05, p.numel()).view_as(p))
    return a, b


def _same(x: dict, y: dict) -> bool:
    return all(torch.allclose(x[n], y[n], atol=1e-6, rtol=1e-4) for n in x)


def test_update_equals_comlrl_update(tiny_llama):
    """Same gradient per agent as CoMLRL: -(1/G) sum_g A_g log pi(y_g), averaged over the problems of an update
    (left-padded prompts of different lengths on our side, zero-advantage rows skipped by ours only)."""
    prompts, completions, rewards = _fixed_data()
    model_a, model_b = _two_models(tiny_llama)
    model_c, _ = _two_models(tiny_llama)
    ours = _ours_delta(model_a, prompts, completions, rewards)
    theirs = _comlrl_delta(model_b, prompts, completions, rewards)
    assert any(d.abs().max() > 1e-4 for d in ours.values())
    for agent in AGENTS:
        names = [n for n in ours if f".{agent}." in n]
        assert names
        for n in names:
            assert torch.allclose(ours[n], theirs[n], atol=1e-6, rtol=1e-4), n
    # without the throwaway token CoMLRL leaves each completion's last token out of the loss
    assert not _same(ours, _comlrl_delta(model_c, prompts, completions, rewards, extra_token=False))


def test_padding_after_eos_is_the_one_difference(tiny_llama):
    """CoMLRL also scores the padding generated after a completion's EOS (its completions are the padded rows);
    ours stops at the EOS. With those pad tokens cut off the two updates are equal; with them they differ."""
    prompts, completions, rewards = _fixed_data(seed=1, early_eos=True)
    model_a, model_b = _two_models(tiny_llama)
    model_c, _ = _two_models(tiny_llama)
    ours = _ours_delta(model_a, prompts, completions, rewards)
    cut = _comlrl_delta(model_b, prompts, completions, rewards, cut_after_eos=True)
    padded = _comlrl_delta(model_c, prompts, completions, rewards, cut_after_eos=False)
    assert _same(ours, cut)
    assert not _same(ours, padded)
