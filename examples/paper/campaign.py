"""The reproduction kit's Campaign: one of the paper configs as the operator runs it on a GPU node.

    python -m examples.paper.campaign --config examples/paper/qwen3-8b.yaml \\
        --split catalogs/awm1k-train/selection.json --catalog-image REGISTRY/awm1k-train:v1 \\
        --vllm-image REGISTRY/vllm-openai:TAG --judge-secret openai-key > campaign.yaml
    kubectl -n rl apply -f campaign.yaml

What it writes (docs/reproduce.md, "On Kubernetes"):

* the paper's step as a late-binding fleet: ``concurrentGroups`` is the config's
  ``groups_per_step`` (64) and ``training.groupSize`` its ``rollout.group_size`` (16), so the
  operator holds 1,024 instances whatever the number of training environments (526 in the
  paper; ``--split``'s ``train`` list), and the Job claims one group at a time of its environment;
* the learner on ``--gpus`` GPUs of one pod (torchrun, FSDP2) and a vLLM server beside it on
  ``--vllm-gpus`` (tensor parallel); the operator points the policy at it and shares the weights
  through an emptyDir;
* the config's serving choices (``allow_ungated``, ``verifier_kind``: the judge, the paper's
  reward; ``--verifier-kind code`` gives its code-only ablation) and its judge, whose key comes
  from ``--judge-secret`` (a Secret with key ``api-key``) and reaches only the env servers;
* the config's serving context and precision (``policy.server``) as the vLLM sidecar's flags.

The config goes in as written (``training.config``) apart from what the Campaign decides itself
(the catalog, the environments, instances, the group size: the operator sets them, see
``awm_operator.campaign_manifests.train_config``) and the local judge section (in a cluster the
judge is the env pods': ``spec.serving.judge``). Nothing here is checked by eye only:
tests/test_campaign_e2e.py creates the three configs' Campaigns on a real API server (the CRDs'
validation), and runs one with the tiny CPU model standing in for Qwen3 through the operator and
``awm train`` on kwok.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

# What the operator sets in the Job's config from the Campaign's own fields (train_config).
SET_BY_THE_CAMPAIGN = ("catalog", "envs", "replicas", "instances", "run_dir", "allow_ungated", "verifier_kind")
SECRET_KEY = "api-key"


def environments(split: Path) -> list[str]:
    """The training environments of an ``awm catalog split`` (its split.json), an ``awm catalog
    select`` (its selection.json), or a catalog directory (its index.json)."""
    data = json.loads(split.read_text())
    if isinstance(data, dict) and "train" in data:
        return list(data["train"])
    if isinstance(data, dict) and isinstance(data.get("chosen"), dict):  # selection.json
        return sorted(data["chosen"])
    if isinstance(data, dict) and "environments" in data:  # a catalog's index.json
        return [e["name"] if isinstance(e, dict) else e for e in data["environments"]]
    raise ValueError(f"{split}: neither a split.json (train: [...]), a selection.json (chosen: {...}) nor a catalog index.json (environments: [...])")


def render(config: dict[str, Any], envs: list[str], name: str, *, catalog_image: str | None = None,
           vllm_image: str | None = None, gpus: int = 4, vllm_gpus: int = 4,
           judge_secret: str | None = None) -> dict[str, Any]:
    """The Campaign manifest of ``config`` (an ``awm train`` config) over ``envs``."""
    if not envs:
        raise ValueError("no environments")
    cfg = copy.deepcopy(config)
    rollout = dict(cfg.get("rollout") or {})
    group_size = int(rollout.pop("group_size", 8))
    groups = int(cfg.get("groups_per_step", 1))
    judge = cfg.pop("judge", None)
    serving: dict[str, Any] = {"allowUngated": bool(cfg.get("allow_ungated", False))}
    if cfg.get("verifier_kind"):
        serving["verifierKind"] = cfg["verifier_kind"]
    if judge:
        serving["judge"] = {k: v for k, v in {
            "baseUrl": judge["base_url"], "model": judge["model"], "votes": judge.get("votes"),
            "reasoning": judge.get("reasoning"), "reasoningEffort": judge.get("reasoning_effort"),
            "apiKeySecret": {"name": judge_secret, "key": SECRET_KEY} if judge_secret else None}.items()
            if v is not None}
    for key in SET_BY_THE_CAMPAIGN:
        cfg.pop(key, None)
    cfg["rollout"] = rollout
    learner = dict(cfg.get("learner") or {})
    learner.pop("distributed", None)  # the operator sets it from training.learner
    if learner:
        cfg["learner"] = learner
    else:
        cfg.pop("learner", None)
    training: dict[str, Any] = {"groupSize": group_size, "config": cfg}
    job: dict[str, Any] = {"backoffLimit": 2}  # a retried pod resumes from its last checkpoint
    policy = cfg.get("policy") or {}
    if policy.get("kind") == "vllm":
        policy = cfg["policy"] = dict(policy)
        server = policy.pop("server", None) or {}  # the operator's sidecar serves it (training.vllm)
        policy.pop("base_url", None)
        training["vllm"] = {"image": vllm_image or "vllm/vllm-openai",
                            "args": ["--tensor-parallel-size", str(vllm_gpus), *sidecar_args(server)],
                            "resources": {"limits": {"nvidia.com/gpu": vllm_gpus}}}
    if gpus > 1:
        training["learner"] = {"processesPerNode": gpus}
    if policy.get("kind") in ("vllm", "hf"):
        job["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    spec: dict[str, Any] = {
        "mode": "training", "environments": list(envs), "concurrentGroups": groups,
        "catalog": {"image": catalog_image} if catalog_image else {},
        "database": {"secretName": "awm-database"}, "serving": serving, "training": training, "job": job}
    return {"apiVersion": "awm.dev/v1alpha1", "kind": "Campaign", "metadata": {"name": name}, "spec": spec}


def sidecar_args(server: dict[str, Any]) -> list[str]:
    """The config's serving settings (``policy.server``: context, precision) as the sidecar's
    flags, so that the Campaign's vLLM serves the context the config trains at (the paper: 32k)."""
    args: list[str] = []
    if server.get("max_model_len"):
        args += ["--max-model-len", str(server["max_model_len"])]
    if server.get("dtype"):
        args += ["--dtype", str(server["dtype"])]
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a paper config (examples/paper/qwen3-*.yaml)")
    parser.add_argument("--split", type=Path, required=True,
                        help="selection.json of `awm catalog select`, split.json of `awm catalog split` (its train "
                             "list), or a catalog's index.json")
    parser.add_argument("--name", help="the Campaign's name (default: paper-<config name>)")
    parser.add_argument("--catalog-image", help="the training catalog as an image (default: the chart's catalog.image)")
    parser.add_argument("--vllm-image", help="the vLLM server's image (default: vllm/vllm-openai)")
    parser.add_argument("--gpus", type=int, default=4, help="learner GPUs (processes) in the trainer's pod")
    parser.add_argument("--vllm-gpus", type=int, default=4, help="GPUs of the vLLM server (tensor parallel)")
    parser.add_argument("--judge-secret", help=f"Secret holding the judge's API key under {SECRET_KEY!r}")
    parser.add_argument("--verifier-kind", choices=("code", "judge"),
                        help="override the config's verifier_kind: code is the paper's code-only ablation")
    args = parser.parse_args(argv)
    try:
        config = yaml.safe_load(args.config.read_text())
        if args.verifier_kind:
            config["verifier_kind"] = args.verifier_kind
        manifest = render(config, environments(args.split),
                          args.name or f"paper-{args.config.stem}", catalog_image=args.catalog_image,
                          vllm_image=args.vllm_image, gpus=args.gpus, vllm_gpus=args.vllm_gpus,
                          judge_secret=args.judge_secret)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    yaml.safe_dump(manifest, sys.stdout, sort_keys=False, width=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
