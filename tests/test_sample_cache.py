"""The bare model's store of sampled completions (orchestry.llm.sampling.SampleCache): a call made twice decodes
once, gives the same completions, and anything that changes a sample misses; discussion reuses concat's call."""

from __future__ import annotations

import json

import pytest

from orchestry.config import SamplingParams
from orchestry.evaluation.baselines import run_method
from orchestry.generators.compositional import generate
from orchestry.llm.sampling import SampleCache, sample_texts
from orchestry.problems import make_problem
from orchestry.sandbox import Sandbox

SAMPLING = SamplingParams(max_completion_length=8)
PROMPTS = ["def f(x):", "def g(s):", "print(", "import"]


@pytest.fixture
def model(tiny_llama, embedded_tokenizer, one_thread):
    return tiny_llama(len(embedded_tokenizer), seed=2).eval()


def test_a_stored_call_is_read_not_decoded(tmp_path, model, embedded_tokenizer) -> None:
    cache = SampleCache(tmp_path / "samples", {"model": "tiny"})
    first = sample_texts(model, embedded_tokenizer, PROMPTS, None, SAMPLING, 5, 3, cache=cache)
    assert (cache.hits, cache.misses) == (0, 1)
    assert len(list((tmp_path / "samples").glob("*.json"))) == 1
    # no model at all: a call that decoded would fail
    again = sample_texts(None, embedded_tokenizer, PROMPTS, None, SAMPLING, 5, 3, cache=cache)
    assert again == first and cache.hits == 1
    plain = sample_texts(model, embedded_tokenizer, PROMPTS, None, SAMPLING, 5, 3)
    assert [t.text for t in plain] == [t.text for t in first]
    assert [(t.completion_tokens, t.truncated) for t in plain] == [
        (t.completion_tokens, t.truncated) for t in first
    ]


@pytest.mark.parametrize(
    "change",
    [
        {"prompts": PROMPTS[:3] + ["import os"]},
        {"seed": 6},
        {"batch_size": 2},
        {"sampling": SamplingParams(max_completion_length=8, temperature=0.7)},
        {"identity": {"model": "other"}},
    ],
)
def test_anything_that_changes_a_sample_misses(tmp_path, model, embedded_tokenizer, change) -> None:
    args = {
        "prompts": PROMPTS,
        "seed": 5,
        "batch_size": 3,
        "sampling": SAMPLING,
        "identity": {"model": "tiny"},
    }
    first = SampleCache(tmp_path, args["identity"])
    sample_texts(model, embedded_tokenizer, args["prompts"], None, args["sampling"], args["seed"],
                 args["batch_size"], cache=first)  # fmt: skip
    args |= change
    second = SampleCache(tmp_path, args["identity"])
    sample_texts(model, embedded_tokenizer, args["prompts"], None, args["sampling"], args["seed"],
                 args["batch_size"], cache=second)  # fmt: skip
    assert (second.hits, second.misses) == (0, 1)
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_a_damaged_file_is_a_miss_and_is_replaced(tmp_path, model, embedded_tokenizer) -> None:
    cache = SampleCache(tmp_path, {"model": "tiny"})
    first = sample_texts(model, embedded_tokenizer, PROMPTS, None, SAMPLING, 5, 3, cache=cache)
    (path,) = tmp_path.glob("*.json")
    for damaged in ("{not json", json.dumps([{"text": "x"}]), json.dumps(json.loads(path.read_text())[:2])):
        path.write_text(damaged)
        again = sample_texts(model, embedded_tokenizer, PROMPTS, None, SAMPLING, 5, 3, cache=cache)
        assert [t.text for t in again] == [t.text for t in first]  # decoded again (other seconds)
    assert cache.hits == 0 and cache.misses == 4
    assert [r["text"] for r in json.loads(path.read_text())] == [t.text for t in first]


def test_adapters_are_refused(tmp_path, model, embedded_tokenizer) -> None:
    cache = SampleCache(tmp_path, {"model": "tiny"})
    with pytest.raises(ValueError, match="bare model"):
        sample_texts(model, embedded_tokenizer, PROMPTS, ["helper"] * 4, SAMPLING, 5, 3, cache=cache)


def test_discussion_reads_concat_s_call_and_gives_the_same_records(
    tmp_path, model, embedded_tokenizer
) -> None:
    problems = [make_problem(g.record) for g in generate(3, 1, seed=0)]
    args = (problems, model, embedded_tokenizer)
    kwargs = {"sampling": SAMPLING, "num_samples": 2, "seed": 1, "batch_size": 4, "progress": False}
    cache = SampleCache(tmp_path, {"model": "tiny"})

    def strip(records):
        return [{k: v for k, v in r.items() if "seconds" not in k} for r in records]

    with Sandbox(timeout_s=2.0, max_workers=1) as sb:
        run_method("concat", *args, sb, cache=cache, **kwargs)
        assert (cache.hits, cache.misses) == (0, 1)
        reused = run_method("discussion", *args, sb, cache=cache, **kwargs)
        assert (cache.hits, cache.misses) == (1, 2)  # the drafts read, the revisions decoded
        decoded = run_method("discussion", *args, sb, **kwargs)
    assert strip(reused) == strip(decoded)


def test_a_method_s_records_do_not_depend_on_the_methods_run_before_it(model, embedded_tokenizer) -> None:
    """The baselines stage runs every method in one process: each one's samples must be those it draws alone,
    whatever the methods before it left in the global random states."""
    import random

    import torch

    problems = [make_problem(g.record) for g in generate(3, 1, seed=0)]
    args = (problems, model, embedded_tokenizer)
    kwargs = {"sampling": SAMPLING, "num_samples": 2, "seed": 1, "batch_size": 4, "progress": False}

    def strip(records):
        return [{k: v for k, v in r.items() if "seconds" not in k} for r in records]

    with Sandbox(timeout_s=2.0, max_workers=1) as sb:
        torch.manual_seed(0)
        alone = run_method("sequential", *args, sb, **kwargs)
        run_method("single", *args, sb, **kwargs)
        torch.rand(7), random.random()  # whatever else a method before it may draw
        after = run_method("sequential", *args, sb, **kwargs)
    assert strip(alone) == strip(after)
    assert len({r["main"] for r in alone}) > 1  # sampled, not one repeated text
