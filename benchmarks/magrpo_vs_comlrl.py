"""Benchmark: Orchestry's MAGRPO trainer vs the authors' library (CoMLRL 1.4.3 ``MAGRPOTrainer``), side by side.

One invocation trains both on the same work and prints their speed, memory and reward next to each other:

* the same base model (``models/base``, the embedded SmolLM2-135M-Instruct in fp32 safetensors);
* the same HumanEval training problems (the first ``--problems`` of the MAGRPO train split, HumanEval/33...),
  one epoch, one turn, two agents (helper writes ``aux``, main the entry point), G = 4 joint actions,
  at most 128 new tokens, temperature 0.8, top-p 0.95, no top-k;
* the same plain-text prompts (system line + user message, no chat template: CoMLRL cuts a chat-templated
  prompt at the first pad token, and this model's pad token ends each chat turn; see benchmarks/README.md);
* the same reward: :func:`bench_reward`, ``orchestry.rewards.code.level_rewards`` with the MAGRPO paper's levels
  (structure and syntax paid without a passing assert: ``format_needs_a_pass=False``; the project's default
  gate pays nothing on HumanEval to this model, so no group would hold a learning signal) and without
  truncation flags (CoMLRL does not report them), run in an ``orchestry.sandbox.Sandbox``; given to our trainer
  as its ``reward_fn`` and wrapped for CoMLRL with the keyword-only ``batch_items`` signature it needs;
* the same learning signal: A_g = R_g - mean(R) (CoMLRL's ``advantage_normalization`` off, as in the paper),
  loss -(1/G) sum_g A_g log pi(y_g), averaged over the problems of one optimizer update;
* the same number of problems per optimizer update (``--problems-per-update``; CoMLRL's
  ``rollout_buffer_size``), so both make the same number of optimizer updates.

Each trainer runs in its own subprocess so that its peak resident memory is its own. Differences that are the
point of the comparison: CoMLRL fine-tunes two full fp32 model copies (one AdamW over all weights each),
generates each agent's G samples in its own ``generate`` call, scores joint actions one by one, and recomputes
each completion's log-probs in a separate fp32 forward pass; ours trains one LoRA adapter per agent on one
shared frozen base, generates all samples of an update in one call, stops a sample when its code block
closes, scores all samples in one sandbox batch, and updates in bf16 autocast on completion tokens only.

The machine's roofline is measured here with torch (memory read bandwidth, fp32 and bf16 matmul FLOP/s) and
each trainer's rollout and training throughput is reported as a fraction of it.

Usage::

    python benchmarks/magrpo_vs_comlrl.py            # 8 problems, 4 per update (about 10 minutes)
    python benchmarks/magrpo_vs_comlrl.py --quick    # 2 problems, 2 per update (smoke run)

Needs ``comlrl==1.4.3`` (the ``bench`` extra: ``make bench-magrpo`` installs it). The last printed line is
exactly ``speedup_vs_comlrl: <ratio>`` (CoMLRL's median seconds per problem-step / ours).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestry.numerics import cpu_line

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "base"
G = 4
MAX_NEW_TOKENS = 128
TEMPERATURE = 0.8
TOP_P = 0.95
SEED = 0
LR_COMLRL = 2e-5  # the paper's full fine-tuning learning rate
LR_OURS = 1e-3  # params.yaml train_magrpo.learning_rate (LoRA)
RESULT_TAG = "BENCH_RESULT "
ENV = {
    "WANDB_MODE": "disabled",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}


# ------------------------------------------------------------------------------------------ common set-up
def _setup(threads: int):
    import random

    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    random.seed(SEED)
    return torch


def _problems(n: int):
    from orchestry.problems import load_problems, split_problems

    return split_problems(load_problems(), "magrpo")["train"][:n]


def bench_reward(problems, helpers, mains, sandbox) -> list:
    """The level reward both trainers get (module docstring): paper levels, no truncation flags."""
    from orchestry.rewards.code import RewardConfig, level_rewards

    return level_rewards(problems, helpers, mains, sandbox, config=RewardConfig(format_needs_a_pass=False))


def _plain_tokenizer():
    """Our tokenizer with the chat template removed: ``chat_prompt`` then renders ``system\\n\\nuser\\n``."""
    from orchestry.llm.loading import load_tokenizer

    tok = load_tokenizer(MODEL)
    tok.chat_template = None
    return tok


def _sandbox():
    from orchestry.sandbox import Sandbox

    return Sandbox(timeout_s=1.0, memory_mb=1024)  # params.yaml's sandbox section


class _PositionCounter:
    """Counts the token positions of the training passes (forwards with gradients on): through the model, and
    through the LM head (CoMLRL computes logits at every position, ours at completion positions only)."""

    def __init__(self):
        self.positions = 0
        self.lm_head_positions = 0

    def attach(self, model) -> None:
        model.get_input_embeddings().register_forward_pre_hook(self._count_inputs)
        model.get_output_embeddings().register_forward_pre_hook(self._count_head)

    def _count_inputs(self, module, args):
        import torch

        if torch.is_grad_enabled() and args:
            self.positions += int(args[0].numel())

    def _count_head(self, module, args):
        import torch

        if torch.is_grad_enabled() and args:
            self.lm_head_positions += int(args[0].numel() // args[0].shape[-1])


def _finish(result: dict, t_start: float) -> None:
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result["process_seconds"] = time.perf_counter() - t_start
    print(RESULT_TAG + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------------------ CoMLRL worker
def run_comlrl(n_problems: int, per_update: int, threads: int) -> None:
    t_start = time.perf_counter()
    torch = _setup(threads)
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
    from datasets import Dataset

    from orchestry.llm.local import chat_prompt
    from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, Problem

    problems = _problems(n_problems)
    tok = _plain_tokenizer()
    stats = {"gen_s": 0.0, "gen_tokens": 0, "gen_calls": 0, "gen_rows": 0, "reward_s": 0.0}
    stats |= {"update_s": 0.0, "updates": 0, "problem_s": [], "rewards": []}
    counter = _PositionCounter()
    sandbox = _sandbox()

    def reward(helper_completions, main_completions, *, batch_items=None):
        problem = Problem.from_dict(batch_items[0])
        n = len(helper_completions)
        return [r.total for r in bench_reward([problem] * n, helper_completions, main_completions, sandbox)]

    def helper_prompt(item):
        return chat_prompt(tok, Problem.from_dict(item).helper_prompt(), HELPER_SYSTEM)

    def main_prompt(item):
        return chat_prompt(tok, Problem.from_dict(item).main_prompt(), MAIN_SYSTEM)

    class Timed(MAGRPOTrainer):
        def _generate_completions(self, agent, batch_items, *args, **kwargs):
            t0 = time.perf_counter()
            out = super()._generate_completions(agent, batch_items, *args, **kwargs)
            stats["gen_s"] += time.perf_counter() - t0
            stats["gen_calls"] += 1
            for toks, n in zip(out["completion_input_ids"][0], out["response_lens"], strict=True):
                stats["gen_tokens"] += n + (1 if n < len(toks) else 0)  # + the EOS, as ours counts it
                stats["gen_rows"] += 1
            return out

        def _compute_rewards(self, prompts, completions_list, batch_items=None):
            t0 = time.perf_counter()
            out = super()._compute_rewards(prompts, completions_list, batch_items=batch_items)
            stats["reward_s"] += time.perf_counter() - t0
            stats["rewards"].append(sum(out) / len(out))
            return out

        def _update_from_samples(self, agent_idx, samples):
            t0 = time.perf_counter()
            super()._update_from_samples(agent_idx, samples)
            stats["update_s"] += time.perf_counter() - t0
            bs = int(self.args.train_batch_size or len(samples))
            stats["updates"] += -(-len(samples) // bs)

        def _train_step_returns(self, batch_item, **kwargs):
            t0 = time.perf_counter()
            super()._train_step_returns(batch_item, **kwargs)
            stats["problem_s"].append(time.perf_counter() - t0)

    args = MAGRPOConfig(
        num_train_epochs=1,
        agent_learning_rate=LR_COMLRL,
        logging_steps=1,
        num_agents=2,
        parallel_training="none",
        agent_devices="cpu",
        num_generations=G,
        max_new_tokens=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        top_k=0,
        num_turns=1,
        eval_interval=0,
        eval_num_samples=0,
        rollout_buffer_size=per_update,
        advantage_normalization=False,
        advantage_mode="mean",
    )
    dataset = Dataset.from_list([p.to_dict() for p in problems])
    trainer = Timed(
        agent_model=str(MODEL),
        num_agents=2,
        tokenizer=tok,
        model_config={"dtype": torch.float32},
        train_dataset=dataset,
        reward_func=reward,
        formatters=[helper_prompt, main_prompt],
        args=args,
    )
    trainer.verbose = False
    for agent in trainer.agents:
        counter.attach(agent)
    n_params = sum(p.numel() for p in trainer.agents[0].parameters())
    load_s = time.perf_counter() - t_start
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    sandbox.close()
    ps = stats["problem_s"]
    cycles = [
        sum(ps[i : i + per_update]) / len(ps[i : i + per_update]) for i in range(0, len(ps), per_update)
    ]
    rw = stats["rewards"]
    _finish(
        {
            "name": "CoMLRL 1.4.3",
            "params": n_params,
            "trainable_params": 2 * n_params,
            "load_s": load_s,
            "train_s": train_s,
            "s_per_problem_cycles": cycles,
            "gen_s": stats["gen_s"],
            "gen_tokens": stats["gen_tokens"],
            "gen_calls": stats["gen_calls"],
            "gen_batch": stats["gen_rows"] / max(1, stats["gen_calls"]),
            "reward_s": stats["reward_s"],
            "update_s": stats["update_s"],
            "train_positions": counter.positions,
            "train_head_positions": counter.lm_head_positions,
            "embedding_params": trainer.agents[0].get_output_embeddings().weight.numel(),
            "train_flops_per_position": 6,  # full fine-tuning: forward 2N + backward 4N
            "train_dtype": "fp32",
            "updates_per_agent": stats["updates"] / 2,
            "updates_taken_per_agent": stats["updates"] / 2,
            "reward_per_update": [
                sum(rw[i : i + per_update]) / len(rw[i : i + per_update])
                for i in range(0, len(rw), per_update)
            ],
            "reward_mean": sum(rw) / max(1, len(rw)),
            "load_avg": os.getloadavg()[0],
        },
        t_start,
    )


# ------------------------------------------------------------------------------------------ our worker
def run_ours(n_problems: int, per_update: int, threads: int, decode_dtype: str = "float32") -> None:
    t_start = time.perf_counter()
    _setup(threads)
    from orchestry.config import SamplingParams, TrainMagrpoParams
    from orchestry.llm.decoding import use_products

    decode_bf16 = use_products("onednn", decode_dtype)  # model.decode_dtype
    from orchestry.llm.loading import attach_adapters, load_model
    from orchestry.numerics import cpu_bf16_supported
    from orchestry.training.magrpo import AGENTS
    from orchestry.training.magrpo.trainer import MAGRPOTrainer

    problems = _problems(n_problems)
    model, _ = load_model(MODEL)
    tok = _plain_tokenizer()
    n_params = sum(p.numel() for p in model.parameters())
    model = attach_adapters(model, AGENTS, r=16, alpha=32, seed=SEED)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    counter = _PositionCounter()
    counter.attach(model)
    cfg = TrainMagrpoParams(
        num_steps=max(1, n_problems // per_update),
        problems_per_step=per_update,
        num_generations=G,
        learning_rate=LR_OURS,
        checkpoint_every=10**6,
        seed=SEED,
        warm_start_epochs=0,  # CoMLRL has none (HumanEval problems name no decomposition: auto is 0 anyway)
    )
    sampling = SamplingParams(max_completion_length=MAX_NEW_TOKENS, temperature=TEMPERATURE, top_p=TOP_P)
    load_s = time.perf_counter() - t_start
    with _sandbox() as sb, tempfile.TemporaryDirectory() as tmp:
        trainer = MAGRPOTrainer(
            model, tok, problems, sb, cfg, sampling, Path(tmp) / "ckpt",
            reward_fn=lambda p, h, m: bench_reward(p, h, m, sb),
        )  # fmt: skip
        t0 = time.perf_counter()
        hist = trainer.train(progress=False)
        train_s = time.perf_counter() - t0
    taken = [sum(f"rows_updated/{a}" in h for h in hist) for a in AGENTS]
    _finish(
        {
            "name": "Orchestry",
            "params": n_params,
            "trainable_params": trainable,
            "load_s": load_s,
            "train_s": train_s,
            "s_per_problem_cycles": [h["seconds"] / len(h["problems"]) for h in hist],
            "gen_s": sum(h["seconds/generate"] for h in hist),
            "gen_tokens": sum(h["tokens/completion"] for h in hist),
            "gen_calls": len(hist),
            "gen_batch": 2 * G * per_update,
            "reward_s": sum(h["seconds/reward"] for h in hist),
            "update_s": sum(h["seconds/update"] for h in hist),
            "train_positions": counter.positions,
            "train_head_positions": counter.lm_head_positions,
            "embedding_params": model.get_output_embeddings().weight.numel(),
            "train_flops_per_position": 4,  # LoRA: forward 2N + activation gradients 2N (no base weight grads)
            "train_dtype": "bf16" if cfg.bf16_update and cpu_bf16_supported() else "fp32",
            "decode_dtype": "bf16" if decode_bf16 else "fp32",
            "updates_per_agent": len(hist),
            "updates_taken_per_agent": sum(taken) / len(taken),
            "reward_per_update": [h["reward"] for h in hist],
            "reward_mean": sum(h["reward"] for h in hist) / len(hist),
            "load_avg": os.getloadavg()[0],
        },
        t_start,
    )


# ------------------------------------------------------------------------------------------ roofline
def measure_roofline(threads: int) -> dict:
    """Memory read bandwidth and matmul FLOP/s of this machine, measured with torch (best of a few runs)."""
    import torch

    torch.set_num_threads(threads)

    def best(fn, reps):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    x = torch.ones(64 << 20, dtype=torch.float32)  # 256 MiB, far larger than the caches
    bw = x.numel() * 4 / best(lambda x=x: x.sum(), 5)
    del x
    out = {"bandwidth": bw}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        n = 512
        a = torch.randn(n, n).to(dt)
        t0 = time.perf_counter()
        _ = a @ a
        if time.perf_counter() - t0 < 0.05:  # fast: measure on a larger matrix (an emulated bf16 is not)
            n = 2048
            a = torch.randn(n, n).to(dt)
        out[f"flops_{name}"] = 2 * n**3 / best(lambda a=a: a @ a, 5 if n == 2048 else 2)
    return out


def rollout_roofline(roof: dict, params: int, batch: float) -> float:
    """Decoding tokens/s bound at ``batch`` rows: fp32 weights read once per step, or fp32 matmul FLOP/s."""
    steps_per_s = roof["bandwidth"] / (4 * params)
    return min(batch * steps_per_s, roof["flops_fp32"] / (2 * params))


# ------------------------------------------------------------------------------------------ driver
def _run_worker(which: str, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", which]
    cmd += ["--problems", str(args.problems), "--problems-per-update", str(args.problems_per_update)]
    cmd += ["--threads", str(args.threads), "--decode-dtype", args.decode_dtype]
    print(f"running {which} (load average {os.getloadavg()[0]:.2f}) ...", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **ENV}, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"{which} worker failed (exit {proc.returncode})")
    res = json.loads(lines[-1][len(RESULT_TAG) :])
    res["wall_s"] = wall
    return res


def _fmt_table(rows: list[tuple[str, str, str, str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    )


def report(c: dict, o: dict, roof: dict, args) -> float:
    def med(r):
        return statistics.median(r["s_per_problem_cycles"])

    def gen_tps(r):
        return r["gen_tokens"] / r["gen_s"]

    def train_tps(r):
        return r["train_positions"] / r["update_s"] if r["update_s"] else 0.0

    def train_flops(r):  # k x (non-embedding params per position + LM head per position that has logits)
        k, emb = r["train_flops_per_position"], r["embedding_params"]
        return k * ((r["params"] - emb) * r["train_positions"] + emb * r["train_head_positions"])

    def train_roof(r):  # positions/s at the peak matmul rate, with this trainer's FLOPs per position
        peak = roof["flops_bf16"] if r["train_dtype"] == "bf16" else roof["flops_fp32"]
        return peak * r["train_positions"] / train_flops(r) if r["train_positions"] else 0.0

    gib = 1 << 30
    rows = [("", c["name"], o["name"], "ratio")]

    def add(label, cv, ov, fmt, ratio=None):
        rows.append((label, fmt.format(cv), fmt.format(ov), "" if ratio is None else f"{ratio:.2f}x"))

    add("seconds per problem-step (median)", med(c), med(o), "{:.1f}", med(c) / med(o))
    add("  generate s (all problems)", c["gen_s"], o["gen_s"], "{:.1f}", c["gen_s"] / o["gen_s"])
    add(
        "  reward s (all problems)",
        c["reward_s"],
        o["reward_s"],
        "{:.1f}",
        c["reward_s"] / max(o["reward_s"], 1e-9),
    )
    add(
        "  update s (all problems)",
        c["update_s"],
        o["update_s"],
        "{:.1f}",
        c["update_s"] / max(o["update_s"], 1e-9),
    )
    add("training loop s", c["train_s"], o["train_s"], "{:.1f}", c["train_s"] / o["train_s"])
    add("total wall s (process)", c["wall_s"], o["wall_s"], "{:.1f}", c["wall_s"] / o["wall_s"])
    add("peak resident memory GiB", c["peak_rss_bytes"] / gib, o["peak_rss_bytes"] / gib, "{:.2f}",
        c["peak_rss_bytes"] / o["peak_rss_bytes"])  # fmt: skip
    add("trainable parameters (M)", c["trainable_params"] / 1e6, o["trainable_params"] / 1e6, "{:.1f}")
    add("generate calls", c["gen_calls"], o["gen_calls"], "{:d}")
    add("rows per generate call", c["gen_batch"], o["gen_batch"], "{:.0f}")
    add("generated tokens", c["gen_tokens"], o["gen_tokens"], "{:d}")
    add("generated tokens/s", gen_tps(c), gen_tps(o), "{:.1f}", gen_tps(o) / gen_tps(c))
    rr_c, rr_o = (
        rollout_roofline(roof, c["params"], c["gen_batch"]),
        rollout_roofline(roof, o["params"], o["gen_batch"]),
    )
    best_rr = rollout_roofline(roof, o["params"], 1e9)
    add("  rollout roofline tok/s at its batch", rr_c, rr_o, "{:.0f}")
    add("  rollout / roofline at its batch", gen_tps(c) / rr_c, gen_tps(o) / rr_o, "{:.1%}")
    add("  rollout / model's fp32 roofline", gen_tps(c) / best_rr, gen_tps(o) / best_rr, "{:.1%}")
    add(
        "training tokens/s (positions fwd+bwd)",
        train_tps(c),
        train_tps(o),
        "{:.1f}",
        train_tps(o) / max(train_tps(c), 1e-9),
    )
    add("  training roofline tok/s", train_roof(c), train_roof(o), "{:.0f}")

    # 0 when a trainer made no training pass (every group's rewards equal: nothing to learn)
    def train_share(r):
        return train_tps(r) / train_roof(r) if train_roof(r) else 0.0

    add("  training / roofline", train_share(c), train_share(o), "{:.1%}")
    add(
        "training GFLOP (model work)",
        train_flops(c) / 1e9,
        train_flops(o) / 1e9,
        "{:.0f}",
        train_flops(c) / train_flops(o) if train_flops(o) else None,
    )
    add("optimizer updates per agent", c["updates_per_agent"], o["updates_per_agent"], "{:.0f}")
    add(
        "  of which with a non-zero gradient",
        c["updates_taken_per_agent"],
        o["updates_taken_per_agent"],
        "{:.0f}",
    )
    add("mean reward per step (max 4.0)", c["reward_mean"], o["reward_mean"], "{:.3f}")
    add("load average at end", c["load_avg"], o["load_avg"], "{:.2f}")
    print()
    print(
        f"MAGRPO side by side: {args.problems} HumanEval train problems, 2 agents, G={G}, <= {MAX_NEW_TOKENS} new "
        f"tokens, 1 turn, 1 epoch, {args.problems_per_update} problem(s) per optimizer update, {args.threads} threads"
    )
    print(f"cpu: {cpu_line()}")
    print(
        f"machine (torch): memory read {roof['bandwidth'] / 1e9:.1f} GB/s, matmul fp32 "
        f"{roof['flops_fp32'] / 1e9:.0f} GFLOP/s, bf16 {roof['flops_bf16'] / 1e9:.1f} GFLOP/s; model "
        f"{o['params'] / 1e6:.1f}M parameters"
    )
    print(_fmt_table(rows))
    print("reward per update  CoMLRL:", " ".join(f"{r:.3f}" for r in c["reward_per_update"]))
    print("reward per update  ours:  ", " ".join(f"{r:.3f}" for r in o["reward_per_update"]))
    print(
        "notes: ratio = CoMLRL / ours for times and memory, ours / CoMLRL for throughput. Training positions are"
        " the tokens fed to training forwards (ours: each prompt once per micro-batch, completions unpadded)."
        f" Training roofline: 6 FLOPs per parameter per position for full fine-tuning ({c['train_dtype']},"
        f" CoMLRL), 4 for LoRA ({o['train_dtype']}, ours: no base-weight gradients), the LM head counted only"
        " where logits are computed. Rollout roofline: fp32 weights read once per decoding step, or fp32 matmul"
        f" FLOP/s, whichever binds. Our rollouts decode with {o.get('decode_dtype', 'fp32')} projection operands"
        " (model.decode_dtype; the LM head in fp32), CoMLRL's in fp32."
    )
    return med(c) / med(o)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 problems, 2 per update (smoke run)")
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--problems-per-update", type=int, default=4)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--worker", choices=["comlrl", "ours"], help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="also write both results and the roofline to this file")
    ap.add_argument(
        "--decode-dtype",
        choices=["float32", "bfloat16", "auto"],
        default="float32",
        help="our rollouts' projection operands (model.decode_dtype; default float32, the project's default)",
    )
    args = ap.parse_args()
    if args.quick:
        args.problems, args.problems_per_update = 2, 2
    args.problems_per_update = min(args.problems_per_update, args.problems)
    if args.problems % args.problems_per_update:
        ap.error("--problems must be a multiple of --problems-per-update (one epoch, full updates)")
    if args.worker == "comlrl":
        return run_comlrl(args.problems, args.problems_per_update, args.threads)
    if args.worker == "ours":
        return run_ours(args.problems, args.problems_per_update, args.threads, args.decode_dtype)

    import importlib.util

    if importlib.util.find_spec("comlrl") is None:
        raise SystemExit(
            "comlrl is not installed: `pip install -c constraints.txt 'comlrl==1.4.3'` (or `make bench-magrpo`)"
        )
    if not (MODEL / "config.json").exists():
        raise SystemExit(f"no model at {MODEL}: run `dvc repro prepare` first")
    os.environ.update(ENV)
    roof = measure_roofline(args.threads)
    comlrl = _run_worker("comlrl", args)
    ours = _run_worker("ours", args)
    if args.json:  # before the report, so a report error loses no measurement
        args.json.write_text(json.dumps({"roofline": roof, "comlrl": comlrl, "ours": ours}, indent=2))
    speedup = report(comlrl, ours, roof, args)
    print(f"speedup_vs_comlrl: {speedup:.2f}")


if __name__ == "__main__":
    main()
