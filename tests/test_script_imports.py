"""Every ``orchestry`` name that the repository's scripts import exists: the benchmarks, the stages and the
committed experiment scripts are not imported by the other tests, so a moved function (``cpu_bf16_supported``,
from ``orchestry.llm.local`` to ``orchestry.numerics``) would otherwise break ``make bench-magrpo`` unnoticed."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    p.relative_to(ROOT).as_posix()
    for pattern in ("benchmarks/*.py", "stages/*.py", "reports/experiments/**/*.py", "scripts/*.py")
    for p in ROOT.glob(pattern)
)


def _missing(tree: ast.AST) -> list[str]:
    """``module.name`` of each ``from orchestry... import name`` (at any depth) that does not resolve."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "orchestry":
            module = importlib.import_module(node.module)
            for alias in node.names:
                if hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ModuleNotFoundError:
                    out.append(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "orchestry":
                    importlib.import_module(alias.name)
    return out


def test_the_scripts_are_found():
    assert "benchmarks/magrpo_vs_comlrl.py" in SCRIPTS and "stages/evaluate.py" in SCRIPTS
    assert any(s.startswith("reports/experiments/") for s in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_orchestry_import_of_a_script_resolves(script):
    assert _missing(ast.parse((ROOT / script).read_text(), script)) == []


def test_a_moved_name_is_reported():
    tree = ast.parse("def f():\n    from orchestry.llm.loading import load_model, cpu_bf16_supported\n")
    assert _missing(tree) == ["orchestry.llm.loading.cpu_bf16_supported"]
