"""The accuracy gate: each scenario of a model measured on the recipe's samples against
the model's default graph, with onnxruntime, and held to the scenario's bounds.

The graphs are those ``weightstore run`` loads from the package being written (resolved
from its model file, the default graph and each scenario's), run on one thread with a
fixed graph optimization level; each output's cosine similarity (float64) and largest
absolute difference are rounded to 6 significant digits, so that a rebuild writes the
same ``summary.json`` whatever the machine's thread count. The figures are measured once
per build, on the first package written, and every layout records them; a bound missed
is an :class:`~weightstore.errors.AccuracyError` before that package is published.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import AccuracyError, RecipeError

if TYPE_CHECKING:
    from ..package.fingerprint import FileDigests
    from ..recipe.schema import LoadedRecipe, ModelEntry

SAMPLES_LIMIT = 1 << 30  # bytes all the arrays of one samples file may hold
DIGITS = 6  # significant digits of every recorded figure


def samples_digest(loaded: LoadedRecipe, entry: ModelEntry,
                   digests: FileDigests) -> str | None:
    """The digest of the model's samples file (its part of the fingerprint), None without
    one; a file that cannot be read is a :class:`RecipeError`."""
    path = loaded.samples_of(entry)
    if path is None:
        return None
    try:
        return digests.of(path)
    except OSError as exc:
        raise RecipeError(f"cannot read the samples: {exc.strerror or exc}", file=str(path),
                          key=_key(loaded, entry)) from None


def _key(loaded: LoadedRecipe, entry: ModelEntry) -> str:
    if entry.samples is not None:
        return f"models[{loaded.recipe.models.index(entry)}].samples"
    return "samples"


@dataclass
class _ModelSamples:
    name: str
    digest: str
    feed: dict[str, Any]
    scenarios: list[tuple[str, dict[str, float] | None]]  # name, bounds


@dataclass
class Gate:
    """The measurements a build makes: the models with samples and scenarios, their
    inputs read and checked against each model's inputs."""

    models: list[_ModelSamples]
    figures: list[dict[str, Any]] | None = field(default=None)

    def __call__(self, folder: Path, files: Mapping[str, str]) -> list[dict[str, Any]]:
        """The figures (measured in the package being written at ``folder``, its model
        files by model name, on the first call), every bound checked."""
        if self.figures is None:
            figures = []
            for m in self.models:
                figures += measure_model(folder / files[m.name], m.name, m.scenarios,
                                         m.feed, m.digest)
            check_bounds(figures)
            self.figures = figures
        return self.figures


def gate(loaded: LoadedRecipe, sources: Sequence[Any],
         digests: FileDigests) -> Gate | None:
    """The build's gate over its opened ``sources`` (scenarios prepared), None when no
    model has both samples and scenarios. Each samples file is read here, before
    anything is stored, and must fit its model's inputs."""
    models = []
    by_name = {m.name: m for m in loaded.recipe.models}
    for s in sources:
        entry = by_name[s.name]
        path = loaded.samples_of(entry)
        if path is None or not s.scenarios:
            continue
        digest = samples_digest(loaded, entry, digests)
        assert digest is not None
        feed = read_samples(path, _key(loaded, entry))
        check_fit(s.weights.catalogue.model, feed, path, _key(loaded, entry))
        bounds = {sc.name: sc.bounds.record() for sc in entry.scenarios
                  if sc.bounds is not None}
        models.append(_ModelSamples(s.name, digest, feed,
                                    [(sc.name, bounds.get(sc.name)) for sc in s.scenarios]))
    return Gate(models) if models else None


def read_samples(path: Path, key: str) -> dict[str, Any]:
    """The named arrays of a samples file, read safely (:mod:`weightstore.io.npz`)."""
    from ..io.npz import read_npz

    def error(message: str, **context: Any) -> RecipeError:
        return RecipeError(message, key=key, **context)

    return read_npz(path, error, what="the samples", limit=SAMPLES_LIMIT)


def check_fit(model: Any, feed: Mapping[str, Any], path: Path, key: str) -> None:
    """Every input of ``model``'s graph has an array of its element type and shape (a
    symbolic dimension takes any size), and every array is an input."""
    from ..io.onnx_arrays import np_dtype

    inits = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    names = {i.name for i in inputs}

    def fail(message: str) -> None:
        raise RecipeError(f"the samples do not fit the model: {message}", file=str(path),
                          key=key)

    for name in feed:
        if name not in names:
            fail(f"'{name}' is not an input of the model (inputs: {', '.join(sorted(names))})")
    for value in inputs:
        if value.name not in feed:
            fail(f"no array for input '{value.name}'")
        array = feed[value.name]
        tensor = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            fail(f"input '{value.name}' is not a tensor")
        expected = np_dtype(tensor.elem_type)
        if array.dtype != expected:
            fail(f"input '{value.name}' is {expected}, the array {array.dtype}")
        if tensor.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
            if len(dims) != array.ndim or any(
                    d is not None and d != n for d, n in zip(dims, array.shape, strict=True)):
                shown = ["?" if d is None else d for d in dims]
                fail(f"input '{value.name}' has shape {shown}, the array "
                     f"{list(array.shape)}")


