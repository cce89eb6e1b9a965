"""A transformers causal LM as an in-process policy (CPU demo, tests).

It renders the history with the tokenizer's chat template (:func:`~awm.trainer.chatformat.chat_format`;
hand-written ChatML for a tokenizer without one), samples a completion token by
token with a KV cache, and returns the prompt ids, completion ids and the log-probability of
every sampled token under the sampling distribution (temperature, allowed tokens). The learner
computes log-probabilities the same way (:class:`SamplingSpec`), so the importance ratio starts
at 1 for fresh samples - exactly in float32 or when the model is shared; a bfloat16 copy
(asynchronous runs on a GPU) rounds its weights and activations differently from the learner's
float32 weights under autocast, so its ratios start near 1, as with a vLLM sampler.

It holds a *copy* of the learner's weights: the learner pushes new weights with
:meth:`LocalPolicy.load_weights` after each optimiser step and the version goes up. That is the
production shape too (vLLM + weight sync), only in one process. A synchronous run, which never
generates while the learner steps, shares the learner's model instead (``share=True``): one copy
of the weights in memory, and a weight sync that only bumps the version.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from dataclasses import dataclass
from typing import Any

import torch

from awm.trainer.chatformat import chat_format
from awm.trainer.precision import autocast, cast_weights
from awm.trainer.policy import PolicyReply


@dataclass
class SamplingSpec:
    temperature: float = 1.0
    max_new_tokens: int = 256
    allowed_token_ids: list[int] | None = None  # restrict generation (the tiny demo's action space)

    def logits_to_logprobs(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of the sampling distribution; the learner must use exactly this."""
        logits = logits.float() / max(self.temperature, 1e-5)
        if self.allowed_token_ids is not None:
            mask = torch.full((logits.shape[-1],), float("-inf"), device=logits.device)
            mask[torch.tensor(self.allowed_token_ids, device=logits.device)] = 0.0
            logits = logits + mask
        return torch.log_softmax(logits, dim=-1)


class LocalPolicy:
    def __init__(self, model: Any, tokenizer: Any, sampling: SamplingSpec, name: str = "local",
                 seed: int = 0, version: int = 0, share: bool = False,
                 dtype: torch.dtype = torch.float32, thinking: bool | None = None) -> None:
        self.shared = share
        if share:
            self.model = model
        else:  # a sampler never takes an update: its copy can live in the compute dtype
            self.model = cast_weights(copy.deepcopy(model), dtype).eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.device = next(self.model.parameters()).device
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.format = chat_format(tokenizer, thinking)
        self.sampling = sampling
        self.name = name
        self.version = version
        self.eos_id = tokenizer.eos_token_id
        self._lock = threading.Lock()
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PolicyReply:
        prompt = self.format.encode_prompt(messages, tools)
        return await asyncio.to_thread(self._reply, prompt)

    def _reply(self, prompt: list[int]) -> PolicyReply:
        with self._lock:
            version = self.version
            ids, logprobs = self.generate(prompt)
        text_ids = ids[:-1] if ids and ids[-1] == self.eos_id else ids
        content = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        finish = "stop" if ids and ids[-1] == self.eos_id else "length"
        return PolicyReply(content, None, finish, len(prompt), len(ids), list(prompt), ids, logprobs, version)

    @torch.no_grad()
    def generate(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        """Sample until end-of-turn or ``max_new_tokens``; returns ids and their log-probabilities
        (a shared float32 model samples under the same autocast as the learner's forward)."""

        with autocast(self.device, self.dtype):
            return self._sample(prompt)

    def _sample(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        past = None
        inputs = torch.tensor([prompt], dtype=torch.long, device=self.device)
        ids: list[int] = []
        logprobs: list[float] = []
        for _ in range(self.sampling.max_new_tokens):
            out = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            dist = self.sampling.logits_to_logprobs(out.logits[0, -1])
            token = int(torch.multinomial(dist.exp(), 1, generator=self._generator))
            ids.append(token)
            logprobs.append(float(dist[token]))
            if token == self.eos_id:
                break
            inputs = torch.tensor([[token]], dtype=torch.long, device=self.device)
        return ids, logprobs

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Weight sync from the learner (between generations, never during one)."""
        with self._lock:
            if not self.shared:
                self.model.load_state_dict(state_dict)
            self.version = version

    async def publish(self, learner: Any) -> None:
        """Weight sync after the learner's step (the same call as :class:`VllmPolicy`'s)."""
        await asyncio.to_thread(self.load_weights, learner.weights(), learner.version)

    def rng_state(self) -> torch.Tensor:
        """The sampler's generator (for a checkpoint: a resumed run samples on where it stopped)."""
        with self._lock:
            return self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        if state is not None:
            with self._lock:
                try:
                    self._generator.set_state(state)
                except (RuntimeError, ValueError):  # a GPU checkpoint resumed on the CPU, or back
                    pass  # sampling goes on from this run's seed instead

    async def close(self) -> None:
        return None
