"""Whether ``dvc repro`` on this machine is expected to reproduce the committed numbers (``orchestry doctor``).

A machine's **numerics fingerprint** is three SHA-256 prefixes of work the pipeline does with the embedded model
(``docs/reproducibility.md``):

* ``logits``: the fp32 logits of one forward pass over 8 fixed chat prompts (a left-padded batch): the prepare
  stage, the baselines and every evaluation's scoring of a prompt go through these kernels;
* ``tokens``: 16 rows x 48 tokens sampled by :func:`orchestry.llm.local.generate` (T 0.8, top-p 0.95, seed 0):
  every rollout and evaluation sample;
* ``adapters``: the LoRA weights (r 16 on q/k/v/o, seed 0) after two AdamW steps (lr 1e-3) on the prompts'
  next-token loss, in the update dtype ``train_magrpo.bf16_update`` resolves to here: the training step.

Two machines whose lines agree in all three, under the same ``model.numerics`` and update dtype, compute the same
bits in these paths, so the pipeline's outputs are expected to be the same on both. The lines of the machines the
committed outputs were made (or reproduced) on are in :data:`REFERENCE` (``orchestry doctor --record`` appends this
machine's). Matching logits and tokens but not adapters means: prepare, the baselines and the base pair reproduce,
training and what follows it do not.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from orchestry import numerics

#: The fingerprint lines of the machines the committed outputs were made or reproduced on (JSON Lines).
REFERENCE = Path("reports/numerics_fingerprints.jsonl")

#: The fields that must agree (beside the three hashes) for two lines to describe the same numerics.
SETTINGS = ("numerics", "update_dtype", "decode_dtype")

#: The prompts of the fingerprint (fixed; changing them changes every line).
TASKS = [
    "Write a Python function `total(xs)` that returns the sum of the numbers in xs.",
    "Write a Python function `shout(s)` that returns s in uppercase.",
    "Write a Python function `evens(xs)` that keeps only the even numbers of xs.",
    "Write a Python function `vowels(s)` that counts the vowels in s.",
    "Write a Python function `biggest(xs)` that returns the largest number in xs, or 0 if xs is empty.",
    "Write a Python function `words(s)` that splits s into words at the spaces.",
    "Write a Python function `squares(xs)` that squares every number of xs.",
    "Write a Python function `backwards(s)` that returns s reversed.",
]


def _sha(t) -> str:
    return hashlib.sha256(t.detach().contiguous().cpu().numpy().tobytes()).hexdigest()[:12]


def _fixed_batch(model_path: str | Path):
    """``(model, tokenizer, prompts, enc, labels)``: the embedded model in fp32 and the 8 fixed chat prompts as one
    left-padded batch, with next-token labels (padding ignored) — the work both fingerprints share."""
    from orchestry.llm.loading import load_model
    from orchestry.llm.local import chat_prompt

    model, tok = load_model(Path(model_path), dtype="float32")
    prompts = [chat_prompt(tok, t) for t in TASKS]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    return model, tok, prompts, enc, labels


def fingerprint(model_path: str | Path, bf16_update: str | bool = False) -> dict:
    """This machine's numerics fingerprint line (module docstring). Call it after
    :func:`orchestry.numerics.apply_numerics` and before anything else in the process has computed with torch.

    Args:
        model_path: the embedded model's folder (``models/base``, written by the prepare stage).
        bf16_update: ``train_magrpo.bf16_update`` (resolved here by :func:`orchestry.numerics.update_dtype_decision`; the
            training step runs in that dtype).

    Returns:
        ``{"machine", "numerics", "update_dtype", "update_reason", "decode_dtype", "logits", "adapters", "tokens",
        "loss_after", "seconds", "date"}``; ``loss_after`` is the loss of the second step's forward pass.

    Raises:
        FileNotFoundError: no model at ``model_path``.
    """
    import torch

    from orchestry.llm.loading import attach_adapters
    from orchestry.llm.local import generate
    from orchestry.runtime import machine_info

    model_path = Path(model_path)
    if not (model_path / "config.json").exists():
        raise FileNotFoundError(f"no model in {model_path} (run `dvc repro prepare` first)")
    t_start = time.perf_counter()
    model, tok, prompts, enc, labels = _fixed_batch(model_path)
    with torch.no_grad():
        logits = model(**enc).logits.float()
    out = generate(model, tok, prompts * 2, max_new_tokens=48, temperature=0.8, top_p=0.95, seed=0,
                   stop_at_code_end=False)  # fmt: skip

    decision = numerics.update_dtype_decision(bf16_update, "cpu")
    bf16 = decision["update_dtype"] == "bf16"
    peft_model = attach_adapters(model, ["helper"], seed=0)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    for _ in range(2):
        with numerics.bf16_autocast(peft_model, bf16):
            loss = peft_model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    lora = torch.cat([p.detach().flatten() for p in params])
    machine = machine_info()
    return {
        "machine": machine,
        "numerics": machine["numerics"],
        "update_dtype": "bf16" if bf16 else "fp32",
        "update_reason": decision.get("reason", ""),
        "decode_dtype": machine["decode_dtype"],
        "logits": _sha(logits),
        "adapters": _sha(lora),
        "tokens": _sha(out.sequences),
        "loss_after": round(float(loss.detach()), 6),
        "seconds": round(time.perf_counter() - t_start, 1),
        "date": time.strftime("%Y-%m-%d"),
    }


def read_reference(path: str | Path = REFERENCE) -> list[dict]:
    """The committed fingerprint lines (``[]`` when the file does not exist).

    Raises:
        ValueError: a line is not a JSON object with ``logits``, ``adapters`` and ``tokens`` (names the line).
    """
    path = Path(path)
    if not path.exists():
        return []
    lines = []
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        if not isinstance(line, dict) or not all(
            isinstance(line.get(k), str) for k in ("logits", "adapters", "tokens")
        ):
            raise ValueError(f"{path}:{n}: not a fingerprint line (needs logits, adapters and tokens)")
        lines.append(line)
    return lines


def verdict(line: dict, reference: list[dict]) -> tuple[str, dict | None]:
    """How this machine's ``line`` compares with the committed ones.

    Returns:
        ``(kind, closest)``: ``"match"`` (a reference line with the same settings and all three hashes: the
        committed outputs are expected to reproduce here), ``"untrained-match"`` (same settings, logits and tokens,
        other adapters: prepare, baselines and the base pair reproduce, training and what follows do not),
        ``"differs"`` (same settings, other logits or tokens), ``"other-settings"`` (no reference line with this
        line's ``numerics``, update dtype and decode dtype) or ``"no-reference"``; ``closest`` is the reference
        line compared with (``None`` for the last two).
    """
    if not reference:
        return "no-reference", None
    same = [r for r in reference if all(r.get(k) == line.get(k) for k in SETTINGS)]
    if not same:
        return "other-settings", None
    for kind, keys in (
        ("match", ("logits", "tokens", "adapters")),
        ("untrained-match", ("logits", "tokens")),
    ):
        for r in same:
            if all(r[k] == line[k] for k in keys):
                return kind, r
    return "differs", same[0]


def line_text(line: dict) -> str:
    """``logits … / adapters … / tokens …`` of a fingerprint line."""
    return f"logits {line['logits']} / adapters {line['adapters']} / tokens {line['tokens']}"


MEANING = {
    "match": "MATCH: `dvc repro` here is expected to reproduce the committed outputs (reports/key_metrics.json).",
    "untrained-match": (
        "PARTLY: the forward pass and sampling match the committed machine, the training step does not: prepare, "
        "the baselines and the base pair are expected to reproduce; the trained pair and what follows will differ."
    ),
    "differs": "DIFFERS: this machine's kernels give other bits: `dvc repro` here gives other numbers than committed.",
    "other-settings": (
        "NO LINE for these settings (numerics, update dtype, decode dtype): the committed outputs were made with "
        "other settings, so they are not expected to reproduce here."
    ),
    "no-reference": "NO REFERENCE: no committed fingerprint lines to compare with.",
}


def gradient_trace(model_path: str | Path) -> dict:
    """Where two machines' training steps part: hashes of every module's output and output gradient in the first
    step of :func:`fingerprint`'s training (fp32), in the order computed, and of each LoRA parameter's gradient and
    AdamW state after the first update.

    Compare two machines' traces (``benchmarks/numerics_fingerprint.py --trace FILE`` on each): the first entry of
    ``backward`` that differs names the module whose backward gives other bits (the entries before it agree), and
    ``forward`` shows whether the forward with LoRA already differs. Call it after
    :func:`orchestry.numerics.apply_numerics`, in a process of its own.

    Returns:
        ``{"forward": [[module, hash], ...], "backward": [[module, hash], ...], "grads": {param: hash},
        "adam": {param: hash of exp_avg_sq}, "loss": hash}``.
    """
    import torch

    from orchestry.llm.loading import attach_adapters

    model, _, _, enc, labels = _fixed_batch(model_path)
    peft_model = attach_adapters(model, ["helper"], seed=0)
    forward, backward = [], []

    def first(x):
        return x[0] if isinstance(x, tuple) else x

    hooks = []
    for name, module in peft_model.named_modules():
        if not name or name.endswith(("dropout", "lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")):
            continue
        if isinstance(module, torch.nn.ModuleDict | torch.nn.ModuleList):
            continue

        def on_forward(m, args, out, name=name):
            t = first(out)
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                forward.append([name, _sha(t)])

        def on_backward(m, grad_in, grad_out, name=name):
            t = first(grad_out)
            if isinstance(t, torch.Tensor):
                backward.append([name, _sha(t)])

        hooks.append(module.register_forward_hook(on_forward))
        hooks.append(module.register_full_backward_hook(on_backward))
    params = {n: p for n, p in peft_model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(list(params.values()), lr=1e-3, weight_decay=0.0)
    loss = peft_model(**enc, labels=labels).loss
    loss.backward()
    for h in hooks:
        h.remove()
    grads = {n: _sha(p.grad) for n, p in params.items()}
    opt.step()
    adam = {n: _sha(opt.state[p]["exp_avg_sq"]) for n, p in params.items()}
    return {
        "forward": forward,
        "backward": backward,
        "grads": grads,
        "adam": adam,
        "loss": _sha(loss.detach()),
    }


def first_difference(a: dict, b: dict) -> dict:
    """The first entry where two :func:`gradient_trace` results part, per part (``None`` where they agree)."""
    out: dict = {"loss": None if a["loss"] == b["loss"] else [a["loss"], b["loss"]]}
    for part in ("forward", "backward"):
        out[part] = next(
            ([i, x, y] for i, (x, y) in enumerate(zip(a[part], b[part], strict=False)) if x != y),
            None if len(a[part]) == len(b[part]) else ["length", len(a[part]), len(b[part])],
        )
    for part in ("grads", "adam"):
        out[part] = next((k for k in a[part] if a[part][k] != b[part].get(k)), None)
    return out
