"""Prepared records as files of a package: where they live, their MAC, what verify checks.

``weightstore prepare`` writes, per device, ``prepared/<device>/<model>.json`` in the
package folder (the record) and ``prepared/<device>/<model>.onnx`` (the graph onnxruntime
optimized and annotated with its ``prepacked_N`` entries, payloads omitted).

A record is trusted only under its MAC: ``prepare`` signs it with the user's private key
(:mod:`weightstore.store.mac`), binding every field, the companion graph's digest
among them, to the record's place (``<target>/<model>``). A record whose MAC does not
hold (edited, written by another user or machine, or by an earlier version) is
unproven: resolution does not use it and says why on stderr, and ``verify`` reports it.

This module reads records as JSON only, so that ``verify``, ``push`` and ``pull``, which
check a package's files, import no models; the lookups resolution makes through a record
are in :mod:`.prepared_cache`.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from ..io.files import parse_json, read_record_bytes
from ..store.mac import entry_mac, verify_mac

FORMAT_VERSION = 2  # 2: the record carries a MAC; 1 (unsigned) is read as unproven
VALUE_PREFIX = "weightstore-value:"  # companion graphs' locations name values, not files
READABLE_VERSIONS = (1, FORMAT_VERSION)
PREPARED = "prepared"
DEFAULT_TARGET = "default"


def record_paths(package: Path, target: str | None, model: str) -> tuple[Path, Path]:
    folder = package / PREPARED / (target or DEFAULT_TARGET)
    return folder / f"{model}.json", folder / f"{model}.onnx"


def _signed(target: str, model: str, doc: dict[str, Any]) -> dict[str, Any]:
    """What a record's MAC covers: every field but the MAC, and where the record is."""
    return {"prepared_record": f"{target}/{model}",
            "doc": {k: v for k, v in doc.items() if k != "mac"}}


def sign_record(target: str | None, model: str, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with its MAC under this user's key (none when no private key is
    available: the record is then unproven wherever it is read)."""
    mac = entry_mac(_signed(target or DEFAULT_TARGET, model, doc))
    return {**doc, "mac": mac} if mac is not None else dict(doc)


def record_unproven(target: str, model: str, doc: dict[str, Any]) -> str | None:
    """Why the record ``doc`` at ``<target>/<model>`` is not proven, None when its MAC
    holds under this user's key."""
    if doc.get("format_version") != FORMAT_VERSION:
        return (f"format_version {doc.get('format_version')} records carry no MAC; "
                "run weightstore prepare again")
    if "mac" not in doc:
        return "it carries no MAC (no private key when it was prepared)"
    if not verify_mac(_signed(target, model, doc), doc["mac"]):
        return ("its MAC does not hold under this user's key (edited, or prepared by "
                "another user or machine); run weightstore prepare again")
    return None


def record_proof(folder: Path, name: str) -> str | None:
    """:func:`record_unproven` for the record at ``name`` (``prepared/<target>/<m>.json``)
    in the package ``folder``."""
    _, target, file = name.split("/")
    try:
        doc = parse_json(read_record_bytes(folder / name))
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"
    if not isinstance(doc, dict):
        return "not a JSON object"
    return record_unproven(target, file.removesuffix(".json"), doc)


PROVEN_SIGNED = "signed"  # a prepared record's MAC holds under this user's key


def prepared_proof(folder: Path, record: str, companion: str) -> dict[str, Any]:
    """What ``verify`` reports of one prepared record: ``{"record", "companion", "proven",
    "detail"}``, ``proven`` being ``"signed"`` when its MAC holds (so its companion's digest
    is the one ``prepare`` wrote) and None otherwise, ``detail`` saying why."""
    why = record_proof(folder, record)
    return {"record": record, "companion": companion,
            "proven": PROVEN_SIGNED if why is None else None,
            "detail": why or "its MAC holds under this user's key"}


def companion_contents(names: Collection[str], folder: Path,
                       ) -> tuple[list[str], list[dict[str, Any]]]:
    """What ``weightstore verify`` checks among the files of a package its summary does
    not list (``names``, relative POSIX paths): the readable prepared records, and each
    one's companion graph as ``{"path", "size", "digest"}`` from the record."""
    records: list[str] = []
    graphs: list[dict[str, Any]] = []
    for name in sorted(names):
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != PREPARED or not parts[2].endswith(".json"):
            continue
        try:
            doc = parse_json(read_record_bytes(folder / name))
            graph = doc["companion"]
            entry = {"path": f"{PREPARED}/{parts[1]}/{graph['file']}",
                     "size": int(graph["size"]), "digest": str(graph["digest"])}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a readable record: verify reports it as unlisted
        if (doc.get("format_version") in READABLE_VERSIONS and ":" in entry["digest"]
                and "/" not in graph["file"] and str(graph["file"]).endswith(".onnx")):
            records.append(name)
            graphs.append(entry)
    return records, graphs
