"""GRPO math against hand-computed values, and the pure parts of the trainer (no server)."""

import math

import pytest
import torch

from awm.trainer.grpo import grpo_loss, group_advantages
from awm.trainer.history import window
from awm.episode.reward import RewardConfig, score
from awm.trainer.samples import build_batch, episode_sequences
from awm.episode.toolcalls import MalformedCall, ToolCall, parse_native, parse_text, strip_calls
from awm.trainer.trajectory import Trajectory, Turn


# -- advantages ---------------------------------------------------------------------------------

def test_group_advantages_by_hand():
    # mean 0.5, sample std sqrt((4 * 0.25) / 3) = 0.57735 -> +-0.5 / 0.57735 = +-0.866025
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), eps=0.0)
    assert adv.tolist() == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)
    # Dr. GRPO (no std scaling): r - mean
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), scale=False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_masked_members_take_no_part():
    # the masked 5.0 (our failure) is neither in the mean nor given an advantage
    adv = group_advantages(torch.tensor([1.0, 0.0, 5.0]), torch.tensor([True, True, False]), eps=0.0)
    assert adv.tolist() == pytest.approx([0.707107, -0.707107, 0.0], abs=1e-6)
    assert group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([True, False])).tolist() == [0.0, 0.0]
    assert group_advantages(torch.tensor([0.5, 0.5, 0.5])).tolist() == [0.0, 0.0, 0.0]


# -- the clipped loss ---------------------------------------------------------------------------

def _case():
    # old log-probs 0, so ratio = exp(logp): sequence 1 has A=+1, sequence 2 has A=-1
    ratios = torch.tensor([[1.0, 1.5, 0.5], [0.7, 1.1, 1.0]])
    logp = ratios.log().requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask


def test_clipped_surrogate_by_hand():
    logp, old, adv, mask = _case()
    loss, stats = grpo_loss(logp, old, adv, mask, clip_eps=0.2)
    # per-token -min(r A, clip(r, 0.8, 1.2) A): seq 1 -> -1, -1.2 (1.5 clipped); seq 2 -> 0.8 (0.7 clipped), 1.1, 1.0
    # token_mean = (-1 - 1.2 + 0.8 + 1.1 + 1.0) / 5 = 0.14
    assert loss.item() == pytest.approx(0.14, abs=1e-6)
    assert stats.clip_fraction == pytest.approx(2 / 5) and stats.tokens == 5
    loss.backward()
    # gradient of -r A / 5 w.r.t. logp is -r A / 5 where unclipped, 0 where clipped or masked
    assert logp.grad.flatten().tolist() == pytest.approx([-0.2, 0.0, 0.0, 0.0, 0.22, 0.2], abs=1e-6)


def test_seq_mean_and_asymmetric_clip():
    logp, old, adv, mask = _case()
    loss, _ = grpo_loss(logp, old, adv, mask, clip_eps=0.2, agg="seq_mean")
    assert loss.item() == pytest.approx((-2.2 / 2 + 2.9 / 3) / 2, abs=1e-6)  # -0.0666667
    loss, _ = grpo_loss(logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.6)
    # with 1 + 0.6 the ratio 1.5 is no longer clipped: (-1 - 1.5 + 2.9) / 5 = 0.08
    assert loss.item() == pytest.approx(0.08, abs=1e-6)


def test_seq_mean_weighs_a_split_episode_once():
    """Rows 0 and 1 are one episode that the history window split (2 + 3 generated tokens); with
    seq_tokens each row is divided by the episode's 5, and the normalizer counts 1 episode."""
    logp, old, adv, mask = _case()
    loss, _ = grpo_loss(logp, old, adv, mask, clip_eps=0.2, agg="seq_mean", normalizer=1.0,
                        seq_tokens=torch.tensor([5.0, 5.0]))
    assert loss.item() == pytest.approx((-2.2 + 2.9) / 5, abs=1e-6)  # one episode's token mean


