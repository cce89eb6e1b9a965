"""awm as the environment side of the RL stacks people already run.

* :mod:`integrations.openenv_server` - OpenEnv's HTTP/WebSocket environment API in front of a
  fleet (any OpenEnv client: TRL, SkyRL, torchforge, Unsloth, ART).

These modules sit above ``awm`` (and use ``trainer.reward`` for rewards); nothing below imports them.
"""
