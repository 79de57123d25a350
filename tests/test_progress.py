"""Progress bars (orchestry.progress and its call sites), the scikit-learn random split, the judge agreement and
the pandas schemes crosstab of the detect_schemes stage."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from orchestry.problems import check_canonical_solutions, load_problems, split_problems
from orchestry.progress import ENV_VAR, progress_bar, progress_enabled
from orchestry.rewards.judge import judge_agreement
from orchestry.sandbox import Sandbox

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def humaneval():
    return load_problems("humaneval")


# ---- the helper ------------------------------------------------------------------------------------------------
def test_forced_on_writes_a_bar_with_eta_and_live_metric(monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, "1")
    out = io.StringIO()  # not a terminal: only the variable turns the bar on
    with progress_bar(4, "demo: train", "episode", file=out) as bar:
        for i in range(4):
            bar.update(1)
            bar.set_postfix(reward=f"{i / 2:.2f}")
    text = out.getvalue()
    assert "demo: train" in text and "4/4" in text and "episode/s" in text
    assert "reward=1.50" in text  # the live metric, last value
    assert "<00:00" in text  # tqdm's elapsed<remaining (the ETA)


def test_off_when_not_a_terminal_and_on_when_it_is(monkeypatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    out = io.StringIO()
    assert not progress_enabled(out)
    with progress_bar(3, "quiet", file=out) as bar:
        bar.update(3)
        bar.set_postfix(reward="1.00")
    assert out.getvalue() == ""
    master, slave = os.openpty()  # a real pseudo-terminal
    with os.fdopen(slave, "w") as tty:
        assert progress_enabled(tty)
        with progress_bar(2, "on a tty", file=tty) as bar:
            bar.update(2)
        tty.flush()
        assert b"on a tty" in os.read(master, 4096)
    os.close(master)


def test_env_var_forces_off_and_bad_values_are_refused(monkeypatch) -> None:
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        monkeypatch.setenv(ENV_VAR, "0")
        assert not progress_enabled(tty)
        monkeypatch.setenv(ENV_VAR, "1")
        out = io.StringIO()
        with progress_bar(1, "caller switch", file=out, enable=False) as bar:  # progress=False always wins
            bar.update(1)
        assert out.getvalue() == ""
        monkeypatch.setenv(ENV_VAR, "maybe")
        with pytest.raises(ValueError, match=f"{ENV_VAR}='maybe'"):
            progress_enabled(tty)
    os.close(master)


# ---- call sites --------------------------------------------------------------------------------------------------
def test_prepare_check_shows_progress_and_finds_the_failing_solution(monkeypatch, capsys, humaneval) -> None:
    monkeypatch.setenv(ENV_VAR, "1")
    probs = [humaneval[0], replace(humaneval[1], canonical_solution="    return []\n"), humaneval[2]]
    with Sandbox(timeout_s=3.0, max_workers=1) as sb:
        checked, failed = check_canonical_solutions(probs, sb, chunk_size=2)
    assert (checked, failed) == (3, ["HumanEval/1"])
    err = capsys.readouterr().err
    assert "prepare: canonical solutions" in err and "3/3" in err and "failed=1" in err
    with pytest.raises(ValueError, match="chunk_size"):
        check_canonical_solutions(probs, None, chunk_size=0)


def test_run_method_progress_and_unchanged_rewards(
    monkeypatch, capsys, humaneval, embedded_tokenizer, one_thread
):
    """Forced on, run_method shows a generate bar and a score bar with the live mean reward; scoring in chunks
    of ``batch_size`` gives the same rewards as scoring every sample in one sandbox batch."""
    from conftest import make_tiny_llama

    from orchestry.config import SamplingParams
    from orchestry.evaluation.baselines import run_method
    from orchestry.rewards.code import level_rewards

    monkeypatch.setenv(ENV_VAR, "1")
    tok = embedded_tokenizer
    model = make_tiny_llama(len(tok), seed=1).eval()
    probs = humaneval[:2]
    sampling = SamplingParams(max_completion_length=8)
    with Sandbox(timeout_s=3.0, max_workers=1) as sb:
        recs = run_method("concat", probs, model, tok, sb, sampling, num_samples=2, seed=3, batch_size=3)
        whole = level_rewards([probs[0]] * 2 + [probs[1]] * 2, [r["helper"] for r in recs],
                              [r["main"] for r in recs], sb, truncated=[r["truncated"] for r in recs])  # fmt: skip
    err = capsys.readouterr().err
    assert "concat: generate" in err and "3/3" in err and "tok_s=" in err  # 8 prompts in batches of 3
    assert "concat: score" in err and "4/4" in err
    mean = sum(r["total"] for r in recs) / len(recs)
    assert f"reward={mean:.3f}" in err
    assert [r["total"] for r in recs] == [w.total for w in whole]
    assert [r["reasons"] for r in recs] == [w.reasons for w in whole]


def test_magrpo_bar_uses_the_shared_switch(
    monkeypatch, capsys, humaneval, embedded_tokenizer, one_thread, tmp_path
):
    """MAGRPO's step bar follows ORCHESTRY_PROGRESS like every other bar (forced off here: nothing on stderr)."""
    from conftest import make_tiny_llama

    from orchestry.config import SamplingParams, TrainMagrpoParams
    from orchestry.llm.loading import attach_adapters
    from orchestry.training.magrpo import AGENTS
    from orchestry.training.magrpo.trainer import MAGRPOTrainer

    tok = embedded_tokenizer
    sampling = SamplingParams(max_completion_length=4, temperature=1.0, top_p=1.0)
    cfg = TrainMagrpoParams(num_steps=1, problems_per_step=1, num_generations=2, bf16_update=False)
    with Sandbox(timeout_s=3.0, max_workers=1) as sb:
        for value, shown in (("1", True), ("0", False)):
            monkeypatch.setenv(ENV_VAR, value)
            model = attach_adapters(make_tiny_llama(len(tok), seed=5), AGENTS, r=4, alpha=8, seed=2)
            trainer = MAGRPOTrainer(model, tok, humaneval[:1], sb, cfg, sampling, tmp_path / value)
            (rec,) = trainer.train()
            err = capsys.readouterr().err
            assert ("MAGRPO" in err and "1/1" in err and f"reward={rec['reward']:.2f}" in err) == shown, err


