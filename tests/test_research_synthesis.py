"""The ``research_synthesis`` task: the committed bundles, the citation checks on hand-made answers, a whole run.

Real parts: the committed bundles file, the real anthropic SDK against the local server of
tests/fake_llm_servers.py for the whole run.
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path

import pytest
from fake_llm_servers import FakeAnthropic

from orchestry.config import ApiGrpoParams, ApiGrpoResearchParams, SamplingParams
from orchestry.sandbox import Sandbox
from orchestry.tasks.common import Turn
from orchestry.tasks.research_data import LICENSE, build_bundles
from orchestry.tasks.research_synthesis import (
    Bundle,
    BundleError,
    ResearchSynthesis,
    cited_ids,
    claims,
    read_bundles,
)
from orchestry.training.api_grpo import run_api_grpo

ROOT = Path(__file__).resolve().parents[1]
BUNDLES = ROOT / "data/tasks/research_bundles.jsonl"
B = Bundle("Research/t", "How is JSON parsed?", (
    ("P1", "json.loads parses a str holding a JSON document into a Python object."),
    ("P2", "json.load reads a JSON document from a file object and returns a Python object."),
    ("P3", "JSONDecoder is the simple JSON decoder class; its object_hook customises the parsing."),
))  # fmt: skip
GOOD = (
    "json.loads turns a JSON string into Python objects [P1]. "
    "json.load does the same for a file object [P2]. "
    "Parsing can be customised through the JSONDecoder class and its object_hook [P3]."
)


def test_the_committed_bundles_are_enough_and_licensed() -> None:
    bundles = read_bundles(BUNDLES)
    assert len(bundles) >= 20 and all(3 <= len(b.passages) <= 5 for b in bundles)
    records = [json.loads(x) for x in BUNDLES.read_text().splitlines()]
    for r in records:
        for p in r["passages"]:
            assert p["license"] == LICENSE and p["source"].startswith("docstring of ") and p["text"].strip()
    version = records[0]["passages"][0]["source"].rsplit("CPython ", 1)[1].rstrip(")")
    if (
        version == platform.python_version()
    ):  # the file is what the builder makes from this Python's docstrings
        assert build_bundles() == records


def test_bad_bundle_files_are_one_clear_error(tmp_path) -> None:
    f = tmp_path / "b.jsonl"
    good = {"id": "x", "question": "q?", "passages": [
        {"id": f"P{i}", "text": "t", "source": "s", "license": "PSF-2.0"} for i in (1, 2, 3)]}  # fmt: skip
    cases = [
        ({**good, "passages": good["passages"][:2]}, "3 to 5"),
        ({**good, "passages": [{**good["passages"][0], "license": ""}, *good["passages"][1:]]}, "no license"),
        ({"id": "x", "question": "q"}, "need id, question and passages"),
    ]
    for record, needle in cases:
        f.write_text(json.dumps(record) + "\n")
        with pytest.raises(BundleError, match=needle):
            read_bundles(f)
    f.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(BundleError, match="repeated"):
        read_bundles(f)
    with pytest.raises(BundleError, match="no such bundles file"):
        read_bundles(tmp_path / "missing.jsonl")


def test_a_cited_complete_answer_scores_the_maximum() -> None:
    task = ResearchSynthesis()
    r = task.check(B, GOOD)
    assert (r["cited"], r["valid"], r["coverage"], r["length"]) == (1.0, 1.0, 1.0, 1.0), r["reasons"]
    assert r["total"] == task.max_reward == 3.5 and r["claims"] == 3


@pytest.mark.parametrize(
    ("bad", "part"),
    [
        (GOOD.replace(" [P2]", ""), "cited"),  # a claim without citation (and P2 no longer covered)
        (GOOD.replace("[P3]", "[P3, P7]"), "valid"),  # an invented passage id
        (GOOD.replace("[P2]", "[P1]").replace("[P3]", "[P1]"), "coverage"),  # only one passage used
        (GOOD + " More words [P1]." * 40, "length"),  # over max_words
        ("JSON is parsed by the json module.", "valid"),  # no citation at all
    ],
)
def test_each_bad_answer_scores_lower(bad: str, part: str) -> None:
    task = ResearchSynthesis()
    good, worse = task.check(B, GOOD), task.check(B, bad)
    assert worse[part] < good[part] and worse["total"] < good["total"], worse
    assert any(reason.startswith(part) for reason in worse["reasons"]), worse["reasons"]


def test_the_judge_is_told_the_checked_reward() -> None:
    with pytest.raises(ValueError, match="at least one weight"):
        ApiGrpoResearchParams(**{f"{k}_weight": 0.0 for k in ResearchSynthesis.reward_parts})
    task = ResearchSynthesis(ApiGrpoResearchParams(length_weight=1.0))
    assert (
        task.weights == {"cited": 1.0, "valid": 1.0, "coverage": 1.0, "length": 1.0}
        and task.max_reward == 4.0
    )
    r = task.check(B, GOOD.replace("[P3]", "[P3, P7]"))
    assert task.result_line(r) == (
        "checked reward 3.75 of 4.00 (cited 1.00, valid 0.75, coverage 1.00, length 1.00); valid: no such passage P7"
    )


def test_claims_citations_prompts_and_items(tmp_path) -> None:
    assert claims("One two three [P1].\nshort\n- a list item here [P2]") == [
        "One two three [P1].",
        "- a list item here [P2]",
    ]
    assert cited_ids("x [P1, P3] y [P2] z (P4) [see P5]") == ["P1", "P3", "P2", "P5"]
    task = ResearchSynthesis(ApiGrpoResearchParams(bundles_path=str(BUNDLES), test_bundles=6))
    train, test = task.items([], [])
    assert len(test) == 6 and len(train) == len(read_bundles(BUNDLES)) - 6
    with pytest.raises(BundleError, match="need more than test_bundles"):
        ResearchSynthesis(ApiGrpoResearchParams(bundles_path=str(BUNDLES), test_bundles=1000)).items([], [])
    _, a = task.messages(B, [], {"researcher_a": "- Quote exactly."})
    assert "[P1]" in a and "[P2]" in a and "[P3]" not in a and "Quote exactly." in a
    _, b = task.messages(B, [Turn("researcher_a", "", "", "NOTES A")], {})
    assert "[P3]" in b and "[P1]\n" not in b
    _, s = task.messages(
        B, [Turn("researcher_a", "", "", "NOTES A"), Turn("researcher_b", "", "", "NOTES B")], {}
    )
    assert "NOTES A" in s and "NOTES B" in s and "at most 120 words" in s
    with pytest.raises(ValueError, match="3 turns"):
        task.messages(B, [Turn("x", "", "", "")] * 3, {})


def test_research_run_through_the_anthropic_sdk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")

    def reply(body: dict) -> str:
        user = body["messages"][-1]["content"]
        if "Notes of researcher A" in user:  # cite every passage of the bundle, one sentence each
            sources = user.split("Sources:\n", 1)[1].split("\n\nNotes of researcher A", 1)[0]
            blocks = re.findall(r"^\[(P\d+)\]\n(.*?)(?=\n\n\[P\d+\]\n|\Z)", sources, re.S | re.M)
            # a sentence per passage built from its own words (supported, not a verbatim 8-word copy)
            return " ".join(
                f"It says that {' '.join(re.findall(r'[A-Za-z]+', t)[:7])} [{i}]." for i, t in blocks
            )
        return "Some notes without any citation at all."

    srv = FakeAnthropic(reply=reply, usage={"input_tokens": 50, "output_tokens": 30})
    with srv.running():
        cfg = ApiGrpoParams(backend="anthropic", model="claude-haiku-4-5", base_url=srv.url,
                            task="research_synthesis", num_episodes=2, behavior_every=2, k_samples=1,
                            beam_width=1, max_problems_eval=1, concurrency=1, preflight=False,
                            cache_path=str(tmp_path / "c.sqlite"),
                            research={"bundles_path": str(BUNDLES)})  # fmt: skip
        summary = run_api_grpo(cfg, SamplingParams(), [], [], lambda: Sandbox(max_workers=1), tmp_path / "out",
                               progress=False)  # fmt: skip
    assert summary["task"] == "research_synthesis" and summary["max_reward"] == 3.5
    eps = [json.loads(x) for x in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    ep = eps[0]
    traj = ep["trajectories"][0]
    train = [e for e in eps if e["phase"] == "train"]
    assert summary["train"]["mean_selected_parts"] == pytest.approx(
        {
            k: sum(e["trajectories"][e["selected"]]["reward"][k] for e in train) / len(train)
            for k in ResearchSynthesis.reward_parts
        }
    )
    assert [t["role"] for t in traj["turns"]] == ["researcher_a", "researcher_b", "synthesiser"]
    assert traj["reward"]["total"] == pytest.approx(3.5), traj["reward"]["reasons"]
    assert set(summary["eval"]["parts"]) == {"cited", "valid", "coverage", "length"}
