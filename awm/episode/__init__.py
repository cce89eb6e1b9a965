"""The episode layer: what the trainer, the framework adapters and the UI share, below all three.

* :mod:`awm.episode.sources` - where instances come from (a running pool, a local fleet, the
  operator's allocation API) behind one contract: claim an instance of environment E, or a group
  of G of E; :func:`~awm.episode.sources.run_source` and
  :func:`~awm.episode.sources.source_from_config` are the only places that choose;
* :mod:`awm.episode.session` - one episode on one instance: reset, tool calls with awm's error
  classes, per-call database changes, verdict, reward and masking;
* :mod:`awm.episode.reward` - the hybrid reward and which episodes are masked;
* :mod:`awm.episode.toolcalls` - tool calls in a model's reply (native or ``<tool_call>`` text);
* :mod:`awm.episode.calldiff` - what each tool call changed in the database;
* :mod:`awm.episode.allocation` - the operator's allocation API client (no kopf, no Kubernetes
  client: the operator re-exports it).

It imports only the core (``awm.client``, ``awm.postgres``, ``awm.fleet`` on demand): never the
env server, the trainer, the operator, the integrations or the UI (tests/test_imports.py).
"""
