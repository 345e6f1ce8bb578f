"""Recipe format: pydantic models, a YAML loader that reports precise locations, and the schema.

Every error a user can make in a recipe becomes one :class:`RecipeError` naming the file, the
1-based line and the dotted key (``layouts[1].alignment``), because the line is what an editor
jumps to and the key is what a test can assert on. The models double as the JSON Schema, so
each field carries a ``description`` that editors show as hover help.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..errors import RecipeError
from ..io.files import MAX_ALIGNMENT, alignment_problem, atomic_write_bytes
from ..io.net import loopback_name
from .file import RECIPE_SIZE_LIMIT, read_recipe_file
from .formats import LAYOUT_KEYS_SINCE
from .pass_params import (
    PASS_PARAMS,
    PassParams,
    PassStep,
    canonical,
    step,
    takes_parameters,
)

# One path component: the first character is alphanumeric, so "." and ".." (and hidden names,
# and anything with a separator) can never match. Pydantic checks it with an end-anchored
# regex engine, so a trailing newline does not slip through either.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
NAME_MAX_LENGTH = 128
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_TITLE = "weightstore recipe"
DEFAULT_SCHEMA_PATH = Path("schemas") / "recipe.schema.json"

Loc = tuple[str | int, ...]


def _constraints(**constraints: Any) -> tuple[Any, ...]:
    """The metadata ``Field(**constraints)`` stands for, to put inside ``Annotated``.

    A type that holds a ``Field`` cannot take a field's ``Field(description=...)`` on
    pydantic 2.0 ("Field may not be used twice on the same field"); the constraints' own
    metadata can, on every pydantic 2, and gives the same validation and JSON Schema.
    """
    return tuple(Field(**constraints).metadata)


Name = Annotated[(str, *_constraints(pattern=NAME_PATTERN, max_length=NAME_MAX_LENGTH))]
NonEmpty = Annotated[(str, *_constraints(min_length=1))]


def _no_nul(value: str) -> str:
    """No file system takes a NUL in a path: refuse it here, where its key is known."""
    if "\x00" in value:
        raise PydanticCustomError("nul_in_path", "path contains a NUL byte")
    return value


PathText = Annotated[NonEmpty, AfterValidator(_no_nul)]


class _Model(BaseModel):
    """Shared config: unknown keys are errors, values are immutable, YAML types are kept.

    Strict mode stops ``version: 1.0`` or ``alignment: true`` from being coerced silently.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _require_unique_names(items: Iterable[Any], kind: str) -> None:
    """Raise on the second use of a name; ``index`` lets the loader point at that entry."""
    first_index: dict[str, int] = {}
    for index, item in enumerate(items):
        if item.name in first_index:
            raise PydanticCustomError(
                "duplicate_name",
                "duplicate {kind} name '{name}' (already used by entry {first})",
                {"kind": kind, "name": item.name, "first": first_index[item.name], "index": index},
            )
        first_index[item.name] = index


class StoreConfig(_Model):
    """Where weights are kept and how they are addressed."""

    path: PathText | None = Field(
        None,
        description="Folder of the content-addressed weight store, relative to the recipe's "
        "folder. Omit to use the build command's default.",
    )
    hash: Literal["blake3", "sha256"] = Field(
        "blake3", description="Digest algorithm that names every stored weight blob."
    )


class CacheConfig(_Model):
    """A registry-backed build cache: repositories whose signed entries a build fetches
    instead of converting, and the one it stores its entries in
    (docs/reference/formats/build-records.md)."""

    read: list[str] = Field(
        default_factory=list,
        description="Registry repositories (host/name, no tag) read for entries, in order.",
    )
    write: str | None = Field(
        None, description="Registry repository entries are pushed to (signed) after a build "
        "that converted."
    )


RESERVED_SCENARIO_NAMES = frozenset({"auto", "common", "default"})

PassName = Literal[tuple(PASS_PARAMS)]  # type: ignore[valid-type]
_BARE_PASS = "<pass name>"  # the union's tags (never in an error's key)
_PASS_TAG = "<pass {}>"


def _pass_entry(name: str, params: type[PassParams]) -> type[PassParams]:
    """The mapping form of pass ``name``: its name and its parameters."""
    title = "".join(part.title() for part in name.split("-")) + "Pass"
    model: type[PassParams] = create_model(  # type: ignore[call-overload]
        title, __base__=params, __doc__=f"The '{name}' pass with its parameters.",
        name=(Literal[name], Field(description="The pass.")))
    return model


_PASS_ENTRIES = {name: _pass_entry(name, params) for name, params in PASS_PARAMS.items()}


def _pass_kind(value: object) -> str | None:
    if isinstance(value, str):
        return _BARE_PASS
    name = value.get("name") if isinstance(value, Mapping) else getattr(value, "name", None)
    return _PASS_TAG.format(name) if name in PASS_PARAMS else None


