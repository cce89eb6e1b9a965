"""Prometheus metrics of one env-server process (scraped from the control port's /metrics)."""

from __future__ import annotations

from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Sub-millisecond resets and a few-millisecond tool calls need fine low buckets.
_FAST = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1, 2, 5, 10)


# Environments whose series a late-binding instance keeps: the most recently served ones. An
# instance switched through hundreds of environments would otherwise export tools x environments
# series for good; an environment last served this many switches ago has long been scraped.
SERVED_ENVS = 64


class Metrics:
    def __init__(self, env: str, instance: str, served_envs: int = SERVED_ENVS) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.instance = instance
        self.served_envs = max(1, served_envs)
        self._served: OrderedDict[str, None] = OrderedDict({env: None})
        self.info = Gauge("awm_instance_info", "Environment served by this instance (1: now; 0: served before).",
                          ["env", "instance"], registry=r)
        self.info.labels(env, instance).set(1)
        # By environment: a late-binding instance serves many in turn (the series of the ones it
        # served; tool names are the environment's own).
        self.tool_calls = Counter("awm_tool_calls_total", "Tool calls by environment, tool and outcome.",
                                  ["env", "tool", "outcome"], registry=r)
        self.tool_latency = Histogram("awm_tool_call_seconds", "Tool call latency inside the server.",
                                      ["env", "tool"], buckets=_FAST, registry=r)
        self.binds = Counter("awm_binds_total", "Switches to another environment: new (a database from the "
                             "provisioner), cached (kept from before), failed.", ["kind"], registry=r)
        self.bind_latency = Histogram("awm_bind_seconds", "Switch latency (claim of an environment to the "
                                      "first tool call possible).", ["kind"], buckets=_FAST, registry=r)
        self.databases = Counter("awm_databases_acquired_total", "Instance databases this instance got (at its "
                                 "start, a switch or a preparation), by source: clone (made on the claim path), ready (made ahead "
                                 "by this pod's provisioner), spare (made ahead by any of the fleet's).", ["source"],
                                 registry=r)
        self.prepares = Counter("awm_prepares_total", "Environments made ready ahead of a claim (POST "
                                "/prepare): made, or raced (bound by a claim meanwhile).", ["outcome"], registry=r)
        self.resets = Histogram("awm_reset_seconds", "Episode reset latency by strategy.",
                                ["strategy"], buckets=_FAST, registry=r)
        self.episodes = Counter("awm_episodes_total", "Verified episodes by environment and verdict.",
                                ["env", "verdict"], registry=r)
        self.verifier_errors = Counter("awm_verifier_errors_total",
                                       "Verifier failures by kind (timeout, memory, crash, exception).",
                                       ["kind"], registry=r)
        self.verifier_timeouts = Counter("awm_verifier_timeouts_total", "Verifiers stopped at their time limit.",
                                         registry=r)
        self.verify_latency = Histogram("awm_verify_seconds", "Verification latency.", buckets=_FAST, registry=r)
        self.db_reconnects = Counter("awm_db_reconnects_total", "Reconnections after a lost database.",
                                     registry=r)
        self.worker_restarts = Counter("awm_worker_restarts_total",
                                       "Sandbox workers killed and replaced, by reason (timeout, crash, protocol).",
                                       ["reason"], registry=r)
        self.escapes = Counter("awm_episode_escapes_total",
                               "Resets that did not trust the fast path and repaired from the snapshot.", registry=r)
        self.judge_latency = Histogram("awm_judge_seconds", "LLM judge latency per verdict (cache hits included).",
                                       buckets=(0.001, 0.01, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120), registry=r)
        self.judge_tokens = Counter("awm_judge_tokens_total", "Tokens spent by the LLM judge.", ["kind"],
                                    registry=r)
        self.judge_cache_hits = Counter("awm_judge_cache_hits_total", "Judgements answered from the cache.",
                                        registry=r)
        self.judge_verdicts = Counter("awm_judge_verdicts_total", "Judge classifications (judge_error included).",
                                      ["classification"], registry=r)
        self.ungated = Counter("awm_ungated_episodes_total",
                               "Episodes of tasks served without passing both gates (--allow-ungated).", registry=r)
        for outcome in ("complete", "incomplete", "agent_error", "error"):
            self.episodes.labels(env, outcome)
        for kind in ("new", "cached", "failed"):
            self.binds.labels(kind)
        for source in ("clone", "ready", "spare"):
            self.databases.labels(source)
        for kind in ("prompt", "completion"):
            self.judge_tokens.labels(kind)

    def bound(self, previous: str, env: str) -> None:
        self.info.labels(previous, self.instance).set(0)
        self.info.labels(env, self.instance).set(1)
        for outcome in ("complete", "incomplete", "agent_error", "error"):
            self.episodes.labels(env, outcome)
        self._served[env] = None
        self._served.move_to_end(env)
        while len(self._served) > self.served_envs:
            old, _ = self._served.popitem(last=False)
            self._forget(old)

    def _forget(self, env: str) -> None:
        """Remove every series labelled with ``env`` (its tools', episodes', info)."""
        for metric in (self.info, self.tool_calls, self.tool_latency, self.episodes):
            for labels in [k for k in metric._metrics if k[0] == env]:  # noqa: SLF001
                metric.remove(*labels)
