"""Scenario diversity: embeddings and the deduplication that uses them.

Two embedders, chosen with ``--embedder``:

* ``api`` (default for real runs): the OpenAI-compatible embeddings endpoint (``AWM_EMBED_*``).
* ``hashing``: character-trigram feature hashing, normalised. Deterministic, offline and free;
  it measures surface similarity, not meaning, so it catches near-duplicate names and
  descriptions but not paraphrases. The test suite uses it (no network model is needed), and it
  is the fallback when no embeddings endpoint exists.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Protocol

from awm.llm import LLMClient


class Embedder(Protocol):
    async def embed(self, texts: list[str]) -> list[list[float]]: ...


class HashingEmbedder:
    def __init__(self, dim: int = 1024) -> None:
        self.dim = dim

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> list[float]:
        vec = [0.0] * self.dim
        words = re.sub(r"[^a-z0-9 ]", " ", text.lower()).split()
        for word in words:
            padded = f" {word} "
            for i in range(len(padded) - 2):
                h = int.from_bytes(hashlib.blake2b(padded[i:i + 3].encode(), digest_size=4).digest(), "little")
                vec[h % self.dim] += 1.0 if h & 1 << 31 else -1.0
        norm = math.sqrt(sum(v * v for v in vec)) or 1.0
        return [v / norm for v in vec]


class ApiEmbedder:
    def __init__(self, llm: LLMClient, batch: int = 64) -> None:
        self.llm = llm
        self.batch = batch

    async def embed(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch):
            for v in await self.llm.embed(texts[start:start + self.batch], stage="scenario-embed"):
                norm = math.sqrt(sum(x * x for x in v)) or 1.0
                vectors.append([x / norm for x in v])
        return vectors


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))  # inputs are unit vectors


def dedup(candidates: list[dict[str, Any]], vectors: list[list[float]], pool: list[list[float]], threshold: float,
          max_per_category: int, counts: dict[str, int]) -> tuple[list[tuple[dict[str, Any], list[float]]], dict[str, str]]:
    """Accept candidates whose nearest neighbour (in the pool and among those accepted before them)
    is below ``threshold``, and whose category has room. Returns (accepted, {name: reason})."""
    accepted: list[tuple[dict[str, Any], list[float]]] = []
    reasons: dict[str, str] = {}
    counts = dict(counts)
    for cand, vec in zip(candidates, vectors):
        nearest = max((cosine(vec, p) for p in pool + [v for _, v in accepted]), default=0.0)
        category = cand.get("category", "")
        if nearest >= threshold:
            reasons[cand["name"]] = f"too similar to an existing scenario (cosine {nearest:.2f} >= {threshold})"
        elif counts.get(category, 0) >= max_per_category:
            reasons[cand["name"]] = f"category {category!r} is full ({max_per_category})"
        else:
            accepted.append((cand, vec))
            counts[category] = counts.get(category, 0) + 1
    return accepted, reasons
