"""Data-parallel MAGRPO under ``accelerate launch``: two CPU processes (gloo) must end with identical, trained
adapters after training on different problems (``benchmarks/magrpo_accelerate_smoke.py`` checks and reports)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "launch",
    [
        [
            "--num_processes",
            "1",
            "--cpu",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ],
        ["--config_file", str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml")],
    ],
    ids=["1-process", "2-processes"],
)
def test_accelerate_launch_trains_identical_adapters(launch):
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which(
        "accelerate"
    )
    if accelerate is None:
        pytest.skip("the accelerate CLI is not on PATH")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [accelerate, "launch", *launch, str(ROOT / "benchmarks" / "magrpo_accelerate_smoke.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    n = 1 if "--cpu" in launch else 2
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert f"OK: {n} process(es), identical adapters" in proc.stdout, proc.stdout[-2000:]
