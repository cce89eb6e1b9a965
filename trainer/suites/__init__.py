"""Out-of-distribution evaluation suites (``awm eval --suite bfcl|tau2|mcp-universe``).

Each suite runs a published benchmark's *own* harness - its generation code, its user simulator,
its evaluator - against an OpenAI-compatible endpoint, in a virtualenv of its own
(:mod:`awm.trainer.suites.envs`), and turns its scores into the table the AWM paper reports
(:mod:`awm.trainer.suites.table`). awm adds no scoring of its own: a number in the table is the
benchmark's. Modules: :mod:`~awm.trainer.suites.bfcl`, :mod:`~awm.trainer.suites.tau2`,
:mod:`~awm.trainer.suites.mcpuniverse`.
"""
