"""Running the operator: ``python -m awm_operator`` (the operator image's entrypoint) and
``awm operator run``. Configuration comes from the environment (``OperatorConfig.from_env``).

Namespaced when ``AWM_NAMESPACES`` lists namespaces (the chart's default), cluster-wide
otherwise. With ``AWM_PEERING`` set, replicas coordinate through that KopfPeering object: only
the highest-priority live replica acts; without it the operator runs standalone.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from typing import Any, Coroutine

import kopf

from awm_operator.config import OperatorConfig


def configure_logging(level: str) -> None:
    kopf.configure(verbose=level.lower() == "debug", debug=False, quiet=level.lower() in ("warning", "error"))
    logging.getLogger("awm").setLevel(level.upper())


async def operate(cfg: OperatorConfig, *, kubeconfig: str | None = None,
                  stop_flag: Any = None, ready_flag: Any = None) -> None:
    """The operator as a coroutine (tests run it in a thread with their own stop flag)."""
    import awm_operator.handlers  # noqa: F401  (registers the handlers with kopf's default registry)

    await kopf.operator(
        namespaces=cfg.namespaces, clusterwide=not cfg.namespaces,
        peering_name=cfg.peering, standalone=cfg.peering is None, priority=cfg.priority,
        memo=kopf.Memo(config=cfg, kubeconfig=kubeconfig),
        stop_flag=stop_flag, ready_flag=ready_flag)


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the operator on uvloop (libuv's event loop, in C) when it is installed, as kopf's own
    ``kopf run`` does, else on asyncio's. The allocation API is the operator's hot path, and most
    of a claim's CPU in the operator is the event loop's sockets and TLS: on uvloop the operator
    sustains about a quarter more claims a second (bench/fleet.py at 4,096 instances,
    docs/benchmarks.md)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def freeze_startup_objects() -> None:
    """Move what the operator loaded at start-up (~108k objects: kopf, kubernetes_asyncio's
    models, pydantic, the handlers) out of the cyclic garbage collector's reach (``gc.freeze``).

    Why: CPython's full collection walks every tracked object, and these never become garbage.
    The operator's bursts (a GRPO step's 1,024 binds, a release's 1,024 resets) promote enough
    short-lived objects to set one off every few steps, and each walked the start-up objects
    too: 60-100 ms on the one event loop that answers the allocation API, a step's group claims
    waiting behind it. Frozen, a full collection walks only what the operator holds for its
    fleets (3-30 ms during a step, measured), and the collector's thresholds stay CPython's
    (bench/fleet.py --late, docs/benchmarks.md: gen0 20,000 was measured too, and kept fewer
    collections but a slower sustained claim loop)."""
    import awm_operator.handlers  # noqa: F401  (everything a running operator loads at start)

    gc.collect()
    gc.freeze()


def run(cfg: OperatorConfig | None = None) -> None:
    cfg = cfg or OperatorConfig.from_env()
    configure_logging(cfg.log_level)
    freeze_startup_objects()
    run_loop(operate(cfg))


class InThread:
    """The operator in a background thread with its own event loop: for tests and benchmarks.

        with InThread(cfg, kubeconfig) as op: ...   # returns once kopf is ready
    """

    def __init__(self, cfg: OperatorConfig, kubeconfig: str | None = None, timeout: float = 30.0) -> None:
        self.cfg, self.kubeconfig, self.timeout = cfg, kubeconfig, timeout
        self.stop_flag, self.ready_flag = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="awm-operator", daemon=True)

    def _main(self) -> None:
        try:
            run_loop(operate(self.cfg, kubeconfig=self.kubeconfig, stop_flag=self.stop_flag,
                             ready_flag=self.ready_flag))
        except BaseException as exc:  # reported by __enter__/__exit__
            self.error = exc
            self.ready_flag.set()

    def __enter__(self) -> "InThread":
        self.thread.start()
        if not self.ready_flag.wait(self.timeout) or self.error is not None:
            self.stop()
            raise RuntimeError(f"operator did not start: {self.error!r}")
        return self

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(30)

    def __exit__(self, *exc: object) -> None:
        self.stop()
