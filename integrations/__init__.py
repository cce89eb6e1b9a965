"""awm as the environment side of the RL stacks people already run (docs/integrations.md).

* what every adapter shares is the episode layer below: :mod:`awm.episode.session` (one episode
  step by step: reset, MCP tool calls, verdict, awm's reward with masking) and
  :mod:`awm.episode.sources` (where instances come from: a running pool with whole GRPO-group
  claims, or the operator's allocation API);
* :mod:`awm.integrations.openenv_server` - OpenEnv's HTTP/WebSocket environment API in front of a
  fleet (any OpenEnv client: TRL, SkyRL, torchforge, Unsloth, ART);
* :mod:`awm.integrations.trl_env` - a ``rollout_func`` for TRL's ``GRPOTrainer``;
* :mod:`awm.integrations.verl_agent` - a verl agent loop (``awm_agent``);
* :mod:`awm.integrations.skyrl_env` - a skyrl-gym ``BaseTextEnv`` (``awm``).

Each framework is imported only by its own module. These modules sit above ``awm`` (the episode
layer) and ``awm.trainer`` (the agent loop, policies); nothing below imports them.
"""
