"""orchestry.runtime.cpu_threads: OMP_NUM_THREADS wins, else the cores this process may run on."""

import os

import pytest

from orchestry.runtime import cpu_threads


def test_omp_num_threads_is_respected(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads() == 3


@pytest.mark.parametrize("bad", ["", "0", "-2", "two", "1.5"])
def test_unusable_values_fall_back_to_the_allowed_cores(monkeypatch, bad: str) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", bad)
    assert cpu_threads() == len(os.sched_getaffinity(0))


def test_a_cpu_set_is_respected(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = os.sched_getaffinity(0)
    one = {min(before)}
    os.sched_setaffinity(0, one)  # as `taskset -c <cpu>` does
    try:
        assert cpu_threads() == 1
    finally:
        os.sched_setaffinity(0, before)
    assert cpu_threads() == len(before)
