"""The policy served by a vLLM server (``policy.kind: vllm``), with weight sync from the learner.

Generation: any number of episodes call :meth:`VllmPolicy.chat` at once - no lock; the server's
continuous batching does the batching. Every request asks for the prompt's and the completion's
token ids and the log-probability of each sampled token (``return_token_ids``, ``logprobs``), so
the learner trains on exactly the tokens the server sampled, under exactly the prompt it
rendered (its chat template, its tool block, thinking on or off), with no re-tokenisation.

Weight sync after each optimiser step (:meth:`VllmPolicy.publish`), two ways:

* ``lora``: the learner trains a peft LoRA; each version is written to ``sync_dir/vNNNNNN`` and
  loaded into the running server under its own name (``POST /v1/load_lora_adapter``,
  ``<model>-<run>-v<N>``). New requests name the newest adapter; requests already running finish on
  theirs, and an adapter is unloaded once nothing uses it. The version of a reply is read from
  the model name the server answered with, so staleness is exact without pausing generation.
* ``full``: the learner's whole model is written (safetensors) and the server reloads it in
  place (``POST /collective_rpc`` ``reload_weights``, vLLM's development endpoint), then its
  prefix cache is dropped (``/reset_prefix_cache``: KV blocks of the old weights would be reused
  for a prompt seen before). One name serves every version, so new requests wait while the
  running ones drain, then the reload happens and the version goes up: no reply mixes two
  versions. (A LoRA's cached blocks are keyed by the adapter, so the LoRA path needs no reset.)

The directory must be readable by the server at the same path: the same machine, or a volume
both containers of a pod mount (docs/training.md).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from awm.trainer.policy import OpenAIPolicy, PolicyReply, PolicyUnavailable, with_thinking

SYNC_MODES = ("lora", "full")


@dataclass
class VllmPolicy(OpenAIPolicy):
    sync_dir: str = "weights"
    weight_sync: str = "lora"  # lora | full
    thinking: bool | None = None  # chat_template_kwargs.enable_thinking (None: the template's default)
    keep_versions: int = 2  # adapter/weight directories kept on disk (the newest, and any still served)
    format: Any = None  # the learner's chat format (re-tokenisation fallback only)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weight_sync not in SYNC_MODES:
            raise ValueError(f"weight_sync must be lora or full, not {self.weight_sync!r}")
        self.root_url = self.base_url.removesuffix("/v1")
        self.base_model = self.model
        self.extra_body = with_thinking({"return_token_ids": True, "logprobs": True, "skip_special_tokens": True,
                                         **self.extra_body}, self.thinking)
        self._names = {self.base_model: self.version}  # served name -> version
        self._inflight: dict[str, int] = {}
        self._drained = asyncio.Event()
        self._drained.set()
        self._open = asyncio.Event()  # cleared while full weights are reloaded
        self._open.set()
        self._unloading: set[asyncio.Task[None]] = set()
        self.sync_seconds: list[float] = []
        self._run = uuid.uuid4().hex[:8]  # adapter names never collide with another run's on a shared server

    @property
    def name(self) -> str:
        return self.base_model

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> PolicyReply:
        await self._open.wait()
        served = self.model
        version = self._names[served]
        self._inflight[served] = self._inflight.get(served, 0) + 1
        self._drained.clear()
        try:
            reply = await super().chat(messages, tools)
        finally:
            self._inflight[served] -= 1
            if not any(self._inflight.values()):
                self._drained.set()
            if served != self.model and not self._inflight[served]:
                self._retire(served)
        reply.version = version
        if reply.completion_ids is None or reply.logprobs is None:
            raise PolicyUnavailable(f"{self.base_url} returned no token ids or log-probs: the server must be "
                                    "vLLM (or accept return_token_ids and logprobs)")
        return reply

    # -- weight sync ------------------------------------------------------------------------

    async def publish(self, learner: Any) -> None:
        """Push the learner's weights as version ``learner.version`` (after its optimiser step)."""
        t0 = time.perf_counter()
        version = int(learner.version)
        path = Path(self.sync_dir).resolve() / f"v{version:06d}"
        export = getattr(learner, "export_state", None)  # a sharded learner gathers its weights first
        state = await asyncio.to_thread(export) if export is not None else None
        await asyncio.to_thread(_save, learner.model, path, state)
        if self.weight_sync == "lora":
            name = f"{self.base_model}-{self._run}-v{version}"
            await self._admin("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
            self._names[name] = version
            old, self.model = self.model, name
            if not self._inflight.get(old):
                self._retire(old)
        else:
            self._open.clear()  # no new request until the reload is done
            try:
                await self._drained.wait()
                await self._admin("/collective_rpc", {"method": "reload_weights",
                                                      "kwargs": {"weights_path": str(path)}})
                # cached KV blocks were computed by the old weights: a prompt seen before would
                # reuse them (measured: log-probs of neither version)
                await self._admin("/reset_prefix_cache", {})
                self._names[self.model] = version
            finally:
                self._open.set()
        self.version = version
        lora = self.weight_sync == "lora"  # a reloaded full copy is never read again
        live = {f"v{v:06d}" for v in self._names.values()} if lora else set()
        await asyncio.to_thread(_prune, Path(self.sync_dir).resolve(), self.keep_versions if lora else 1, live)
        self.sync_seconds.append(time.perf_counter() - t0)

    def _retire(self, name: str) -> None:
        """Unload an old adapter in the background (the base model is never unloaded)."""
        if name == self.base_model or name not in self._names:
            return
        del self._names[name]
        task = asyncio.get_running_loop().create_task(
            self._admin("/v1/unload_lora_adapter", {"lora_name": name}, quiet=True))
        self._unloading.add(task)
        task.add_done_callback(self._unloading.discard)

    async def _admin(self, path: str, body: dict[str, Any], quiet: bool = False) -> None:
        try:
            response = await self._http.post(self.root_url + path, json=body, timeout=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - httpx errors, and loop shutdown during an unload
            if quiet:
                return
            raise PolicyUnavailable(f"weight sync: {self.root_url}{path} unreachable: {exc}") from exc
        if response.status_code >= 400 and not quiet:
            raise PolicyUnavailable(f"weight sync: {self.root_url}{path} answered HTTP {response.status_code}: "
                                    f"{response.text[:500]}")

    def rng_state(self) -> None:
        return None  # the server samples; its seeds are not ours to checkpoint

    def set_rng_state(self, state: Any) -> None:
        return None

    async def close(self) -> None:
        """Unload this run's adapters (a shared server keeps serving its base model)."""
        for name in [n for n in self._names if n != self.base_model]:
            self._retire(name)
        self.model = self.base_model
        for task in list(self._unloading):
            await asyncio.gather(task, return_exceptions=True)
        await super().close()


def _save(model: Any, path: Path, state: dict[str, Any] | None = None) -> None:
    """The adapter (a peft model) or the whole model, safetensors, replaced atomically;
    ``state``: the weights gathered from a sharded model (else the model's own)."""
    staging = path.with_name(path.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True, **({"state_dict": state} if state is not None else {}))
    shutil.rmtree(path, ignore_errors=True)
    staging.rename(path)


def _prune(directory: Path, keep: int, live: set[str]) -> None:
    """Remove old versions, except the newest ``keep`` and those still served (``live``: the
    server may read an adapter from disk again after evicting it from its cache)."""
    versions = sorted(p for p in directory.glob("v[0-9]*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in versions[:-max(keep, 1)]:
        if old.name not in live:
            shutil.rmtree(old, ignore_errors=True)


@dataclass
class LoraSpec:
    """The learner's LoRA (peft): rank, scaling and the projections it adapts."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LoraSpec:
        return cls(**(data or {}))

    def apply(self, model: Any) -> Any:
        from peft import LoraConfig, get_peft_model

        return get_peft_model(model, LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                                                target_modules=list(self.target_modules)))
