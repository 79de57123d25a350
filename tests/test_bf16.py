"""``train_magrpo.bf16_update: auto | true | false``: what each setting resolves to on hardware with and without
native bf16 (the capability monkeypatched, so the test means the same on every CPU), what ``params.yaml`` accepts,
and that the trainer resolves once and runs its update accordingly."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import orchestry.numerics as N
import orchestry.training.magrpo as M
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.local import Generation, GenerationBatch, attach_adapters
from orchestry.params_file import ParamsError, load_params
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.training.magrpo import AGENTS, MAGRPOTrainer, Rollout

pytestmark = pytest.mark.usefixtures("one_thread")


# --- the resolver -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize(("setting", "expected"), [("auto", None), (True, True), (False, False)])
@pytest.mark.parametrize(
    ("device", "capability"), [("cpu", "cpu_bf16_supported"), ("cuda:0", "cuda_bf16_supported")]
)
def test_resolution_follows_the_hardware_flag(
    monkeypatch, native, setting, expected, device, capability
) -> None:
    monkeypatch.setattr(N, capability, lambda: native)
    want = native if expected is None else expected  # auto: native bf16 or nothing
    assert N.resolve_bf16(setting, device) is want
    assert N.resolve_bf16(setting, torch.device(device)) is want


def test_auto_is_fp32_on_a_device_without_a_bf16_check(monkeypatch) -> None:
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: True)
    monkeypatch.setattr(N, "cuda_bf16_supported", lambda: True)
    assert N.resolve_bf16("auto", "meta") is False


def test_true_on_emulated_bf16_warns_in_one_line(monkeypatch, caplog) -> None:
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: False)
    with caplog.at_level(logging.WARNING, logger="orchestry.numerics"):
        assert N.resolve_bf16(True, "cpu") is True
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "emulated" in warning.getMessage() and "\n" not in warning.getMessage()
    caplog.clear()
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: True)
    with caplog.at_level(logging.WARNING, logger="orchestry.numerics"):
        assert N.resolve_bf16(True, "cpu") is True
        assert N.resolve_bf16("auto", "cpu") is True
    assert not caplog.records  # native: nothing to warn about


@pytest.mark.parametrize("setting", ["maybe", 1, None])
def test_resolver_refuses_other_settings(setting) -> None:
    with pytest.raises(ValueError, match="auto"):
        N.resolve_bf16(setting, "cpu")


def test_autocast_takes_the_resolved_bool(tiny_llama) -> None:
    model = tiny_llama(16)
    with N.bf16_autocast(model, True):  # even where bf16 is emulated: the resolver decided
        assert torch.is_autocast_enabled("cpu")
    with N.bf16_autocast(model, False):
        assert not torch.is_autocast_enabled("cpu")


# --- params.yaml ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("auto", "auto"),
        ("true", True),
        ("false", False),
        ("True", True),
        ("'false'", False),
        ("AUTO", "auto"),
    ],
)
def test_params_accept_auto_true_false(tmp_path: Path, text: str, value) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(f"train_magrpo:\n  bf16_update: {text}\n")
    assert load_params(path).train_magrpo.bf16_update == value


@pytest.mark.parametrize("text", ["maybe", "1", "0", "null", "bf16", "[true]"])
def test_params_refuse_other_values_naming_the_key(tmp_path: Path, text: str) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(f"train_magrpo:\n  bf16_update: {text}\n")
    with pytest.raises(ParamsError, match=r"train_magrpo\.bf16_update: .*auto, true or false"):
        load_params(path)


def test_the_default_is_auto() -> None:
    assert TrainMagrpoParams().bf16_update == "auto"
    assert TrainMagrpoParams(bf16_update=False).bf16_update is False


# --- the trainer ------------------------------------------------------------------------------------------------


def _rollout(vocab: int, problems, G: int) -> Rollout:
    g = torch.Generator().manual_seed(0)
    B = len(problems) * len(AGENTS) * G
    batch = GenerationBatch(
        torch.randint(3, vocab, (B, 9), generator=g),
        torch.ones(B, 9, dtype=torch.long),
        5,
        [Generation("", 5, 4, i) for i in range(B)],
        0.0,
    )
    rewards = torch.arange(len(problems) * G, dtype=torch.float).view(len(problems), G)
    return Rollout(list(problems), batch, rewards, [LevelReward().to_dict()] * (len(problems) * G), G)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("setting", ["auto", True, False])
def test_trainer_resolves_once_and_updates_accordingly(tiny_llama, monkeypatch, native, setting) -> None:
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: native)
    problems = load_problems()[:1]
    model = attach_adapters(tiny_llama(32), AGENTS, r=2, alpha=4)
    cfg = TrainMagrpoParams(num_generations=2, problems_per_step=1, bf16_update=setting)
    trainer = MAGRPOTrainer(model, None, problems, None, cfg, SamplingParams(), checkpoint_dir="/nonexistent")
    want = native if setting == "auto" else setting
    assert trainer.bf16 is want

    # resolved at construction: a later change of the capability does not reach the update
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: not native)
    seen = []
    logprobs = M.completion_logprobs

    def spy(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu"))
        return logprobs(*args, **kwargs)

    monkeypatch.setattr(M, "completion_logprobs", spy)
    trainer.update(_rollout(32, problems, 2))
    assert seen and all(s is want for s in seen)


# --- model.decode_dtype: decoding's projections ------------------------------------------------------------------


@pytest.mark.parametrize("native", [True, False])
def test_decode_dtype_resolution_follows_the_hardware_flag(monkeypatch, native) -> None:
    from orchestry.llm import decoding

    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: native)
    monkeypatch.setattr(decoding, "DECODE_BF16", False)
    monkeypatch.setattr(decoding, "PRODUCTS", "onednn")
    monkeypatch.delenv(N.NUMERICS_ENV, raising=False)
    assert decoding.use_products("onednn", "auto") is native and decoding.DECODE_BF16 is native
    assert N.machine_info()["decode_dtype"] == ("bfloat16" if native else "float32")
    assert decoding.use_products("onednn", "float32") is False and decoding.DECODE_BF16 is False
    assert N.machine_info()["decode_dtype"] == "float32"
    assert decoding.use_products("mkl", "auto") is False  # bf16 needs oneDNN's products
    monkeypatch.setenv(N.NUMERICS_ENV, "portable")
    assert decoding.use_products("onednn", "auto") is False  # the portable profile decodes in fp32


def test_decode_dtype_bfloat16_needs_native_bf16_and_onednn(monkeypatch) -> None:
    from orchestry.llm import decoding

    monkeypatch.setattr(decoding, "DECODE_BF16", False)
    monkeypatch.setattr(decoding, "PRODUCTS", "onednn")
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: True)
    assert decoding.use_products("onednn", "bfloat16") is True
    with pytest.raises(ValueError, match="needs model.decode_products onednn"):
        decoding.use_products("mkl", "bfloat16")
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match="native bf16.*use auto"):
        decoding.use_products("onednn", "bfloat16")
    # params this machine cannot run are bad params, as the stages and the CLI report them (exit code 2)
    with pytest.raises(ParamsError, match="native bf16"):
        N.resolve_decode_bf16("bfloat16")
    with pytest.raises(ValueError, match="'float32', 'bfloat16' or 'auto'"):
        N.resolve_decode_bf16("fp16")
    assert decoding.DECODE_BF16 is True  # a refused setting changes nothing


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model:\n  decode_dtype: fp16\n", r"model\.decode_dtype"),
        ("model:\n  decode_dtype: bfloat16\n  decode_products: mkl\n", "needs model.decode_products: onednn"),
        ("model:\n  decode_dtype: bfloat16\n  numerics: portable\n", "portable decodes in fp32"),
    ],
)
def test_params_refuse_decode_dtypes_that_cannot_run(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ParamsError, match=message):
        load_params(path)


def test_decode_dtype_defaults_to_float32_and_portable_accepts_auto(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("model:\n  decode_dtype: auto\n  numerics: portable\n")
    assert load_params(path).model.decode_dtype == "auto"
    path.write_text("model: {}\n")
    assert load_params(path).model.decode_dtype == "float32"
