"""``awm train`` configuration: one YAML file, every section a small dataclass.

Relative paths in the file (``catalog``, ``policy.path``) are resolved against the file's own
directory when they exist there, so ``examples/train-tiny.yaml`` works from any directory;
``run_dir`` is relative to the current directory. Those paths, ``policy.server.python`` and its ``args`` may
name environment variables (``${AWM_REAL_MODEL}``) and ``~``: a model or an interpreter that lives
in a cache outside the repository is named without writing a machine's path into the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import yaml

from awm.trainer.agent import AgentConfig
from awm.episode.reward import RewardConfig
from awm.trainer.rollout import RolloutConfig
from awm.trainer.tiny import TinySpec
from awm.trainer.vllm_policy import LoraSpec

# The choices of the config's enumerated settings, each spelled once: the fields' types, and the
# check at load (from_dict), which names them in its error.
PolicyKind = Literal["tiny", "hf", "vllm"]
WeightSync = Literal["lora", "full"]
DType = Literal["auto", "float32", "bfloat16"]
LossAgg = Literal["token_mean", "seq_mean"]
Backend = Literal["auto", "gloo", "nccl"]
RunMode = Literal["async", "sync"]
VerifierKind = Literal["code", "judge"]
DTYPES: tuple[str, ...] = get_args(DType)


def _one_of(choices: Any) -> str:
    """``a, b or c`` of a Literal's values."""
    values = get_args(choices)
    return f"{', '.join(values[:-1])} or {values[-1]}"


@dataclass
class PolicyConfig:
    # tiny: built here from `tiny` | hf: a local transformers checkpoint at `path`, generating in
    # process | vllm: the checkpoint at `path` served by a vLLM server at `base_url` (or started
    # from `server`), the learner here, weights pushed to the server after every step
    kind: PolicyKind = "tiny"
    path: str | None = None
    temperature: float = 1.0
    max_new_tokens: int = 256
    device: str = "auto"  # auto: the first CUDA GPU when there is one, else cpu | cpu | cuda | cuda:N | mps
    # compute precision (autocast); weights and optimiser state are float32 regardless
    dtype: DType = "auto"  # auto: bfloat16 on a GPU that has it, else float32 | float32 | bfloat16
    tiny: TinySpec = field(default_factory=TinySpec)
    # Qwen3-style templates: thinking on or off (chat_template_kwargs.enable_thinking), the same
    # in rollouts and training; None: the template's default
    thinking: bool | None = None
    # -- kind vllm --
    base_url: str | None = None  # the server's OpenAI-compatible URL (…/v1)
    served_model: str = "policy"  # the name the server serves `path` under (--served-model-name)
    weight_sync: WeightSync = "lora"  # lora: a peft LoRA, loaded at runtime | full: all weights, reloaded
    lora: LoraSpec = field(default_factory=LoraSpec)
    sync_dir: str | None = None  # where versions are written for the server to read (default run_dir/weights)
    request_timeout_s: float = 300.0
    # JSON merged into every generation request (null drops a field), e.g. {tool_choice: required}
    # for guided tool calls (vLLM's structured outputs), or {chat_template: ...}
    extra_body: dict[str, Any] = field(default_factory=dict)
    # start the server here (same machine or pod): {python: vLLM's interpreter, args: [extra flags],
    # port: 0}; without it, base_url names a server that runs already
    server: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> PolicyConfig:
        data = dict(data or {})
        data["tiny"] = TinySpec.from_dict(data.get("tiny"))
        data["lora"] = LoraSpec.from_dict(data.get("lora"))
        cfg = cls(**data)
        if cfg.kind not in get_args(PolicyKind):
            raise ValueError(f"policy.kind must be {_one_of(PolicyKind)}, not {cfg.kind!r}")
        if cfg.kind == "vllm":
            if not cfg.path:
                raise ValueError("policy.kind vllm needs policy.path (the model directory the server serves)")
            if not cfg.base_url and not cfg.server:
                raise ValueError("policy.kind vllm needs policy.base_url (a running server) or policy.server")
            if cfg.weight_sync not in get_args(WeightSync):
                raise ValueError(f"policy.weight_sync must be {_one_of(WeightSync)}, not {cfg.weight_sync!r}")
        if not isinstance(cfg.extra_body, dict):
            raise ValueError("policy.extra_body must be a mapping (JSON merged into every request)")
        reserved = {"return_token_ids", "logprobs", "model", "messages", "tools"} & set(cfg.extra_body)
        if reserved:  # the learner trains on the ids and log-probs the server returns
            raise ValueError(f"policy.extra_body cannot set {', '.join(sorted(reserved))}: the trainer sets them")
        if cfg.extra_body and cfg.kind != "vllm":
            raise ValueError("policy.extra_body applies to policy.kind vllm only (requests to a server)")
        if cfg.dtype == "float16":
            raise ValueError("policy.dtype float16 is not supported for training: its gradients underflow "
                             "without loss scaling; use bfloat16 (or auto)")
        if cfg.dtype not in DTYPES:
            raise ValueError(f"policy.dtype must be one of {', '.join(DTYPES)}, not {cfg.dtype!r}")
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", cfg.device):
            raise ValueError(f"policy.device must be auto, cpu, cuda, cuda:N or mps, not {cfg.device!r}")
        return cfg



