"""RigDash's streaming benchmark: RigDash against reading the backend directly (see docs/benchmarks.md).

Run it with ``./scripts/bench`` (``--quick`` for a short smoke run). Only ``stats``, ``sse`` and
``wsproto`` are pure; the rest starts processes and talks to 127.0.0.1 only.
"""