PassItem = Annotated[
    Union[(Annotated[PassName, Tag(_BARE_PASS)],
           *(Annotated[m, Tag(_PASS_TAG.format(n))] for n, m in _PASS_ENTRIES.items()))],
    Discriminator(_pass_kind, custom_error_type="unknown_pass",
                  custom_error_message="unknown pass (known: " + ", ".join(PASS_PARAMS) + ")"),
]
_PASS_TAGS = frozenset({_BARE_PASS, *(_PASS_TAG.format(n) for n in PASS_PARAMS)})


class Bounds(_Model):
    """An accuracy gate: how far a scenario's outputs may drift from the default graph's
    on the model's samples (each output is compared on its own, in float64)."""

    min_cosine: float | None = Field(
        None, ge=-1.0, le=1.0, allow_inf_nan=False,
        description="Lowest cosine similarity allowed between an output of the scenario "
                    "and the same output of the default graph (from -1 to 1).")
    max_abs: float | None = Field(
        None, ge=0.0, allow_inf_nan=False,
        description="Largest absolute difference allowed between any element of an output "
                    "of the scenario and of the default graph.")

    @model_validator(mode="after")
    def _some_bound(self) -> Bounds:
        if self.min_cosine is None and self.max_abs is None:
            raise ValueError("bounds name min_cosine, max_abs or both")
        return self

    def record(self) -> dict[str, float]:
        """The bounds a package records: those set."""
        return {k: v for k, v in self.model_dump(mode="json").items() if v is not None}


class ScenarioEntry(_Model):
    """A named variant of a model: the records of a list of rewrite passes, stored in it."""

    name: Name = Field(description="Scenario name; used as a file name component. 'auto', "
                                   "'common' and 'default' are reserved.")
    requires: dict[str, Any] = Field(
        default_factory=dict,
        description="Device capabilities this scenario needs, for devices whose scenario is "
                    "'auto': each key must be among the device's capabilities with an equal "
                    "value; a list on one side means 'any of' (the device offers several, or "
                    "the scenario accepts several).")
    passes: list[PassItem] = Field(
        min_length=1,
        description="Rewrite passes to run, in order, on the model's metadata; the records "
                    "they produce are stored in the packaged model and replayed by name. "
                    "Each is a pass's name, or a mapping of its name and parameters "
                    "({name: quantize-weights, bits: 4, block_size: 32}).")
    bounds: Bounds | None = Field(
        None,
        description="Accuracy gate: the build measures the scenario on the model's samples "
                    "against the default graph and fails when an output misses a bound.")

    @field_validator("passes")
    @classmethod
    def _canonical(cls, value: list[Any]) -> list[Any]:
        """Each pass in its canonical form: a pass without parameters by its bare name,
        one with parameters as its mapping, every default filled (a bare
        ``quantize-weights`` is its mapping with the defaults)."""
        out: list[Any] = []
        for item in value:
            name = item if isinstance(item, str) else item.name
            if not takes_parameters(name):
                out.append(name)
            elif isinstance(item, str):
                out.append(_PASS_ENTRIES[name](name=name))
            else:
                out.append(item)
        return out

    def steps(self) -> list[PassStep]:
        """``(name, canonical parameters)`` of each pass, in order."""
        return [step(p) if isinstance(p, str)
                else step(p.name, p.model_dump(mode="json", exclude={"name"}))
                for p in self.passes]

    def canonical_passes(self) -> list[str | dict[str, Any]]:
        """The passes as the scenario's record and digest hold them."""
        return [canonical(name, params) for name, params in self.steps()]

    def record(self) -> dict[str, Any]:
        """What the scenario contributes to a package's fingerprint (``bounds`` only when
        set: a scenario without keeps its fingerprint)."""
        out = self.model_dump(mode="json")
        if self.bounds is None:
            del out["bounds"]
        else:
            out["bounds"] = self.bounds.record()
        return out


_SHA256 = r"^[0-9a-f]{64}$"
_PINNED_REF = r"^[^@\s]+/[^@\s]+@sha256:[0-9a-f]{64}$"


