"""The ``story`` and ``documentation`` tasks: their checks on hand-made good and bad outputs, and whole API-GRPO runs.

Real parts: the real sandbox runs the doctests; whole runs use a tiny random Llama built from a config and saved
with the embedded tokenizer (local backend), or the real anthropic SDK against the local server of
tests/fake_llm_servers.py.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import pytest
from fake_llm_servers import FakeAnthropic

from orchestry.config import ApiGrpoDocumentationParams, ApiGrpoParams, ApiGrpoStoryParams, SamplingParams
from orchestry.problems import make_problem
from orchestry.sandbox import Sandbox
from orchestry.tasks.common import Turn
from orchestry.tasks.documentation import Documentation, code_fingerprint, describes, undocumented
from orchestry.tasks.story import Story, StorySpec, pov_ok, split_title, story_specs
from orchestry.training.api_grpo import make_task, run_api_grpo

# ---- story -----------------------------------------------------------------------------------------------------
SPEC = StorySpec("Story/t/0", "a lighthouse keeper's last night", ("lantern", "river"), "first", 30, 80)
GOOD_FIRST = """<<The Last Light>>
I climbed the stairs for the last time and lit the lantern. Below me the river met the sea, dark and slow.
My hands shook. For forty years I had kept this light, and tonight a machine would take my place. I stayed
until dawn anyway, watching the boats come home."""


def _story(text: str) -> tuple[Turn, Turn]:
    return Turn("writer", "", "", "draft"), Turn("editor", "", "", text)


def test_a_story_meeting_every_constraint_scores_the_maximum() -> None:
    task = Story()
    r = task.check(SPEC, GOOD_FIRST)
    assert (r["length"], r["words"], r["pov"], r["title"]) == (1.0, 1.0, 1.0, 1.0)
    assert r["total"] == task.max_reward == 4.0 and r["reasons"] == []
    assert 30 <= r["word_count"] <= 80


@pytest.mark.parametrize(
    ("bad", "part"),
    [
        (GOOD_FIRST.replace("<<The Last Light>>\n", "The Last Light\n"), "title"),  # no <<title>>
        (GOOD_FIRST.replace("lantern", "lamp"), "words"),  # a required word missing
        ("<<Short>>\nI lit the lantern by the river. Then I left home.", "length"),  # 12 words
        (GOOD_FIRST + (" And then the night went on." * 12), "length"),  # too long
        (
            GOOD_FIRST.replace("I ", "She ")
            .replace("me ", "her ")
            .replace("My ", "Her ")
            .replace("I had", "she had"),
            "pov",
        ),  # third person where first was asked
    ],
)
def test_each_violated_constraint_scores_lower(bad: str, part: str) -> None:
    task = Story()
    good, worse = task.check(SPEC, GOOD_FIRST), task.check(SPEC, bad)
    assert worse[part] < good[part] and worse["total"] < good["total"], worse
    assert any(reason.startswith(part) for reason in worse["reasons"]), worse["reasons"]
    others = [k for k in task.reward_parts if k != part]
    assert all(worse[k] == good[k] for k in others), worse  # only that constraint failed


def test_point_of_view_ignores_dialogue_and_weights_apply() -> None:
    third = 'He walked to the river. "I am tired," she said, and they sat down by their lantern.'
    assert pov_ok(third, "third") and not pov_ok(third, "first")
    assert not pov_ok("We walked. He sat. She slept.", "third")  # narration in 'we'
    with pytest.raises(ValueError, match="first or third"):
        pov_ok(third, "second")
    assert split_title("<<A>>\nbody") == ("A", "body") and split_title("no title") == (None, "no title")
    task = Story(ApiGrpoStoryParams(length_weight=0.0, words_weight=2.0, pov_weight=0.5, title_weight=0.5))
    assert task.max_reward == 3.0
    assert task.check(SPEC, GOOD_FIRST.replace("river", "sea"))["total"] == pytest.approx(1.0 + 0.5 + 0.5)


def test_a_fence_is_unwrapped_and_a_preamble_is_part_of_the_story() -> None:
    task = Story()
    assert task.check(SPEC, "```\n" + GOOD_FIRST + "\n```") == task.check(SPEC, GOOD_FIRST)
    with_preamble = task.check(SPEC, "Here is the story:\n" + GOOD_FIRST)
    assert with_preamble["word_count"] == task.check(SPEC, GOOD_FIRST)["word_count"] + 4
    f = task.features(
        SPEC, (Turn("writer", "", "", GOOD_FIRST), Turn("editor", "", "", "Here is it:\n" + GOOD_FIRST)), {}
    )
    assert f["editor_preamble"] == 1.0 and f["editor_has_title"] == 1.0


def test_the_judge_is_told_the_checked_story_reward() -> None:
    task = Story(ApiGrpoStoryParams(title_weight=2.0))
    assert task.weights == {"length": 1.0, "words": 1.0, "pov": 1.0, "title": 2.0} and task.max_reward == 5.0
    r = task.check(SPEC, GOOD_FIRST.replace("lantern", "lamp"))
    assert task.result_line(r) == (
        "checked reward 4.50 of 5.00 (length 1.00, words 0.50, pov 1.00, title 1.00); "
        "words: not used in a sentence lantern"
    )
    assert task.result_line(task.check(SPEC, GOOD_FIRST)).endswith("title 1.00)")  # no reasons, no "; "


def test_story_specs_and_prompts() -> None:
    a = story_specs(16, "train", 2, 30, 80, seed=0)
    assert a == story_specs(16, "train", 2, 30, 80, seed=0) and a != story_specs(
        16, "train", 2, 30, 80, seed=1
    )
    test = story_specs(8, "test", 2, 30, 80)
    assert not {s.topic for s in a} & {s.topic for s in test}  # evaluation topics never trained on
    assert all(len(s.words) == 2 and s.pov in ("first", "third") for s in a + test)
    assert len({s.task_id for s in a}) == 16
    with pytest.raises(ValueError, match="split"):
        story_specs(1, "val", 2, 30, 80)
    with pytest.raises(ValueError, match="bad story spec"):
        story_specs(1, "train", 2, 90, 80)
    with pytest.raises(ValueError, match="min_words"):
        ApiGrpoStoryParams(min_words=90, max_words=80)
    zero = {f"{k}_weight": 0.0 for k in Story.reward_parts}
    with pytest.raises(ValueError, match="at least one weight"):
        ApiGrpoStoryParams(**zero)
    with pytest.raises(ValueError, match="min_words"):  # the range is checked first
        ApiGrpoStoryParams(min_words=90, max_words=80, **zero)
    with pytest.raises(ValueError, match="at least one weight"):
        ApiGrpoDocumentationParams(**{f"{k}_weight": 0.0 for k in Documentation.reward_parts})
    assert Story(ApiGrpoStoryParams(**{**zero, "pov_weight": 0.5})).max_reward == 0.5
    task = Story()
    system, user = task.messages(SPEC, [], {"writer": "- Be vivid."})
    assert '"lantern", "river"' in user and "first person" in user and "Be vivid." in user
    _, edit = task.messages(SPEC, [Turn("writer", "", "", "DRAFT TEXT")], {})
    assert "DRAFT TEXT" in edit and "30 and 80 words" in edit
    with pytest.raises(ValueError, match="2 turns"):
        task.messages(SPEC, _story("x"), {})
    # the latest story is scored: the writer's draft while the editor has not answered
    r_partial, r_final = task.score([SPEC, SPEC], [(Turn("writer", "", "", GOOD_FIRST),), _story("no")])
    assert r_partial["total"] == 4.0 and r_final["total"] < 1.0
    assert isinstance(make_task(ApiGrpoParams(task="story")), Story)


# ---- documentation ---------------------------------------------------------------------------------------------
COUNT = make_problem(
    {"task_id": "T/count", "entry_point": "count_upper",
     "prompt": 'def count_upper(s: str, start: int = 0) -> int:\n    """Count uppercase letters."""\n',
     "canonical_solution": "    n = 0\n    for ch in s[start:]:\n        if ch.isupper():\n            n += 1\n    return n\n",
     "test": "def check(candidate):\n    assert candidate('aBC') == 2\n"}
)  # fmt: skip

GOOD_DOC = '''```python
def count_upper(s: str, start: int = 0) -> int:
    """Count the uppercase letters of a string.

    Args:
        s: the text to scan.
        start: index of the first character looked at.

    Returns:
        The number of uppercase letters in s[start:].

    >>> count_upper('aBC')
    2
    >>> count_upper('ABC', start=2)
    1
    """
    n = 0
    for ch in s[start:]:
        if ch.isupper():
            n += 1
    return n
```'''


def _doc_turns(editor: str) -> tuple[Turn, Turn, Turn]:
    return Turn("writer", "", "", "x"), Turn("reviewer", "", "", "ok"), Turn("editor", "", "", editor)


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(timeout_s=3.0, max_workers=1) as sb:
        yield sb


def test_good_documentation_scores_the_maximum(sandbox) -> None:
    task = Documentation()
    (r,) = task.score([COUNT], [_doc_turns(GOOD_DOC)], sandbox)
    assert (r["unchanged"], r["doctests"], r["params"], r["returns"]) == (1.0, 1.0, 1.0, 1.0), r["reasons"]
    assert r["examples"] == r["doctests_passed"] == 2
    assert r["total"] == task.max_reward == 2.0


BAD_DOCS = {
    "a failing doctest": (GOOD_DOC.replace("    1\n", "    3\n"), "doctests"),
    "a doctest that raises": (GOOD_DOC.replace("count_upper('aBC')", "count_upper(None)"), "doctests"),
    "no examples": (GOOD_DOC.replace(">>> count_upper('aBC')\n    2\n    >>> count_upper('ABC', start=2)\n    1\n", ""), "doctests"),
    "a parameter not described": (GOOD_DOC.replace("        start: index of the first character looked at.\n", ""), "params"),
    "the return value not described": (
        GOOD_DOC.replace("    Returns:\n        The number of uppercase letters in s[start:].\n", ""), "returns"),
    "the code changed": (GOOD_DOC.replace("n += 1", "n += 2"), "unchanged"),
    "the signature changed": (GOOD_DOC.replace("start: int = 0) -> int", "start=0)"), "unchanged"),
    "no function": ("I cannot document this.", "unchanged"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_DOCS))
def test_each_bad_documentation_scores_lower(sandbox, case: str) -> None:
    bad, part = BAD_DOCS[case]
    task = Documentation()
    good, worse = task.score([COUNT, COUNT], [_doc_turns(GOOD_DOC), _doc_turns(bad)], sandbox)
    assert worse[part] < good[part] and worse["total"] < good["total"], (case, worse)
    if part == "unchanged":  # documenting different code earns nothing (require_unchanged)
        assert worse["total"] == 0.0
    if case == "a failing doctest":
        assert worse["doctests"] == 0.5 and worse["doctests_passed"] == 1


def test_the_judge_is_told_the_checked_documentation_reward(sandbox) -> None:
    task = Documentation(ApiGrpoDocumentationParams(params_weight=1.0))
    assert task.weights == {"unchanged": 0.25, "doctests": 1.0, "params": 1.0, "returns": 0.25}
    (r,) = task.score([COUNT], [_doc_turns(BAD_DOCS["a failing doctest"][0])], sandbox)
    line = task.result_line(r)
    assert line.startswith(
        "checked reward 2.00 of 2.50 (unchanged 1.00, doctests 0.50, params 1.00, returns 1.00); doctests: 1/2 pass"
    ), line


def test_extra_code_in_the_answer_is_a_change_and_its_doctests_do_not_run(sandbox) -> None:
    """An answer that redefines the doctest runner (or anything else) beside the function is changed code."""
    cheat = GOOD_DOC.replace("    1\n", "    3\n").replace(
        "```python\n",
        "```python\nimport sys\n\n\ndef _orchestry_doctests(name):\n    return [True] * 9\n\n\n",
    )
    (strict,) = Documentation().score([COUNT], [_doc_turns(cheat)], sandbox)
    assert strict["unchanged"] == 0.0 and strict["total"] == 0.0
    loose = Documentation(ApiGrpoDocumentationParams(require_unchanged=False))
    (r,) = loose.score([COUNT], [_doc_turns(cheat)], sandbox)
    assert r["doctests"] == 0.0 and r["doctests_passed"] == 0  # not run: they would describe other code
    # no example ran, so nothing shows the stated return value
    assert r["params"] == 1.0 and r["returns"] == 0.0 and r["total"] == pytest.approx(0.5)
    module_doc = GOOD_DOC.replace("```python\n", '```python\n"""A module docstring is not code."""\n')
    (ok,) = Documentation().score([COUNT], [_doc_turns(module_doc)], sandbox)
    assert ok["total"] == 2.0


def test_what_counts_as_describing_a_parameter() -> None:
    for text in ("s: the text", "  s (str): the text", "s -- the text", ":param str s: the text", "Scan `s`.",
                 "s : str\n    the text"):  # fmt: skip
        assert describes(text, "s"), text
    for text in ("The letters of s[start:].", "start: first index", "it's a string", "s:", "`start`"):
        assert not describes(text, "s"), text


def test_undocumented_strips_the_docstring_only() -> None:
    code = undocumented(COUNT)
    assert '"""' not in code and "def count_upper(s: str, start: int=0) -> int:" in code
    assert "Count uppercase" not in code and "n += 1" in code
    no_solution = make_problem(
        {**{k: getattr(COUNT, k) for k in ("task_id", "entry_point", "prompt", "test")}}
    )
    with pytest.raises(ValueError, match="no canonical solution"):
        undocumented(no_solution)
    import ast

    a = ast.parse(GOOD_DOC.strip("`").removeprefix("python\n")).body[0]
    b = ast.parse(COUNT.prompt + COUNT.canonical_solution).body[0]
    assert code_fingerprint(a) == code_fingerprint(b)
    task = Documentation()
    _, w = task.messages(COUNT, [], {})
    assert code in w and "doctest" in w
    _, rv = task.messages(COUNT, [Turn("writer", "", "", GOOD_DOC)], {})
    assert "Args:" in rv and "Original code" in rv
    _, ed = task.messages(COUNT, [Turn("writer", "", "", GOOD_DOC), Turn("reviewer", "", "", "REVIEW")], {})
    assert "REVIEW" in ed
    assert task.items([COUNT, no_solution], [no_solution]) == ([COUNT], [])
    with pytest.raises(ValueError, match="no train problem"):
        task.items([no_solution], [])


