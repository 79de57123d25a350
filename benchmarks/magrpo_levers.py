"""The speed levers of our MAGRPO trainer, measured one at a time (before -> after) on the embedded model.

Each variant runs in its own subprocess (so that its peak resident memory is its own) on the same work as one
optimizer update of ``benchmarks/magrpo_vs_comlrl.py``: 4 HumanEval train problems x 2 agents x G = 4 samples,
at most 128 new tokens, the same plain prompts. "after" is the trainer as shipped; "before" removes one lever.

Generation levers use the real model's samples (seeded, so before and after sample the same way). Update levers
use a fixed synthetic rollout with the same shape (prompts of 220 tokens, completions of 40-128 tokens, a
non-zero advantage on every row), so that each variant trains on exactly the same tokens.

Usage::

    python benchmarks/magrpo_levers.py                 # all levers (about 15 minutes on 2 cores)
    python benchmarks/magrpo_levers.py --lever bf16    # one lever
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "base"
N_PROBLEMS, G, MAX_NEW_TOKENS = 4, 4, 128
TAG = "LEVER_RESULT "

# lever -> (description, before variant, after variant)
LEVERS = {
    "one_generate": ("one generate call for all agents' and problems' samples", "gen_per_agent", "gen"),
    "stop_at_code_end": ("stop a sample when its code block closes", "gen_no_stop", "gen"),
    "prefill_once": (
        "prefill each distinct prompt once, share its KV cache (generation)",
        "gen_no_prefix",
        "gen",
    ),
    "nucleus_sampler": (
        "nucleus sampling among the top-1024 tokens (vs transformers' full-vocabulary sort and draw)",
        "gen_hf_sampling",
        "gen",
    ),
    "drop_finished_rows": (
        "decode in rounds of 16 tokens, finished rows leave the batch",
        "gen_one_round",
        "gen",
    ),
    "lora": (
        "one frozen base + a LoRA adapter per agent (vs a full copy per agent); both one batch",
        "upd_full_copies",
        "upd_one_batch",
    ),
    "logits_to_keep": (
        "LM head on completion positions only (vs all positions)",
        "upd_padded_all_logits",
        "upd_padded",
    ),
    "packing": ("prompt once per group, completions packed without padding", "upd_padded", "upd"),
    "bf16": ("bf16 autocast in the update, only where the CPU supports it", "upd_bf16_forced", "upd"),
    "micro_batch": ("micro-batches sized to memory (vs all rows at once)", "upd_one_batch", "upd"),
    "reward_overlap": ("reward execution overlapped with generation", "gen_then_reward", "gen_with_reward"),
}


# ------------------------------------------------------------------------------------------ worker side
def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRSS:
    """Peak resident memory above the level at entry, sampled every 2 ms."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop = True
        self._t.join()
        self.peak = max(self.peak, _rss())


def _setup():
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    from orchestry.llm.loading import attach_adapters, load_model, load_tokenizer
    from orchestry.llm.local import chat_prompt
    from orchestry.problems import HELPER_SYSTEM, MAIN_SYSTEM, load_problems, split_problems
    from orchestry.training.magrpo import AGENTS

    base, _ = load_model(MODEL)
    tok = load_tokenizer(MODEL)
    tok.chat_template = None  # plain prompts, as in the side-by-side benchmark
    problems = split_problems(load_problems(), "magrpo")["train"][:N_PROBLEMS]
    prompts, adapters = [], []
    for p in problems:
        for agent, text in zip(
            AGENTS,
            (
                chat_prompt(tok, p.helper_prompt(), HELPER_SYSTEM),
                chat_prompt(tok, p.main_prompt(), MAIN_SYSTEM),
            ),
            strict=True,
        ):
            prompts += [text] * G
            adapters += [agent] * G
    return base, tok, problems, prompts, adapters, attach_adapters