class PinnedSource(_Model):
    """A model fetched by digest, once, into the store: a file at an HTTPS ``url`` with
    its ``sha256``, or the file at ``path`` of the OCI artifact ``ref`` (pinned by its
    manifest digest; a weightstore package or another client's ModelPack or ORAS one)."""

    url: str | None = Field(None, description="https:// URL of the ONNX model file (plain "
                            "http only on a loopback host).")
    sha256: str | None = Field(None, pattern=_SHA256,
                               description="SHA-256 of the file at url, 64 hex digits.")
    size: int | None = Field(None, ge=0, description="Bytes of the file at url, when known: "
                             "a fetch stops at it instead of reading on.")
    ref: str | None = Field(None, pattern=_PINNED_REF,
                            description="host/repository@sha256:<64 hex> of an OCI artifact.")
    path: PathText | None = Field(None, description="The model file within the artifact "
                                  "(default: its only .onnx file).")

    @model_validator(mode="after")
    def _one_kind(self) -> PinnedSource:
        from urllib.parse import urlsplit

        if (self.url is None) == (self.ref is None):
            raise ValueError("a pinned source has a url (with sha256) or a ref, not both")
        if self.url is not None:
            if self.sha256 is None or self.path is not None:
                raise ValueError("a url source needs its sha256, and no path")
            parts = urlsplit(self.url)
            if parts.scheme == "http" and not loopback_name(parts.hostname or ""):
                raise ValueError("plain http is refused outside loopback: use https")
            if parts.scheme not in ("https", "http") or not parts.hostname:
                raise ValueError("a url source is an https:// URL")
        elif self.sha256 is not None or self.size is not None:
            raise ValueError("a ref is pinned by its own digest: no sha256, no size")
        return self

    @property
    def digest(self) -> str:
        """What the source's bytes are pinned by: ``sha256:<hex>``."""
        return f"sha256:{self.sha256}" if self.url else str(self.ref).rpartition("@")[2]


_FILE, _PINNED = "<file>", "<pinned>"  # the two kinds of source (never in an error's key)


def _source_kind(value: object) -> str:
    return _PINNED if isinstance(value, (Mapping, PinnedSource)) else _FILE


# a local path, or a source pinned by digest
Source = Annotated[
    Annotated[PathText, Tag(_FILE)] | Annotated[PinnedSource, Tag(_PINNED)],
    Discriminator(_source_kind),
]
CompanionKind = Literal["config", "doc", "code", "dataset", "weights"]


class CompanionFile(_Model):
    """A file (or a folder's whole tree) shipped in every package beside the models:
    a configuration, a tokenizer, a licence, a model card."""

    source: Source = Field(
        description="Path of the file or folder, relative to the recipe's folder: a folder "
        "gives every regular file below it (hidden names left out; a link or other special "
        "file inside it is refused). Or a file pinned by digest ({url, sha256} or {ref, "
        "path}), fetched once into the store.")
    path: PathText | None = Field(
        None, description="Where it goes in the package, relative to the package folder "
        "('/' between parts). Default: the source's own name (a pinned one's: the last "
        "part of its url or path); for a folder, '.' puts its files at the package root.")
    kind: CompanionKind | None = Field(
        None, description="What the file is, as ModelPack names its layers: config, doc, "
        "code, dataset or weights. Default by name: licences, read-mes and *.md, *.rst, "
        "*.txt are doc; *.py, *.sh code; *.safetensors, *.bin, *.pt, *.data weights; "
        "anything else config.")


class ModelEntry(_Model):
    """One ONNX model to package."""

    name: Name = Field(description="Model name, unique within the recipe; used as a file name.")
    source: Source = Field(
        description="Path of the ONNX model file, relative to the recipe's folder; or a "
        "source pinned by digest ({url, sha256} or {ref, path}), fetched once into the store."
    )
    file: Name | None = Field(
        None, description="The model's file name in the package, ending in .onnx, for a "
        "runtime that opens a fixed name (model.onnx beside genai_config.json). Default: "
        "<name>.onnx.")
    scenarios: list[ScenarioEntry] = Field(
        default_factory=list,
        description="Alternative graphs of this model, stored in the packaged model as "
                    "rewrite records and replayed by name.",
    )
    samples: PathText | None = Field(
        None, description="A .npz of named sample inputs of this model (numpy.savez), "
        "relative to the recipe's folder: the build measures each scenario on them against "
        "the default graph (summary.json's accuracy). Default: the recipe's samples.")

    @field_validator("file")
    @classmethod
    def _onnx_file(cls, value: str | None) -> str | None:
        from .companions import path_problem

        if value is not None:
            if not value.endswith(".onnx"):
                raise ValueError("a model's file name ends in .onnx")
            problem = path_problem(value)
            if problem is not None:
                raise ValueError(problem.replace("a companion path", "a model's file name"))
        return value

    @field_validator("scenarios")
    @classmethod
    def _unique_scenarios(cls, value: list[ScenarioEntry]) -> list[ScenarioEntry]:
        _require_unique_names(value, "scenario")
        return value


