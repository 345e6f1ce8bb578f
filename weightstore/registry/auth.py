"""Credentials (environment, Docker's config file) and the registry auth challenges.

Registries answer 401 with ``WWW-Authenticate``: ``Basic`` (send the user and password)
or ``Bearer realm=...,service=...,scope=...`` (trade them, or nothing for anonymous
access, for a short-lived token at the realm). Credentials come from, in order:
``WEIGHTSTORE_REGISTRY_USERNAME`` / ``WEIGHTSTORE_REGISTRY_PASSWORD``, then
``$DOCKER_CONFIG/config.json`` (default ``~/.docker/config.json``) ``auths`` entries
(``auth`` = base64 ``user:password``, or ``username`` / ``password``). Credential helpers
(``credsStore``) are not run.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RegistryAuthError
from ..io.files import parse_json, read_regular
from .credential_helpers import IDENTITY_TOKEN_USER, helper_get

ENV_USER = "WEIGHTSTORE_REGISTRY_USERNAME"
ENV_PASSWORD = "WEIGHTSTORE_REGISTRY_PASSWORD"

_PARAM = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


@dataclass(frozen=True)
class Credentials:
    """A user and password, or an identity token (a refresh token for the token service);
    neither secret is in the repr."""

    username: str
    password: str = field(repr=False)
    identity_token: str | None = field(default=None, repr=False)

    def basic(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode("ascii")


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict[str, str]


def parse_challenge(header: str | None) -> Challenge | None:
    """The first challenge of a ``WWW-Authenticate`` header (registries send one)."""
    if not header:
        return None
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3)
              for m in _PARAM.finditer(rest)}
    return Challenge(scheme.lower(), params)


def docker_config_path() -> Path:
    folder = os.environ.get("DOCKER_CONFIG")
    return Path(folder) / "config.json" if folder else Path.home() / ".docker" / "config.json"


def find_credentials(host: str, *, environment: bool = True) -> Credentials | None:
    """Credentials for ``host`` (with its port), or None for anonymous access.
    ``environment`` False: not those of the environment, which name no host (a mirror's
    client: they are the origin's)."""
    user, password = os.environ.get(ENV_USER), os.environ.get(ENV_PASSWORD)
    if environment and user and password is not None:
        return Credentials(user, password)
    path = docker_config_path()
    try:
        doc = parse_json(read_regular(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RegistryAuthError(f"unreadable Docker config: {exc}", file=str(path)) from None
    if not isinstance(doc, dict):
        return None
    helpers = doc.get("credHelpers")
    for name in (helpers.get(host) if isinstance(helpers, dict) else None,
                 doc.get("credsStore")):
        if isinstance(name, str) and name:
            found = helper_get(name, host)
            if found is not None:
                return _credentials(*found)
    auths = doc.get("auths")
    if not isinstance(auths, dict):
        return None
    for name in (host, f"https://{host}", f"http://{host}", f"https://{host}/v2/"):
        entry = auths.get(name)
        if isinstance(entry, dict):
            return _entry_credentials(entry, path, host)
    return None


def _credentials(user: str, secret: str) -> Credentials:
    """A helper's answer: the username ``<token>`` marks an identity token."""
    if user == IDENTITY_TOKEN_USER:
        return Credentials("", "", identity_token=secret)
    return Credentials(user, secret)


def _entry_credentials(entry: dict, path: Path, host: str) -> Credentials | None:
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credentials("", "", identity_token=token)
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return Credentials(entry["username"], entry["password"])
    encoded = entry.get("auth")
    if not isinstance(encoded, str) or not encoded:
        return None
    try:
        user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        sep = ""
    if not sep:
        raise RegistryAuthError("Docker config 'auth' is not base64 of user:password",
                                file=str(path), host=host)
    return Credentials(user, password)
