"""Host names and URLs: which ones stay on this machine, which ones a request may follow,
and the settings in seconds that bound a transfer."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from ..errors import WeightstoreError


def loopback_name(name: str) -> bool:
    """Is ``name`` (no port, no brackets) ``localhost`` or a loopback address? Where plain
    HTTP is allowed (a test registry, a local file server), and nowhere else."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_url(url: str, insecure: bool = False) -> bool:
    """May a request go to ``url``: HTTPS to any host, plain HTTP to a loopback host only
    (to any host with ``insecure``, which the user asked for)? Any other scheme is not."""
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    if parts.scheme == "https":
        return True
    return parts.scheme == "http" and (insecure or loopback_name(parts.hostname))


def hop_guard(refuse: Callable[[str], Exception],
              insecure: bool = False) -> Callable[[str], None]:
    """The check of every hop of a redirect before it is followed
    (:class:`weightstore.io.http.Session`'s ``guard``): a hop :func:`allowed_url` refuses
    raises ``refuse(target)`` before any connection to it is made."""
    def guard(target: str) -> None:
        if not allowed_url(target, insecure):
            raise refuse(target[:200])
    return guard


def seconds_setting(env: Mapping[str, str], name: str, default: float,
                    error: type[WeightstoreError]) -> float:
    """The positive number of seconds the environment variable ``name`` holds, else
    ``default``; anything else is ``error`` naming it."""
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise error(f"{name} must be a positive number of seconds", value=text[:40])
    return value