# ---- whole runs ------------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_base(tmp_path, embedded_tokenizer, one_thread, tiny_llama):
    """A tiny random Llama built from a config, saved with the embedded tokenizer (the local backend's folder)."""
    tok = embedded_tokenizer
    model = tiny_llama(len(tok), seed=3)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def test_documentation_run_offline_with_a_local_model(tmp_path, tiny_base) -> None:
    cfg = ApiGrpoParams(task="documentation", num_episodes=2, behavior_every=2, k_samples=2, beam_width=1,
                        max_tokens=16, max_problems_eval=1, cache_path=str(tmp_path / "c.sqlite"),
                        local_batch_size=8)  # fmt: skip
    metrics = []
    summary = run_api_grpo(cfg, SamplingParams(), [COUNT], [COUNT], lambda: Sandbox(max_workers=1),
                           tmp_path / "out", model_path=str(tiny_base), progress=False,
                           on_metrics=lambda m, s: metrics.append(m))  # fmt: skip
    assert summary["task"] == "documentation" and summary["max_reward"] == 2.0
    assert summary["eval"]["status"] == "done" and set(summary["eval"]["parts"]) == set(
        Documentation.reward_parts
    )
    assert set(summary["train"]["mean_selected_parts"]) == set(Documentation.reward_parts)
    assert all(f"train/part/{k}" in metrics[0] for k in Documentation.reward_parts)
    with open(tmp_path / "out" / "rewards.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(f"part_{k}" in rows[0] for k in Documentation.reward_parts)
    ep = json.loads((tmp_path / "out" / "episodes.jsonl").read_text().splitlines()[0])
    traj = ep["trajectories"][0]
    assert [t["role"] for t in traj["turns"]] == ["writer", "reviewer", "editor"]
    assert "count_upper" in traj["turns"][0]["prompt"] and "reasons" in traj["reward"]


def test_story_run_through_the_anthropic_sdk_learns_from_checked_rewards(tmp_path, monkeypatch) -> None:
    """Editors alternate between the draft with its title and a preamble without one: the checked title
    constraint separates them and the library tells the editor to answer with the titled story only."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    counter = itertools.count()

    def reply(body: dict) -> str:
        user = body["messages"][-1]["content"]
        pov = "first" if "first person" in user else "third"
        story = GOOD_FIRST if pov == "first" else GOOD_FIRST.replace("I ", "He ").replace("My ", "His ")
        if "The writer's draft" not in user:
            return story
        if next(counter) % 2 == 0:
            return story
        return "Here is the edited story, with everything fixed as you asked:\n" + split_title(story)[1]

    srv = FakeAnthropic(reply=reply, usage={"input_tokens": 50, "output_tokens": 60})
    with srv.running():
        cfg = ApiGrpoParams(backend="anthropic", model="claude-haiku-4-5", base_url=srv.url, task="story",
                            num_episodes=4, behavior_every=2, k_samples=2, beam_width=2, max_tokens=200,
                            max_problems_eval=2, concurrency=1, preflight=False, top_fraction=0.5,
                            cache_path=str(tmp_path / "c.sqlite"),
                            story={"train_prompts": 4, "test_prompts": 2})  # fmt: skip
        summary = run_api_grpo(cfg, SamplingParams(), [COUNT], [COUNT], lambda: Sandbox(max_workers=1),
                               tmp_path / "out", progress=False)  # fmt: skip
    assert summary["task"] == "story" and summary["max_reward"] == 4.0
    eps = [json.loads(x) for x in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    assert {e["task_id"] for e in eps if e["phase"] == "train"} <= {f"Story/train/{i}" for i in range(4)}
    assert {e["task_id"] for e in eps if e["phase"] == "eval"} == {"Story/test/0", "Story/test/1"}
    titles = [t["reward"]["title"] for e in eps if e["phase"] == "train" for t in e["trajectories"]]
    assert 0.0 in titles and 1.0 in titles
    lib = json.loads((tmp_path / "out" / "learned_behaviors.json").read_text())
    assert "editor" in lib["behaviors"], lib["updates"]
    assert "title line" in lib["behaviors"]["editor"] or "story only" in lib["behaviors"]["editor"]
    assert set(summary["eval"]["parts"]) == {"length", "words", "pov", "title"}
    from orchestry.reporting.report import _api_grpo_section

    page = _api_grpo_section(summary, tmp_path / "out" / "summary.json")
    assert "mean test reward (max 4.0)" in page and "Each reward part" in page and "<td>title</td>" in page


@pytest.mark.slow
def test_text_tasks_offline_with_the_embedded_model(tmp_path) -> None:
    """The one integration test with SmolLM2 (models/base): one episode of each text task, every part reported."""
    import torch

    from orchestry.problems import read_problems

    root = Path(__file__).resolve().parents[1]
    if (
        not (root / "models/base/model.safetensors").exists()
        or not (root / "data/problems/test.jsonl").exists()
    ):
        pytest.skip("models/base or data/problems not prepared")
    train = read_problems(root / "data/problems/train.jsonl")
    test = read_problems(root / "data/problems/test.jsonl")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, parts in (("story", Story.reward_parts), ("documentation", Documentation.reward_parts)):
            cfg = ApiGrpoParams(task=name, num_episodes=1, behavior_every=1, k_samples=1, beam_width=1,
                                max_tokens=48, max_problems_eval=1, cache_path=str(tmp_path / "c.sqlite"),
                                story={"train_prompts": 1, "test_prompts": 1})  # fmt: skip
            summary = run_api_grpo(cfg, SamplingParams(), train, test, lambda: Sandbox(max_workers=1),
                                   tmp_path / name, model_path=str(root / "models/base"), progress=False)  # fmt: skip
            assert summary["task"] == name and summary["episodes_completed"] == 1
            assert summary["cost"]["usd"] == 0 and summary["cost"]["tokens"] > 0
            assert summary["eval"]["status"] == "done" and set(summary["eval"]["parts"]) == set(parts)
    finally:
        torch.set_num_threads(threads)
