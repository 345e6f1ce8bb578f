"""Session plans: what a load hands onnxruntime, recorded for later processes.

A plan is the model handed over (its tensors pointing at ranges of files in one folder)
and each of those files' identity (:mod:`weightstore.io.identity`) as it was when its
ranges were verified. Plans are signed with the user's key
(:mod:`weightstore.caches.signed_records`), under a key made of the resolution's own key
(:mod:`weightstore.resolve.cache`) and the providers. Nothing here imports onnx or numpy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import blake3

from ..caches.signed_records import SignedRecords
from ..io.files import parse_json
from ..io.identity import Identity, identity_of
from .runtime import LoadReport, create_session

if TYPE_CHECKING:
    from ..resolve.model import ResolvedModel

FORMAT_VERSION = 2
RECORDS = SignedRecords("sessions")
FOLDER_KEY = "session.model_external_initializers_file_folder_path"


@dataclass(frozen=True)
class SessionPlan:
    """What a load hands onnxruntime: the model (its tensors pointing at ranges of files
    in ``folder``) and, for each of those files, its identity when they were verified."""

    model: bytes
    folder: str
    files: tuple[tuple[str, Identity], ...]
    live_bytes: int = 0  # the resolution's live payload bytes (for the load's report)

    def unchanged(self) -> bool:
        """Does every file still have the identity it had when verified?"""
        for name, identity in self.files:
            try:
                if identity_of(os.stat(os.path.join(self.folder, name))) != identity:
                    return False
            except OSError:
                return False
        return True

    def to_bytes(self) -> bytes:
        header = json.dumps({"folder": self.folder, "live_bytes": self.live_bytes,
                             "files": [[n, list(i)] for n, i in self.files]})
        return header.encode() + b"\n" + self.model

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionPlan | None:
        header, _, model = data.partition(b"\n")
        try:
            doc = parse_json(header)
            files = tuple((str(n), tuple(int(x) for x in i)) for n, i in doc["files"])
            return cls(model, str(doc["folder"]), files,  # type: ignore[arg-type]
                       int(doc["live_bytes"]))
        except (ValueError, KeyError, TypeError):
            return None


def plan_key(resolved: ResolvedModel, providers: Sequence[str]) -> str | None:
    """The key of a resolution's session plan, None when the resolution has no key."""
    if resolved.key is None:
        return None
    text = json.dumps([FORMAT_VERSION, resolved.key, list(providers)])
    return blake3.blake3(text.encode()).hexdigest()


def plan_session(ort: Any, plan: SessionPlan, options: Any, providers: Sequence[str],
                 report: LoadReport, *, model: str) -> Any:
    """onnxruntime's session of ``plan``: its model, external data from its folder."""
    options = options or ort.SessionOptions()
    options.add_session_config_entry(FOLDER_KEY, plan.folder)
    return create_session(ort, plan.model, options, providers, report, model=model)


def keep_plan(key: str | None, plan: SessionPlan) -> None:
    if key is not None:
        RECORDS.put(key, plan.to_bytes())


def recorded(key: str) -> SessionPlan | None:
    """The plan recorded under ``key`` whose files are all unchanged, or None."""
    body = RECORDS.get(key)
    plan = None if body is None else SessionPlan.from_bytes(body)
    return plan if plan is not None and plan.unchanged() else None
