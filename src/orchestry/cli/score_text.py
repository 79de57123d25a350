"""``orchestry score-text``: the checked reward of one text-task answer (story, documentation, research synthesis),
with each part and the reasons, so a rubric can be tried by hand. No model loads; documentation runs the
answer's doctests in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from orchestry.cli.common import MAX_TIMEOUT_S, IsolationMode, _fail, _seconds

TextTask = Literal["story", "documentation", "research_synthesis"]


class SpecError(ValueError):
    """The spec (file or id) or the answer cannot be used (one line)."""


def _read_answer(path: Path) -> str:
    if not path.is_file():
        raise SpecError(f"--answer: {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"--answer: {path}: not UTF-8 text") from None
    except OSError as e:
        raise SpecError(f"--answer: {path}: {e.strerror or e}") from None
    if not text.strip():
        raise SpecError(f"--answer: {path}: empty answer")
    return text


def _json_object(path: Path) -> dict:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecError(f"--spec: {path}: not a JSON object ({e})") from None
    if not isinstance(d, dict):
        raise SpecError(f"--spec: {path}: not a JSON object")
    return d


def _story_spec(spec: str, params: Any):
    from orchestry.tasks.story import POVS, StorySpec, story_specs

    p = params.api_grpo.story
    path = Path(spec)
    if path.is_file():
        d = _json_object(path)
        try:
            words = d.get("words", [])
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise TypeError("words must be a list of strings")
            if d.get("pov") not in POVS:
                raise TypeError(f"pov must be one of {', '.join(POVS)}")
            s = StorySpec(
                str(d.get("task_id", f"Story/{path.stem}")),
                str(d["topic"]),
                tuple(words),
                d["pov"],
                int(d.get("min_words", p.min_words)),
                int(d.get("max_words", p.max_words)),
                str(d.get("title", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(
                f"--spec: {path}: need topic, pov, words (min_words, max_words, title) ({e})"
            ) from None
        return s
    parts = spec.split("/")
    if len(parts) != 3 or parts[0] != "Story" or parts[1] not in ("train", "test") or not parts[2].isdigit():
        raise SpecError(f"--spec: {spec!r} is no file and no story id (Story/train/N or Story/test/N)")
    i = int(parts[2])
    if i >= 10_000:
        raise SpecError(f"--spec: {spec!r}: index too large")
    return story_specs(i + 1, parts[1], p.required_words, p.min_words, p.max_words, p.seed)[i]


def _bundle(spec: str, params: Any):
    from orchestry.tasks.research_synthesis import BundleError, read_bundles

    path = Path(spec)
    try:
        if path.is_file():
            bundles = read_bundles(path)
            if len(bundles) != 1:
                raise SpecError(
                    f"--spec: {path}: {len(bundles)} bundles; give a file with one, or a bundle id"
                )
            return bundles[0]
        bundles = read_bundles(params.api_grpo.research.bundles_path)
    except BundleError as e:
        raise SpecError(f"--spec: {e}") from None
    for b in bundles:
        if spec in (b.task_id, b.task_id.removeprefix("Research/")):
            return b
    raise SpecError(
        f"--spec: {spec!r} is no file and no bundle id of {params.api_grpo.research.bundles_path}"
    )


def _problem(spec: str, problems: str):
    from orchestry.evaluation.scoring import problem_index
    from orchestry.problems import ProblemFormatError
    from orchestry.tasks.documentation import undocumented

    path = Path(spec)
    try:
        if path.is_file():
            index = problem_index(path)
            if len(index) != 1:
                raise SpecError(f"--spec: {path}: {len(index)} problems; give a file with one, or a task id")
            problem = next(iter(index.values()))
        else:
            index = problem_index(problems)
            if spec not in index:
                raise SpecError(f"--spec: {spec!r} is no file and no task_id of {problems}")
            problem = index[spec]
    except ProblemFormatError as e:
        raise SpecError(f"--spec: {e}") from None
    try:
        undocumented(problem)
    except ValueError as e:
        raise SpecError(f"--spec: {problem.task_id}: cannot be documented ({e})") from None
    return problem


def score_text_answer(
    task: str,
    spec: str,
    answer: str,
    params: Any = None,
    problems: str = "data/problems/all.jsonl",
    isolation: str = "auto",
    timeout_s: float = 3.0,
) -> tuple[dict, float]:
    """``(reward, max_reward)`` of ``answer`` for ``task`` on ``spec`` (a file or an id), with the task module's
    own checks (``check``/``score``).

    Raises:
        SpecError: an unknown task, a spec that is no usable file or id, an empty answer.
    """
    from orchestry.tasks.common import Turn

    if params is None:
        from orchestry.config import Params

        params = Params()
    if not answer.strip():
        raise SpecError("--answer: empty answer")
    if task == "story":
        from orchestry.tasks.story import Story

        t = Story(params.api_grpo.story)
        return t.check(_story_spec(spec, params), answer), t.max_reward
    if task == "research_synthesis":
        from orchestry.tasks.research_synthesis import ResearchSynthesis

        t = ResearchSynthesis(params.api_grpo.research)
        return t.check(_bundle(spec, params), answer), t.max_reward
    if task == "documentation":
        from orchestry.sandbox import Sandbox
        from orchestry.tasks.documentation import Documentation

        t = Documentation(params.api_grpo.documentation)
        problem = _problem(spec, problems)
        turn = Turn(role="writer", system="", prompt="", text=answer)
        with Sandbox(timeout_s=timeout_s, max_workers=1, isolation=isolation) as sandbox:
            return t.score([problem], [[turn]], sandbox)[0], t.max_reward
    raise SpecError(f"--task: unknown task {task!r} (story, documentation or research_synthesis)")


def score_text(
    task: Annotated[str, typer.Option(help="The text task: story, documentation or research_synthesis.")],
    spec: Annotated[
        str,
        typer.Option(
            help="What the answer answers: a file (story: JSON {topic, pov, words, min_words, max_words, title}; "
            "research_synthesis: a one-bundle JSONL; documentation: a one-problem HumanEval JSONL) or an id "
            "(Story/test/3, a bundle id, a problem task_id)."
        ),
    ],
    answer: Annotated[Path, typer.Option(help="The answer to score (a UTF-8 text file).")],
    params: Annotated[
        Path | None,
        typer.Option(help="params.yaml for the weights and specs (default: ./params.yaml if present)."),
    ] = None,
    problems: Annotated[
        str, typer.Option(help="documentation: where a task_id --spec is looked up.")
    ] = "data/problems/all.jsonl",
    isolation: Annotated[IsolationMode, typer.Option(help="documentation: sandbox isolation.")] = "auto",
    timeout_s: Annotated[
        float,
        typer.Option(
            parser=_seconds, help=f"documentation: seconds per doctest (0 < s <= {MAX_TIMEOUT_S:g})."
        ),
    ] = 3.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the reward as one JSON object.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of an error.")] = False,
) -> None:
    """Score one text-task answer with the task's checked reward: the total, each part and the reasons.

    Exit code 2 on an unknown task, a missing/empty/unreadable answer or spec, an unknown id or bad params.
    """
    from orchestry.params_file import ParamsError, load_params

    try:
        if task not in ("story", "documentation", "research_synthesis"):
            raise SpecError(f"--task: unknown task {task!r} (story, documentation or research_synthesis)")
        text = _read_answer(answer)
        path = params if params is not None else Path("params.yaml")
        loaded = load_params(path) if params is not None or path.is_file() else None
        reward, max_reward = score_text_answer(task, spec, text, loaded, problems, isolation, timeout_s)
    except SpecError as e:
        _fail(str(e), 2, debug)
    except ParamsError as e:
        _fail(f"--params: {e}", 2, debug)
    except Exception as e:  # a bug: one line, the traceback with --debug
        _fail(f"{type(e).__name__}: {e} (run with --debug for the traceback)", 1, debug)
    public = {k: v for k, v in reward.items() if not k.startswith("_")}
    if as_json:
        typer.echo(json.dumps({"task": task, "max": max_reward, **public}))
        return
    typer.echo(f"reward {public['total']:.3f} / {max_reward:g}")
    for k, v in public.items():
        if k in ("total", "reasons"):
            continue
        typer.echo(f"  {k}: {v:.3f}" if isinstance(v, float) else f"  {k}: {v}")
    for r in public.get("reasons") or []:
        typer.echo(f"  - {r}")
    if not public.get("reasons"):
        typer.echo("  (every check passed)")
