"""Typed ``params.yaml``: one pydantic model per stage section; unknown keys and bad values fail before any work.

Field names follow TRL's GRPOConfig where one exists (``num_generations``, ``max_completion_length``,
``temperature``, ``top_p``, ``learning_rate``, ``beta``).

The defaults here are the committed ``params.yaml`` (the laptop setting; a test keeps them equal). Every
number has a finite range (``inf``/``nan`` are rejected), lists of names are non-empty, and a key written twice
in the YAML file (at any depth, a repeated section included) is an error, not "the last one wins"
(the file is read by :mod:`orchestry.params_file`).

This package holds :class:`Params` (the whole file, and the checks across sections); the sections are written in
:mod:`orchestry.config.pipeline` (model, sampling, sandbox, prepare, baselines, evaluate, detect_schemes,
intervals, plot, mlflow), :mod:`orchestry.config.magrpo` (train_magrpo and its coach),
:mod:`orchestry.config.api_grpo`, :mod:`orchestry.config.orchestrator` (train_orchestrator) and
:mod:`orchestry.config.clients` (what a section that calls chat models says about its clients), on the strict base
of :mod:`orchestry.config.base`. Every name is importable from ``orchestry.config`` itself.
"""

from __future__ import annotations

from pydantic import model_validator

from orchestry.config.api_grpo import (
    ApiGrpoDocumentationParams,
    ApiGrpoJudgeParams,
    ApiGrpoParams,
    ApiGrpoResearchParams,
    ApiGrpoStoryParams,
)
from orchestry.config.base import BIG, Name, Seed, _Section
from orchestry.config.clients import ApiClientParams, ModelPrice
from orchestry.config.magrpo import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_MODES,
    CRITIC_MODES,
    AdvantageEstimator,
    AdvantageMode,
    CoachParams,
    CriticMode,
    TrainMagrpoParams,
)
from orchestry.config.orchestrator import TrainOrchestratorParams
from orchestry.config.pipeline import (
    BASELINE_METHODS,
    BaselineMethod,
    BaselinesParams,
    CompositionalParams,
    DetectSchemesParams,
    EvaluateParams,
    IntervalsParams,
    MlflowParams,
    ModelParams,
    PlotParams,
    PrepareParams,
    SamplingParams,
    SandboxParams,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_MODES",
    "AdvantageEstimator",
    "AdvantageMode",
    "ApiClientParams",
    "ApiGrpoDocumentationParams",
    "ApiGrpoJudgeParams",
    "ApiGrpoParams",
    "ApiGrpoResearchParams",
    "ApiGrpoStoryParams",
    "BASELINE_METHODS",
    "BIG",
    "BaselineMethod",
    "BaselinesParams",
    "CRITIC_MODES",
    "CoachParams",
    "CompositionalParams",
    "CriticMode",
    "DetectSchemesParams",
    "EvaluateParams",
    "IntervalsParams",
    "MlflowParams",
    "ModelParams",
    "ModelPrice",
    "Name",
    "Params",
    "PlotParams",
    "PrepareParams",
    "SamplingParams",
    "SandboxParams",
    "Seed",
    "TrainMagrpoParams",
    "TrainOrchestratorParams",
]


class Params(_Section):
    """The whole ``params.yaml``; a missing section takes its defaults."""

    model: ModelParams = ModelParams()
    sampling: SamplingParams = SamplingParams()
    sandbox: SandboxParams = SandboxParams()
    prepare: PrepareParams = PrepareParams()
    baselines: BaselinesParams = BaselinesParams()
    train_magrpo: TrainMagrpoParams = TrainMagrpoParams()
    api_grpo: ApiGrpoParams = ApiGrpoParams()
    train_orchestrator: TrainOrchestratorParams = TrainOrchestratorParams()
    evaluate: EvaluateParams = EvaluateParams()
    detect_schemes: DetectSchemesParams = DetectSchemesParams()
    intervals: IntervalsParams = IntervalsParams()
    plot: PlotParams = PlotParams()
    mlflow: MlflowParams = MlflowParams()

    @model_validator(mode="after")
    def _across_sections(self) -> Params:
        if self.model.numerics == "portable":
            if self.train_magrpo.bf16_update is True:
                raise ValueError(
                    "model.numerics: portable trains in fp32: set train_magrpo.bf16_update auto or false"
                )
            if self.model.dtype != "float32" or self.model.load_in_4bit:
                raise ValueError("model.numerics: portable needs model.dtype float32 and load_in_4bit false")
            if self.model.decode_dtype == "bfloat16":
                raise ValueError(
                    "model.numerics: portable decodes in fp32: set model.decode_dtype auto or float32"
                )
        if self.model.decode_dtype == "bfloat16" and self.model.decode_products != "onednn":
            raise ValueError("model.decode_dtype: bfloat16 needs model.decode_products: onednn")
        if self.train_magrpo.warm_start_epochs not in (0, "auto") and self.prepare.source != "compositional":
            raise ValueError(
                "train_magrpo.warm_start_epochs needs prepare.source: compositional (the generated problems' "
                f"reference decompositions; got {self.prepare.source!r}): set train_magrpo.warm_start_epochs: 0"
            )
        return self
