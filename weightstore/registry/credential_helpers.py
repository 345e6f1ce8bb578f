"""Docker credential helpers: ``docker-credential-<name> get``, as docker, skopeo and oras
run them.

The helper (found on ``PATH``) reads the server URL (the registry host, as docker writes
it) on stdin and prints ``{"ServerURL", "Username", "Secret"}`` on stdout. A non-zero exit
whose output says "credentials not found" means it holds none for that host (the caller
tries its next source). A helper that is missing, fails, hangs past
:data:`HELPER_TIMEOUT` (it is killed, with every process it started) or prints something
else is one :class:`RegistryAuthError` naming it; an empty Secret is no credentials. The
username ``<token>`` marks the Secret as an identity token (an OAuth2 refresh token for
the token service). What the helper prints on stdout (where the Secret is) never goes
into an error: only its name, its exit status and, on failure, the first line of its
stderr (at most 200 characters).
"""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from ..errors import RegistryAuthError
from ..io.files import parse_json

if TYPE_CHECKING:  # subprocess loads when a helper runs, not on every pull
    import subprocess

REAP_TIMEOUT = 2.0  # seconds to collect a killed helper's output before giving it up
HELPER_TIMEOUT = 30.0  # seconds a credential helper may take to answer before it is killed
PREFIX = "docker-credential-"
NOT_FOUND = "credentials not found"  # what every helper of docker's project says
IDENTITY_TOKEN_USER = "<token>"  # the username that marks the Secret as an identity token
MAX_LINE = 200  # characters of a failing helper's stderr quoted in the error


def helper_get(name: str, server: str) -> tuple[str, str] | None:
    """``(username, secret)`` the helper ``docker-credential-<name>`` holds for ``server``,
    or None when it holds none."""
    program = PREFIX + name
    found = shutil.which(program)
    if found is None:
        raise RegistryAuthError("credential helper not found on PATH", helper=program,
                                host=server)
    import subprocess

    try:
        proc = subprocess.Popen([found, "get"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise RegistryAuthError("credential helper could not be started", helper=program,
                                host=server, detail=exc.strerror) from None
    try:
        out, err = proc.communicate(server.encode(), timeout=HELPER_TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise RegistryAuthError(f"credential helper did not answer within "
                                f"{HELPER_TIMEOUT:g} s; killed", helper=program,
                                host=server) from None
    if proc.returncode != 0:
        said = (out + b"\n" + err).decode(errors="replace")
        if NOT_FOUND in said.lower():
            return None
        raise RegistryAuthError("credential helper failed", helper=program, host=server,
                                status=proc.returncode, stderr=_first_line(err))
    return _parse_answer(out, program, server)


def _kill(proc: subprocess.Popen) -> None:
    """Kill the helper and whatever it started (its own session), then reap it."""
    import signal
    import subprocess

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # gone already
        proc.kill()
    try:
        proc.communicate(timeout=REAP_TIMEOUT)
    except subprocess.TimeoutExpired:  # a grandchild of another session holds the pipes
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait()


def _first_line(err: bytes) -> str | None:
    lines = err.decode(errors="replace").strip().splitlines()
    return lines[0][:MAX_LINE] if lines else None


def _parse_answer(out: bytes, program: str, server: str) -> tuple[str, str] | None:
    try:
        doc = parse_json(out)
        user, secret = doc["Username"], doc["Secret"]
        if not isinstance(user, str) or not isinstance(secret, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise RegistryAuthError("credential helper answered no Username and Secret",
                                helper=program, host=server) from None
    return (user, secret) if secret else None