class Layout(_Model):
    """How one release lays out model weights on disk."""

    name: Name = Field(description="Layout name, unique within the recipe; used as a folder name.")
    external_weight: Literal["embedded", "separate", "combined"] = Field(
        description="Where weights go: 'embedded' inside the model (GE external_weight mode 0), "
        "'separate' one file per weight (mode 1), 'combined' one shared weight file (mode 2)."
    )
    alignment: int = Field(
        512,
        ge=1,
        description="Byte alignment of each weight in external files; a power of two "
        f"from 1 to {MAX_ALIGNMENT} (1 MiB).",
        json_schema_extra={"maximum": MAX_ALIGNMENT},
    )
    size_threshold: int = Field(
        1024,
        ge=0,
        description="Weights smaller than this many bytes stay inside the model file.",
    )
    constants: Literal["external-data", "file-constant"] = Field(
        "external-data",
        description="How external weights are referenced: 'external-data' as ONNX external "
        "data on initializers, 'file-constant' as FileConstant nodes reading the weight file.",
    )
    split: Literal["none", "scenario"] = Field(
        "none",
        description="'none' packs all weights together; 'scenario' groups weight files by "
        "the variants that use them: common, default, and one per scenario.",
    )
    combined: Literal["per-model", "shared"] = Field(
        "per-model",
        description="Combined layouts only: 'per-model' writes one <model>_weight_combined "
        "per model (GE's mode 2, a payload two models use is written twice); 'shared' "
        "writes one <package>_weight_combined for all models, each payload once. Split "
        "layouts always share their group files between models, so 'per-model' is refused "
        "there.",
    )

    def record(self) -> dict[str, Any]:
        """The settings a package records (summary, fingerprint).

        Keys added after package format 1 appear only when set away from their default, so
        a package that does not use them keeps its format-1 bytes and fingerprint.
        """
        out = self.model_dump(mode="json")
        for name in LAYOUT_KEYS_SINCE:
            if out[name] == type(self).model_fields[name].default:
                del out[name]
        return out

    @field_validator("alignment")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        problem = alignment_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class Device(_Model):
    """A deployment target: what it supports, and which scenario it runs."""

    name: Name = Field(description="Device name, unique within the recipe.")
    capabilities: dict[str, Any] = Field(
        default_factory=dict,
        description="Facts about the target: processor and features, accelerator kind, "
                    "memory, supported kernel ABIs or packed formats (free-form keys).")
    scenario: str | None = Field(
        None,
        description="The scenario the device runs: a scenario name, null for the default "
                    "graph, or 'auto' for the first scenario (in recipe order) whose "
                    "'requires' the capabilities satisfy (the default graph if none does).")
    files: list[CompanionFile] = Field(
        default_factory=list,
        description="Companion files of this device only, as the top-level files: one at "
                    "a path the top-level files use replaces it for the device, others "
                    "are added. The device's runtime folder holds them at its root.")


class Recipe(_Model):
    """A weightstore recipe: which models to package, and in which weight layouts."""

    package: Name = Field(description="Package name; used as a folder name in the output.")
    version: Name = Field(
        description="Package version such as \"1.0.0\" (quote it in YAML so it stays a string)."
    )
    store: StoreConfig = Field(
        default_factory=StoreConfig, description="Weight store settings; all keys are optional."
    )
    models: list[ModelEntry] = Field(min_length=1, description="Models to package (at least one).")
    layouts: list[Layout] = Field(
        min_length=1, description="Weight layouts to build for every model (at least one)."
    )
    devices: list[Device] = Field(
        default_factory=list,
        description="Deployment targets: each gets a devices/<name>/ folder in every package "
                    "with the models it runs and the weight files they need (an embedded "
                    "layout's device models hold their live weights inline)."
    )
    files: list[CompanionFile] = Field(
        default_factory=list,
        description="Companion files of every package (configs, tokenizers, licences): "
                    "stored, listed in summary.json with their digests and verified as "
                    "the models are.")
    output: PathText = Field(
        "dist", description="Output folder for built packages, relative to the recipe's folder."
    )
    samples: PathText | None = Field(
        None, description="A .npz of named sample inputs (numpy.savez), relative to the "
        "recipe's folder, for every model without samples of its own: the build measures "
        "each scenario on them against the default graph (summary.json's accuracy).")
    cache: str | CacheConfig | None = Field(
        None,
        description="Build cache: a registry repository read and written, or {read, write}. "
        "weightstore build's --cache, --cache-from and --cache-to beat it, and it beats "
        "$WEIGHTSTORE_CACHE, $WEIGHTSTORE_CACHE_FROM and $WEIGHTSTORE_CACHE_TO.",
    )

    @property
    def has_companions(self) -> bool:
        """Does the recipe name companion files (its own or a device's)?"""
        return bool(self.files) or any(d.files for d in self.devices)

    @field_validator("models")
    @classmethod
    def _unique_models(cls, value: list[ModelEntry]) -> list[ModelEntry]:
        _require_unique_names(value, "model")
        return value

    @field_validator("layouts")
    @classmethod
    def _unique_layouts(cls, value: list[Layout]) -> list[Layout]:
        _require_unique_names(value, "layout")
        return value

    @field_validator("devices")
    @classmethod
    def _unique_devices(cls, value: list[Device]) -> list[Device]:
        _require_unique_names(value, "device")
        return value


