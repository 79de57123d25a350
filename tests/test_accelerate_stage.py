"""The `train_magrpo` DVC stage with ``train_magrpo.num_processes: 2``: ``dvc repro`` relaunches the stage under
``accelerate launch`` (2 CPU processes, gloo) and the run matches one process with the same global batch; a run
killed after a checkpoint resumes from it under the two processes.

Temporary repository (``orchestry.smoke.make_micro_repo``) with a tiny random Llama saved as ``models/base`` (the
embedded tokenizer) and 8 generated problems as ``data/problems/train.jsonl``. The comparison needs the same
rollouts in both runs: with temperature > 0 each process samples with its own seed, so 1 and 2 processes draw
different completions (equally good ones, not equal ones). Greedy decoding makes the completions the same; its
G completions of a problem are equal, so the group advantages are zero and the gradient comes from the KL term
(beta > 0) against the base, which is non-zero because the supervised warm start (run on every process, on all
problems, in the same order) moved the adapters first. Each MAGRPO update thus back-propagates 2 problems per
process and all-reduces the gradients, against 4 problems in one process.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = Path("models/adapters/magrpo")

MICRO = {
    "sampling": {"max_completion_length": 16, "temperature": 0.0},
    "sandbox": {"workers": 1},
    "intervals": {"resamples": 100},
    "train_magrpo": {
        "num_steps": 4,
        "problems_per_step": 2,
        "num_generations": 2,
        "max_problems": 8,
        "checkpoint_every": 1,
        "lora_r": 4,
        "lora_alpha": 8,
        "beta": 0.1,
        "learning_rate": 0.001,
        "warm_start_epochs": 1,
        "warm_start_lr": 0.01,
        "warm_start_batch": 4,
        "num_processes": 2,
        # fp32: the comparison below is of float sums in another order; a bf16 update (auto on a CPU with AVX-512
        # BF16) rounds each process's gradient to bf16 and moved the adapters by 9e-5 there
        "bf16_update": False,
    },
}
# one process, the same global batch: 2 processes x 2 problems = 1 process x 4 problems per update
ONE_PROCESS = {"train_magrpo": {"num_processes": 1, "problems_per_step": 4}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A committed micro repository with a tiny base model and generated train problems (not committed: the
    `prepare` stage's outputs, present as its deps)."""
    from transformers import AutoTokenizer

    from orchestry.generators.compositional import generate
    from orchestry.llm.loading import EMBEDDED_GGUF, embedded_gguf_dir
    from orchestry.problems import make_problem
    from orchestry.runtime import write_jsonl
    from orchestry.smoke import make_micro_repo, merge

    dest = tmp_path_factory.mktemp("accel") / "repo"
    make_micro_repo(ROOT, dest, _env(dest))
    params = yaml.safe_load((dest / "params.yaml").read_text())
    (dest / "params.yaml").write_text(yaml.safe_dump(merge(params, MICRO), sort_keys=False))
    problems = [make_problem(g.record, g.record["task_id"]) for g in generate(8, [1, 2], seed=0)]
    write_jsonl(dest / "data/problems/train.jsonl", (p.to_dict() for p in problems))
    tok = AutoTokenizer.from_pretrained(embedded_gguf_dir(), gguf_file=EMBEDDED_GGUF)
    model = make_tiny_llama(len(tok), seed=3)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(dest / "models/base")
    tok.save_pretrained(dest / "models/base")
    return dest


