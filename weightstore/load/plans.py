"""Session plans: what a load hands onnxruntime, recorded for later processes.

A plan is the model handed over (its tensors pointing at ranges of files in one folder),
the files it points at, and every range of theirs that the load uses, with its digest.
Plans are signed with the user's key (:mod:`weightstore.caches.signed_records`), under a
key made of the resolution's own key (:mod:`weightstore.resolve.cache`) and the
providers. A plan spares a later load the resolution and the model's building, never the
verification: each load that uses one opens the files once and verifies every range
through those descriptors while onnxruntime creates the session (:mod:`.pinned`).
Nothing here imports onnx or numpy.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import blake3

from ..caches.signed_records import SignedRecords
from ..io.files import parse_json
from .pinned import PinnedFiles, Range, Verifier
from .reader import Reader
from .runtime import LoadReport, create_session

if TYPE_CHECKING:
    from ..resolve.model import ResolvedModel

FORMAT_VERSION = 3
RECORDS = SignedRecords("sessions")
FOLDER_KEY = "session.model_external_initializers_file_folder_path"


@dataclass(frozen=True)
class SessionPlan:
    """What a load hands onnxruntime: the model (its tensors pointing at ranges of
    ``files`` in ``folder``) and the ranges of those files it uses, with their digests."""

    model: bytes
    folder: str
    files: tuple[str, ...]
    ranges: tuple[Range, ...]
    live_bytes: int = 0  # the resolution's live payload bytes (for the load's report)

    def to_bytes(self) -> bytes:
        header = json.dumps({"folder": self.folder, "live_bytes": self.live_bytes,
                             "files": list(self.files),
                             "ranges": [r.to_list() for r in self.ranges]})
        return header.encode() + b"\n" + self.model

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionPlan | None:
        header, _, model = data.partition(b"\n")
        try:
            doc = parse_json(header)
            files = tuple(str(n) for n in doc["files"])
            ranges = tuple(Range.from_list(r) for r in doc["ranges"])
            if any(r.file not in files for r in ranges):
                return None
            return cls(model, str(doc["folder"]), files, ranges, int(doc["live_bytes"]))
        except (ValueError, KeyError, TypeError):
            return None


def plan_key(resolved: ResolvedModel, providers: Sequence[str]) -> str | None:
    """The key of a resolution's session plan, None when the resolution has no key."""
    if resolved.key is None:
        return None
    text = json.dumps([FORMAT_VERSION, resolved.key, list(providers)])
    return blake3.blake3(text.encode()).hexdigest()


def plan_session(ort: Any, plan: SessionPlan, options: Any, providers: Sequence[str],
                 report: LoadReport, *, model: str, reader: Reader | None = None,
                 verified: Collection[Range] = ()) -> Any | None:
    """onnxruntime's session of ``plan`` (its model, external data from its folder),
    every range verified on this load through the files it pins (:mod:`.pinned`); None
    when a range fails, a file cannot be opened or read, or a file changed or was
    replaced meanwhile (the reason in ``report.not_in_place``). A model onnxruntime refuses
    is a :class:`LoadError`. ``verified``: ranges this load read and verified already
    (carried inline in the model), not read again."""
    try:
        pinned = PinnedFiles(plan.folder, plan.files)
    except OSError as exc:
        report.not_in_place = f"cannot open a weight file: {exc}"
        return None
    with pinned:
        verifier = Verifier(pinned, [r for r in plan.ranges if r not in verified], reader)
        verifier.start()
        try:
            options = options or ort.SessionOptions()
            options.add_session_config_entry(FOLDER_KEY, plan.folder)
            session = create_session(ort, plan.model, options, providers, report,
                                     model=model)
        finally:
            verifier.join()
        report.read_bytes += verifier.read
        if verifier.failed is not None:
            report.not_in_place = verifier.failed
            return None
        if not pinned.unchanged():
            report.not_in_place = "a weight file changed or was replaced while it was loaded"
            return None
        report.verified_bytes += verifier.read
        return session


def keep_plan(key: str | None, plan: SessionPlan) -> None:
    if key is not None:
        RECORDS.put(key, plan.to_bytes())


def recorded(key: str) -> SessionPlan | None:
    """The plan recorded under ``key``, or None."""
    body = RECORDS.get(key)
    return None if body is None else SessionPlan.from_bytes(body)

