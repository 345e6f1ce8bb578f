"""The TLS a request to a host uses: the authorities it trusts and the client certificate
it shows, read where the container ecosystem keeps them
(``docs/how-to/registry-auth-and-tls.md``, "TLS").

Trust, the first of these that is set:

- ``REQUESTS_CA_BUNDLE`` (or ``CURL_CA_BUNDLE``): a PEM bundle, or a folder of hashed
  certificates (the variable ``requests`` and pip read); nothing else is trusted;
- ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``: OpenSSL's own settings (curl, git, and Go
  programs such as skopeo read them too); nothing else is trusted;
- else the system's store (OpenSSL's default paths, where ``update-ca-certificates``
  puts a company's CA), or certifi's bundle where the system has none.

Then, for one host (``host[:port]`` as a reference writes it), its ``certs.d`` folder,
as Docker, containerd, podman and skopeo lay it out: every ``*.crt`` is a CA trusted in
addition, and ``client.cert`` with ``client.key`` (any ``<name>.cert`` with its
``<name>.key``; the first by name) is the client certificate shown when the server asks
(mTLS). The folder is ``$WEIGHTSTORE_CERTS_D/<host>`` when that variable is set, else
the first of ``$XDG_CONFIG_HOME/containers/certs.d/<host>`` (``~/.config/...``),
``/etc/containers/certs.d/<host>`` and ``/etc/docker/certs.d/<host>`` that exists.

A context is made once per process for each set of settings and host folder (loading the
system's store costs tens of milliseconds), again when the folder's files change, and
shared by every connection.
"""

from __future__ import annotations

import functools
import os
import ssl
from pathlib import Path
from typing import Any

from ..errors import WeightstoreError

CERTS_ENV = "WEIGHTSTORE_CERTS_D"
TRUST_ENV = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")


def certs_folders(env: Any = None) -> list[Path]:
    """The ``certs.d`` folders looked in, in order."""
    env = os.environ if env is None else env
    if env.get(CERTS_ENV):
        return [Path(env[CERTS_ENV])]
    config = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return [Path(config) / "containers" / "certs.d", Path("/etc/containers/certs.d"),
            Path("/etc/docker/certs.d")]


def host_folder(host: str) -> Path | None:
    """``host``'s own ``certs.d`` folder, or None."""
    if not host or "/" in host or host in (".", ".."):
        return None
    for folder in certs_folders():
        if (folder / host).is_dir():
            return folder / host
    return None


def context(host: str, error: type[WeightstoreError]) -> ssl.SSLContext:
    """The TLS context of connections to ``host``; a ``certs.d`` folder whose files cannot
    be used is ``error`` naming the file."""
    settings = tuple(os.environ.get(name) or None for name in TRUST_ENV)
    folder = host_folder(host)
    return _context(settings, folder, _signature(folder), error)


def _signature(folder: Path | None) -> tuple:
    """What tells that a ``certs.d`` folder's files changed (a context made from them is
    then made again)."""
    if folder is None:
        return ()
    try:
        with os.scandir(folder) as entries:
            return tuple(sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size)
                                for e in entries))
    except OSError:
        return ()


@functools.lru_cache(maxsize=32)
def _context(settings: tuple[str | None, ...], folder: Path | None, signature: tuple,
             error: type[WeightstoreError]) -> ssl.SSLContext:
    bundle = settings[0] or settings[1]
    if bundle:
        try:
            ctx = ssl.create_default_context(
                **({"capath": bundle} if os.path.isdir(bundle) else {"cafile": bundle}))
        except (OSError, ssl.SSLError) as exc:
            raise error(f"unusable CA bundle: {exc}", file=bundle) from None
    else:
        ctx = ssl.create_default_context()  # OpenSSL's paths, SSL_CERT_FILE/_DIR first
        if not (settings[2] or settings[3]) and not ctx.cert_store_stats()["x509_ca"]:
            import certifi

            ctx.load_verify_locations(certifi.where())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if folder is not None:
        _load_folder(ctx, folder, error)
    return ctx


def _load_folder(ctx: ssl.SSLContext, folder: Path, error: type[WeightstoreError]) -> None:
    try:
        names = sorted(entry.name for entry in os.scandir(folder))
    except OSError as exc:
        raise error(f"unreadable certs.d folder: {exc.strerror}", folder=str(folder)) from None
    for name in names:
        path = folder / name
        try:
            if name.endswith(".crt"):
                ctx.load_verify_locations(cafile=str(path))
        except (OSError, ssl.SSLError) as exc:
            raise error(f"unusable CA certificate: {exc}", file=str(path)) from None
    certs = [n for n in names if n.endswith(".cert")]
    keys = [n for n in names if n.endswith(".key")]
    for name in certs:
        if name[:-len(".cert")] + ".key" not in keys:
            raise error("a client certificate without its key", file=str(folder / name),
                        missing=name[:-len(".cert")] + ".key")
    for name in keys:
        if name[:-len(".key")] + ".cert" not in certs:
            raise error("a client key without its certificate", file=str(folder / name),
                        missing=name[:-len(".key")] + ".cert")
    if certs:
        cert = folder / certs[0]
        try:
            ctx.load_cert_chain(str(cert), str(cert.with_suffix(".key")))
        except (OSError, ssl.SSLError) as exc:
            raise error(f"unusable client certificate or key: {exc}",
                        file=str(cert)) from None
