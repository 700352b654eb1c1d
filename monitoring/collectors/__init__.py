"""One module per source of rig readings on the host; each returns plain data or raises ``Unavailable`` with a reason.

Backends' own readings live with each backend (inference/backends/<kind>/monitor.py), GPUs in monitoring/gpus/.
"""

from __future__ import annotations

from inference.backends.monitor import Unavailable

__all__ = ["Unavailable"]
