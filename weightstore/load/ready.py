"""``weightstore.load``: a ready session, recorded for later processes.

A load whose live weights are plain byte ranges of the package's own files hands
onnxruntime a model pointing at those ranges (:mod:`.session`, the direct load): the
weights are verified on a second thread while onnxruntime creates the session, and the
session is handed over only when both are done. Such a load then records its *session
plan* for later processes: the model it handed over, the files it points at and each range
it uses with its digest, signed with the
user's key (:mod:`weightstore.caches.signed_records`) under a key made of the
resolution's own key (:mod:`weightstore.resolve.cache`) and the providers.

A later load of the same resolution finds the plan and creates the session from the
recorded model, with neither the resolution's phases nor onnx nor numpy. It still opens
every file the model points at and verifies every range it uses, through those very
descriptors, while onnxruntime creates the session, and hands the session over only when
each range matched and each path still names the file it opened (:mod:`.pinned`): file
identity proves nothing about content, so no load trusts it. A range that fails, or a
file changed meanwhile, drops the plan; the load then resolves, reads and verifies
everything again, naming what failed or falling back to dormant payloads.

As with onnxruntime's own loading of external data, the session maps the package files:
a package is replaced by renaming (as weightstore writes one), not rewritten in place
while sessions use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import LoadError
from .plans import RECORDS, plan_key, plan_session, recorded
from .runtime import LoadReport

if TYPE_CHECKING:
    from ..resolve.model import ResolvedModel
    from .manager import WeightManager
    from .reader import Reader


def runtime() -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise LoadError("loading needs onnxruntime: pip install 'weightstore[runtime]'") from None
    return ort


def load(resolved: ResolvedModel, *, buffers: Mapping[str, Any] | None = None,
         reader: Reader | None = None, jobs: int = 4, manager: WeightManager | None = None,
         providers: Sequence[str] = ("CPUExecutionProvider",),
         session_options: Any = None, report: LoadReport | None = None,
         in_place: bool = True) -> Any:
    """An onnxruntime session of ``resolved``, reading exactly its active payloads.

    ``buffers`` (file name -> bytes-like) supply payloads from the caller's memory (GE's
    user memory by file name), verified like bytes read; the weights onnxruntime packs are
    handed over without a copy (the caller keeps the memory unchanged while the session
    is created), the others are copied into the load's private data file.

    With prepared weights bound (``weightstore prepare``), the session is created from the
    prepared companion; a packed payload failing its checksum makes it fall back to the
    portable weights (read anyway: onnxruntime checks packed weights against them).

    Otherwise a load of a package's plain weights hands onnxruntime the package's own
    files, verified while it creates the session (:mod:`.direct`), and records its plan;
    a later load of the same resolution takes the model from that plan and verifies every
    range again, through the files it pins (see the module's text). The rest goes through
    the load's private data files (:mod:`.session`), as everything does with
    ``in_place=False``: weights another session of the process holds (``manager``, by
    default the process's own) are then shared, not read again.
    """
    ort = runtime()
    report = report if report is not None else LoadReport()
    key = None if buffers or not in_place or resolved.prepared_graph is not None else (
        plan_key(resolved, providers))
    plan = None if key is None else recorded(key)
    if plan is not None:
        mine = LoadReport()  # the caller's report learns of this load only if it succeeds
        try:
            session = plan_session(ort, plan, session_options, providers, mine,
                                   model=str(resolved.source.path), reader=reader)
        except LoadError:  # refused (another onnxruntime?): loaded and recorded anew
            session = None
        if session is not None:
            report.read_bytes += mine.read_bytes
            report.verified_bytes += mine.verified_bytes
            report.runtime_seconds += mine.runtime_seconds
            report.files_pinned = len(plan.files)
            report.live_bytes = plan.live_bytes
            report.from_record = True
            return session
        RECORDS.drop(key)  # type: ignore[arg-type]
        report.not_in_place = mine.not_in_place
    from .manager import WEIGHTS
    from .session import copied_session, runnable_model

    model = runnable_model(resolved)
    if resolved.prepared_graph is not None and not buffers:
        from .prepared import prepared_session

        session = prepared_session(ort, resolved, reader=reader, jobs=jobs, report=report,
                                   providers=providers, session_options=session_options)
        if session is not None:
            return session
        resolved = resolved.without_prepared()  # a packed payload failed: portable weights
    if not buffers and in_place:
        from .direct import direct_session

        session = direct_session(ort, resolved, model, reader=reader, jobs=jobs,
                                 providers=providers, session_options=session_options,
                                 report=report, plan_key=key)
        if session is not None:
            return session
        model = runnable_model(resolved)  # the direct load changed its copy
    return copied_session(ort, resolved, model, buffers=buffers, reader=reader, jobs=jobs,
                          manager=manager or WEIGHTS, providers=providers,
                          session_options=session_options, report=report)
