"""The ``api_grpo`` section of ``params.yaml`` (:class:`ApiGrpoParams`): the beam search, the behaviour library, the
judge and the settings of each text task (:mod:`orchestry.config`).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from orchestry.config.base import BIG, Name, Seed, _Section
from orchestry.config.clients import ApiClientParams


class ApiGrpoJudgeParams(_Section):
    enabled: bool = Field(False, description="mix an LLM judge's 0-10 scores into the value estimator")
    model: str | None = Field(None, description="judge model on the same backend (None: api_grpo.model)")
    weight: float = Field(0.3, ge=0, le=1, description="share of the value from the judge (rest: executable)")
    quality_weight: float = Field(1.0, ge=0, le=1e3)
    collaboration_weight: float = Field(1.0, ge=0, le=1e3)
    efficiency_weight: float = Field(1.0, ge=0, le=1e3)
    on_partial: bool = Field(False, description="also judge unfinished trajectories when pruning the beam")
    extract_behaviors: bool = Field(True, description="also ask the judge for guidelines from top episodes")
    max_tokens: int = Field(64, ge=8, le=4096)


def _require_some_weight(section: _Section) -> None:
    """Raises ValueError unless one of the ``*_weight`` fields (a checked reward's part weights) is > 0."""
    if sum(v for k, v in section if k.endswith("_weight")) <= 0:
        raise ValueError("at least one weight must be > 0")


class ApiGrpoStoryParams(_Section):
    """``api_grpo.task: story`` (writer -> editor): generated story specs and the checkable reward's weights."""

    train_prompts: int = Field(16, ge=1, le=10_000, description="story specs for training episodes")
    test_prompts: int = Field(8, ge=1, le=10_000, description="story specs of the with/without evaluation")
    min_words: int = Field(30, ge=1, le=10_000, description="shortest allowed story (words, title excluded)")
    max_words: int = Field(80, ge=1, le=10_000, description="longest allowed story (words, title excluded)")
    required_words: int = Field(2, ge=0, le=10, description="words every story must use")
    length_weight: float = Field(1.0, ge=0, le=1e3, description="reward for a length in the range")
    words_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of required words used")
    pov_weight: float = Field(1.0, ge=0, le=1e3, description="reward for the requested point of view")
    title_weight: float = Field(1.0, ge=0, le=1e3, description="reward for a <<title>> line")
    prose_gate: bool = Field(
        True,
        description="multiply the parts by the prose score (real sentences, no repetition; tasks/story.py)",
    )
    copy_max: float = Field(
        0.3, ge=0, le=1, description="a story with more of its words in 4-grams of the prompt scores 0"
    )
    seed: Seed = Field(0, description="which specs are generated (topics, words, point of view)")

    @model_validator(mode="after")
    def _range(self) -> ApiGrpoStoryParams:
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) > max_words ({self.max_words})")
        _require_some_weight(self)
        return self


class ApiGrpoDocumentationParams(_Section):
    """``api_grpo.task: documentation`` (writer -> reviewer -> editor): the checkable reward's weights."""

    doctests_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of passing doctests")
    params_weight: float = Field(0.5, ge=0, le=1e3, description="times the share of parameters described")
    returns_weight: float = Field(0.25, ge=0, le=1e3, description="reward for describing the return value")
    unchanged_weight: float = Field(0.25, ge=0, le=1e3, description="reward for leaving the code unchanged")
    require_unchanged: bool = Field(
        True, description="a changed function (AST) scores 0 on every part: its docs describe other code"
    )
    require_consistent: bool = Field(
        True,
        description="a docstring whose summary shares no word with the code (name, parameters, body) or whose "
        "stated return contradicts the examples' outputs scores 0 on doctests, params and returns",
    )

    @model_validator(mode="after")
    def _some_weight(self) -> ApiGrpoDocumentationParams:
        _require_some_weight(self)
        return self


class ApiGrpoResearchParams(_Section):
    """``api_grpo.task: research_synthesis`` (researchers -> synthesiser): bundles and the checks' weights."""

    bundles_path: Name = Field(
        "data/tasks/research_bundles.jsonl", description="question + 3-5 passages per line (repo-relative)"
    )
    test_bundles: int = Field(6, ge=1, le=10_000, description="the last bundles, kept for the evaluation")
    max_words: int = Field(120, ge=1, le=10_000, description="longest allowed answer (words)")
    cited_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of claims citing a passage")
    valid_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of citations that exist")
    coverage_weight: float = Field(1.0, ge=0, le=1e3, description="times the share of passages cited")
    length_weight: float = Field(0.5, ge=0, le=1e3, description="reward for 1..max_words words")
    support_min: float = Field(
        0.5,
        ge=0,
        le=1,
        description="a claim is supported when this share of its content words is in the cited passages",
    )
    copy_max: float = Field(
        0.5,
        ge=0,
        le=1,
        description="an answer with more of its words in 8-grams of the prompt/passages scores 0",
    )

    @model_validator(mode="after")
    def _some_weight(self) -> ApiGrpoResearchParams:
        _require_some_weight(self)
        return self


class ApiGrpoParams(ApiClientParams):
    SECTION: ClassVar[str] = "api_grpo"
    STAGE: ClassVar[str] = "train_api_grpo"

    task: Literal["code_collaboration", "code_review", "story", "documentation", "research_synthesis"] = (
        "code_collaboration"
    )
    k_samples: int = Field(2, ge=1, le=64, description="k: sampled responses per beam trajectory per turn")
    beam_width: int = Field(2, ge=1, le=64, description="N: trajectories kept after each turn")
    num_episodes: int = Field(
        4, ge=1, le=BIG, description="training episodes (one beam search on one train problem)"
    )
    behavior_every: int = Field(
        2, ge=1, le=BIG, description="m: refresh the behaviour library every m episodes"
    )
    top_fraction: float = Field(
        0.2, gt=0, le=0.5, description="top (and bottom) share of trajectories compared"
    )
    max_behaviors: int = Field(3, ge=0, le=10, description="guidelines injected per agent")
    init_behaviors: Name | None = Field(
        None,
        description="start from this learned_behaviors.json (of any task; the stage needs it under "
        "data/behaviors/) instead of an empty library, and evaluate none vs transferred vs learned here",
    )
    main_sees_helper: bool = Field(
        True, description="code_collaboration: main's prompt shows the helper's code"
    )
    judge: ApiGrpoJudgeParams = ApiGrpoJudgeParams()
    story: ApiGrpoStoryParams = ApiGrpoStoryParams()
    documentation: ApiGrpoDocumentationParams = ApiGrpoDocumentationParams()
    research: ApiGrpoResearchParams = ApiGrpoResearchParams()
    eval_budget_fraction: float = Field(
        0.3, ge=0, lt=1, description="share of the budget kept for the test eval"
    )
    max_tokens: int | None = Field(80, ge=1, le=8192, description="tokens per call (None: sampling's)")
    temperature: float | None = Field(
        None, ge=0, le=2, description="None: sampling's (anthropic: model default)"
    )
    top_p: float | None = Field(None, gt=0, le=1, description="None: sampling's (anthropic: model default)")
    max_problems_eval: int = Field(
        6, ge=1, le=BIG, description="test problems of the with/without-behaviours comparison"
    )
    eval_samples: int = Field(1, ge=1, le=1000, description="episodes per test problem and arm")
    cache_path: Name = Field(".orchestry/api_grpo_cache.sqlite", description="response cache (repo-relative)")
    preflight: bool = Field(True, description="check key and server before any work")