def test_learner_seq_mean_counts_episodes_not_rows():
    """The same episode as one row or split in two gives the same gradient under seq_mean."""
    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.samples import Sequence
    from awm.trainer.tiny import TinySpec, build_model

    nan = math.nan
    whole = [Sequence([1, 2, 3, 4, 5, 6, 7], [0, 1, 1, 0, 1, 1, 1], [0, nan, nan, 0, nan, nan, nan], 1.0, "e1"),
             Sequence([1, 2, 3], [0, 1, 1], [0, nan, nan], -1.0, "e2")]
    split = [Sequence([1, 2, 3], [0, 1, 1], [0, nan, nan], 1.0, "e1"),
             Sequence([1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, nan, nan, nan], 1.0, "e1"),
             Sequence([1, 2, 3], [0, 1, 1], [0, nan, nan], -1.0, "e2")]
    grads = []
    for seqs in (whole, split):
        model = build_model(16, TinySpec(hidden_size=16, layers=1, heads=2), seed=0)
        learner = Learner(model, GRPOConfig(lr=0.0, loss_agg="seq_mean", max_grad_norm=1e9), SamplingSpec())
        learner.step(seqs)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_a_resumed_learner_takes_the_same_next_step(tmp_path):
    """Checkpoint after one step, load into a fresh learner: the optimiser's moments, the random
    states and the rollout side's states come back, so the second step is the same as without
    the interruption."""
    import random as _random

    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner
    from awm.trainer.local_policy import LocalPolicy, SamplingSpec
    from awm.trainer.rollout import RolloutConfig, RolloutService, TaskRef
    from awm.trainer.samples import Sequence
    from awm.trainer.tiny import TinySpec, build_model, build_tokenizer

    nan = math.nan
    seqs = [Sequence([1, 2, 3, 4, 5], [0, 1, 1, 1, 1], [0, *[nan] * 4], 1.0, "a"),
            Sequence([1, 2, 4, 3], [0, 1, 1, 1], [0, *[nan] * 3], -1.0, "b")]
    spec, cfg = TinySpec(hidden_size=16, layers=1, heads=2), GRPOConfig(lr=1e-2)
    tokenizer = build_tokenizer(["a b c"], [], 100)

    straight = Learner(build_model(16, spec, seed=0), cfg, SamplingSpec())
    straight.step(seqs)
    policy = LocalPolicy(straight.model, tokenizer, SamplingSpec(), seed=3)
    service = RolloutService(None, policy, [TaskRef("e", f"t{i}") for i in range(5)], None, None,  # type: ignore[arg-type]
                             RolloutConfig(seed=1))
    service.next_task()
    saved = straight.save(tmp_path, tokenizer, 1, {"tasks": service.rng_state(), "sampler": policy.rng_state()})
    after_save = (torch.get_rng_state(), _random.getstate())
    straight.step(seqs)
    expected_tasks = [service.next_task() for _ in range(6)]
    expected_sample = torch.rand(3, generator=policy._generator)

    torch.manual_seed(123)
    _random.seed(123)
    resumed = Learner(build_model(16, spec, seed=0), cfg, SamplingSpec())
    resumed.model.load_state_dict(type(straight.model).from_pretrained(saved).state_dict())
    step, extra = resumed.load_state(saved)
    assert step == 1 and resumed.version == 1
    assert torch.equal(torch.get_rng_state(), after_save[0]) and _random.getstate() == after_save[1]
    resumed.step(seqs)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)  # Adam's moments came back: the same second step
    policy2 = LocalPolicy(resumed.model, tokenizer, SamplingSpec(), seed=99)
    service2 = RolloutService(None, policy2, service.tasks, None, None, RolloutConfig(seed=7))  # type: ignore[arg-type]
    service2.set_rng_state(extra["tasks"])
    policy2.set_rng_state(extra["sampler"])
    assert [service2.next_task() for _ in range(6)] == expected_tasks
    assert torch.equal(torch.rand(3, generator=policy2._generator), expected_sample)


