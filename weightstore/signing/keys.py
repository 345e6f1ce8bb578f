"""Ed25519 keys: generated, read, written and trusted.

A private key is a PKCS#8 PEM file, written 0600 by ``weightstore key generate``, or the
same PEM text in ``$WEIGHTSTORE_SIGNING_KEY`` (a CI secret). A key file that others may
read or write (any group or other permission bit) or that another user owns is refused.

A public key is written ``ed25519:<64 hex digits>`` (the raw 32-byte key). Its key id is
the one securesystemslib and TUF give it: the SHA-256 of the canonical JSON
``{"keytype": "ed25519", "keyval": {"public": "<hex>"}, "scheme": "ed25519"}``, so that
their verifiers match our signatures to the key by id.

Trusted public keys come from ``<user config folder>/trusted-keys`` (one per line; ``#``
starts a comment) and ``$WEIGHTSTORE_TRUSTED_KEYS`` (separated by spaces, commas or new
lines): either, or both, may list several (key rotation).

Signing needs ``cryptography`` (``pip install 'weightstore[sign]'``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SignatureError
from ..io.files import fsync_dir, read_regular, write_all
from ..store.location import user_config_dir

PUBLIC_PREFIX = "ed25519:"
SIGNING_KEY_ENV = "WEIGHTSTORE_SIGNING_KEY"
TRUSTED_KEYS_ENV = "WEIGHTSTORE_TRUSTED_KEYS"
TRUSTED_KEYS_FILE = "trusted-keys"
_PUBLIC = re.compile(r"ed25519:([0-9a-f]{64})")


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise SignatureError("signing needs cryptography: pip install "
                             "'weightstore[sign]'") from None
    return ed25519


@dataclass(frozen=True)
class PublicKey:
    raw: bytes  # 32 bytes

    @property
    def text(self) -> str:
        return PUBLIC_PREFIX + self.raw.hex()

    @property
    def keyid(self) -> str:
        doc = {"keytype": "ed25519", "keyval": {"public": self.raw.hex()},
               "scheme": "ed25519"}
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def verifies(self, signature: bytes, data: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            _crypto().Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, data)
        except (InvalidSignature, ValueError):
            return False
        return True


class PrivateKey:
    """A loaded private key; ``public`` is its public half."""

    def __init__(self, key: Any) -> None:
        self._key = key
        from cryptography.hazmat.primitives import serialization

        self.public = PublicKey(key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw))

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)  # Ed25519: the same bytes always give one signature


def parse_public(text: str) -> PublicKey:
    """``ed25519:<hex>``, or a file holding it (first non-comment line)."""
    value = text.strip()
    if not _PUBLIC.fullmatch(value) and os.path.isfile(value):
        lines = [ln.split("#", 1)[0].strip() for ln in read_regular(value).decode(
            errors="replace").splitlines()]
        value = next((ln for ln in lines if ln), "")
    match = _PUBLIC.fullmatch(value.lower())
    if match is None:
        raise SignatureError("not a public key: expected ed25519:<64 hex digits> or a file "
                             "holding one", key=text.strip()[:80])
    return PublicKey(bytes.fromhex(match.group(1)))


def trusted_keys(env: dict[str, str] | None = None) -> list[PublicKey]:
    """The trusted public keys: the user's ``trusted-keys`` file and the environment."""
    env = dict(os.environ) if env is None else env
    found: list[PublicKey] = []
    path = user_config_dir(env) / TRUSTED_KEYS_FILE
    if path.is_file():
        for n, line in enumerate(read_regular(path).decode(errors="replace").splitlines(), 1):
            value = line.split("#", 1)[0].strip()
            if value:
                try:
                    found.append(parse_public(value))
                except SignatureError as exc:
                    raise SignatureError(exc.message, file=str(path), line=n) from None
    for value in re.split(r"[\s,]+", env.get(TRUSTED_KEYS_ENV, "")):
        if value:
            try:
                found.append(parse_public(value))
            except SignatureError as exc:
                raise SignatureError(exc.message, variable=TRUSTED_KEYS_ENV) from None
    return list(dict.fromkeys(found))


def load_private(path: str | os.PathLike[str] | None = None,
                 env: dict[str, str] | None = None) -> PrivateKey:
    """The private key in the file at ``path``, else in ``$WEIGHTSTORE_SIGNING_KEY``."""
    env = dict(os.environ) if env is None else env
    if path is None:
        text = env.get(SIGNING_KEY_ENV)
        if not text:
            raise SignatureError("no signing key: pass a key file or set "
                                 f"${SIGNING_KEY_ENV}")
        return _private(text.encode(), variable=SIGNING_KEY_ENV)
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SignatureError(f"cannot read the signing key: {exc.strerror}",
                             file=str(path)) from None
    if st.st_mode & 0o077:
        raise SignatureError("the signing key file is open to other users: chmod 600 it",
                             file=str(path), mode=oct(stat.S_IMODE(st.st_mode)))
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise SignatureError("the signing key file belongs to another user", file=str(path))
    return _private(read_regular(path), file=str(path))


def _private(data: bytes, **where: str) -> PrivateKey:
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(data.strip() + b"\n", password=None)
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"not a PEM private key: {exc}", **where) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError("the signing key is not an Ed25519 key", **where)
    return PrivateKey(key)


def generate(path: str | os.PathLike[str]) -> PublicKey:
    """A new key pair: the private key written to ``path`` (0600; an existing file is
    refused), the public key returned."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    path = Path(path)
    if os.path.lexists(path):
        raise SignatureError("refusing to overwrite an existing file", file=str(path))
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:  # 0600 from its creation; linked into place only whole, never over a file
        write_all(fd, pem, 0)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise SignatureError("refusing to overwrite an existing file",
                                 file=str(path)) from None
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp)
    fsync_dir(path.parent)
    return PrivateKey(key).public