# ---- the scikit-learn random split ----------------------------------------------------------------------------
def test_random_split_is_sklearns_seeded_train_test_split(humaneval) -> None:
    from sklearn.model_selection import train_test_split

    s = split_problems(humaneval, "random", seed=7, fractions=(0.2, 0.6, 0.2))
    ids = {k: [p.task_id for p in v] for k, v in s.items()}
    assert (len(ids["val"]), len(ids["train"]), len(ids["test"])) == (33, 98, 33)  # round(32.8), round(98.4)
    assert sorted(ids["val"] + ids["train"] + ids["test"]) == sorted(p.task_id for p in humaneval)
    rest, test = train_test_split(humaneval, test_size=33, random_state=7)
    train, val = train_test_split(rest, test_size=33, random_state=7)
    assert ids["test"] == [p.task_id for p in test] and ids["val"] == [p.task_id for p in val]
    assert split_problems(humaneval, "random", seed=7) == s
    assert split_problems(humaneval, "random", seed=8)["test"] != s["test"]
    # empty parts and rounding past n (3 x 0.5 rounds to 2 + 2) are handled, nothing lost or repeated
    edge = split_problems(humaneval[:3], "random", seed=0, fractions=(0.5, 0.5, 0.0))
    assert [len(edge[k]) for k in ("val", "train", "test")] == [2, 1, 0]
    assert (
        split_problems(humaneval[:4], "random", seed=0, fractions=(0.0, 1.0, 0.0))["train"] == humaneval[:4]
    )


def test_magrpo_split_is_unchanged(humaneval) -> None:
    s = split_problems(humaneval, "magrpo")
    idx = {k: [int(p.task_id.split("/")[1]) for p in v] for k, v in s.items()}
    assert idx == {"val": list(range(0, 32)), "train": list(range(33, 133)), "test": list(range(133, 164))}


# ---- judge agreement --------------------------------------------------------------------------------------------
def _weighted_kappa(a: list[int], b: list[int], k: int) -> float:
    """Cohen's quadratic-weighted kappa written out: 1 - sum w O / sum w E, w = (i - j)^2."""
    n = len(a)
    obs = Counter(zip(a, b, strict=True))
    pa, pb = Counter(a), Counter(b)
    num = sum((i - j) ** 2 * obs[(i, j)] / n for i in range(k) for j in range(k))
    den = sum((i - j) ** 2 * pa[i] * pb[j] / n / n for i in range(k) for j in range(k))
    return 1 - num / den