def _gen_variant(variant: str) -> dict:
    import orchestry.llm.local as L
    from orchestry.rewards.code import level_rewards
    from orchestry.sandbox import Sandbox

    base, tok, problems, prompts, adapters, attach = _setup()
    model = attach(base, ("helper", "main"), seed=0)
    kw = dict(max_new_tokens=MAX_NEW_TOKENS, temperature=0.8, top_p=0.95, seed=1)
    out: dict = {}
    sandbox = Sandbox(timeout_s=3.0, memory_mb=1024)

    def rewards_of(batch):
        probs, helpers, mains = [], [], []
        for n, p in enumerate(problems):
            for g in range(G):
                probs.append(p)
                helpers.append(batch.items[(n * 2) * G + g].text)
                mains.append(batch.items[(n * 2 + 1) * G + g].text)
        return level_rewards(probs, helpers, mains, sandbox)

    with _PeakRSS() as peak:
        t0 = time.perf_counter()
        if variant == "gen_per_agent":  # CoMLRL's call structure: one call per problem and agent, G rows each
            tokens = 0
            for i in range(0, len(prompts), G):
                model.set_adapter(adapters[i])
                b = L.generate(model, tok, prompts[i : i + G], None, **kw)
                tokens += sum(it.completion_tokens for it in b.items)
            out["tokens"] = tokens
        elif variant in ("gen", "gen_no_stop", "gen_no_prefix", "gen_one_round", "gen_hf_sampling"):
            # transformers' own temperature/top-p sampling in place of NucleusSampler (generate's kwargs as they
            # were with the former FAST_NUCLEUS switch off)
            if variant == "gen_hf_sampling":
                rounds = L._generate_in_rounds

                def hf_sampling(model, enc, kwargs, *args):
                    del kwargs["logits_processor"]
                    kwargs.update(do_sample=True, temperature=kw["temperature"], top_p=kw["top_p"], top_k=0)
                    return rounds(model, enc, kwargs, *args)

                L._generate_in_rounds = hf_sampling
            if variant == "gen_no_prefix":
                L.prompt_groups = lambda *a, **k: None
            if variant == "gen_one_round":
                L.ROUND_TOKENS = 10**6
            b = L.generate(model, tok, prompts, adapters, stop_at_code_end=variant != "gen_no_stop", **kw)
            out["tokens"] = sum(it.completion_tokens for it in b.items)
        elif variant in ("gen_then_reward", "gen_with_reward"):
            prev = L.generate(model, tok, prompts, adapters, **{**kw, "seed": 2})  # a batch to score
            rewards_of(prev)  # warm the sandbox workers
            t0 = time.perf_counter()
            if variant == "gen_then_reward":
                b = L.generate(model, tok, prompts, adapters, **kw)
                t1 = time.perf_counter()
                rewards_of(prev)
                out["reward_s"] = time.perf_counter() - t1
            else:  # score `prev` in a thread while generating: the best case of overlapping the two
                th = threading.Thread(target=rewards_of, args=(prev,))
                th.start()
                b = L.generate(model, tok, prompts, adapters, **kw)
                th.join()
            out["tokens"] = sum(it.completion_tokens for it in b.items)
        out["seconds"] = time.perf_counter() - t0
    sandbox.close()
    out["peak_extra_mib"] = (peak.peak - peak.base) / 2**20
    out["tokens_per_s"] = out["tokens"] / out["seconds"]
    return out


def _synthetic_rollout(vocab: int, problems):
    """2 agents x N problems x G rows: one 220-token prompt per (problem, agent), completions of 40-128 tokens."""
    import torch

    from orchestry.llm.local import Generation, GenerationBatch
    from orchestry.rewards.code import LevelReward
    from orchestry.training.magrpo import Rollout

    g = torch.Generator().manual_seed(0)
    P, T = 220, MAX_NEW_TOKENS
    rows = []
    for _ in range(N_PROBLEMS * 2):
        prompt = torch.randint(100, vocab, (P,), generator=g)
        rows += [torch.cat([prompt, torch.randint(100, vocab, (T,), generator=g)]) for _ in range(G)]
    seqs = torch.stack(rows)
    mask = torch.ones_like(seqs)
    lengths = torch.randint(40, T + 1, (len(rows),), generator=g)
    for i, n in enumerate(lengths.tolist()):
        mask[i, P + n :] = 0
    items = [Generation("", P, int(n), i) for i, n in enumerate(lengths.tolist())]
    rewards = torch.tensor([[0.0, 1.0, 0.5, 2.0]] * N_PROBLEMS)  # every row has a non-zero advantage
    details = [LevelReward().to_dict() for _ in range(N_PROBLEMS * G)]
    return Rollout(list(problems), GenerationBatch(seqs, mask, P, items, 0.0), rewards, details, G)


