"""``train_magrpo.bf16_update: auto | true | false``: what each setting resolves to on hardware with and without
native bf16 (the capability monkeypatched, so the test means the same on every CPU), what ``params.yaml`` accepts,
and that the trainer resolves once and runs its update accordingly."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

import orchestry.numerics as N
import orchestry.training.magrpo.trainer as M
from orchestry.config import SamplingParams, TrainMagrpoParams
from orchestry.llm.loading import attach_adapters
from orchestry.llm.local import Generation, GenerationBatch
from orchestry.params_file import ParamsError, load_params
from orchestry.problems import load_problems
from orchestry.rewards.code import LevelReward
from orchestry.runtime import machine_info
from orchestry.training.magrpo import AGENTS, Rollout
from orchestry.training.magrpo.trainer import MAGRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _record(folder: Path, choice: str, fp32_ms: float = 10.0, bf16_ms: float = 5.0) -> Path:
    """Write this machine's recorded update-dtype measurement into ``folder`` (what a first run leaves)."""
    path = folder / "update_dtype.json"
    entry = {"fp32_ms": fp32_ms, "bf16_ms": bf16_ms, "choice": choice, "date": "2026-11-28"}
    path.write_text(json.dumps({N.machine_key(): entry}), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def measured_bf16_faster(tmp_path, monkeypatch, one_thread) -> Path:
    """This machine recorded as measured faster in bf16, in a folder of the test, so that ``auto`` follows the
    hardware capability alone in the tests that set it (the measurement has tests of its own below)."""
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv(N.CACHE_DIR_ENV, str(folder))
    return _record(folder, "bf16")


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


def test_auto_on_a_native_cpu_follows_the_recorded_measurement(monkeypatch, measured_bf16_faster) -> None:
    monkeypatch.setattr(N, "cpu_bf16_supported", lambda: True)
    assert N.resolve_bf16("auto", "cpu") is True
    decision = N.update_dtype_decision("auto", "cpu")
    assert decision["update_dtype"] == "bf16" and decision["bf16_ms"] == 5.0
    _record(measured_bf16_faster.parent, "fp32", fp32_ms=10.0, bf16_ms=70.0)  # native, but measured slower
    assert N.resolve_bf16("auto", "cpu") is False
    assert N.update_dtype_decision("auto", "cpu") == {
        "update_dtype": "fp32",
        "reason": f"auto: measured on this CPU, fp32 10.0 ms vs bf16 70.0 ms ({measured_bf16_faster})",
        "fp32_ms": 10.0,
        "bf16_ms": 70.0,
    }
    assert N.resolve_bf16(True, "cpu") is True and N.resolve_bf16(False, "cpu") is False  # explicit wins


@pytest.mark.parametrize(("fp32_ms", "bf16_ms", "choice"), [(10.0, 8.9, "bf16"), (10.0, 9.0, "bf16"),
                                                             (10.0, 9.5, "fp32"), (10.0, 30.0, "fp32")])  # fmt: skip
def test_bf16_is_chosen_only_when_clearly_faster(tmp_path, monkeypatch, fp32_ms, bf16_ms, choice) -> None:
    monkeypatch.setenv(N.CACHE_DIR_ENV, str(tmp_path / "fresh"))
    got = N.recorded_update_dtype(lambda: {"fp32_ms": fp32_ms, "bf16_ms": bf16_ms})
    assert got["choice"] == choice and got["key"] == N.machine_key()


def test_measured_once_then_read_back(tmp_path, monkeypatch) -> None:
    """The first call measures (really, on this CPU, a small shape) and records; later calls read the record and
    never measure again, so every run on this machine makes the same choice."""
    folder = tmp_path / "fresh"
    monkeypatch.setenv(N.CACHE_DIR_ENV, str(folder))
    first = N.recorded_update_dtype(lambda: N.measure_update_dtype(tokens=64, layers=1, repeats=2))
    assert first["fp32_ms"] > 0 and first["bf16_ms"] > 0 and first["choice"] in ("bf16", "fp32")
    assert first["choice"] == ("bf16" if first["bf16_ms"] <= N.BF16_MARGIN * first["fp32_ms"] else "fp32")
    recorded = json.loads((folder / "update_dtype.json").read_text())
    assert list(recorded) == [N.machine_key()]

    def must_not_measure():
        raise AssertionError("measured again")

    again = N.recorded_update_dtype(must_not_measure)
    assert again == first


def test_an_unreadable_record_is_measured_again(tmp_path, monkeypatch, caplog) -> None:
    folder = tmp_path / "fresh"
    folder.mkdir()
    (folder / "update_dtype.json").write_text("{not json", encoding="utf-8")
    monkeypatch.setenv(N.CACHE_DIR_ENV, str(folder))
    with caplog.at_level(logging.WARNING, logger="orchestry.numerics"):
        got = N.recorded_update_dtype(lambda: {"fp32_ms": 4.0, "bf16_ms": 8.0})
    assert got["choice"] == "fp32" and "unreadable" in caplog.text
    assert json.loads((folder / "update_dtype.json").read_text())[N.machine_key()]["choice"] == "fp32"


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
    assert machine_info()["decode_dtype"] == ("bfloat16" if native else "float32")
    assert decoding.use_products("onednn", "float32") is False and decoding.DECODE_BF16 is False
    assert machine_info()["decode_dtype"] == "float32"
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