def test_kl_penalty_k3_by_hand():
    logp = torch.zeros(1, 2)
    ref = torch.tensor([[-0.5, 0.0]])
    loss, stats = grpo_loss(logp, torch.zeros(1, 2), torch.tensor([0.0]), torch.ones(1, 2), ref_logp=ref, kl_coef=0.1)
    k3 = math.exp(-0.5) + 0.5 - 1  # 0.1065307
    assert stats.kl == pytest.approx(k3 / 2, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * k3 / 2, abs=1e-7)


def test_minus_infinity_at_masked_positions_keeps_the_loss_finite():
    """A prompt token outside the allowed set has log-prob -inf under the policy and under the
    reference: -inf - -inf is NaN, and NaN * 0 would poison the loss and every gradient."""
    inf = float("inf")
    logp = torch.tensor([[-inf, -0.5, -1.0]], requires_grad=True)
    ref = torch.tensor([[-inf, -0.5, -0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    loss, stats = grpo_loss(logp, torch.tensor([[0.0, -0.5, -1.0]]), torch.tensor([1.0]), mask,
                            ref_logp=ref, kl_coef=0.1)
    loss.backward()
    k3 = math.exp(0.5) - 0.5 - 1
    assert loss.item() == pytest.approx((-1 - 1 + 0.1 * k3) / 2, abs=1e-6)
    assert stats.kl == pytest.approx(k3 / 2, abs=1e-6)
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 0] == 0


def test_accumulating_micro_batches_equals_one_batch():
    logp, old, adv, mask = _case()
    full, _ = grpo_loss(logp, old, adv, mask)
    part1, _ = grpo_loss(logp[:1], old[:1], adv[:1], mask[:1], normalizer=5.0)
    part2, _ = grpo_loss(logp[1:], old[1:], adv[1:], mask[1:], normalizer=5.0)
    assert (part1 + part2).item() == pytest.approx(full.item(), abs=1e-7)


def test_learner_gradient_accumulation_matches_full_batch():
    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.samples import Sequence
    from awm.trainer.tiny import TinySpec, build_model

    seqs = [Sequence([3, 5, 7, 9], [0, 0, 1, 1], [0, 0, -2.0, -1.5], 1.0),
            Sequence([3, 5, 8], [0, 1, 1], [0, -2.2, -2.0], -0.5),
            Sequence([3, 4, 6, 7, 2], [0, 0, 1, 0, 1], [0, 0, -2.1, 0, float("nan")], 0.25)]
    grads = []
    for micro in (3, 1):
        model = build_model(16, TinySpec(hidden_size=16, layers=1, heads=2), seed=1)
        learner = Learner(model, GRPOConfig(lr=0.0, micro_batch_size=micro, max_grad_norm=1e9), SamplingSpec())
        stats = learner.step(seqs)
        assert stats["trained_tokens"] == 6 and learner.version == 1
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def _two_groups(model):
    """Two groups of two sequences whose sampling log-probs are ``model``'s own (a sampler that
    generated with exactly these weights), as build_batch numbers them."""
    from awm.trainer.learner import output_logits
    from awm.trainer.samples import Sequence

    rows = [([3, 5, 7, 9], [0, 0, 1, 1], 1.0), ([3, 5, 8], [0, 1, 1], -1.0),
            ([3, 4, 6, 7, 2], [0, 0, 1, 0, 1], 0.5), ([3, 9, 2], [0, 1, 1], -0.5)]
    seqs = []
    for n, (ids, mask, advantage) in enumerate(rows):
        with torch.no_grad():
            logits = output_logits(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), 0)
            logp = torch.log_softmax(logits.float(), -1)[0].gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
        old = [0.0] + [float(v) if m else 0.0 for v, m in zip(logp, mask[1:])]
        seqs.append(Sequence(ids, mask, old, advantage, f"e{n}", group=n // 2))
    return seqs


def test_mini_batches_split_a_step_by_group_never_inside_one():
    from awm.trainer.learner import mini_batches
    from awm.trainer.samples import Sequence

    seqs = [Sequence([1, 2], [0, 1], [0.0, 0.0], group=g, episode_id=f"e{i}") for i, g in enumerate([0, 0, 1, 2, 2, 3])]
    assert mini_batches(seqs, None) == [seqs]
    assert [[s.episode_id for s in m] for m in mini_batches(seqs, 2)] == [["e0", "e1", "e2"], ["e3", "e4", "e5"]]
    assert [len(m) for m in mini_batches(seqs, 3)] == [5, 1]


def test_a_step_of_two_mini_batches_is_two_updates_against_the_sampler():
    """With the sampler's log-probs known (no TIS), update 2 of a step is exactly a step over its
    groups taken after update 1; the version still goes up once per step (one weight sync)."""
    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.tiny import TinySpec, build_model

    spec = TinySpec(hidden_size=16, layers=1, heads=2)
    cfg = dict(lr=5e-2, micro_batch_size=1, max_grad_norm=1e9)
    mini = Learner(build_model(16, spec, seed=1), GRPOConfig(**cfg, mini_batch_groups=1), SamplingSpec())
    seqs = _two_groups(mini.model)
    stats = mini.step(seqs)
    assert stats["updates"] == 2 and mini.version == 1 and stats["trained_tokens"] == 8
    one = Learner(build_model(16, spec, seed=1), GRPOConfig(**cfg), SamplingSpec())
    one.step([s for s in seqs if s.group == 0])
    one.step([s for s in seqs if s.group == 1])
    for a, b in zip(mini.model.parameters(), one.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    # and it is not one update over both groups
    whole = Learner(build_model(16, spec, seed=1), GRPOConfig(**cfg), SamplingSpec())
    assert whole.step(seqs)["updates"] == 1
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(mini.model.parameters(), whole.model.parameters()))


def test_later_mini_batches_measure_the_gap_against_the_pre_step_policy():
    """The sampler generated with the learner's weights: before the step there is no gap. Update 2
    runs on weights update 1 moved, yet its importance weights and its logged gap are taken
    against the pre-step policy (zero gap, nothing truncated); and its PPO ratio is the moved
    policy's over that pre-step one, which the clip then bounds."""
    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.tiny import TinySpec, build_model

    learner = Learner(build_model(16, TinySpec(hidden_size=16, layers=1, heads=2), seed=1),
                      GRPOConfig(lr=0.5, mini_batch_groups=1, tis_cap=1.0, max_grad_norm=1e9), SamplingSpec())
    stats = learner.step(_two_groups(learner.model))
    assert stats["updates"] == 2
    assert stats["logprob_gap"] == pytest.approx(0.0, abs=1e-6) and stats["tis_truncated_fraction"] == 0.0
    assert stats["ratio_mean"] != pytest.approx(1.0, abs=1e-4)  # update 2's ratio: moved / pre-step


def test_log_probs_from_the_first_trained_token_equal_the_whole_sequence_s():
    # The learner applies the output layer from the first trained token on (logits_to_keep):
    # the log-probs it reads and their gradients must be those of the whole sequence.
    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner, first_trained
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.tiny import TinySpec, build_model

    model = build_model(16, TinySpec(hidden_size=16, layers=2, heads=2), seed=3)
    learner = Learner(model, GRPOConfig(lr=0.0), SamplingSpec(temperature=0.7))
    ids = torch.tensor([[3, 5, 7, 9, 11, 2], [3, 5, 8, 4, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    mask = torch.tensor([[0, 0, 0, 1, 1.0], [0, 0, 1, 0, 0]])  # targets 1..5: rows train from 4 and 3
    first = first_trained(mask)
    assert first == 2 and first_trained(torch.zeros(2, 5)) == 0
    results = []
    for start in (0, first):
        model.zero_grad()
        logp = learner.sequence_logprobs(model, ids, attention, start)
        assert logp.shape == (2, 5)
        (logp * mask).sum().backward()
        results.append(((logp * mask).detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-6)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-6)


def test_policy_device_and_dtype_reach_the_learner_and_the_sampler(tmp_path):
    """What a GPU run does with ``policy.device``/``policy.dtype``, on the CPU with bfloat16:
    the learner keeps float32 master weights and computes under autocast, the reference and an
    async sampler's copy are bfloat16, and a synchronous run shares one model between learner
    and sampler."""
    from awm.trainer.config import TrainConfig
    from awm.trainer.learner import Learner
    from awm.trainer.models import build_policy, resolve_device, resolve_dtype
    from awm.trainer.local_policy import LocalPolicy
    from awm.trainer.samples import Sequence

    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda:0")
    cfg = TrainConfig.from_dict({"policy": {"device": "cpu", "dtype": "bfloat16",
                                            "tiny": {"hidden_size": 16, "layers": 1, "heads": 2,
                                                     "actions": ["a b", "c d"]}},
                                 "grpo": {"kl_coef": 0.1}, "run_dir": str(tmp_path)})
    model, reference, tokenizer, sampling, compute = build_policy(cfg, ["a b c d"], None)
    assert compute == torch.bfloat16
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16}
    learner = Learner(model, cfg.grpo, sampling, reference, compute_dtype=compute)
    copy_policy = LocalPolicy(learner.model, tokenizer, sampling, share=False, dtype=compute)
    assert {p.dtype for p in copy_policy.model.parameters()} == {torch.bfloat16}
    # rotary tables are buffers: rounded to bfloat16 they would garble positions past a few hundred
    for frozen in (reference, copy_policy.model):
        assert {b.dtype for b in frozen.buffers() if b.is_floating_point()} <= {torch.float32}
    # the learner's forward runs in the compute dtype (autocast), on float32 weights
    seen: list[torch.dtype] = []
    hook = model.lm_head.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    policy = LocalPolicy(learner.model, tokenizer, sampling, share=True, dtype=compute)
    ids, logprobs = policy.generate(tokenizer.encode("a b"))
    assert ids and len(ids) == len(logprobs) and all(lp <= 0 for lp in logprobs)
    before = [p.detach().clone() for p in model.parameters()]
    stats = learner.step([Sequence([*tokenizer.encode("a b"), *ids], [0, 0, *[1] * len(ids)],
                                   [0.0, 0.0, *logprobs], 1.0)])
    assert stats["trained_tokens"] == len(ids) and math.isfinite(stats["loss"])
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}
    policy.load_weights(learner.weights(), learner.version)
    copy_policy.load_weights(learner.weights(), learner.version)
    assert policy.model is model and policy.version == 1  # shared: the step is already in it
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert {p.dtype for p in copy_policy.model.parameters()} == {torch.bfloat16}  # cast on load
    with pytest.raises(ValueError, match="float32"):
        Learner(model.to(torch.bfloat16), cfg.grpo, sampling)


def test_bfloat16_compute_keeps_small_updates():
    """At an RL-sized learning rate most updates are far below bfloat16's resolution of a weight;
    with float32 master weights a bfloat16-compute step changes as many weights as a float32 one
    (bfloat16 weights would keep almost none of them)."""
    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.samples import Sequence
    from awm.trainer.tiny import TinySpec, build_model

    seq = Sequence([1, 2, 3, 4, 5, 6], [0, 0, 1, 1, 1, 1], [0.0, 0.0, *[math.nan] * 4], 1.0)  # on-policy
    changed = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = build_model(16, TinySpec(hidden_size=32, layers=1, heads=2), seed=0)
        before = [p.detach().clone() for p in model.parameters()]
        learner = Learner(model, GRPOConfig(lr=1e-6, max_grad_norm=1e9), SamplingSpec(), compute_dtype=dtype)
        learner.step([seq])
        changed[dtype] = sum(int((a != b).sum()) for a, b in zip(before, model.parameters()))
        if dtype == torch.float32:  # what training bfloat16 weights directly would keep of the same step
            kept = sum(int((a.bfloat16() != b.bfloat16()).sum()) for a, b in zip(before, model.parameters()))
    assert changed[torch.float32] > 1000
    assert changed[torch.bfloat16] >= 0.9 * changed[torch.float32]
    assert kept < 0.1 * changed[torch.float32]


@pytest.mark.parametrize("section, bad, message", [
    ("policy", {"dtype": "fp8"}, "policy.dtype"), ("policy", {"device": "gpu"}, "policy.device"),
    ("policy", {"kind": "vllm"}, "policy.kind"), ("grpo", {"loss_agg": "sum"}, "grpo.loss_agg"),
    ("agent", {"tool_format": "txt"}, "tool_format"), ("agent", {"tool_descriptions": "brief"}, "tool_descriptions"),
    ("policy", {"extra_body": {"tool_choice": "required"}}, "policy.kind vllm only"),
    ("policy", {"kind": "vllm", "path": "m", "base_url": "http://x/v1", "extra_body": "required"}, "mapping"),
    ("policy", {"kind": "vllm", "path": "m", "base_url": "http://x/v1", "extra_body": {"logprobs": False}},
     "cannot set logprobs"),
    ("grpo", {"mini_batch_groups": 0}, "grpo.mini_batch_groups"),
    ("grpo", {"mini_batch_groups": 1.5}, "grpo.mini_batch_groups"),
    ("grpo", {"mini_batch_groups": 3}, "must divide groups_per_step")])
def test_bad_settings_are_refused_when_the_config_loads(section, bad, message):
    from awm.trainer.config import TrainConfig

    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict({section: bad})


def test_config_paths_name_environment_variables(tmp_path, monkeypatch):
    from awm.trainer.config import TrainConfig

    model = tmp_path / "model"
    model.mkdir()
    config = tmp_path / "run.yaml"
    config.write_text("policy:\n  kind: vllm\n  path: ${AWM_TEST_MODEL}\n  extra_body: {tool_choice: required}\n"
                      "  server: {python: $AWM_TEST_PY, args: [--chat-template, '${AWM_TEST_MODEL}/t.jinja']}\n")
    monkeypatch.setenv("AWM_TEST_MODEL", str(model))
    monkeypatch.setenv("AWM_TEST_PY", "/opt/vllm/bin/python")
    cfg = TrainConfig.load(config)
    assert cfg.policy.path == str(model) and cfg.policy.extra_body == {"tool_choice": "required"}
    assert cfg.policy.server == {"python": "/opt/vllm/bin/python", "args": ["--chat-template", f"{model}/t.jinja"]}
    monkeypatch.delenv("AWM_TEST_MODEL")
    with pytest.raises(ValueError, match="environment variable AWM_TEST_MODEL is not set"):
        TrainConfig.load(config)


def test_short_tool_descriptions_keep_what_makes_arguments_valid():
    import jsonschema

    from awm.episode.toolcalls import first_sentence, short_tools

    full = {"name": "list_users", "description": "List sales users. Each with their team.\n\nArgs: ...",
            "inputSchema": {"type": "object", "additionalProperties": False, "required": ["title"], "properties": {
                "title": {"type": "string", "description": "A parameter called title.", "minLength": 1},
                "role": {"anyOf": [{"enum": ["rep", "manager"], "type": "string"}, {"type": "null"}],
                         "default": None, "description": "Only users with this role.", "title": "Role"},
                "team": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}], "default": None},
                "ids": {"type": "array", "items": {"type": "integer", "description": "An id."}},
                "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "fixed": {"anyOf": [{"type": "string", "const": "x"}, {"type": "null"}]},
                "level": {"anyOf": [{"type": "string", "enum": ["a", None]}, {"type": "null"}]},
                "filter": {"type": "object", "default": {"title": "t", "description": "d"}}}}}
    short = short_tools([full])[0]
    assert short["description"] == "List sales users."
    schema = short["inputSchema"]
    described = [p for p, v in schema["properties"].items() if "description" in v or "title" in v]
    assert not described and "description" not in schema["properties"]["ids"]["items"]
    assert schema["properties"]["role"] == {"type": ["string", "null"], "enum": ["rep", "manager", None], "default": None}
    assert schema["properties"]["team"] == {"type": ["integer", "null"], "minimum": 1, "default": None}
    assert schema["properties"]["either"] == full["inputSchema"]["properties"]["either"]  # not an Optional
    assert schema["required"] == ["title"] and schema["additionalProperties"] is False
    assert schema["properties"]["fixed"] == full["inputSchema"]["properties"]["fixed"]  # null must stay valid
    assert schema["properties"]["level"]["enum"] == ["a", None]
    assert schema["properties"]["filter"]["default"] == {"title": "t", "description": "d"}  # data, not prose
    # the same arguments are valid, and invalid, under both
    for args in ({"title": "x"}, {"title": "x", "role": None, "team": 3}, {"title": "x", "role": "boss"},
                 {"title": ""}, {"role": "rep"}, {"title": "x", "team": 0}, {"title": "x", "extra": 1},
                 {"title": "x", "ids": [1, "2"]}, {"title": "x", "either": 1.5}, {"title": "x", "fixed": None},
                 {"title": "x", "fixed": "y"}, {"title": "x", "level": None}, {"title": "x", "level": "b"}):
        verdicts = [jsonschema.Draft202012Validator(s).is_valid(args) for s in (full["inputSchema"], schema)]
        assert verdicts[0] == verdicts[1], args
    assert first_sentence("x" * 200, 50) == "x" * 49 + "…"
    assert first_sentence("Version 2.1 of it. More.") == "Version 2.1 of it."


# -- what becomes a training sequence ----------------------------------------------------------

def _turn(i, prompt, completion, lps=None):
    return Turn(i, {"role": "assistant", "content": ""}, [], [], "text", 0.0, 0.0, 0,
                prompt_ids=prompt, completion_ids=completion, logprobs=lps or [-1.0] * len(completion))


def test_turns_pack_into_one_sequence_until_the_window_cuts():
    traj = Trajectory("e1", "lamps", "t", "", "p", turns=[
        _turn(0, [1, 2, 3], [4, 5]),
        _turn(1, [1, 2, 3, 4, 5, 6, 7], [8]),  # context grew by a tool result (6, 7): packed
        _turn(2, [1, 2, 6, 7, 8, 9], [10]),  # the window dropped turn 0: a new sequence
    ])
    first, second = episode_sequences(traj)
    assert first.input_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert first.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]  # prompt and tool-result tokens never count
    assert first.old_logprobs == [0, 0, 0, -1.0, -1.0, 0, 0, -1.0]
    assert second.input_ids == [1, 2, 6, 7, 8, 9, 10] and second.loss_mask == [0] * 6 + [1]