@dataclass(frozen=True)
class LoadedRecipe:
    """A validated recipe plus the folder its relative paths are taken from."""

    recipe: Recipe
    path: Path
    base_dir: Path
    selected: frozenset[str] | None = None  # build --model: the models to package

    def models(self) -> list[ModelEntry]:
        """The models to package, in recipe order: all, or those ``build --model`` chose.

        Everything else (devices, the scenarios they may name) stays the whole recipe's.
        """
        return [m for m in self.recipe.models if self.selected is None or m.name in self.selected]

    def resolve(self, p: str) -> Path:
        """Absolute path for ``p``, relative ones taken from the recipe's folder.

        Normalisation is lexical on purpose: a model that is a symlink into a blob cache must
        keep its own folder, because ONNX external data is found beside the model file.
        """
        return Path(os.path.normpath(self.base_dir / p))

    def model_source(self, model: ModelEntry) -> Path:
        return self.resolve(model.source)

    def samples_of(self, model: ModelEntry) -> Path | None:
        """The model's samples file (its own, else the recipe's), None without one."""
        samples = model.samples or self.recipe.samples
        return None if samples is None else self.resolve(samples)

    def output_dir(self) -> Path:
        return self.resolve(self.recipe.output)

    def store_path(self) -> Path | None:
        """The configured store folder, or None to let the caller pick its default."""
        path = self.recipe.store.path
        return None if path is None else self.resolve(path)


def load_recipe(path: str | os.PathLike[str]) -> LoadedRecipe:
    """Read, parse and validate a recipe file; every failure is a :class:`RecipeError`."""
    absolute, data = read_recipe_file(path)
    return load_recipe_bytes(absolute, data, os.fspath(path))


def load_recipe_bytes(absolute: Path, data: bytes, filename: str | None = None,
                      ) -> LoadedRecipe:
    """Parse and validate the bytes of the recipe file at ``absolute`` (named
    ``filename`` in errors, by default the absolute path)."""
    filename = str(absolute) if filename is None else filename
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecipeError("recipe is not valid UTF-8", file=filename, offset=exc.start) from None
    recipe = parse_recipe_text(text, filename)
    return LoadedRecipe(recipe=recipe, path=absolute, base_dir=absolute.parent)


def loaded_from(recipe: Recipe | Mapping[str, Any], base_dir: str | os.PathLike[str],
                ) -> LoadedRecipe:
    """A recipe given as an object or a plain mapping (validated like a file), its
    relative paths taken from ``base_dir``."""
    base = Path(os.path.abspath(base_dir))
    name = "<recipe>"
    if not isinstance(recipe, Recipe):
        try:
            recipe = Recipe.model_validate(recipe)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise RecipeError(_describe(first), file=name,
                              key=_dotted(_error_loc(first))) from None
        except RecursionError:
            raise RecipeError("recipe is nested too deeply", file=name) from None
    _check_references(recipe, name, lambda _loc: None)
    return LoadedRecipe(recipe=recipe, path=base / name, base_dir=base)


def parse_recipe_text(text: str, filename: str) -> Recipe:
    """Parse recipe YAML (safe tags only) and validate it; ``filename`` is used in errors."""
    if len(text) > RECIPE_SIZE_LIMIT:
        raise RecipeError(f"recipe is larger than {RECIPE_SIZE_LIMIT >> 20} MiB",
                          file=filename)
    try:
        loader = yaml.SafeLoader(text)  # the reader rejects control characters up front
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, filename) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise RecipeError("recipe is empty", file=filename)
        _reject_duplicate_keys(root, filename)
        _reject_alias_bombs(root, filename)
        data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, filename) from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"invalid YAML: {' '.join(str(exc).split())}", file=filename) from None
    except RecursionError:
        raise RecipeError("recipe is nested too deeply", file=filename) from None
    finally:
        loader.dispose()

    if not isinstance(data, dict):
        found = {list: "a list", str: "a string", type(None): "nothing"}.get(
            type(data), f"a {type(data).__name__}")
        raise RecipeError(
            f"recipe must be a mapping with keys such as package, version, models and layouts; "
            f"found {found}",
            file=filename,
            line=_line(root),
        )
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, root, filename) from None
    except RecursionError:
        raise RecipeError("recipe is nested too deeply", file=filename) from None
    _check_references(recipe, filename, lambda loc: _locate(root, loc))
    return recipe