def session_options(ort: Any) -> Any:
    """onnxruntime's options of every measurement: one thread for the operators and
    between them, a fixed optimization level, deterministic kernels where it has them,
    warnings kept off the build's output."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if hasattr(options, "use_deterministic_compute"):
        options.use_deterministic_compute = True
    options.log_severity_level = 3
    return options


def _outputs(model_file: Path, scenario: str | None, feed: Mapping[str, Any],
             where: dict[str, str]) -> dict[str, Any]:
    """The outputs of the model's graph (``scenario``'s, or the default) on ``feed``, as
    ``weightstore run`` resolves and loads it."""
    from ..load.ready import load, runtime
    from ..resolve.api import resolve

    ort = runtime()
    with resolve(model_file, scenario=scenario, cache=False) as resolved:
        session = load(resolved, session_options=session_options(ort), in_place=False)
        names = [o.name for o in session.get_outputs()]
        try:
            values = session.run(None, dict(feed))
        except Exception as exc:  # onnxruntime's own classes
            detail = " ".join(str(exc).split())
            raise AccuracyError(f"the model did not run on the samples: {detail}",
                                **where) from None
    return dict(zip(names, values, strict=True))


def measure_model(model_file: Path, model: str,
                  scenarios: Sequence[tuple[str, dict[str, float] | None]],
                  feed: Mapping[str, Any], samples: str) -> list[dict[str, Any]]:
    """The figures of each of ``scenarios`` (name, bounds) of the model in ``model_file``
    against its default graph, on ``feed`` (the samples whose digest is ``samples``)."""
    reference = _outputs(model_file, None, feed, {"model": model})
    out = []
    for name, bounds in scenarios:
        got = _outputs(model_file, name, feed, {"model": model, "scenario": name})
        outputs = []
        for output, expected in reference.items():
            if output not in got:
                raise AccuracyError(f"model '{model}' scenario '{name}' has no output "
                                    f"'{output}' to compare with the default graph's")
            outputs.append({"name": output, **figures(expected, got[output],
                                                      f"model '{model}' scenario '{name}' "
                                                      f"output '{output}'")})
        entry: dict[str, Any] = {"model": model, "scenario": name, "samples": samples,
                                 "outputs": outputs}
        if bounds is not None:
            entry["bounds"] = dict(bounds)
        out.append(entry)
    return out


def figures(expected: Any, got: Any, what: str) -> dict[str, float | None]:
    """Cosine similarity and largest absolute difference of two outputs, in float64,
    rounded to :data:`DIGITS` significant digits (None where a value is not finite)."""
    import numpy as np

    if np.shape(expected) != np.shape(got):
        raise AccuracyError(f"{what} has shape {list(np.shape(got))}, the default graph's "
                            f"{list(np.shape(expected))}")
    a = np.asarray(expected, dtype=np.float64).ravel()
    b = np.asarray(got, dtype=np.float64).ravel()
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return {"cosine": None, "max_abs": None}
    norms = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
    if norms == 0.0:
        cosine = 1.0 if not a.any() and not b.any() else 0.0
    else:
        cosine = max(-1.0, min(1.0, float(np.dot(a, b)) / norms))
    max_abs = float(np.max(np.abs(a - b))) if a.size else 0.0
    return {"cosine": rounded(cosine), "max_abs": rounded(max_abs)}


def rounded(value: float) -> float:
    return float(f"{value:.{DIGITS}g}")


def missed(entry: Mapping[str, Any]) -> str | None:
    """The first bound ``entry``'s figures miss, in words, None when all hold."""
    bounds = entry.get("bounds") or {}
    for output in entry["outputs"]:
        at = (f"model '{entry['model']}' scenario '{entry['scenario']}' output "
              f"'{output['name']}'")
        low = bounds.get("min_cosine")
        if low is not None and (output["cosine"] is None or output["cosine"] < low):
            return f"{at}: cosine {_shown(output['cosine'])} is below min_cosine {low:.6g}"
        high = bounds.get("max_abs")
        if high is not None and (output["max_abs"] is None or output["max_abs"] > high):
            return f"{at}: max_abs {_shown(output['max_abs'])} is above max_abs {high:.6g}"
    return None


def _shown(value: float | None) -> str:
    return "not finite" if value is None or not math.isfinite(value) else f"{value:.6g}"


def check_bounds(entries: Sequence[Mapping[str, Any]]) -> None:
    """Refuse the first bound missed: one line naming model, scenario, output, figure."""
    for entry in entries:
        problem = missed(entry)
        if problem is not None:
            raise AccuracyError(f"accuracy gate: {problem}")
