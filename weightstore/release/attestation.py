"""Signed release provenance: ``release.json`` in a DSSE envelope, and its verification.

``weightstore release --sign KEY`` writes ``release.intoto.jsonl`` beside ``release.json``:
an in-toto attestation bundle of one line, the DSSE envelope (:mod:`weightstore.signing.dsse`)
whose payload is ``release.json``'s bytes exactly (payload type
``application/vnd.in-toto+json``). ``weightstore release --verify DIR --key PUB`` checks, in
order: the envelope's signature by one of the keys; that its payload is ``release.json``;
every subject of the Statement against the SHA-256 of the file of that name in ``DIR``;
that ``DIR`` holds no release file the Statement does not name; and that ``SHA256SUMS``
lists exactly the subjects with the same digests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SignatureError
from ..io.digests import digest_file
from ..io.files import parse_json, read_regular
from .provenance import PROVENANCE_NAME, SUMS_NAME

if TYPE_CHECKING:
    from ..signing.keys import PrivateKey, PublicKey

ATTESTATION_NAME = "release.intoto.jsonl"


def attestation(provenance: bytes, key: PrivateKey) -> bytes:
    """The attestation bundle signing ``provenance`` (``release.json``'s bytes)."""
    from ..signing.dsse import bundle_line, envelope

    return bundle_line(envelope(provenance, key))


@dataclass
class ReleaseVerification:
    folder: Path
    key: str = ""  # the public key whose signature verified
    subjects: dict[str, str] = field(default_factory=dict)  # file -> sha256
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.key) and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "ok": self.ok, "key": self.key,
                "subjects": self.subjects, "problems": self.problems}


def verify_release(folder: str | Path, keys: list[PublicKey]) -> ReleaseVerification:
    """Check a release folder's signed provenance against ``keys`` (see the module's
    text). A missing or unreadable release file, or an envelope no key verifies, is a
    :class:`SignatureError`; digests that do not match are ``problems``."""
    from ..signing.dsse import open_envelope, read_bundle

    folder = Path(folder)
    out = ReleaseVerification(folder)
    if not keys:
        raise SignatureError("no key to verify with: pass --key or trust one "
                             "(trusted-keys, $WEIGHTSTORE_TRUSTED_KEYS)")
    try:
        bundle = read_regular(folder / ATTESTATION_NAME)
    except FileNotFoundError:
        raise SignatureError("the release is not signed: no attestation",
                             file=str(folder / ATTESTATION_NAME)) from None
    provenance = read_regular(folder / PROVENANCE_NAME)
    last: SignatureError | None = None
    for doc in read_bundle(bundle):
        try:
            payload, key = open_envelope(doc, keys)
        except SignatureError as exc:
            last = exc
            continue
        if payload != provenance:
            last = SignatureError("the signed provenance is not release.json",
                                  file=str(folder / PROVENANCE_NAME))
            continue
        out.key = key.text
        break
    if not out.key:
        raise last or SignatureError("the attestation bundle is empty",
                                     file=str(folder / ATTESTATION_NAME))
    try:
        statement = parse_json(provenance)
        out.subjects = {str(s["name"]): str(s["digest"]["sha256"])
                        for s in statement["subject"]}
    except (ValueError, KeyError, TypeError):
        raise SignatureError("release.json is not an in-toto Statement with subjects",
                             file=str(folder / PROVENANCE_NAME)) from None
    for name, expected in sorted(out.subjects.items()):
        path = folder / name
        if Path(name).name != name or not path.is_file():
            out.problems.append(f"{name}: named by the provenance, missing from the folder")
        elif digest_file("sha256", path) != expected:
            out.problems.append(f"{name}: its SHA-256 is not the one the provenance signs")
    own = {SUMS_NAME, PROVENANCE_NAME, ATTESTATION_NAME}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name not in own and path.name not in out.subjects:
            out.problems.append(f"{path.name}: in the folder, not in the signed provenance")
    sums = {}
    for line in read_regular(folder / SUMS_NAME).decode(errors="replace").splitlines():
        digest, _, name = line.partition("  ")
        sums[name] = digest
    if sums != out.subjects:
        out.problems.append(f"{SUMS_NAME}: does not list exactly the signed subjects and "
                            "their digests")
    return out
