"""One module per source of rig readings; each returns plain data or raises ``Unavailable`` with a reason."""

from __future__ import annotations


class Unavailable(Exception):
    """A reading could not be taken; the message says why (shown on the panel)."""