def _check_references(recipe: Recipe, filename: str,
                      locate: Callable[[Loc], int | None]) -> None:
    """Rules that relate several parts of a recipe, reported at the key that breaks them."""
    def fail(message: str, loc: Loc) -> None:
        raise RecipeError(message, file=filename, line=locate(loc), key=_dotted(loc))

    known = set()
    for i, model in enumerate(recipe.models):
        for j, sc in enumerate(model.scenarios):
            if sc.name in RESERVED_SCENARIO_NAMES:
                fail(f"scenario name '{sc.name}' is reserved",
                     ("models", i, "scenarios", j, "name"))
            if sc.bounds is not None and not (model.samples or recipe.samples):
                fail(f"scenario '{sc.name}' has bounds but model '{model.name}' has no "
                     "samples to measure them on (samples, on the model or the recipe)",
                     ("models", i, "scenarios", j, "bounds"))
            known.add(sc.name)
    _check_companion_paths(recipe, fail)
    for i, layout in enumerate(recipe.layouts):
        if layout.split == "scenario" and layout.external_weight == "embedded":
            fail(f"layout '{layout.name}' splits weights by scenario but keeps them embedded",
                 ("layouts", i, "split"))
        if "combined" in layout.model_fields_set:
            _check_combined(layout, ("layouts", i, "combined"), fail)
        if known and layout.constants == "file-constant":
            # Scenario records name nodes and initializers of the base graph by position;
            # FileConstant nodes change that graph, so the records could not be replayed.
            fail(f"layout '{layout.name}' uses constants: file-constant, which changes the "
                 "graph that scenario records refer to; use external-data for models with "
                 "scenarios", ("layouts", i, "constants"))


def _check_companion_paths(recipe: Recipe, fail: Callable[[str, Loc], None]) -> None:
    """Each companion's path (written or by default) is a package path of its own: no
    escape, none of the package's own names, no model file, no other companion's path
    (a device's may replace a top-level one: that is what it is for). The paths of a
    folder's files are checked again when the build lists them."""
    models: list[str] = []
    for i, model in enumerate(recipe.models):
        name = model_file_name(model)
        if name in models:
            fail(f"model file '{name}' is another model's file too",
                 ("models", i, "file" if model.file else "name"))
        models.append(name)
    _check_file_entries(recipe.files, ("files",), models, fail)
    for i, device in enumerate(recipe.devices):
        _check_file_entries(device.files, ("devices", i, "files"), models, fail)


def _check_file_entries(entries: Sequence[CompanionFile], loc: Loc, models: list[str],
                        fail: Callable[[str, Loc], None]) -> None:
    from .companions import collision, path_problem

    taken = list(models)
    for i, entry in enumerate(entries):
        path = companion_path(entry)
        at: Loc = (*loc, i, "path" if entry.path is not None else "source")
        pin = entry.source
        if isinstance(pin, PinnedSource) and pin.ref is not None and pin.path is None:
            fail("a companion pinned by ref names its file in the artifact (path)",
                 (*loc, i, "source"))
        if path == "." and entry.path is not None:
            if isinstance(pin, PinnedSource):
                fail("path '.' (the package root) is for a folder source; give the file "
                     "a name", at)
            continue  # a folder at the package root: its files are checked one by one
        problem = path_problem(path)
        if problem is not None:
            fail(f"{problem}, got {path!r}", at)
        other = collision(path, taken)
        if other is not None:
            fail(f"companion path '{path}' collides with '{other}' in the package", at)
        taken.append(path)


def model_file_name(model: ModelEntry) -> str:
    """The model's file name in the package: its ``file``, else ``<name>.onnx``."""
    return model.file or f"{model.name}.onnx"


def companion_path(entry: CompanionFile) -> str:
    """Where a companion entry goes in the package: its ``path``, or its source's own
    name (a pinned source's: the last part of its url's path, or of its path in the
    artifact)."""
    if entry.path is not None:
        return entry.path
    if isinstance(entry.source, str):
        return Path(os.path.normpath(entry.source)).name
    if entry.source.url is not None:
        from urllib.parse import unquote, urlsplit

        return unquote(urlsplit(entry.source.url).path).rpartition("/")[2]
    return str(entry.source.path).rpartition("/")[2]


def _check_combined(layout: Layout, loc: Loc, fail: Callable[[str, Loc], None]) -> None:
    """``combined`` chooses between files per model and one file for all models, which
    only combined layouts have; split layouts' group files are shared by construction."""
    if layout.external_weight != "combined":
        fail(f"layout '{layout.name}' sets combined, which applies only to "
             f"external_weight: combined (not {layout.external_weight})", loc)
    if layout.split == "scenario" and layout.combined == "per-model":
        fail(f"layout '{layout.name}' splits weights by scenario into group files that all "
             "models share; combined: per-model cannot apply (omit it or use shared)", loc)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _yaml_error(exc: yaml.MarkedYAMLError, filename: str) -> RecipeError:
    mark = exc.problem_mark or exc.context_mark
    problem = exc.problem or "syntax error"
    message = f"invalid YAML: {problem}" + (f" ({exc.context})" if exc.context else "")
    if mark is None:
        return RecipeError(message, file=filename)
    return RecipeError(message, file=filename, line=mark.line + 1, column=mark.column + 1)


