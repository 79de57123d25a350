"""Issue 55: outputs that game the text tasks' rewards score below a third of the maximum, good references at
least two thirds. The table is the committed record of the gamed outputs (the issue's five and more).

Real parts: the real sandbox runs the doctests; the committed research bundles.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestry.problems import make_problem
from orchestry.sandbox import Sandbox
from orchestry.tasks.common import Turn
from orchestry.tasks.documentation import Documentation, calls_function, documented_names, stated_kind
from orchestry.tasks.research_synthesis import ResearchSynthesis, read_bundles, supported
from orchestry.tasks.story import Story, StorySpec
from orchestry.tasks.text_checks import compression_ratio, copied_share, distinct_n, is_real_sentence

ROOT = Path(__file__).resolve().parents[1]

# ---- story -----------------------------------------------------------------------------------------------------
SPEC = StorySpec("Story/t/0", "a lighthouse keeper's last night", ("lantern", "river"), "first", 30, 80)
SPEC3 = StorySpec("Story/t/1", "a market on the moon", ("copper", "window"), "third", 30, 80)
STORY_GOOD = {
    "first person": (
        SPEC,
        """<<The Last Light>>
I climbed the stairs for the last time and lit the lantern. Below me the river met the sea, dark and slow.
My hands shook. For forty years I had kept this light, and tonight a machine would take my place. I stayed
until dawn anyway, watching the boats come home.""",
    ),
    "third person": (
        SPEC3,
        """<<Dust and Coins>>
