"""Ed25519 keys: generated, read, written and trusted.

A private key is a PKCS#8 PEM file, written 0600 by ``weightstore key generate``, or the
same PEM text in ``$WEIGHTSTORE_SIGNING_KEY`` (a CI secret), or that PEM base64-encoded on
one line in ``$WEIGHTSTORE_SIGNING_KEY_B64`` (``base64 -w0 ci.pem``: a value a CI secret
store can mask, which GitLab refuses for text with newlines). A key file that others may
read or write (any group or other permission bit) or that another user owns is refused.

A public key is written ``ed25519:<64 hex digits>`` (the raw 32-byte key). Its key id is
the one securesystemslib and TUF give it: the SHA-256 of the canonical JSON
``{"keytype": "ed25519", "keyval": {"public": "<hex>"}, "scheme": "ed25519"}``, so that
their verifiers match our signatures to the key by id.

Trusted public keys come from ``<user config folder>/trusted-keys`` (one per line; ``#``
starts a comment) and ``$WEIGHTSTORE_TRUSTED_KEYS`` (separated by spaces, commas or new
lines): either, or both, may list several (key rotation). A ``trusted-keys`` file that
others may write, that another user owns, or that lies in a folder others may change is
refused, as OpenSSH refuses such an ``authorized_keys``.

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
from ..io.files import fsync_dir, open_regular, read_regular, write_all
from ..store.location import user_config_dir

PUBLIC_PREFIX = "ed25519:"
SIGNING_KEY_ENV = "WEIGHTSTORE_SIGNING_KEY"
SIGNING_KEY_B64_ENV = "WEIGHTSTORE_SIGNING_KEY_B64"
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
    if os.path.exists(path):
        _refuse_open_folders(path, "the trusted-keys file")
        data = _owned_bytes(path, "the trusted-keys file", others=0o022, chmod="chmod go-w")
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
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
    """The private key in the file at ``path``, else in ``$WEIGHTSTORE_SIGNING_KEY``
    (the PEM) or ``$WEIGHTSTORE_SIGNING_KEY_B64`` (the PEM in base64), not both."""
    env = dict(os.environ) if env is None else env
    if path is None:
        return _private(*_key_from_env(env))
    path = Path(path)
    data = _owned_bytes(path, "the signing key file", others=0o077, chmod="chmod 600")
    return _private(data, file=str(path))


def _key_from_env(env: dict[str, str]) -> tuple[bytes, str]:
    """The PEM bytes the environment holds and the variable that holds them."""
    pem, encoded = env.get(SIGNING_KEY_ENV), env.get(SIGNING_KEY_B64_ENV)
    if pem and encoded:
        raise SignatureError(f"set only one of ${SIGNING_KEY_ENV} and "
                             f"${SIGNING_KEY_B64_ENV}")
    if pem:
        return pem.encode(), SIGNING_KEY_ENV
    if not encoded:
        raise SignatureError(f"no signing key: pass a key file or set ${SIGNING_KEY_ENV} "
                             f"(or ${SIGNING_KEY_B64_ENV})")
    import base64
    import binascii

    try:  # a secret store may keep a trailing new line or wrap the lines
        return base64.b64decode("".join(encoded.split()), validate=True), SIGNING_KEY_B64_ENV
    except (binascii.Error, ValueError):
        raise SignatureError("the signing key is not base64 (base64 -w0 the PEM file)",
                             variable=SIGNING_KEY_B64_ENV) from None


def _owned_bytes(path: Path, what: str, *, others: int, chmod: str) -> bytes:
    """The bytes of ``path``, a file only its owner may change (as OpenSSH asks of a
    private key and of ``authorized_keys``): one line naming the file and what is wrong
    when any of the permission bits ``others`` is set or another user owns it. The
    descriptor read is the one judged."""
    try:
        f = os.fdopen(open_regular(path), "rb")
    except OSError as exc:
        raise SignatureError(f"cannot read {what}: {exc.strerror or exc}",
                             file=str(path)) from None
    with f:
        st = os.fstat(f.fileno())
        if not hasattr(os, "geteuid"):  # no POSIX owners or modes to judge
            return f.read()
        if st.st_mode & others:
            raise SignatureError(f"{what} is open to other users: {chmod} it",
                                 file=str(path), mode=oct(stat.S_IMODE(st.st_mode)))
        if st.st_uid != os.geteuid():
            raise SignatureError(f"{what} belongs to another user", file=str(path),
                                 owner=st.st_uid)
        return f.read()


def _refuse_open_folders(path: Path, what: str) -> None:
    """Refuse ``path`` when a folder above it (as named, and as links resolve it) lets
    another user replace it: one of another user than this one or root, or writable by
    group or others without the sticky bit (``/tmp``'s, which keeps each name its
    owner's). OpenSSH's ``StrictModes`` walk for ``authorized_keys``."""
    if not hasattr(os, "geteuid"):
        return
    folders = dict.fromkeys([*Path(os.path.abspath(path)).parents,
                             *Path(os.path.realpath(path)).parents])
    for folder in folders:
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if st.st_uid not in (os.geteuid(), 0):
            raise SignatureError(f"{what} is in a folder of another user", file=str(path),
                                 folder=str(folder), owner=st.st_uid)
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise SignatureError(f"{what} is in a folder other users can write: chmod go-w "
                                 "it", file=str(path), folder=str(folder),
                                 mode=oct(stat.S_IMODE(st.st_mode)))


def _private(data: bytes, variable: str | None = None, **where: str) -> PrivateKey:
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(data.strip() + b"\n", password=None)
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"not a PEM private key: {exc}", variable=variable,
                             **where) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SignatureError("the signing key is not an Ed25519 key", variable=variable,
                             **where)
    return PrivateKey(key)


def _make_private_folders(folder: Path) -> None:
    """Create ``folder`` and the folders above it that do not exist yet, each 0700 (as
    ssh-keygen creates ``~/.ssh``): a fresh home has no ``~/.config/weightstore``."""
    missing = []
    while not os.path.lexists(folder) and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        try:
            os.mkdir(created, 0o700)
        except FileExistsError:
            continue  # made meanwhile: its maker chose its mode
        except OSError as exc:
            raise SignatureError(f"cannot create the key's folder: {exc.strerror or exc}",
                                 folder=str(created)) from None
        os.chmod(created, 0o700)  # whatever the umask


def generate(path: str | os.PathLike[str]) -> PublicKey:
    """A new key pair: the private key written to ``path`` (0600; an existing file is
    refused; missing folders above it are created 0700), the public key returned."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    text = os.fspath(path)
    if text.endswith(("/", os.sep)) or os.path.isdir(text):
        raise SignatureError("a key file path is needed, not a folder", file=text)
    path = Path(path)
    if os.path.lexists(path):
        raise SignatureError("refusing to overwrite an existing file", file=str(path))
    _make_private_folders(path.parent)
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