@dataclass
class GRPOConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None  # DAPO's "clip higher"; None: symmetric
    kl_coef: float = 0.0  # > 0 keeps a frozen reference copy of the initial policy
    loss_agg: LossAgg = "token_mean"
    scale_rewards: bool = True  # divide by the group's std (False: Dr. GRPO)
    micro_batch_size: int = 8  # sequences per forward/backward; an update accumulates over its mini-batch
    # Groups (tasks) per optimiser update: a step of groups_per_step groups makes
    # groups_per_step / mini_batch_groups updates (the paper: 64 / 16 = 4), the later ones with
    # PPO's ratio against the pre-step policy. None: one update per step, over the whole batch.
    mini_batch_groups: int | None = None
    max_grad_norm: float = 1.0
    # Truncated importance sampling for tokens the sampler scored differently from the learner
    # (older weights, another numeric path): each token's loss is weighted by
    # min(pi_learner / pi_sampler, tis_cap), detached. None: the PPO ratio is taken against the
    # sampler's log-probs directly (the in-process policy's exact ones).
    tis_cap: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GRPOConfig:
        data = dict(data or {})
        for key in ("lr", "weight_decay", "clip_eps", "kl_coef", "max_grad_norm", "tis_cap"):
            if data.get(key) is not None:
                data[key] = float(data[key])  # YAML reads 3e-3 as a string
        cfg = cls(**data)
        if cfg.loss_agg not in get_args(LossAgg):
            raise ValueError(f"grpo.loss_agg must be {_one_of(LossAgg)}, not {cfg.loss_agg!r}")
        if cfg.micro_batch_size < 1:
            raise ValueError("grpo.micro_batch_size must be at least 1")
        if cfg.mini_batch_groups is not None and (isinstance(cfg.mini_batch_groups, bool)
                                                  or not isinstance(cfg.mini_batch_groups, int)
                                                  or cfg.mini_batch_groups < 1):
            raise ValueError("grpo.mini_batch_groups must be a whole number of groups, at least 1 (or unset: "
                             "one update per step)")
        if cfg.tis_cap is not None and cfg.tis_cap < 1.0:
            raise ValueError("grpo.tis_cap must be at least 1 (or unset)")
        return cfg


@dataclass
class LearnerConfig:
    # Shard the learner over the processes torchrun started (FSDP2; trainer/distributed.py):
    #   torchrun --nproc-per-node N --no-python awm train --config run.yaml
    # Rank 0 runs rollouts, metrics and checkpoints; the others take part in the learner's steps.
    distributed: bool = False
    backend: Backend = "auto"  # auto: nccl with GPUs, else gloo

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LearnerConfig:
        cfg = cls(**(data or {}))
        if cfg.backend not in get_args(Backend):
            raise ValueError(f"learner.backend must be {_one_of(Backend)}, not {cfg.backend!r}")
        return cfg


@dataclass
class EvaluationConfig:
    """How a run's checkpoints are to be evaluated: decoding, context and history window. A record
    that travels with the training config (the paper pins its evaluation apart from its training:
    another temperature, a longer context, a longer history); ``awm train`` does not read it, and
    ``awm eval`` takes the same values as flags (docs/reproduce.md, step 4)."""

    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    max_model_len: int | None = None  # the serving engine's context (vLLM --max-model-len)
    rope_scaling: dict[str, Any] | None = None  # the serving engine's RoPE scaling beyond the native context
    history_window: int | None = None  # assistant turns kept in the prompt (agent.history_window)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EvaluationConfig:
        data = dict(data or {})
        for key in ("temperature", "top_p"):
            if data.get(key) is not None:
                data[key] = float(data[key])
        cfg = cls(**data)
        if cfg.temperature < 0 or (cfg.top_p is not None and not 0 < cfg.top_p <= 1):
            raise ValueError("evaluation.temperature must be >= 0 and evaluation.top_p in (0, 1]")
        for key in ("top_k", "max_model_len", "history_window"):
            value = getattr(cfg, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"evaluation.{key} must be a whole number, at least 1 (or unset)")
        if cfg.rope_scaling is not None and not isinstance(cfg.rope_scaling, dict):
            raise ValueError("evaluation.rope_scaling must be a mapping (the model's rope_scaling)")
        return cfg