The market opened when the Earth rose over the grey hills. Mara sold copper pots from a cart with a cracked
window, and the miners paid her in stories instead of coins. She listened to them all. When the last shuttle
left, she closed her stall, counted the tales she had earned and smiled at the quiet stars.""",
    ),
}
STORY_GAMED = {
    # the issue's: title + required words + "I me my" x 10 (was 4.0 / 4), the prompt copied back (was 2.0 / 4)
    "keyword salad": (SPEC, "<<X>>\nlantern river " + "I me my " * 10),
    "prompt copied back": (SPEC, SPEC.prompt),
    "prompt copied under a title": (SPEC, "<<Story>>\n" + SPEC.prompt),
    "one sentence repeated": (SPEC, "<<X>>\n" + "I lit the lantern by the river and I was happy. " * 6),
    "word list lines": (SPEC, "<<X>>\n- lantern\n- river\n- I\n- me\n- my\n" * 6),
}


@pytest.mark.parametrize("case", list(STORY_GOOD))
def test_good_stories_score_high(case: str) -> None:
    spec, text = STORY_GOOD[case]
    task = Story()
    r = task.check(spec, text)
    assert r["total"] >= 2 / 3 * task.max_reward and r["prose"] == 1.0, r["reasons"]


@pytest.mark.parametrize("case", list(STORY_GAMED))
def test_gamed_stories_score_below_a_third(case: str) -> None:
    spec, text = STORY_GAMED[case]
    task = Story()
    r = task.check(spec, text)
    assert r["total"] < task.max_reward / 3, (case, r)
    if "prompt" in case:
        assert r["total"] == 0.0 and any(x.startswith("copied") for x in r["reasons"])


def test_required_words_count_only_inside_real_sentences() -> None:
    spec, text = STORY_GOOD["first person"]
    listed = text.replace("lit the lantern", "lit the lamp") + "\nlantern"
    r = Story().check(spec, listed)
    assert r["words"] == 0.5 and "not used in a sentence lantern" in "; ".join(r["reasons"])
    assert not is_real_sentence("lantern river I me my I me my I me my")
    assert is_real_sentence("I climbed the stairs and lit the lantern.")
    assert distinct_n(("a b " * 10).split()) < 0.2 and compression_ratio("I was here. " * 40) < 0.1
    assert copied_share(SPEC.prompt, [SPEC.prompt], 4) == 1.0


# ---- research synthesis ----------------------------------------------------------------------------------------
BUNDLE = next(
    b for b in read_bundles(ROOT / "data/tasks/research_bundles.jsonl") if b.task_id.endswith("json-parse")
)
RESEARCH_GOOD = (
    "json.loads deserializes a str, bytes or bytearray holding a JSON document into a Python object [P1]. "
    "json.load does the same for a file-like object that supports read [P2]. "
    "An optional object_hook function is called with each decoded dict, so parsing can be customised [P1, P2]. "
    "The JSONDecoder class is the simple JSON decoder behind them [P3]."
)
RESEARCH_GAMED = {
    "blah with citations": "blah blah blah [P1]. blah blah blah [P2]. blah blah blah [P3].",  # was 3.5 / 3.5
    "the prompt copied back": BUNDLE.prompt,  # was 2.61 / 3.5
    "bare ids": "\n".join(f"[P{i}]" for i in range(1, 16)),  # the model's own, was 1.7
    "passages copied with ids": " ".join(f"{t} [{i}]." for i, t in BUNDLE.passages),
    "keyword salad": "json loads object hook decoder dict str bytes [P1]. json load file object document [P2]. "
    "decoder json simple [P3].",
    "claims the passages do not support": "The json module sends email over SMTP servers [P1]. It also draws "
    "pictures on the screen [P2]. The decoder plays music for the user [P3].",
}


def test_a_supported_synthesis_scores_high() -> None:
    task = ResearchSynthesis()
    r = task.check(BUNDLE, RESEARCH_GOOD)
    assert r["total"] >= 2 / 3 * task.max_reward and r["supported"] == r["claims"] == 4, r["reasons"]


@pytest.mark.parametrize("case", list(RESEARCH_GAMED))
def test_gamed_syntheses_score_below_a_third(case: str) -> None:
    task = ResearchSynthesis()
    r = task.check(BUNDLE, RESEARCH_GAMED[case])
    assert r["total"] < task.max_reward / 3, (case, r)


def test_a_claim_is_supported_only_by_the_passage_it_cites() -> None:
    passages = dict(BUNDLE.passages)
    right = "json.load reads a JSON document from a file-like object into a Python object [P2]."
    assert supported(right, passages)
    assert not supported(right.replace("[P2]", "[P3]"), passages)  # P3 says nothing of files
    assert not supported("[P1]", passages) and not supported("See [P1].", passages)  # no claim


# ---- documentation ---------------------------------------------------------------------------------------------
COUNT = make_problem(
    {"task_id": "T/count", "entry_point": "count_upper",
     "prompt": 'def count_upper(s: str, start: int = 0) -> int:\n    """Count uppercase letters."""\n',
     "canonical_solution": "    n = 0\n    for ch in s[start:]:\n        if ch.isupper():\n            n += 1\n    return n\n",
     "test": "def check(candidate):\n    assert candidate('aBC') == 2\n"}
)  # fmt: skip
BODY = "    n = 0\n    for ch in s[start:]:\n        if ch.isupper():\n            n += 1\n    return n\n"


def _fn(doc: str) -> str:
    return f'```python\ndef count_upper(s: str, start: int = 0) -> int:\n    """{doc}\n    """\n{BODY}```'


GOOD_ARGS = (
    "\n\n    Args:\n        s: the text to scan.\n        start: index of the first character looked at.\n"
)
DOC_GOOD = _fn(
    "Count the uppercase letters of a string." + GOOD_ARGS
    + "\n    Returns:\n        The number of uppercase letters in s[start:].\n\n"
    "    >>> count_upper('aBC')\n    2\n    >>> count_upper('ABC', start=2)\n    1"
)  # fmt: skip
DOC_GAMED = {
    # the issue's: prose "Deletes all files", the arg names in backticks, "Returns...", >>> 1 + 1 (was 2.0 / 2)
    "unrelated prose, backticks, 1 + 1": _fn("Deletes all files. Uses `s` and `start`.\n\n    Returns the result."
                                              "\n\n    >>> 1 + 1\n    2"),
    "prose that contradicts the code": _fn(
        "Check whether the string is in upper case." + GOOD_ARGS
        + "\n    Returns:\n        True if every letter of s is uppercase.\n\n    >>> count_upper('aBC')\n    2"),
    "examples that do not call the function": _fn(
        "Count the uppercase letters of a string." + GOOD_ARGS
        + "\n    Returns:\n        The number of uppercase letters.\n\n    >>> 'aBC'.upper()\n    'ABC'\n"
        "    >>> 2\n    2"),
    "made-up parameters, no examples": _fn(
        "Count the uppercase letters of a string.\n\n    Args:\n        text: the text.\n        verbose: "
        "print progress.\n        s: x\n        start: y\n\n    Returns:\n        A number."),
}  # fmt: skip


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(timeout_s=3.0, max_workers=1) as sb:
        yield sb


def _doc(text: str) -> tuple[Turn, Turn, Turn]:
    return Turn("writer", "", "", "x"), Turn("reviewer", "", "", "ok"), Turn("editor", "", "", text)


def test_documentation_table(sandbox) -> None:
    task = Documentation()
    cases = {"good": DOC_GOOD, **DOC_GAMED}
    rs = dict(
        zip(cases, task.score([COUNT] * len(cases), [_doc(x) for x in cases.values()], sandbox), strict=True)
    )
    assert rs["good"]["total"] == task.max_reward, rs["good"]["reasons"]
    for case in DOC_GAMED:
        if case == "examples that do not call the function":  # the parameters' descriptions still earn
            assert rs[case]["doctests"] == 0.0 and rs[case]["total"] == 0.75, rs[case]
            continue
        assert rs[case]["total"] < task.max_reward / 3, (case, rs[case])
    assert rs["prose that contradicts the code"]["consistent"] == 0.0
    assert rs["unrelated prose, backticks, 1 + 1"]["relevant"] == 0.0
    assert "no such parameter text, verbose" in "; ".join(rs["made-up parameters, no examples"]["reasons"])


def test_documentation_helpers() -> None:
    assert calls_function("count_upper('a')", "count_upper") and calls_function("list(f(1))", "f")
    assert not calls_function("1 + 1", "f") and not calls_function("(f(1), 2)[1]", "f")
    assert not calls_function("g(f(1))", "f")
    assert documented_names("Sum.\n\nArgs:\n    a (int): x\n    b: y\n\nReturns:\n    c: z\n:param d: w") == [
        "a",
        "b",
        "d",
    ]
    assert stated_kind("Returns:\n    True if the list is sorted.") == "bool"
    assert stated_kind("Return the number of letters in the string.") == "number"
    assert stated_kind("Returns the result.") is None