def _env(repo: Path) -> dict[str, str]:
    """The copy's own package first (its processes import the code under test), one thread per process."""
    from orchestry.smoke import clean_env

    return {**clean_env(), "PYTHONPATH": str(repo / "src"), "OMP_NUM_THREADS": "1", "ORCHESTRY_PROGRESS": "0",
            "MLFLOW_ENABLE_ASYNC_LOGGING": "false", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip


def _copy(repo: Path, dest: Path, over: dict | None = None) -> Path:
    from orchestry.smoke import merge

    shutil.copytree(repo, dest, symlinks=True)
    if over:
        params = yaml.safe_load((dest / "params.yaml").read_text())
        (dest / "params.yaml").write_text(yaml.safe_dump(merge(params, over), sort_keys=False))
    return dest


def _repro(repo: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dvc", "repro", "-s", "train_magrpo"], cwd=repo,
                          env=_env(repo), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _adapters(repo: Path, folder: Path = ADAPTERS) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for agent in ("helper", "main"):
        for k, v in load_file(repo / folder / agent / "adapter_model.safetensors").items():
            out[f"{agent}/{k}"] = v
    return out


def _stage_runs(repo: Path) -> list:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("orchestry")
    return client.search_runs([exp.experiment_id], filter_string="tags.stage = 'train_magrpo'")


def _kill_after_a_checkpoint(repo: Path) -> int:
    """Run ``dvc repro`` in ``repo`` and kill it with every process under it (the stage, the launcher, both
    processes, the sandbox) once a checkpoint before the last step is written; returns that checkpoint's step."""
    steps = MICRO["train_magrpo"]["num_steps"]
    proc = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "-s", "train_magrpo"], cwd=repo, env=_env(repo),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    done = 0
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None and not done:
            for manifest in (repo / ".orchestry/checkpoints/magrpo").glob("*/manifest.json"):
                with contextlib.suppress(OSError, ValueError):  # being written or moved
                    done = max(done, json.loads(manifest.read_text())["next_step"])
            time.sleep(0.01)
    finally:
        if proc.poll() is None:  # torchrun starts each worker in a session of its own: kill the whole tree
            import psutil

            tree = psutil.Process(proc.pid).children(recursive=True)
            proc.kill()
            for p in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            psutil.wait_procs(tree, timeout=30)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and 1 <= done < steps, (
        f"not killed mid-way: {proc.returncode}, {done}"
    )
    return done


@pytest.mark.slow
def test_two_processes_resume_after_a_kill_and_match_one_process(repo, tmp_path):
    two = _copy(repo, tmp_path / "two")
    one = _copy(repo, tmp_path / "one", ONE_PROCESS)

    t0 = time.time()
    step = _kill_after_a_checkpoint(two)
    assert not (two / ADAPTERS).exists()
    resumed = _repro(two)
    t2 = time.time() - t0
    assert "relaunching in 2 processes" in resumed.stderr
    # both processes resumed the main process's checkpoint
    assert resumed.stderr.count(f"resuming MAGRPO from step {step} ") == 2, resumed.stderr[-4000:]
    t0 = time.time()
    _repro(one)
    t1 = time.time() - t0

    a1, a2 = _adapters(one), _adapters(two)
    moved = max(float(a2[k].abs().max()) for k in a2 if "lora_B" in k)  # lora_B starts at zero
    diff = max(float((a1[k] - a2[k]).abs().max()) for k in a1)
    print(f"killed after step {step}; 2 processes {t2:.0f} s, 1 process {t1:.0f} s; lora_B moved {moved:.3g}; "
          f"max |1 process - 2 processes| {diff:.3g}")  # fmt: skip
    assert a1.keys() == a2.keys()
    assert moved > 1e-3  # the warm start and the updates trained the adapters
    assert diff <= 1e-5, diff

    # the main process alone logged and wrote the outputs, the whole run's: the killed run (left RUNNING by SIGKILL,
    # marked KILLED when the resumed stage started) and the resumed one, no run of the second process; every
    # process's samples, as one process has them
    runs = _stage_runs(two)
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]
    assert all(("orchestry.stale" in r.data.tags) == (r.info.status == "KILLED") for r in runs)
    assert all(r.data.params["num_processes"] == "2" for r in runs)
    s1 = [json.loads(line) for line in (one / "reports/train/magrpo_samples.jsonl").open()]
    s2 = [json.loads(line) for line in (two / "reports/train/magrpo_samples.jsonl").open()]
    steps = MICRO["train_magrpo"]["num_steps"]
    assert len(s2) == steps * 4 * 2  # steps x problems per update x G
    assert [(s["step"], s["task_id"], s["main"]) for s in s2] == [
        (s["step"], s["task_id"], s["main"]) for s in s1
    ]
    csv1 = (one / "reports/train/magrpo_steps.csv").read_text().splitlines()
    csv2 = (two / "reports/train/magrpo_steps.csv").read_text().splitlines()
    assert len(csv2) == steps + 1 and csv1[0] == csv2[0]
    # the warm start (every process trains all problems in the same order) gives the same pair as one process
    w1, w2 = _adapters(one, ADAPTERS / "warm_start"), _adapters(two, ADAPTERS / "warm_start")
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)
    assert max(float(w2[k].abs().max()) for k in w2 if "lora_B" in k) > 0  # the warm start trained them
    # the finished run removed its checkpoint and warm-started pair
    assert not list((two / ".orchestry/checkpoints/magrpo").iterdir())


def test_step_records_of_the_processes_merge_into_the_whole_steps():
    from orchestry.training.magrpo.batching import merge_records

    a = {"step": 3, "reward": 1.0, "tokens/completion": 10, "seconds": 2.0, "rows_updated/main": 4,
         "problems": ["p0", "p1"], "truncation_rate": 0.5, "advantage_abs/main": 0.2}  # fmt: skip
    b = {"step": 3, "reward": 2.0, "tokens/completion": 30, "seconds": 5.0, "rows_updated/main": 2,
         "problems": ["p2", "p3"], "truncation_rate": 0.0}  # fmt: skip
    m = merge_records([a, b])
    assert m == {"step": 3, "reward": 1.5, "tokens/completion": 40, "seconds": 5.0, "rows_updated/main": 6,
                 "problems": ["p0", "p1", "p2", "p3"], "truncation_rate": 0.25,
                 "advantage_abs/main": 0.2}  # fmt: skip
