"""model.numerics and the machine record (orchestry.numerics): flags, the portable setting, params checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from orchestry.numerics import (
    FLAGS,
    NATIVE_MKL_CBWR,
    PORTABLE_ENV,
    apply_numerics,
    cpu_flags,
    cpu_line,
    cpu_model,
)
from orchestry.params_file import ParamsError, load_params

CPUINFO = "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse2 avx avx2 fma avx512f\n"
HAS_AVX2 = cpu_flags()["avx2"]


def test_flags_and_line_come_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    assert cpu_flags(info) == {"avx2": True, "avx512f": True, "avx512_bf16": False, "amx_bf16": False}
    assert cpu_model(info) == "Test CPU 9000"
    assert cpu_line(info) == "Test CPU 9000; avx2=yes, avx512f=yes, avx512_bf16=no, amx_bf16=no"
    missing = tmp_path / "missing"
    assert cpu_flags(missing) == dict.fromkeys(FLAGS, False)  # not Linux / not x86: nothing claimed


def test_native_sets_only_mkls_strict_mode_and_keeps_a_users_branch(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "")  # records this process's value, restored after the test
    monkeypatch.delenv("MKL_CBWR")
    apply_numerics("native")
    assert os.environ["MKL_CBWR"] == NATIVE_MKL_CBWR == "AUTO,STRICT"
    monkeypatch.setenv("MKL_CBWR", "AUTO")  # the user's own branch stays
    apply_numerics("native")
    assert os.environ["MKL_CBWR"] == "AUTO"
    assert "ORCHESTRY_NUMERICS" not in os.environ
    with pytest.raises(ValueError, match="native or portable"):
        apply_numerics("fast")


def test_native_products_have_the_same_bits_at_one_and_two_threads():
    """Under ``native`` (applied after torch is imported, as a stage does) an fp32 product of a decoding step's
    shape gives the same bits with 1 and 2 threads. Without MKL's strict mode (``MKL_CBWR=AUTO``) they differed on
    an Intel Xeon with AVX-512 (MKL split the sums of the first shape over the threads)."""
    code = """
        import hashlib, json, sys, torch
        from orchestry.numerics import apply_numerics
        apply_numerics("native")
        g = torch.Generator().manual_seed(0)
        shapes = [(8, 576, 576), (8, 576, 192), (64, 1536, 576), (128, 1536, 576)]
        bits = {}
        for rows, k, n in shapes:
            x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                out = torch.nn.functional.linear(x, w).numpy().tobytes()
                bits.setdefault(f"{rows}x{k}x{n}", []).append(hashlib.sha256(out).hexdigest())
        print(json.dumps(bits))
        """
    p = _child_args(code, [])
    assert p.returncode == 0, p.stderr[-2000:]
    bits = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(bits) == 4
    for shape, (one, two) in bits.items():
        assert one == two, f"{shape}: 1 and 2 threads give other bits under native"


def _child_args(code: str, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with ``args``, the portable variables removed from the environment, then
    ``env`` added."""
    base = {k: v for k, v in os.environ.items() if k not in (*PORTABLE_ENV, "ORCHESTRY_NUMERICS")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def _child(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return _child_args(code, [], env)


@pytest.mark.skipif(not HAS_AVX2, reason="portable pins AVX2 kernels: needs an x86-64 CPU with AVX2")
def test_portable_pins_the_kernels_and_trains_in_fp32():
    """In a fresh process, as a stage starts: torch imported first (as the stage scripts do), then the setting."""
    out = _child(
        """
        import json, os, torch
        from orchestry.numerics import apply_numerics, resolve_bf16
        from orchestry.runtime import machine_info
        apply_numerics("portable")
        print(json.dumps({"env": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR",
                          "ONEDNN_MAX_CPU_ISA", "ORCHESTRY_NUMERICS")},
                          "bf16_auto": resolve_bf16("auto", "cpu"), "machine": machine_info()}))
        """
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["env"] == {**PORTABLE_ENV, "ORCHESTRY_NUMERICS": "portable"}
    assert got["bf16_auto"] is False
    m = got["machine"]
    assert (m["kernels"], m["mkl_cbwr"], m["numerics"]) == ("AVX2", "COMPATIBLE", "portable")
    assert m["threads"] >= 1 and "avx2" in m["cpu_flags"].split()


@pytest.mark.skipif(not HAS_AVX2, reason="needs a CPU whose torch kernels can be AVX2")
def test_portable_refuses_when_torch_already_chose_other_kernels():
    out = _child(
        """
        import torch
        torch.ones(8).exp().sum()  # computes: torch fixes its kernels (scalar ones, from the environment)
        from orchestry.numerics import apply_numerics
        apply_numerics("portable")
        """,
        env={"ATEN_CPU_CAPABILITY": "default"},
    )
    assert out.returncode != 0
    assert "already uses its DEFAULT kernels" in out.stderr


@pytest.mark.skipif(not HAS_AVX2, reason="portable pins AVX2 kernels")
def test_portable_applied_in_a_running_stage_equals_the_environment_at_start():
    """The bits of a float32 product and softmax: ``apply_numerics`` after torch is imported gives exactly what
    the portable environment set at process start gives, and not what the native kernels give (MKL's COMPATIBLE
    branch has no FMA), so the setting really took effect."""
    code = """
        import hashlib, sys, torch
        from orchestry.numerics import apply_numerics
        if sys.argv[1] == "late":
            apply_numerics("portable")
        torch.set_num_threads(2)
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(64, 576, generator=g), torch.randn(576, 1536, generator=g)
        print(hashlib.sha256(torch.softmax(a @ b, -1).numpy().tobytes()).hexdigest())
        """
    bits = {}
    for how, env in (("native", {}), ("at_start", PORTABLE_ENV), ("late", {})):
        p = _child_args(code, [how], env)
        assert p.returncode == 0, p.stderr[-2000:]
        bits[how] = p.stdout.strip()
    assert len(bits["late"]) == 64
    assert bits["late"] == bits["at_start"]
    assert bits["late"] != bits["native"]


@pytest.mark.parametrize(
    "extra, message",
    [
        ("train_magrpo:\n  bf16_update: true\n", "bf16_update auto or false"),
        ("", "model.dtype float32"),
    ],
)
def test_portable_params_must_be_fp32(tmp_path, extra, message):
    model = "model:\n  numerics: portable\n" + ("  dtype: bfloat16\n" if not extra else "")
    path = tmp_path / "params.yaml"
    path.write_text(model + extra)
    with pytest.raises(ParamsError, match=message):
        load_params(path)
    path.write_text("model:\n  numerics: portable\n")
    assert load_params(path).model.numerics == "portable"
    path.write_text("model:\n  numerics: fastest\n")
    with pytest.raises(ParamsError, match="numerics"):
        load_params(path)
