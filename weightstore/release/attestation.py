"""Signed release provenance: ``release.json`` in a DSSE envelope, and its verification.

``weightstore release --sign KEY`` writes ``release.intoto.jsonl`` beside ``release.json``:
an in-toto attestation bundle of one line, the DSSE envelope (:mod:`weightstore.signing.dsse`)
whose payload is ``release.json``'s bytes exactly (payload type
``application/vnd.in-toto+json``). ``weightstore release --verify DIR --key PUB`` checks, in
order: the envelope's signature by one of the keys; that its payload is ``release.json``;
every subject of the Statement against the SHA-256 of the regular file of that name in
``DIR`` (a link, even to the right bytes, is not one), and every companion file's subject
(``<top folder>/<path>``) against that file in the archive of that top folder, read as
``unpack`` reads it from the start up to the last companion (they come before the
weights, which are not decompressed: the archive's signed SHA-256 covers them); that
``DIR`` holds nothing else (no file, folder, link or FIFO) but
``SHA256SUMS``, ``release.json`` and the attestation; and that ``SHA256SUMS`` is exactly
what release writes of the subjects that are files of ``DIR`` (not the companions inside
archives, which their archive's line covers), so that no line ``sha256sum -c`` would
fail (a wrong digest, a file not there, a name twice) can pass.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SignatureError
from ..io.digests import digest_file
from ..io.files import parse_json, read_regular
from ..packaging.unpack import SUFFIX
from .provenance import PROVENANCE_NAME, SUMS_NAME, FileRecord, render_sums

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


def _is_regular(path: Path) -> bool:
    """A regular file itself, not a link to one (nor a FIFO: never opened)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


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
    own = {SUMS_NAME, PROVENANCE_NAME, ATTESTATION_NAME}
    for name in sorted(os.listdir(folder)):  # anything else, of any kind, is no release's
        if name not in own and name not in out.subjects:
            out.problems.append(f"{name}: in the folder, not in the signed provenance")
    files, members = _split_subjects(out.subjects)
    intact = set()
    for name, expected in sorted(files.items()):
        path = folder / name
        if Path(name).name != name or not _is_regular(path):
            out.problems.append(f"{name}: named by the provenance, not a file of the folder "
                                "(missing, a link, a folder, a FIFO or a device)")
        elif digest_file("sha256", path) != expected:
            out.problems.append(f"{name}: its SHA-256 is not the one the provenance signs")
        else:
            intact.add(name)
    for archive, inside in sorted(members.items()):
        if archive in intact:  # one that is not: named above, its members not read
            out.problems += _member_problems(folder / archive, inside)
        elif archive not in files:
            out.problems += [f"{archive.removesuffix(SUFFIX)}/{path}: named by the "
                             "provenance, not a file of an archive it signs"
                             for path in sorted(inside)]
    sums = render_sums([FileRecord(name, digest) for name, digest in files.items()])
    if read_regular(folder / SUMS_NAME) != sums:
        out.problems.append(f"{SUMS_NAME}: is not the list release writes of the signed "
                            "subjects and their digests (one line each, in order, nothing "
                            "else)")
    return out


def _split_subjects(subjects: dict[str, str]) -> tuple[dict[str, str],
                                                       dict[str, dict[str, str]]]:
    """The folder's files, and the companion files inside archives by archive name
    (``<top folder>.tar.zst``) and path in the package."""
    files: dict[str, str] = {}
    members: dict[str, dict[str, str]] = {}
    for name, digest in subjects.items():
        root, sep, path = name.partition("/")
        if sep:
            members.setdefault(f"{root}{SUFFIX}", {})[path] = digest
        else:
            files[name] = digest
    return files, members


def _member_problems(archive: Path, expected: dict[str, str]) -> list[str]:
    """The companion subjects of ``archive`` its files do not match: the archive read as
    ``unpack`` reads it (a member its summary does not hold is refused there) up to the
    last of them, which is near its start (the companions come before the weights), and no
    further: its own SHA-256, already matched, vouches for the rest of its bytes."""
    from ..errors import IntegrityError, PackageError
    from ..packaging.unpack import read_archive

    root = archive.name.removesuffix(SUFFIX)
    try:
        found = read_archive(archive, sha256_of=set(expected), until=set(expected)).sha256
    except (PackageError, IntegrityError) as exc:
        return [f"{archive.name}: {exc}"]
    return [f"{root}/{path}: " + ("its SHA-256 is not the one the provenance signs"
                                  if path in found else "not a file of its archive")
            for path, digest in sorted(expected.items()) if found.get(path) != digest]
