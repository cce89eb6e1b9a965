"""Runs inside the BFCL virtualenv (bfcl-eval installed; never imported by awm): registers the
endpoint's model in BFCL's own model table with BFCL's ``OpenAICompletionsHandler`` - the way
BFCL's README has new OpenAI-compatible models added - then runs BFCL's own generation and its
own evaluator, and writes what the evaluator scored as ``awm-bfcl.json`` under ``--root``.

    python bfcl_run.py --root DIR --model M --base-url URL --categories simple_python,irrelevance
                       [--ids '{"simple_python": ["simple_python_0"]}'] [--prompting]

The API key comes from OPENAI_API_KEY (BFCL's handler reads it). Everything BFCL writes (result/,
score/, its id file) stays under ``--root`` (BFCL_PROJECT_ROOT).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace


def registry_key(model: str, fc: bool) -> str:
    """BFCL keys its result directories by this name and maps '_' back to '/' when it evaluates,
    so the key has neither."""
    return "awm-" + re.sub(r"[^A-Za-z0-9.-]+", "-", model) + ("-FC" if fc else "-prompt")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("--categories", required=True)
    p.add_argument("--ids", default="")
    p.add_argument("--temperature", type=float, default=0.001)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompting", action="store_true")
    a = p.parse_args()
    root = Path(a.root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["BFCL_PROJECT_ROOT"] = str(root)  # read when bfcl_eval's constants are imported
    os.environ["OPENAI_BASE_URL"] = a.base_url
    os.environ.setdefault("OPENAI_API_KEY", "EMPTY")

    from bfcl_eval._llm_response_generation import main as generation_main
    from bfcl_eval.constants.eval_config import SCORE_PATH
    from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING, ModelConfig
    from bfcl_eval.eval_checker.eval_runner import main as evaluation_main
    from bfcl_eval.model_handler.api_inference.openai_completion import OpenAICompletionsHandler

    fc = not a.prompting
    key = registry_key(a.model, fc)
    MODEL_CONFIG_MAPPING[key] = ModelConfig(
        model_name=a.model, display_name=f"{a.model} ({'FC' if fc else 'Prompt'})", url=a.base_url, org="awm",
        license="unknown", model_handler=OpenAICompletionsHandler, is_fc_model=fc, underscore_to_dot=fc)
    categories = [c for c in a.categories.split(",") if c]
    ids = json.loads(a.ids) if a.ids else {}
    if ids:
        (root / "test_case_ids_to_generate.json").write_text(json.dumps(ids))
    generation_main(SimpleNamespace(
        model=[key], test_category=categories, temperature=a.temperature, include_input_log=False,
        exclude_state_log=True, num_gpus=1, num_threads=a.threads, gpu_memory_utilization=0.9, backend="sglang",
        skip_server_setup=True, local_model_path=None, result_dir=None, allow_overwrite=True, run_ids=bool(ids),
        enable_lora=False, max_lora_rank=None, lora_modules=None))
    evaluation_main([key], categories, None, None, partial_eval=bool(ids))

    scored: dict[str, dict] = {}
    for path in sorted((SCORE_PATH / key).rglob("*_score.json")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        category = re.sub(r"^BFCL_v\d+_|_score\.json$", "", path.name)
        scored[category] = {**lines[0], "failed": [e.get("id") for e in lines[1:] if isinstance(e, dict)]}
    sections: dict[str, dict] = {}
    for name in ("overall", "non_live", "live", "multi_turn"):
        table = SCORE_PATH / f"data_{name}.csv"
        if table.is_file():
            for row in csv.DictReader(table.open()):
                if row.get("Model") == MODEL_CONFIG_MAPPING[key].display_name:
                    sections[name] = row
    (root / "awm-bfcl.json").write_text(json.dumps({"registry_key": key, "categories": scored, "sections": sections},
                                                   indent=2))


if __name__ == "__main__":
    main()
