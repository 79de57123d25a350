"""``orchestry doctor``: the fingerprint of this machine (a tiny random Llama saved with the embedded tokenizer, the
real kernels, the real update-dtype resolution), the committed lines it is compared with, the verdict and its exit
code, and ``--record``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from orchestry import doctor as D
from orchestry.cli import app

pytestmark = pytest.mark.usefixtures("one_thread")

SETTINGS = {"numerics": "native", "update_dtype": "fp32", "decode_dtype": "float32"}


def _line(**kw) -> dict:
    return {**SETTINGS, "machine": {"cpu": "X"}, "logits": "a", "adapters": "b", "tokens": "c", **kw}


@pytest.mark.parametrize(
    ("reference", "kind"),
    [
        ([], "no-reference"),
        ([_line(update_dtype="bf16")], "other-settings"),
        ([_line(numerics="portable")], "other-settings"),
        ([_line(logits="z")], "differs"),
        ([_line(tokens="z", adapters="z")], "differs"),
        ([_line(adapters="z")], "untrained-match"),
        ([_line(adapters="z"), _line()], "match"),
        ([_line(logits="z"), _line(adapters="z")], "untrained-match"),
    ],
)
def test_verdict(reference, kind) -> None:
    got, closest = D.verdict(_line(), reference)
    assert got == kind
    assert (closest is None) == (kind in ("no-reference", "other-settings"))


def test_a_bad_reference_names_its_line(tmp_path) -> None:
    ref = tmp_path / "ref.jsonl"
    ref.write_text(json.dumps(_line()) + "\n\n{oops\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ref\.jsonl:3: not JSON"):
        D.read_reference(ref)
    ref.write_text(json.dumps({"logits": "a"}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ref\.jsonl:1: not a fingerprint line"):
        D.read_reference(ref)
    assert D.read_reference(tmp_path / "none.jsonl") == []


@pytest.fixture
def tiny_base(tmp_path, embedded_tokenizer, tiny_llama):
    base = tmp_path / "base"
    model = tiny_llama(len(embedded_tokenizer), seed=3)
    model.generation_config.pad_token_id = embedded_tokenizer.pad_token_id
    model.save_pretrained(base)
    embedded_tokenizer.save_pretrained(base)
    params = tmp_path / "params.yaml"
    params.write_text("train_magrpo:\n  bf16_update: false\n", encoding="utf-8")
    return base, params


def test_record_then_match_then_a_changed_training_step_is_a_partial_match(tmp_path, tiny_base) -> None:
    base, params = tiny_base
    ref = tmp_path / "reports" / "numerics_fingerprints.jsonl"
    args = ["doctor", "--params", str(params), "--model", str(base), "--reference", str(ref)]
    r = CliRunner().invoke(app, [*args, "--record"])
    assert r.exit_code == 1, r.output  # nothing committed yet
    assert "NO REFERENCE" in r.output and "update:      fp32 (bf16_update false)" in r.output
    (line,) = D.read_reference(ref)
    assert line["update_dtype"] == "fp32" and line["numerics"] == "native" and len(line["adapters"]) == 12

    r = CliRunner().invoke(app, [*args, "--json"])  # the same machine, the same bits
    assert r.exit_code == 0, r.output
    text = r.output[r.output.index('{"machine"') :]  # progress bars and warnings share the output
    again = json.loads(text.splitlines()[0])
    assert again["verdict"] == "match"
    assert {k: again[k] for k in ("logits", "adapters", "tokens")} == {
        k: line[k] for k in ("logits", "adapters", "tokens")
    }

    ref.write_text(json.dumps({**line, "adapters": "000000000000"}) + "\n", encoding="utf-8")
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1 and "PARTLY" in r.output and "committed:   logits" in r.output, r.output


def test_missing_model_is_one_error_line(tmp_path) -> None:
    r = CliRunner().invoke(
        app, ["doctor", "--model", str(tmp_path / "nowhere"), "--reference", str(tmp_path / "r")]
    )
    assert r.exit_code == 2 and "error: --model: no model in" in r.output, r.output


def test_the_gradient_trace_is_stable_here_and_names_where_two_traces_part(tiny_base) -> None:
    base, _ = tiny_base
    a, b = D.gradient_trace(base), D.gradient_trace(base)
    assert a["backward"][0][0].endswith("lm_head") and len(a["grads"]) == len(a["adam"]) > 0
    assert D.first_difference(a, b) == {
        "loss": None,
        "forward": None,
        "backward": None,
        "grads": None,
        "adam": None,
    }
    name, h = b["backward"][3]
    b["backward"][3] = [name, "0" * 12]
    key = next(iter(b["grads"]))
    b["grads"][key] = "x"
    got = D.first_difference(a, b)
    assert got["backward"] == [3, a["backward"][3], [name, "0" * 12]] and got["grads"] == key
    assert got["forward"] is None and got["adam"] is None