def test_masked_episodes_are_left_out_of_the_batch():
    def traj(name, reward, masked=False):
        return Trajectory(name, "lamps", "t", "", "p", reward=reward, masked=masked, turns=[_turn(0, [1], [2])])

    batch = build_batch([[traj("a", 1.0), traj("b", 0.0), traj("c", 0.0, masked=True)],
                         [traj("d", 0.0), traj("e", 0.0)]])  # second group: no signal
    assert batch.episodes == 5 and batch.masked == 1 and batch.zero_advantage_groups == 1
    assert [(s.episode_id, round(s.advantage, 4)) for s in batch.sequences] == [("a", 0.7070), ("b", -0.7070)]


def test_history_window_keeps_head_and_whole_turns():
    head = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    turn = lambda i: [{"role": "assistant", "content": f"a{i}", "tool_calls": [{"id": f"c{i}"}]},
                      {"role": "tool", "tool_call_id": f"c{i}", "content": f"r{i}"}]
    messages = head + turn(0) + turn(1) + turn(2)
    assert window(messages, None) == messages and window(messages, 3) == messages
    assert window(messages, 2) == head + turn(1) + turn(2)
    assert window(messages, 1) == head + turn(2)


# -- tool calls and rewards --------------------------------------------------------------------

def test_text_tool_calls():
    text = ('I will look. <tool_call>{"name": "find_note", "arguments": {"title": "todo"}}</tool_call>'
            '<tool_call>[{"name": "list_notes", "arguments": "{}"}]</tool_call>')
    assert parse_text(text) == [ToolCall("call_0", "find_note", {"title": "todo"}), ToolCall("call_1", "list_notes", {})]
    assert strip_calls(text) == "I will look."
    bad = parse_text('<tool_call>{"name": "x", "arguments": {oops}}</tool_call> <tool_call>{"arguments": {}}</tool_call>'
                     '<tool_call>{"name": "y"')
    assert [type(c) for c in bad] == [MalformedCall] * 3
    assert "not JSON" in bad[0].error and "name" in bad[1].error and "closing" in bad[2].error
    assert parse_text("The answer is 3.") == []


