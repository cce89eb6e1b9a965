"""Running untrusted code (generated tools, verifiers, imported apps) in confined worker processes.

:mod:`awm.sandbox.pool` (server side) starts and drives workers; :mod:`awm.sandbox.worker` is the
worker's main; :mod:`awm.sandbox.confine` applies the kernel's confinement in it;
:mod:`awm.sandbox.appshim` lets a generated FastAPI/SQLAlchemy app run in a worker unchanged.
"""
