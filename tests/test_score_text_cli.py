"""``orchestry score-text`` (issue 55, item 3): one text-task answer scored with the task's checks, each part and
the reasons printed; bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestry.cli import app

ROOT = Path(__file__).resolve().parents[1]
STORY = (
    "<<The Lantern>>\n"
    "I climbed the old tower each night with a lantern in my hand. From the top I watched the river below as "
    "the boats drifted home through the fog. My daughter brought me bread and tea, and we talked about the "
    "winter ahead while the light turned slowly over the dark water."
)
SPEC = {"topic": "a lighthouse keeper", "pov": "first", "words": ["lantern", "river"], "min_words": 30,
        "max_words": 80}  # fmt: skip
DOC_PROBLEM = {
    "task_id": "Doc/0",
    "prompt": 'def add(a: int, b: int) -> int:\n    """Add two numbers."""\n',
    "canonical_solution": "    return a + b\n",
    "entry_point": "add",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
}
DOC_ANSWER = '''```python
def add(a: int, b: int) -> int:
    """Add the two numbers `a` and `b` and return their sum.

    Args:
        a: the first number to add.
        b: the second number to add.

    Returns:
        The sum of a and b.

    >>> add(1, 2)
    3
    >>> add(-4, 4)
    0
    """
    return a + b
```'''


def _run(tmp_path: Path, *args: str):
    return CliRunner().invoke(app, ["score-text", *args, "--params", str(ROOT / "params.yaml")])


def _files(tmp_path: Path, answer: str, spec: dict | None = None) -> tuple[Path, Path]:
    a = tmp_path / "answer.txt"
    a.write_text(answer, encoding="utf-8")
    s = tmp_path / "spec.json"
    s.write_text(json.dumps(spec or SPEC), encoding="utf-8")
    return s, a


def test_story_prints_reward_parts_and_reasons(tmp_path):
    spec, answer = _files(tmp_path, STORY)
    r = _run(tmp_path, "--task", "story", "--spec", str(spec), "--answer", str(answer))
    assert r.exit_code == 0, r.output
    assert r.output.startswith("reward 4.000 / 4")
    for part in ("length", "words", "pov", "title", "prose"):
        assert f"  {part}: " in r.output
    # keyword salad: low reward, with the reasons printed
    _, salad = _files(tmp_path, "<<X>>\nlantern river " + "I me my " * 10)
    r = _run(tmp_path, "--task", "story", "--spec", str(spec), "--answer", str(salad), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["total"] < d["max"] / 3 and d["reasons"]


def test_story_id_and_research_bundle_id(tmp_path):
    _, answer = _files(tmp_path, STORY)
    r = _run(tmp_path, "--task", "story", "--spec", "Story/test/0", "--answer", str(answer), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["title"] == 1.0
    bundles = ROOT / "data/tasks/research_bundles.jsonl"
    if not bundles.exists():
        pytest.skip("no research bundles file")
    first = json.loads(bundles.read_text(encoding="utf-8").splitlines()[0])
    copy = "\n".join(p["text"] for p in first["passages"]) + " [P1]"
    _, copied = _files(tmp_path, copy)
    single = tmp_path / "bundle.jsonl"
    single.write_text(json.dumps(first) + "\n", encoding="utf-8")
    for spec in (first["id"], str(single)):
        r = CliRunner().invoke(
            app,
            ["score-text", "--task", "research_synthesis", "--spec", spec, "--answer", str(copied), "--json"],
        )
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        assert d["total"] == 0.0 and any(x.startswith("copied") for x in d["reasons"])


def test_documentation_runs_the_doctests(tmp_path):
    problems = tmp_path / "p.jsonl"
    problems.write_text(json.dumps(DOC_PROBLEM) + "\n", encoding="utf-8")
    _, answer = _files(tmp_path, DOC_ANSWER)
    args = ["--task", "documentation", "--spec", "Doc/0", "--problems", str(problems)]
    r = _run(tmp_path, *args, "--answer", str(answer), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["doctests"] == 1.0 and d["unchanged"] == 1.0 and d["total"] >= d["max"] * 2 / 3
    _, bad = _files(tmp_path, DOC_ANSWER.replace("    0\n", "    1\n"))
    r = _run(tmp_path, *args, "--answer", str(bad), "--json")
    d = json.loads(r.output)
    assert d["doctests"] == 0.5 and any(x.startswith("doctests") for x in d["reasons"])


@pytest.mark.parametrize(
    ("task", "spec", "answer", "message"),
    [
        ("poem", "SPEC", STORY, "--task: unknown task 'poem'"),
        ("story", "SPEC", None, "--answer:"),
        ("story", "SPEC", "  \n", "empty answer"),
        ("story", "Story/dev/1", STORY, "no story id"),
        ("story", "MISSING", STORY, "no story id"),
        ("research_synthesis", "no-such-bundle", STORY, "no bundle id"),
        ("documentation", "No/1", STORY, "no task_id"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, task, spec, answer, message):
    s, a = _files(tmp_path, answer if answer is not None else "x")
    if answer is None:
        a = tmp_path / "missing.txt"
    spec = str(s) if spec == "SPEC" else str(tmp_path / "missing.json") if spec == "MISSING" else spec
    extra: list[str] = []
    if task == "documentation":  # a fresh clone has no data/problems: name a problem file that exists
        problems = tmp_path / "p.jsonl"
        problems.write_text(json.dumps(DOC_PROBLEM) + "\n", encoding="utf-8")
        extra = ["--problems", str(problems)]
    r = _run(tmp_path, "--task", task, "--spec", spec, "--answer", str(a), *extra)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.output
