"""Per-row random streams (orchestry.llm.local.NucleusSampler ``row_seeds``, ``row_seeds``, ``sample_texts``): a
sampled row's completion depends on its own prompt and seed, not on the batch it is decoded in."""

from __future__ import annotations

import pytest
import torch

import orchestry.llm.local as L
from orchestry.config import SamplingParams
from orchestry.llm.sampling import sample_texts

PROMPTS = ["def f(x):", "def g(s):", "print(", "import", "def f(x):", "class A:"]
SAMPLING = SamplingParams(max_completion_length=10, temperature=1.0, top_p=0.95)


@pytest.fixture
def model(tiny_llama, embedded_tokenizer, one_thread):
    return tiny_llama(len(embedded_tokenizer), seed=2).eval()


def test_inverse_cdf_draws_the_distribution_and_never_an_empty_column():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0, 0.0]]).repeat(20000, 1)
    u = torch.rand(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(L.inverse_cdf(probs, u), minlength=6)
    torch.testing.assert_close(counts / 20000.0, probs[0], atol=0.015, rtol=0)
    # uniforms at the ends: the first column, and the last positive one (never the zero padding)
    edge = L.inverse_cdf(probs[:3], torch.tensor([0.0, 1.0 - 2**-53, 0.999999999]))
    assert edge.tolist() == [0, 3, 3]
    # a row whose mass does not sum to 1 (rounding) is scaled by its total
    assert L.inverse_cdf(torch.tensor([[0.2, 0.2]]), torch.tensor([0.6])).tolist() == [1]


def test_row_seeds_name_the_row_not_its_place():
    seeds = L.row_seeds(PROMPTS, 5)
    assert len(set(seeds)) == len(PROMPTS)  # the second "def f(x):" is its prompt's 2nd row: another seed
    assert all(0 <= s < 2**63 for s in seeds)
    # reordered or cut: each prompt's k-th row keeps its seed
    order = [3, 0, 5, 1, 2, 4]
    assert L.row_seeds([PROMPTS[i] for i in order], 5) == [seeds[i] for i in order]
    assert L.row_seeds(PROMPTS[:3], 5) == seeds[:3]
    assert L.row_seeds(PROMPTS, 6) != seeds


def test_the_sampler_draws_each_row_from_its_own_stream():
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    seeds = [11, 12, 13, 14]
    whole = L.NucleusSampler(1.0, 0.95, row_seeds=seeds)
    drawn = torch.stack([whole.draw(scores) for _ in range(5)])  # [steps, rows]
    part = L.NucleusSampler(1.0, 0.95, row_seeds=seeds)
    part.rows = [2, 0]  # a batch of rows 2 and 0 only
    alone = torch.stack([part.draw(scores[[2, 0]]) for _ in range(5)])
    assert torch.equal(alone, drawn[:, [2, 0]])
    with pytest.raises(ValueError, match="rows"):
        part.draw(scores)


@pytest.mark.parametrize("fast", [True, False])  # LlamaDecoder's steps, and model.generate's
def test_a_rows_completion_does_not_depend_on_the_rest_of_the_batch(model, embedded_tokenizer, fast):
    seeds = L.row_seeds(PROMPTS, 3)

    def texts(rows):
        out = L.generate(
            model,
            embedded_tokenizer,
            [PROMPTS[i] for i in rows],
            max_new_tokens=10,
            temperature=1.0,
            top_p=0.95,
            seed=rows[0],  # the call's seed does not matter with row seeds
            stop_at_code_end=False,
            fast_decoding=fast,
            row_seeds=[seeds[i] for i in rows],
        )
        return [it.text for it in out.items]

    whole = texts([0, 1, 2, 3, 4, 5])
    assert texts([3, 1]) == [whole[3], whole[1]]
    assert texts([5]) == [whole[5]]
    assert whole[0] != whole[4]  # the same prompt's two rows: two streams
    with pytest.raises(ValueError, match="row_seeds"):
        L.generate(model, embedded_tokenizer, PROMPTS[:2], row_seeds=seeds[:1])


def test_sample_texts_gives_the_same_completions_at_any_batch_size(model, embedded_tokenizer):
    runs = {b: sample_texts(model, embedded_tokenizer, PROMPTS, None, SAMPLING, 7, b) for b in (1, 2, 4, 6)}
    texts = {b: [t.text for t in r] for b, r in runs.items()}
    assert texts[1] == texts[2] == texts[4] == texts[6]
    assert len(set(texts[6])) > 1  # not one degenerate answer
    # the first prompts alone: the same rows as in the whole call
    first = sample_texts(model, embedded_tokenizer, PROMPTS[:3], None, SAMPLING, 7, 6)
    assert [t.text for t in first] == texts[6][:3]
    other_seed = sample_texts(model, embedded_tokenizer, PROMPTS, None, SAMPLING, 8, 6)
    assert [t.text for t in other_seed] != texts[6]