def test_native_tool_calls():
    calls = parse_native([
        {"id": "a", "type": "function", "function": {"name": "add_note", "arguments": '{"title": "x"}'}},
        {"id": "b", "type": "function", "function": {"name": "add_note", "arguments": "{title: x}"}},
        {"id": "c", "type": "function", "function": {"arguments": "{}"}},
    ])
    assert calls[0] == ToolCall("a", "add_note", {"title": "x"})
    assert isinstance(calls[1], MalformedCall) and isinstance(calls[2], MalformedCall)


@pytest.mark.parametrize("verdict, kinds, malformed, infra, expected", [
    ({"verdict": "complete"}, [], 0, None, (1.0, False)),
    ({"verdict": "incomplete"}, [], 0, None, (0.0, False)),
    ({"verdict": "complete"}, ["invalid_arguments"], 2, None, (0.75, False)),  # 2 x 0.1 format + 0.05 tool
    ({"verdict": "incomplete"}, ["tool_error"] * 20, 20, None, (-0.5, False)),  # penalties capped at 0.5
    ({"verdict": "complete"}, ["tool_crashed"], 0, None, (0.0, True)),  # environment's fault: masked
    ({"verdict": "incomplete"}, ["timeout"], 0, None, (0.0, True)),
    ({"verdict": "incomplete"}, ["unavailable"], 0, None, (0.0, True)),
    ({"verdict": "error", "error_kind": "infra"}, [], 0, None, (0.0, True)),
    ({"verdict": "error", "error_kind": "crash"}, [], 0, None, (0.0, True)),
    ({"verdict": "error", "error_kind": "timeout"}, [], 0, None, (0.0, True)),
    (None, [], 0, "instance lost", (0.0, True)),
])
def test_reward_and_masking(verdict, kinds, malformed, infra, expected):
    cfg = RewardConfig(format_penalty=0.1, tool_error_penalty=0.05, max_penalty=0.5)
    result = score(verdict, kinds, malformed, infra, cfg)
    assert (round(result.reward, 6), result.masked) == expected


