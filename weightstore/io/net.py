"""Host names: which ones stay on this machine."""

from __future__ import annotations

import ipaddress


def loopback_name(name: str) -> bool:
    """Is ``name`` (no port, no brackets) ``localhost`` or a loopback address? Where plain
    HTTP is allowed (a test registry, a local file server), and nowhere else."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
