"""``orchestry paired`` and ``compare.paired_comparison``: two methods' samples, paired by problem."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from orchestry.cli import app
from orchestry.reporting.compare import CompareError, paired_comparison, read_samples

runner = CliRunner()


def rec(task, total, **kw):
    base = {"task_id": task, "total": total, "structure": 0.0, "syntax": 0.0, "tests": 0.0, "cooperation": 0.0,
            "passed": 0, "total_asserts": 3}  # fmt: skip
    return {**base, **kw}


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def row(df, metric):
    return df.set_index("metric").loc[metric]


def test_difference_is_paired_by_problem_and_hand_computed():
    # per-problem means: reference A 1.0, B 1.0; other A 2.0, B 2.0 (+ C, which the reference lacks)
    ref = [rec("A", 1.0), rec("A", 1.0), rec("B", 0.0), rec("B", 2.0)]
    other = [rec("A", 2.0), rec("A", 2.0), rec("B", 1.0), rec("B", 3.0), rec("C", 4.0)]
    t = paired_comparison(ref, other, ["total"], n_boot=500)
    r = row(t, "total")
    assert r["n_problems"] == 2
    assert (r["reference"], r["other"], r["diff"]) == (1.0, 2.0, 1.0)
    assert (r["diff_low"], r["diff_high"]) == (1.0, 1.0) and r["excludes_zero"]


def test_an_effect_that_changes_sign_across_problems_does_not_exclude_zero():
    ref = [rec("A", 1.0), rec("B", 1.0), rec("C", 1.0), rec("D", 1.0)]
    other = [rec("A", 2.0), rec("B", 0.0), rec("C", 2.0), rec("D", 0.0)]
    r = row(paired_comparison(ref, other, ["total"], n_boot=2000), "total")
    assert r["diff"] == 0.0 and r["diff_low"] < 0 < r["diff_high"] and not r["excludes_zero"]


def test_flags_pass_cooperation_and_aux_facts():
    ref = [rec("A", 0.0, aux_called=False), rec("A", 0.0, aux_called=True)]
    other = [rec("A", 4.0, passed=3, cooperation=1.0, aux_called=True), rec("A", 0.0, aux_called=True)]
    t = paired_comparison(ref, other, ["pass", "coop_rate", "aux_called"], n_boot=200)
    assert row(t, "pass")["other"] == 0.5 and row(t, "pass")["reference"] == 0.0
    assert row(t, "coop_rate")["diff"] == 0.5
    assert row(t, "aux_called")["reference"] == 0.5 and row(t, "aux_called")["other"] == 1.0


def test_a_metric_one_side_did_not_record_is_left_out():
    ref = [rec("A", 1.0)]  # no "truncated" key (an older run)
    other = [rec("A", 1.0, truncated=True)]
    t = paired_comparison(ref, other, ["total", "truncated"], n_boot=100)
    assert list(t["metric"]) == ["total"]


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(CompareError, match="no problem"):
        paired_comparison([rec("A", 1.0)], [rec("B", 1.0)])
    with pytest.raises(CompareError, match="unknown metric"):
        paired_comparison([rec("A", 1.0)], [rec("A", 1.0)], ["reward"])
    with pytest.raises(CompareError, match="at least one record"):
        paired_comparison([], [rec("A", 1.0)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec("A", 1.0)) + "\n\n{oops\n")
    with pytest.raises(CompareError, match=r"bad.jsonl:3: not JSON"):
        read_samples(bad)
    bad.write_text('{"total": 1.0}\n')
    with pytest.raises(CompareError, match="needs a task_id"):
        read_samples(bad)


def test_cli_prints_each_comparison_and_writes_csv(tmp_path):
    ref = write(tmp_path / "base.jsonl", [rec("A", 1.0), rec("B", 1.0)])
    a = write(tmp_path / "a.jsonl", [rec("A", 3.0), rec("B", 3.0)])
    b = write(tmp_path / "b.jsonl", [rec("A", 0.0), rec("B", 1.0)])
    out = tmp_path / "out" / "paired.csv"
    result = runner.invoke(app, ["paired", str(ref), str(a), str(b), "--metric", "total", "--csv", str(out)])
    assert result.exit_code == 0, result.output
    assert "+2.000 [+2.000, +2.000]" in result.output and "-0.500" in result.output
    lines = out.read_text().splitlines()
    assert lines[0].startswith("metric,") and len(lines) == 3 and lines[1].endswith(str(a))


def test_cli_missing_file_is_one_error_line_and_exit_code_2(tmp_path):
    ref = write(tmp_path / "base.jsonl", [rec("A", 1.0)])
    result = runner.invoke(app, ["paired", str(ref), str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and "nope.jsonl: cannot read" in result.stderr
    assert "Traceback" not in result.output


def test_cli_plot_draws_a_png_and_checks_the_labels(tmp_path):
    ref = write(tmp_path / "base.jsonl", [rec("A", 1.0, aux_called=False), rec("B", 1.0, aux_called=False)])
    a = write(tmp_path / "a.jsonl", [rec("A", 3.0, aux_called=True), rec("B", 2.0, aux_called=False)])
    png = tmp_path / "fig" / "paired.png"
    ok = runner.invoke(app, ["paired", str(ref), str(a), "--plot", str(png), "--label", "variant a"])
    assert ok.exit_code == 0, ok.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    bad = runner.invoke(app, ["paired", str(ref), str(a), "--plot", str(png), "--label", "x", "--label", "y"])
    assert bad.exit_code == 2 and "--label: 2 labels for 1 compared files" in bad.stderr
