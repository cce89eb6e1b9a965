"""awm's trainer: an MCP agent loop, a rollout service over env instances, and a GRPO learner.

Modules, roughly in the order data flows through them:

* :mod:`awm.trainer.toolcalls`, :mod:`awm.trainer.history` - parsing tool calls, the sliding history window;
* :mod:`awm.trainer.policy` (OpenAI-compatible endpoints), :mod:`awm.trainer.local_policy` (a transformers
  model in process) - the policies an agent can run;
* :mod:`awm.trainer.agent` - one episode on one instance, streamed to JSONL as it happens;
* :mod:`awm.trainer.reward` - the hybrid reward, and which samples are masked (our faults, not the agent's);
* :mod:`awm.trainer.rollout` - instance sources, concurrent episodes, GRPO groups, bounded staleness;
* :mod:`awm.trainer.grpo` (loss math), :mod:`awm.trainer.samples` (trajectories to token tensors),
  :mod:`awm.trainer.learner` (the training loop, checkpoints);
* :mod:`awm.trainer.eval` (pass@k), :mod:`awm.trainer.metrics` (Prometheus, JSONL, plots), :mod:`awm.trainer.cli`.

Nothing here imports torch at module import time except the learner-side modules, so the CLI
stays cheap and the env server never needs torch.
"""
