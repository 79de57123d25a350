"""Smoke test of the MAGRPO trainer under ``accelerate launch`` (data parallel), on CPU, in about a minute.

A tiny random Llama (the embedded model's tokenizer, 2 layers) with one LoRA adapter per agent trains two
steps on HumanEval train problems with the level reward run in the sandbox, plus 0.001 per character of the two
answers (a random model never earns a level point, and equal rewards would mean zero advantages and no update).
Each process takes its own problems; after every update the adapters' gradients are averaged over the
processes (accelerate's ``reduce``), so all processes must end with identical adapters, different from the
initial ones: the script checks both and prints one line.

Usage::

    accelerate launch --num_processes 1 --cpu benchmarks/magrpo_accelerate_smoke.py
    accelerate launch --num_processes 2 --cpu benchmarks/magrpo_accelerate_smoke.py
    accelerate launch --config_file configs/accelerate/cpu_2proc.yaml benchmarks/magrpo_accelerate_smoke.py
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    import dataclasses

    import torch
    from accelerate import PartialState
    from accelerate.utils import gather_object
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orchestry.config import SamplingParams, TrainMagrpoParams
    from orchestry.llm.loading import EMBEDDED_GGUF, attach_adapters, embedded_gguf_dir
    from orchestry.problems import load_problems, split_problems
    from orchestry.rewards.code import level_rewards
    from orchestry.sandbox import Sandbox
    from orchestry.training.magrpo import AGENTS
    from orchestry.training.magrpo.trainer import MAGRPOTrainer

    t0 = time.time()
    state = PartialState(cpu=not torch.cuda.is_available())  # as the trainer does: gloo without GPUs
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(embedded_gguf_dir(), gguf_file=EMBEDDED_GGUF)
    tok.padding_side = "left"
    torch.manual_seed(0)  # the same initial model on every process
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = attach_adapters(LlamaForCausalLM(cfg), AGENTS, r=4, alpha=8, seed=0)
    with torch.no_grad():  # non-zero lora_B so that both lora_A and lora_B get gradients
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(1))
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    problems = split_problems(load_problems(), "magrpo")["train"][:8]
    params = TrainMagrpoParams(
        num_steps=2, problems_per_step=1, num_generations=2, learning_rate=1e-2, advantage="raw"
    )
    sampling = SamplingParams(max_completion_length=8, temperature=1.0, top_p=1.0)
    with (
        Sandbox(timeout_s=3.0, memory_mb=1024, max_workers=1) as sandbox,
        tempfile.TemporaryDirectory() as tmp,
    ):
        ckpt = Path(gather_object([tmp])[0]) / "ckpt"  # the main process's folder (same machine)

        def reward(probs, helpers, mains):
            return [
                dataclasses.replace(r, structure=r.structure + 0.001 * len(h + m))
                for r, h, m in zip(level_rewards(probs, helpers, mains, sandbox), helpers, mains, strict=True)
            ]

        trainer = MAGRPOTrainer(model, tok, problems, sandbox, params, sampling, ckpt, reward_fn=reward)
        history = trainer.train(progress=False)
        state.wait_for_everyone()
    digest = hashlib.sha256()
    for n, p in sorted(model.named_parameters()):
        if "lora_" in n:
            digest.update(p.detach().numpy().tobytes())
    moved = any(not torch.equal(p, initial[n]) for n, p in model.named_parameters() if "lora_" in n)
    # this process's own problems; the history (gathered from every process) lists all of them
    seen = [p.task_id for s in range(len(history)) for p in trainer.problems_for_step(s)]
    listed = [p for h in history for p in h["problems"]]
    rows = [(state.process_index, digest.hexdigest()[:16], seen, moved, listed)]
    everything = gather_object(rows)
    if state.is_main_process:
        hashes = {h for _, h, _, _, _ in everything}
        for rank, h, seen, moved, _ in sorted(everything):
            print(f"process {rank}: adapters {h} ({'trained' if moved else 'UNCHANGED'}), problems {seen}")
        problems_seen = [p for _, _, s, _, _ in everything for p in s]
        trained = all(m for _, _, _, m, _ in everything)
        same_history = all(sorted(listed) == sorted(problems_seen) for *_, listed in everything)
        ok = len(hashes) == 1 and trained and len(problems_seen) == len(set(problems_seen)) and same_history
        print(
            f"{'OK' if ok else 'FAILED'}: {state.num_processes} process(es), "
            f"{'identical' if len(hashes) == 1 else 'DIFFERENT'} adapters after {len(history)} updates, "
            f"{len(problems_seen)} distinct problems, {time.time() - t0:.0f} s"
        )
        if not ok:
            sys.exit(1)


if __name__ == "__main__":
    main()
