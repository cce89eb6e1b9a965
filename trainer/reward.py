"""Moved to :mod:`awm.episode.reward` (below the trainer, so adapters and the UI use it without
importing the trainer); this name stays importable for code not yet switched."""

from awm.episode.reward import *  # noqa: F401,F403