# -- policy replies and metrics ------------------------------------------------------------------

def test_token_ids_and_logprobs_from_a_vllm_style_reply():
    from awm.trainer.policy import _token_data

    data = {"prompt_token_ids": [1, 2, 3]}
    choice = {"token_ids": [7, 8], "logprobs": {"content": [{"token": "a", "logprob": -0.5},
                                                            {"token": "b", "logprob": -1.25}]}}
    assert _token_data(data, choice) == ([1, 2, 3], [7, 8], [-0.5, -1.25])
    assert _token_data({}, {"message": {}}) == (None, None, None)  # an endpoint that returns no ids


def test_prometheus_metrics_are_served():
    import socket

    import httpx

    from awm.trainer.metrics import TrainMetrics

    metrics = TrainMetrics()
    traj = Trajectory("e", "lamps", "t", "", "p", reward=1.0, turns=[_turn(0, [1], [2, 3])],
                      verdict={"verdict": "complete"})
    metrics.observe_trajectory(traj)
    metrics.observe_step({"step_s": 0.5, "rollouts_per_s": 32.0, "tokens_per_s": 64.0, "reward_mean": 1.0,
                          "env_wait_fraction": 0.25, "version": 1, "dropped_stale": 0, "staleness": [0, 1]})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics.serve(port)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    for line in ('awm_train_rollouts_total{env="lamps"} 1.0', "awm_train_generated_tokens_total 2.0",
                 "awm_train_rollouts_per_second 32.0", "awm_train_env_wait_fraction 0.25",
                 "awm_train_staleness_count 2.0", "awm_train_reward_count 1.0", "awm_train_step_seconds_count 1.0"):
        assert line in text