def _reader_error(exc: yaml.reader.ReaderError, text: str, filename: str) -> RecipeError:
    line = text.count("\n", 0, exc.position) + 1
    column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
    return RecipeError(f"invalid YAML: unacceptable character #x{exc.character:04x}",
                       file=filename, line=line, column=column)


_MERGE_TAG = "tag:yaml.org,2002:merge"
EXPANDED_LIMIT = 1 << 20  # nodes plus scalar characters, once every alias is expanded
_INT_TAG = "tag:yaml.org,2002:int"
INTEGER_DIGITS_LIMIT = 64  # far past any size, count or version a recipe holds


def _reject_alias_bombs(root: yaml.Node, filename: str) -> None:
    """Refuse a document whose aliases expand it past :data:`EXPANDED_LIMIT`.

    Anchors and aliases are useful (one layout reused with ``<<: *base``), but nested
    aliases grow exponentially: a few hundred bytes can stand for gigabytes once parsed
    and validated. The expanded size is computed on the node graph, each shared node once.
    An alias inside its own anchor (a value that contains itself) is refused at the alias:
    no recipe field can hold one, and a free-form field (a device's capabilities) would
    take it in and fail later, far from the recipe. So is an integer of more digits than
    any recipe value needs (Python refuses to convert more than a few thousand).
    """
    size: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool, Loc]] = [(root, False, ())]
    while stack:
        node, finished, loc = stack.pop()
        key = id(node)
        kids = _kids(node, loc)
        if (isinstance(node, yaml.ScalarNode) and node.tag == _INT_TAG
                and len(node.value) > INTEGER_DIGITS_LIMIT):
            raise RecipeError(f"number has more than {INTEGER_DIGITS_LIMIT} digits",
                              file=filename, line=_line(node), key=_dotted(loc))
        if finished:
            active.discard(key)
            own = len(node.value) if isinstance(node, yaml.ScalarNode) else 0
            size[key] = min(EXPANDED_LIMIT + 1,
                            1 + own + sum(size.get(id(k), 1) for k, _ in kids))
            continue
        if key in size or key in active:
            continue
        active.add(key)
        stack.append((node, True, loc))
        for k, at in kids:
            if id(k) in active:  # the kid is an ancestor: an alias inside its own anchor
                raise RecipeError("recipe value contains itself through an alias (an alias "
                                  "inside its own anchor)", file=filename, line=_line(k),
                                  key=_dotted(at))
        stack.extend((k, False, at) for k, at in kids if id(k) not in size)
    if size[id(root)] > EXPANDED_LIMIT:
        raise RecipeError("recipe expands past the size limit through its aliases "
                          f"(more than {EXPANDED_LIMIT} values and characters)", file=filename)


def _kids(node: yaml.Node, loc: Loc) -> list[tuple[yaml.Node, Loc]]:
    """A node's children, each with where it stands (a mapping's key at its own key)."""
    if isinstance(node, yaml.MappingNode):
        return [(n, (*loc, k.value if isinstance(k, yaml.ScalarNode) else "?"))
                for k, v in node.value for n in (k, v)]
    if isinstance(node, yaml.SequenceNode):
        return [(n, (*loc, i)) for i, n in enumerate(node.value)]
    return []


def _reject_duplicate_keys(root: yaml.Node, filename: str) -> None:
    """PyYAML keeps the last of two equal keys; a recipe with both is almost surely a mistake."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, Loc]] = [(root, ())]
    while stack:
        node, loc = stack.pop()
        if id(node) in seen:  # anchors and aliases share nodes (and may form cycles)
            continue
        seen.add(id(node))
        children: list[tuple[yaml.Node, Loc]] = []
        if isinstance(node, yaml.MappingNode):
            first_line: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    ident = (key_node.tag, key_node.value)
                    if ident in first_line:
                        raise RecipeError(
                            f"duplicate key '{key_node.value}' (first defined on line "
                            f"{first_line[ident]})",
                            file=filename,
                            line=_line(key_node),
                            key=_dotted((*loc, key_node.value)),
                        )
                    first_line[ident] = _line(key_node)
                    children.append((value_node, (*loc, key_node.value)))
                else:
                    children.append((value_node, loc))
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, (*loc, i)) for i, item in enumerate(node.value)]
        stack.extend(reversed(children))  # report the first duplicate in file order


def _locate(root: yaml.Node, loc: Sequence[str | int],
            keys: dict[int, dict[str, tuple[yaml.Node, yaml.Node]]] | None = None) -> int:
    """1-based line for a validation ``loc``: the key's line, or the nearest enclosing node's.

    A missing key stops the walk at its parent mapping, which is the line to fix.
    ``keys``: each mapping's keys by name, filled as mappings are met, so that locating
    every error of a recipe costs its length once, not once per error (50,000 unknown
    keys once took 136 s).
    """
    keys = {} if keys is None else keys
    node = root
    line = _line(root)
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            named = keys.get(id(node))
            if named is None:
                named = keys[id(node)] = {}
                for key_node, value_node in node.value:
                    if isinstance(key_node, yaml.ScalarNode):
                        named.setdefault(key_node.value, (key_node, value_node))
            found = named.get(str(part))
            if found is None:
                return _line(node)
            line, node = _line(found[0]), found[1]
        elif (isinstance(node, yaml.SequenceNode) and isinstance(part, int)
              and 0 <= part < len(node.value)):
            node = node.value[part]
            line = _line(node)
        else:
            return _line(node)
    return line


def _dotted(loc: Sequence[str | int]) -> str:
    """``("layouts", 1, "alignment")`` -> ``"layouts[1].alignment"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _error_loc(error: Any) -> Loc:
    loc = tuple(p for p in error["loc"] if p not in (_FILE, _PINNED) and p not in _PASS_TAGS)
    if error["type"] == "unknown_pass" and isinstance(error.get("input"), Mapping):
        loc = (*loc, "name")
    if error["type"] == "duplicate_name":
        loc = (*loc, error["ctx"]["index"], "name")
    return loc