def test_judge_agreement_by_hand() -> None:
    rewards = [0.0, 1.0, 2.5, 4.0, 3.0]  # R_max 4 -> bins of 0.8: 0, 1, 3, 4, 3
    judge = [1.0, 3.0, 5.5, 9.0, 2.0]  # J / 10 -> bins of 2: 0, 1, 2, 4, 1
    got = judge_agreement(rewards, judge, 4.0)
    # Spearman = Pearson of ranks: R ranks 1 2 3 5 4, J ranks 1 3 4 5 2 -> 1 - 6 * sum d^2 / (n (n^2 - 1))
    assert got["spearman"] == pytest.approx(1 - 6 * (0 + 1 + 1 + 0 + 4) / (5 * 24))
    assert got["kappa"] == pytest.approx(_weighted_kappa([0, 1, 3, 4, 3], [0, 1, 2, 4, 1], 5))
    assert got["pairs"] == 5
    perfect = judge_agreement([0.0, 2.0, 4.0], [0.0, 5.0, 10.0], 4.0)
    assert perfect["spearman"] == pytest.approx(1.0) and perfect["kappa"] == pytest.approx(1.0)
    for r, j in (([1.0], [5.0]), ([2.0, 2.0], [1.0, 9.0]), ([0.0, 0.1], [1.0, 1.2])):
        got = judge_agreement(r, j, 4.0)
        assert math.isnan(got["kappa"]), (r, j)  # undefined, not "no agreement"
    with pytest.raises(ValueError, match="2 rewards for 1 judge"):
        judge_agreement([1.0, 2.0], [3.0], 4.0)


# ---- detect_schemes: the pandas crosstab gives the same report ------------------------------------------------
def test_detect_schemes_stage_report(tmp_path, humaneval) -> None:
    """The stage (real MLflow sqlite store in a temp dir) writes the counts/shares the per-method loops gave."""
    from orchestry.analysis.schemes import SCHEMES, detect_scheme, scheme_distribution

    (tmp_path / "data/problems").mkdir(parents=True)
    (tmp_path / "data/problems/all.jsonl").write_text(
        "".join(json.dumps(p.to_dict()) + "\n" for p in humaneval[:3])
    )
    mains = {
        "fallback": "def has_close_elements(numbers, threshold):\n    r = aux(numbers)\n    if r is None:\n"
        "        return False\n    return r\n",
        "wrapper": "def has_close_elements(numbers, threshold):\n    return aux(numbers, threshold)\n",
        "none": "def has_close_elements(numbers, threshold):\n    return False\n",
    }
    files = {"eval/base": ["none", "none", "wrapper"], "eval/magrpo": ["fallback", "wrapper", "wrapper"],
             "baselines/single": ["none"]}  # fmt: skip
    for name, kinds in files.items():
        path = tmp_path / "reports" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        recs = [{"task_id": "HumanEval/0", "sample": i, "main": mains[k], "passed": i % 2}
                for i, k in enumerate(kinds)]  # fmt: skip
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    env = {**os.environ, "MLFLOW_ENABLE_ASYNC_LOGGING": "false"}
    env.pop("DVC_ROOT", None)
    res = subprocess.run([sys.executable, str(REPO / "stages/detect_schemes.py")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((tmp_path / "reports/schemes.json").read_text())
    labels = {("baseline_" + n.split("/")[1]) if n.startswith("baselines") else n.split("/")[1]: kinds
              for n, kinds in files.items()}  # fmt: skip
    assert {
        m: [detect_scheme(mains[k], "has_close_elements") for k in v] for m, v in labels.items()
    } == labels
    passing = {m: [k for i, k in enumerate(v) if i % 2] for m, v in labels.items()}
    assert report == {
        "schemes": list(SCHEMES),
        "counts": {m: dict(Counter(v)) for m, v in labels.items()},
        "distribution": {m: scheme_distribution(v) for m, v in labels.items()},
        "distribution_when_a_test_passes": {m: scheme_distribution(v) for m, v in passing.items() if v},
        "samples": {m: len(v) for m, v in labels.items()},
    }
    assert report["distribution"]["magrpo"]["wrapper"] == pytest.approx(2 / 3)
