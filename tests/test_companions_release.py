"""Companion files (configs, tokenizers, licences) through a release: its archives (read
by GNU tar), ``SHA256SUMS`` (checked by GNU sha256sum), its provenance and signature
(checked by securesystemslib's DSSE verifier), ``release --check``, ``unpack``,
``verify`` of what was unpacked, and ``diff`` between versions."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from tests.release_helpers import companion_sources, make_companion_checkout
from weightstore.cli import main
from weightstore.release.api import ReleaseOptions, release
from weightstore.release.attestation import ATTESTATION_NAME, verify_release

SUFFIX = ".tar.zst"
ROOT = ("genai_config.json", "tokenizer.json", "LICENSE", "extra/merges.txt", "extra/blob.bin")
KINDS = {"genai_config.json": "config", "tokenizer.json": "config", "LICENSE": "doc",
         "extra/merges.txt": "config", "extra/blob.bin": "weights", "README.md": "doc"}
gnu = pytest.mark.skipif(shutil.which("sha256sum") is None or shutil.which("zstd") is None,
                         reason="GNU coreutils' sha256sum, GNU tar and zstd")


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory, _encoder_master) -> dict:
    """Two versions of a package with companion files, built into one store and
    released: name -> (recipe, release result)."""
    from weightstore.signing.keys import generate, load_private

    root = tmp_path_factory.mktemp("companions")
    public = generate(root / "release.pem")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(root / "cache"))
        out = {"key": public, "key_path": root / "release.pem"}
        for version in (1, 2):
            recipe = make_companion_checkout(root / f"v{version}", _encoder_master, version)
            out[version] = (recipe, release(recipe, ReleaseOptions(
                jobs=2, signer=load_private(root / "release.pem"))))
    return out


def _package(recipe: Path, layout: str = "combined") -> Path:
    return recipe.parent / "out" / "pkg" / "1.0.0" / layout


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _edit_member(archive: Path, name: str, out: Path) -> None:
    """``archive`` with one byte of the member ending in ``/name`` flipped (its size and
    every header as they were), recompressed into ``out``."""
    raw = bytearray(zstandard.ZstdDecompressor().decompressobj().decompress(
        archive.read_bytes()))
    with tarfile.open(fileobj=io.BytesIO(bytes(raw)), mode="r:") as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith(f"/{name}"))
    raw[member.offset_data + 3] ^= 1
    out.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(bytes(raw)))


@gnu
def test_gnu_tools_check_every_companion_against_the_provenance(versions, tmp_path, capsys):
    """sha256sum checks the release folder with its SHA256SUMS; GNU tar extracts each
    archive, whose companions are the sources' bytes; and sha256sum checks each extracted
    companion against its subject in release.json."""
    _, result = versions[1]
    out = result.output
    subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=out, check=True,
                   capture_output=True)
    assert sorted(line.split("  ")[1] for line in
                  (out / "SHA256SUMS").read_text().splitlines()) == sorted(
        a.file_name for a in result.archives)
    members = [s for s in json.loads((out / "release.json").read_text())["subject"]
               if "/" in s["name"]]
    (tmp_path / "MEMBERS").write_text("".join(f"{s['digest']['sha256']}  {s['name']}\n"
                                              for s in members))
    sources = companion_sources(1)
    assert len(members) == len(sources) * len(result.archives)
    for archive in result.archives:
        subprocess.run(["tar", "--zstd", "-xf", str(out / archive.file_name), "-C",
                        str(tmp_path)], check=True, capture_output=True)
        root = tmp_path / archive.file_name.removesuffix(SUFFIX)
        for path, data in sources.items():
            assert (root / path).read_bytes() == data, path
        summary = json.loads((root / "summary.json").read_text())
        assert {c["path"]: c["kind"] for c in summary["companions"]} == {
            p: KINDS[p] for p in ROOT}
        # what GNU tar extracted is a package verify passes
        assert main(["verify", str(root)]) == 0, capsys.readouterr().out
        capsys.readouterr()
    checked = subprocess.run(["sha256sum", "--check", "--strict", "MEMBERS"], cwd=tmp_path,
                             capture_output=True, text=True, check=True)
    assert checked.stdout.count(": OK\n") == len(members)


def test_the_signed_provenance_names_every_companion_by_its_sha256(versions):
    """securesystemslib verifies the envelope; its payload's subjects name each archive
    and each companion file in it (``<archive's top folder>/<path>``) by the SHA-256 of
    the file's bytes, so a companion taken out of a release can be checked on its own."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    _, result = versions[1]
    public = versions["key"]
    envelope = Envelope.from_dict(json.loads((result.output / ATTESTATION_NAME).read_text()))
    key = SSlibKey(public.keyid, "ed25519", "ed25519", {"public": public.raw.hex()})
    envelope.verify([key], 1)
    statement = json.loads(envelope.payload)
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    expected = {a.file_name: a.sha256 for a in result.archives}
    for archive in result.archives:
        root = archive.file_name.removesuffix(SUFFIX)
        expected |= {f"{root}/{path}": _sha256(data)
                     for path, data in companion_sources(1).items()}
    assert subjects == expected
    check = verify_release(result.output, [public])
    assert check.ok, check.problems
    assert check.subjects == subjects


def test_release_verify_checks_the_companions_inside_the_archives(versions, tmp_path):
    """A provenance whose companion subject is not the archive's file fails --verify (the
    archive, its own subject, unchanged), signed as it is by the right key."""
    from weightstore.release.attestation import attestation
    from weightstore.signing.keys import load_private

    _, result = versions[1]
    copy = tmp_path / "copy"
    shutil.copytree(result.output, copy)
    doc = json.loads((copy / "release.json").read_text())
    name = f"{result.archives[0].file_name.removesuffix(SUFFIX)}/tokenizer.json"
    subject = next(s for s in doc["subject"] if s["name"] == name)
    subject["digest"]["sha256"] = _sha256(b"another tokenizer")
    provenance = json.dumps(doc).encode()
    (copy / "release.json").write_bytes(provenance)
    key = load_private(versions["key_path"])
    (copy / ATTESTATION_NAME).write_bytes(attestation(provenance, key))
    check = verify_release(copy, [versions["key"]])
    assert not check.ok
    assert check.problems == [f"{name}: its SHA-256 is not the one the provenance signs"]


def test_release_refuses_a_companion_edited_in_its_package_folder(versions, tmp_path, capsys):
    recipe, _ = versions[1]
    folder = tmp_path / "edited"
    shutil.copytree(_package(recipe), folder)
    config = folder / "genai_config.json"
    data = bytearray(config.read_bytes())
    data[5] ^= 1
    config.write_bytes(bytes(data))
    assert main(["release", str(folder), "--output", str(tmp_path / "rel")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "genai_config.json" in err
    assert not (tmp_path / "rel").exists()


def test_check_catches_a_companion_edited_in_an_archive_or_a_source(versions, tmp_path,
                                                                    capsys):
    recipe, result = versions[1]
    work = tmp_path / "v1"
    shutil.copytree(recipe.parent, work, ignore=shutil.ignore_patterns("store"))
    recipe = work / recipe.name
    published = work / "out" / "releases" / "pkg-1.0.0"
    archive = published / result.archives[0].file_name
    assert main(["release", "--check", str(recipe)]) == 0
    capsys.readouterr()
    original = archive.read_bytes()
    _edit_member(archive, "extra/merges.txt", archive)
    assert main(["release", "--check", str(recipe)]) == 1
    root = archive.name.removesuffix(SUFFIX)
    assert f"member {root}/extra/merges.txt: content differs" in capsys.readouterr().out
    archive.write_bytes(original)
    (work / "hf" / "LICENSE").write_text("Another licence\n")  # what the sources now give
    assert main(["release", "--check", str(recipe)]) == 1
    assert "not reproducible" in capsys.readouterr().out


def test_unpack_restores_every_companion_and_verify_passes(versions, tmp_path, capsys):
    _, result = versions[1]
    for archive in result.archives:
        dest = tmp_path / archive.layout
        assert main(["unpack", str(result.output / archive.file_name), str(dest)]) == 0
        for path, data in companion_sources(1).items():
            assert (dest / path).read_bytes() == data, path
        assert main(["verify", str(dest)]) == 0
    capsys.readouterr()


def test_unpack_refuses_a_tampered_companion_and_leaves_nothing(versions, tmp_path, capsys):
    _, result = versions[1]
    for name in ("tokenizer.json", "devices/cpu/genai_config.json"):
        bad = tmp_path / name.replace("/", "-") / result.archives[0].file_name
        bad.parent.mkdir()
        _edit_member(result.output / result.archives[0].file_name, name, bad)
        dest = bad.parent / "unpacked"
        assert main(["unpack", str(bad), str(dest)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "differs from its summary" in err and name in err
        assert sorted(p.name for p in bad.parent.iterdir()) == [bad.name]


@pytest.mark.parametrize("form", ["folders", "archives"])
def test_diff_names_companions_added_removed_and_changed(versions, form, capsys):
    sides = []
    for version in (1, 2):
        recipe, result = versions[version]
        sides.append(str(_package(recipe)) if form == "folders"
                     else str(result.output / result.archives[0].file_name))
    assert main(["diff", *sides, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    changes = {(c["kind"], c["name"], c.get("device")): c for c in doc["changes"]
               if c["what"] == "companion"}
    old, new = companion_sources(1), companion_sources(2)
    assert set(changes) == {
        ("removed", "LICENSE", None), ("added", "README.md", None),
        ("changed", "tokenizer.json", None), ("changed", "genai_config.json", None),
        ("changed", "extra/blob.bin", None),
        # a device's own file, where it has one (edge runs the package's)
        ("changed", "genai_config.json", "cpu")}
    tokenizer = changes[("changed", "tokenizer.json", None)]
    assert (tokenizer["old_size"], tokenizer["new_size"]) == (
        len(old["tokenizer.json"]), len(new["tokenizer.json"]))
    assert tokenizer["old_kind"] == tokenizer["new_kind"] == "config"
    licence = changes[("removed", "LICENSE", None)]
    assert (licence["old_size"], licence["new_size"], licence["old_kind"]) == (
        len(old["LICENSE"]), None, "doc")
    readme = changes[("added", "README.md", None)]
    assert (readme["new_size"], readme["new_kind"], readme["old_size"]) == (
        len(new["README.md"]), "doc", None)
    cpu = changes[("changed", "genai_config.json", "cpu")]
    assert cpu["new"] != changes[("changed", "genai_config.json", None)]["new"]
    assert cpu["new_size"] == len(new["devices/cpu/genai_config.json"])
    # reported as companions, not once more as files
    assert not [c for c in doc["changes"] if c["what"] == "file"
                and c["name"] in {"LICENSE", "README.md", "tokenizer.json"}]
    # what a device holding v1 downloads to hold v2 counts its changed companions
    changed = sum(len(new[p]) for p in ("README.md", "tokenizer.json", "extra/blob.bin"))
    assert doc["fetch"]["devices"]["edge"] >= changed + len(new["genai_config.json"])
    assert doc["fetch"]["devices"]["cpu"] >= changed + len(new["devices/cpu/genai_config.json"])
    assert main(["diff", *sides]) == 1
    text = capsys.readouterr().out
    assert f"+ companion README.md (doc, {len(new['README.md'])} bytes)" in text
    assert (f"~ companion tokenizer.json (config, {len(old['tokenizer.json'])} -> "
            f"{len(new['tokenizer.json'])} bytes)") in text
    assert "~ companion genai_config.json on device cpu (config, " in text
    assert main(["diff", sides[0], sides[0], "--json"]) == 0
    capsys.readouterr()
