"""Die with the parent: an env server started by a local fleet must not outlive the fleet.

A fleet that is SIGKILLed (or crashes) cannot stop its env servers, and they run in their own
sessions (so Ctrl-C at the fleet's terminal does not hit them twice): without this they would run
on, parented to init, for as long as the machine is up. The fleet names itself in
``AWM_PARENT_PID``; the child asks the kernel for SIGTERM when its parent thread exits
(``PR_SET_PDEATHSIG``) as the first thing its ``main`` does, then checks that its parent is still
that process, which closes the race of a parent that died between fork and the ``prctl``. We do not
use ``preexec_fn`` (unsafe in a process with threads). SIGTERM, not SIGKILL: the server then stops
as on any other SIGTERM, closing its workers' pipes so they exit too. The kernel's "parent" is the
thread that forked: asyncio spawns from its event loop's thread, which outlives the fleet it runs.

Env servers in pods have no ``AWM_PARENT_PID`` (they are the container's main process) and are
unaffected.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

from awm import settings

PARENT_ENV = settings.names.AWM_PARENT_PID
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """If ``AWM_PARENT_PID`` names our parent, have the kernel send ``sig`` when it dies; exit now
    if it is already gone. Raises OSError if the kernel refuses (the child must not run
    unsupervised without saying so)."""
    expected = settings.var.AWM_PARENT_PID.pop()
    if expected is None:
        return
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    else:  # no parent-death signal elsewhere (macOS): notice reparenting instead, once a second
        threading.Thread(target=_watch, args=(expected, sig), name="lifeline", daemon=True).start()
    if os.getppid() != expected:  # the parent died before the prctl: nobody will signal us
        sys.exit(f"envserver: the process that started us ({expected}) is gone; exiting")


def _watch(parent: int, sig: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), sig)
