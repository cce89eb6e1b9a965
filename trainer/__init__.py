"""awm's trainer: an MCP agent loop, a rollout service over env instances, and a GRPO learner.

Modules, roughly in the order data flows through them:

* :mod:`awm.trainer.history` - the sliding history window (tool-call parsing, the reward and the
  instance sources are the episode layer's: :mod:`awm.episode`);
* :mod:`awm.trainer.policy` (OpenAI-compatible endpoints), :mod:`awm.trainer.local_policy` (a transformers
  model in process) - the policies an agent can run;
* :mod:`awm.trainer.agent` - one episode on one instance, streamed to JSONL as it happens;
* :mod:`awm.trainer.rollout` - concurrent episodes, GRPO groups, bounded staleness;
* :mod:`awm.trainer.grpo` (loss math), :mod:`awm.trainer.samples` (trajectories to token tensors),
  :mod:`awm.trainer.learner` (one optimiser step, checkpoints), :mod:`awm.trainer.models` (building the
  policy), :mod:`awm.trainer.run` (the ``awm train`` loop), :mod:`awm.trainer.distributed` (FSDP ranks);
* :mod:`awm.trainer.eval` (pass@k), :mod:`awm.trainer.metrics` (Prometheus, JSONL, plots), :mod:`awm.trainer.cli`
  (registers the commands, each in a module of its own: ``cmd_agent``, ``cmd_train``, ``cmd_eval``,
  ``cmd_warmstart``, ``cmd_verify``; the options they share in ``cmd_options``).

Nothing here imports torch at module import time except the learner-side modules, so the CLI
stays cheap and the env server never needs torch.
"""
