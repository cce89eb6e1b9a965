"""``awm ui``: a web view of catalogs, runs, trajectories with per-call database diffs, the fleet,
and a playground on a real instance (docs/ui.md).

Layering: ``ui`` sits on top (like ``integrations``): it reads the trainer's files and uses the
core's clients; nothing below imports it (awm/cli.py registers the command lazily).

* :mod:`awm.ui.index` - SQLite index of a run's trajectories.jsonl (paging 100,000 episodes);
* :mod:`awm.ui.runs` - run directories, metrics, eval reports;
* :mod:`awm.ui.catalog` - environments, tables, tools, tasks and gate status;
* :mod:`awm.ui.fleet` - instance states and rates (instances, operator API, Prometheus);
* :mod:`awm.ui.playground` - MCP sessions on real instances for hand-made tool calls;
* :mod:`awm.ui.app` - the Starlette server; ``ui/static`` the front end (ES modules, no build step).
"""