@dataclass
class TrainConfig:
    # policy.server.args as written (set by from_dict; not a setting): what to_record keeps
    _written_server_args: ClassVar[list[str] | None] = None
    catalog: str = "starter"
    envs: list[str] | None = None
    tasks: list[str] | None = None  # task ids to train on (default: all tasks of the chosen envs)
    replicas: int = 2  # instances per environment
    # Instances in all, each serving any chosen environment (late binding; instead of replicas):
    # a GRPO group switches free instances to its environment when it starts.
    instances: int | None = None
    database_url: str | None = None
    run_dir: str = "runs/train"
    seed: int = 0
    steps: int = 20
    groups_per_step: int = 2
    mode: RunMode = "async"  # async: rollouts overlap training (bounded staleness) | sync
    checkpoint_every: int = 10
    resume: bool = True
    metrics_port: int = 0  # > 0: serve Prometheus metrics on this port
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a pod, so that Prometheus can scrape it
    torch_threads: int = 1
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    # The LLM judge of judge-verifier tasks (awm.judge.JudgeSettings fields: base_url, model, votes,
    # ...; the key from the environment variable named by api_key_env, AWM_JUDGE_API_KEY).
    judge: dict[str, Any] | None = None
    verifier_kind: VerifierKind | None = None  # which one where a task has both
    allow_ungated: bool = False  # also train on tasks that have not passed both gates

    def serving(self) -> dict[str, Any]:
        """The local fleet's judge, verifier kind and gate settings."""
        from awm.judge import JudgeSettings

        judge = JudgeSettings.model_validate(self.judge) if self.judge else None
        return {"judge": judge, "verifier_kind": self.verifier_kind, "allow_ungated": self.allow_ungated}

    @classmethod
    def from_dict(cls, data: dict[str, Any], base_dir: Path | None = None) -> TrainConfig:
        data = dict(data)
        sections = {"rollout": RolloutConfig, "agent": AgentConfig, "reward": RewardConfig,
                    "policy": PolicyConfig, "grpo": GRPOConfig, "learner": LearnerConfig,
                    "evaluation": EvaluationConfig}
        for key, kind in sections.items():
            data[key] = kind.from_dict(data.get(key))  # type: ignore[attr-defined]
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown settings: {', '.join(sorted(unknown))}")
        cfg = cls(**data)
        if base_dir is not None:
            cfg.catalog = _resolve(cfg.catalog, base_dir)
            if cfg.policy.server:
                server = cfg.policy.server
                if server.get("python"):
                    server["python"] = _expand(str(server["python"]), "policy.server.python")
                # The record keeps the args as written: `--api-key ${VLLM_API_KEY}` names a secret
                # that config.json, shared with the run directory, must not hold.
                cfg._written_server_args = [str(arg) for arg in server.get("args") or []]
                server["args"] = [_expand(arg, "policy.server.args") for arg in cfg._written_server_args]
            if cfg.policy.path:
                cfg.policy.path = _resolve(cfg.policy.path, base_dir, "policy.path")
            if cfg.policy.sync_dir:
                cfg.policy.sync_dir = _resolve(cfg.policy.sync_dir, base_dir)
        if cfg.mode not in get_args(RunMode):
            raise ValueError(f"mode must be {_one_of(RunMode)}")
        mini = cfg.grpo.mini_batch_groups
        if mini is not None and (mini > cfg.groups_per_step or cfg.groups_per_step % mini):
            raise ValueError(f"grpo.mini_batch_groups ({mini}) must divide groups_per_step ({cfg.groups_per_step}): "
                             "every optimiser update of a step takes the same number of groups")
        if cfg.learner.distributed and cfg.policy.kind != "vllm":
            raise ValueError("learner.distributed needs policy.kind vllm: a sharded model generates only "
                             "with every process taking part, so generation is the server's")
        if cfg.verifier_kind is not None and cfg.verifier_kind not in get_args(VerifierKind):
            raise ValueError(f"verifier_kind must be {_one_of(VerifierKind)}")
        cfg.serving()  # a malformed judge section fails here, before anything starts
        return cfg

    @classmethod
    def load(cls, path: Path | str, overrides: dict[str, Any] | None = None) -> TrainConfig:
        path = Path(path)
        data = yaml.safe_load(path.read_text()) or {}
        data.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.from_dict(data, path.resolve().parent)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_record(self) -> dict[str, Any]:
        """The settings as a run directory keeps them: the database password is left out, since
        run directories are shared and copied around while the DSN is an admin credential, and
        ``policy.server.args`` are as written, before ``${VAR}`` was expanded."""
        data = self.to_dict()
        if data["database_url"]:
            data["database_url"] = redact_dsn(data["database_url"])
        written = getattr(self, "_written_server_args", None)
        if written is not None and data["policy"]["server"]:
            data["policy"]["server"]["args"] = list(written)
        return data


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***`` (an unparsable one is dropped whole)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - whatever it holds, it is not written out
        return "***"
    if params.get("password"):
        params["password"] = "***"
    return make_conninfo(**params)


def _expand(value: str, what: str) -> str:
    """``~`` and ``$VAR``/``${VAR}`` expanded; a variable that is not set is an error here, not a
    path that does not exist later."""
    expanded = os.path.expandvars(os.path.expanduser(value))
    missing = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
    if missing:
        raise ValueError(f"{what}: environment variable {missing[0]} is not set ({value!r})")
    return expanded


def _resolve(value: str, base_dir: Path, what: str = "path") -> str:
    value = _expand(value, what)
    if value == "starter" or Path(value).is_absolute():
        return value
    candidate = base_dir / value
    return str(candidate.resolve()) if candidate.exists() else value
