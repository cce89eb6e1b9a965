"""awm's trainer: an MCP agent loop, a rollout service over env instances, and a GRPO learner.

Modules, roughly in the order data flows through them:

* :mod:`trainer.toolcalls`, :mod:`trainer.history` - parsing tool calls, the sliding history window;
* :mod:`trainer.policy` (OpenAI-compatible endpoints), :mod:`trainer.local_policy` (a transformers
  model in process) - the policies an agent can run;
* :mod:`trainer.agent` - one episode on one instance, streamed to JSONL as it happens;
* :mod:`trainer.reward` - the hybrid reward, and which samples are masked (our faults, not the agent's);
* :mod:`trainer.rollout` - instance sources, concurrent episodes, GRPO groups, bounded staleness;
* :mod:`trainer.grpo` (loss math), :mod:`trainer.samples` (trajectories to token tensors),
  :mod:`trainer.learner` (the training loop, checkpoints);
* :mod:`trainer.eval` (pass@k), :mod:`trainer.metrics` (Prometheus, JSONL, plots), :mod:`trainer.cli`.

Nothing here imports torch at module import time except the learner-side modules, so the CLI
stays cheap and the env server never needs torch.
"""
