"""What a load hands onnxruntime, and what it records: the session created from a model
file (timed, its refusal a typed error), tensors pointed at the load's data files, and the
load's report. Shared by the portable load (:mod:`.session`) and the prepared one
(:mod:`.prepared`), neither of which imports the other for it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import LoadError

if TYPE_CHECKING:
    from ..io.onnx_proto import TensorProto


@dataclass
class LoadReport:
    """What one load did: bytes read, entries shared from the manager, fallbacks, and the
    seconds onnxruntime itself took to create the session (the rest is reading and
    verifying)."""

    read_bytes: int = 0
    live_bytes: int = 0
    entries_read: int = 0
    entries_shared: int = 0
    fell_back: dict[str, str] = field(default_factory=dict)
    runtime_seconds: float = 0.0
    # bytes verified against their digests on this load (every byte handed over is)
    verified_bytes: int = 0
    # a session plan recorded earlier (:mod:`.ready`) was used: the resolution and the
    # model handed over came from records; these files were opened and their ranges
    # verified on this load (:mod:`.pinned`)
    from_record: bool = False
    files_pinned: int = 0
    # why the package's files could not be handed over in place (a range failed its
    # digest, a file changed meanwhile): the load read them into files of its own
    not_in_place: str | None = None


def create_session(ort: Any, path: Path | bytes, options: Any, providers: Sequence[str],
                   report: LoadReport, *, model: str) -> Any:
    """onnxruntime's session of the model file at ``path`` (or of the serialized model),
    timed into ``report``; a model onnxruntime refuses is a :class:`LoadError` naming
    ``model`` (where it came from)."""
    start = time.perf_counter()
    try:
        return ort.InferenceSession(path if isinstance(path, bytes) else str(path), options,
                                    providers=list(providers))
    except Exception as exc:  # onnxruntime's own classes (Fail, InvalidGraph, ...) only
        detail = " ".join(str(exc).split())
        raise LoadError(f"onnxruntime refused the model: {detail}", model=model) from exc
    finally:
        report.runtime_seconds += time.perf_counter() - start


def point_at(tensor: TensorProto, name: str, offset: int, length: int,
             extra: Sequence[tuple[str, str]] = ()) -> None:
    """Make ``tensor``'s payload ``length`` bytes of file ``name`` at ``offset``."""
    from ..io.onnx_proto import TensorProto

    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", name), ("offset", str(offset)), ("length", str(length)),
                       *extra):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