def _describe(error: Any) -> str:
    """One readable sentence for a pydantic error, naming the offending value where useful."""
    kind = error["type"]
    value = error.get("input")
    if kind == "unknown_pass" and isinstance(value, Mapping):
        value = value.get("name")
    if kind == "string_pattern_mismatch":
        message = ("must be letters, digits, '.', '_' or '-', starting with a letter or digit "
                   "(it is used as a file name)")
    else:
        message = error["msg"].removeprefix("Value error, ")
    if kind not in ("missing", "extra_forbidden") and (
            value is None or isinstance(value, (str, int, float, bool))):
        shown = repr(value)
        message += f", got {shown if len(shown) <= 60 else shown[:57] + '...'}"
        if kind == "string_type" and isinstance(value, (int, float)):
            message += " (quote it to make it a string)"
    return message


def _validation_error(exc: ValidationError, root: yaml.Node, filename: str) -> RecipeError:
    """Report the error that comes first in the file, and how many others there are.

    A misspelt key gives two errors in one mapping: the key it should have been is
    missing, the one written is unknown. The unknown key is the cause, so it is reported,
    with the missing key it probably stands for."""
    keys: dict[int, dict[str, tuple[yaml.Node, yaml.Node]]] = {}
    located = [(_locate(root, _error_loc(e), keys), _error_loc(e), e)
               for e in exc.errors(include_url=False)]
    missing: dict[Loc, list[str]] = {}
    for _, loc, e in located:
        if e["type"] == "missing" and loc:
            missing.setdefault(loc[:-1], []).append(str(loc[-1]))
    unknown = {loc[:-1] for _, loc, e in located if e["type"] == "extra_forbidden" and loc}

    def rank(item: tuple[int, Loc, Any]) -> tuple[bool, int]:
        line, loc, e = item
        return (e["type"] == "missing" and loc[:-1] in unknown, line)

    line, loc, error = min(located, key=rank)
    message = f"invalid recipe: {_describe(error)}"
    if error["type"] == "extra_forbidden" and loc:
        message = f"invalid recipe: unknown key {str(loc[-1])!r}"
        close = difflib.get_close_matches(str(loc[-1]), missing.get(loc[:-1], []), n=1)
        if close:
            message += f" (did you mean {close[0]!r}?)"
    more = len(located) - 1
    if more:
        message += f" (and {more} more error{'s' if more > 1 else ''})"
    return RecipeError(message, file=filename, line=line, key=_dotted(loc) or None)


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema for recipes, for editors (hover help, completion) and external checkers."""
    schema = Recipe.model_json_schema()
    schema["$schema"] = SCHEMA_DIALECT
    schema["title"] = SCHEMA_TITLE
    return schema


def render_schema() -> str:
    """The schema as stable JSON text, so the committed file can be compared byte for byte."""
    return json.dumps(recipe_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_schema(path: str | os.PathLike[str] = DEFAULT_SCHEMA_PATH) -> Path:
    """Write the schema atomically (creating its folder) and return where it went."""
    from ..io.files import check_output_folder

    target = Path(path)
    check_output_folder(target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, render_schema().encode("utf-8"))
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m weightstore.recipe.schema [PATH]``: regenerate the recipe schema."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) > 1 or any(a.startswith("-") for a in args):
        print("usage: python -m weightstore.recipe.schema [PATH]", file=sys.stderr)
        return 2
    print(write_schema(args[0] if args else DEFAULT_SCHEMA_PATH))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