def _upd_variant(variant: str) -> dict:
    import torch

    import orchestry.llm.logprobs as LP
    import orchestry.numerics as N
    from orchestry.algorithms.magrpo import group_advantages, policy_loss
    from orchestry.config import SamplingParams, TrainMagrpoParams
    from orchestry.training.magrpo import AGENTS
    from orchestry.training.magrpo.trainer import MAGRPOTrainer

    base, tok, problems, _, _, attach = _setup()
    ro = _synthetic_rollout(len(tok), problems)
    cfg = TrainMagrpoParams(num_generations=G, problems_per_step=N_PROBLEMS)
    out: dict = {"train_tokens": int(ro.batch.attention_mask.sum())}
    if variant == "upd_full_copies":  # CoMLRL's layout: a full fp32 copy per agent, AdamW over all weights
        models = {a: copy.deepcopy(base) for a in AGENTS}
        del base
        adv = group_advantages(ro.rewards)
        with _PeakRSS() as peak:
            t0 = time.perf_counter()
            for a_idx, agent in enumerate(AGENTS):
                m = models[agent]
                m.train()
                opt = torch.optim.AdamW(m.parameters(), lr=cfg.learning_rate)
                rows = ro.rows(a_idx)
                seq_lp, _, _ = LP.completion_logprobs(
                    m, ro.batch.sequences[rows], ro.batch.attention_mask[rows], ro.batch.prompt_width
                )
                policy_loss(seq_lp.view_as(adv), adv).backward()
                opt.step()
                opt.zero_grad(set_to_none=False)  # keeps grads allocated, as across CoMLRL's updates
            out["seconds"] = time.perf_counter() - t0
        out["peak_extra_mib"] = (peak.peak - peak.base) / 2**20 + sum(
            p.numel() * 4 for p in models["main"].parameters()
        ) / 2**20  # + the second copy, made before the measurement started
        out["trainable_params"] = sum(p.numel() for p in models["main"].parameters()) * 2
        return out
    model = attach(base, AGENTS, seed=0)
    trainer = MAGRPOTrainer(model, tok, problems, None, cfg, SamplingParams(), "/nonexistent")
    if variant == "upd_one_batch":
        trainer.micro_batch_tokens_limit = 10**9
    if variant == "upd_bf16_forced":
        N.cpu_bf16_supported = lambda: True  # force autocast even where bf16 is emulated
        out["cpu_bf16_supported"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    if variant in ("upd_padded", "upd_padded_all_logits"):
        keep_all = variant == "upd_padded"

        def padded(model, sequences, attention_mask, prompt_width):  # one left-padded row per sequence
            T = sequences.shape[1] - prompt_width
            o = model(
                input_ids=sequences,
                attention_mask=attention_mask,
                position_ids=(attention_mask.cumsum(dim=1) - 1).clamp(min=0),
                logits_to_keep=T + 1 if keep_all else 0,
                use_cache=False,
            )
            logits = o.logits[:, -T - 1 : -1, :].float()
            logp = torch.log_softmax(logits, -1).gather(-1, sequences[:, prompt_width:, None]).squeeze(-1)
            mask = attention_mask[:, prompt_width:].to(logp.dtype)
            return (logp * mask).sum(1), logp * mask, mask

        import orchestry.training.magrpo.trainer as tm

        tm.completion_logprobs = padded
    with _PeakRSS() as peak:
        t0 = time.perf_counter()
        trainer.update(ro)
        out["seconds"] = time.perf_counter() - t0
    out["peak_extra_mib"] = (peak.peak - peak.base) / 2**20
    out["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out["micro_batches"] = len(trainer._micro_batches(ro, ro.rows(0), list(range(N_PROBLEMS * G))))
    return out


def worker(variant: str) -> None:
    res = _gen_variant(variant) if variant.startswith("gen") else _upd_variant(variant)
    res["ru_maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["load_avg"] = os.getloadavg()[0]
    print(TAG + json.dumps(res), flush=True)


# ------------------------------------------------------------------------------------------ driver
def run_variant(variant: str, cache: dict) -> dict:
    if variant not in cache:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", variant], cwd=ROOT, env=env, capture_output=True, text=True
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(TAG)]
        if proc.returncode or not lines:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"variant {variant} failed")
        cache[variant] = json.loads(lines[-1][len(TAG) :])
    return cache[variant]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lever", action="append", choices=sorted(LEVERS), help="only these levers (repeatable)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    cache: dict = {}
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} threads", flush=True)
    print(
        f"{'lever':18s} {'before':>10s} {'after':>10s} {'gain':>7s}   {'memory before -> after':>24s}  what"
    )
    for name in args.lever or LEVERS:
        what, before, after = LEVERS[name]
        b, a = run_variant(before, cache), run_variant(after, cache)
        extra = ""
        if "tokens" in a:
            extra = f" ({b['tokens_per_s']:.1f} -> {a['tokens_per_s']:.1f} tok/s; {b['tokens']} / {a['tokens']} tokens)"
        if "reward_s" in b:
            extra += f" (reward alone {b['reward_s']:.1f} s)"
        mem = f"{b['peak_extra_mib']:.0f} -> {a['peak_extra_mib']:.0f} MiB"
        print(
            f"{name:18s} {b['seconds']:9.1f}s {a['seconds']:9.1f}s {b['seconds'] / a['seconds']:6.2f}x   {mem:>24s}  "
            f"{what}{extra}",
            flush=True,
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(cache, indent=2))


if __name__ == "__main__":
    main()
