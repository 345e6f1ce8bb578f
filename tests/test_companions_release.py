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


def _members(archive: Path) -> list[str]:
    """The archive's members in order, as GNU tar lists them (folders end in /)."""
    listed = subprocess.run(["tar", "--zstd", "-tf", str(archive)], check=True,
                            capture_output=True, text=True).stdout
    return listed.splitlines()


@gnu
def test_archives_hold_the_companions_before_the_weights(versions):
    """Archive format 2: the top folder, summary.json, then every companion file (a
    device's own version too) with its folders, then the rest, each part sorted by path
    components and every folder before its files, so that reaching the companions
    decompresses a few kB, not the weights (one zstd frame). GNU tar lists them so."""
    _, result = versions[1]
    companions = ["LICENSE", "devices/", "devices/cpu/", "devices/cpu/genai_config.json",
                  "extra/", "extra/blob.bin", "extra/merges.txt", "genai_config.json",
                  "tokenizer.json"]
    for archive in result.archives:
        root = archive.file_name.removesuffix(SUFFIX)
        names = [n.removeprefix(f"{root}/")
                 for n in _members(result.output / archive.file_name)]
        assert names[:2 + len(companions)] == ["", "summary.json", *companions], names
        rest = names[2 + len(companions):]
        assert "encoder.onnx" in rest and rest == sorted(rest, key=lambda n: n.split("/"))
        for i, name in enumerate(names[1:], 1):  # every folder before its files
            parent = name.rstrip("/").rpartition("/")[0]
            assert not parent or f"{parent}/" in names[1:i], name


def test_verify_decompresses_an_archive_only_up_to_its_companions(versions):
    """The companions are read as unpack reads them (each checked against the summary and
    hashed with SHA-256), and the reading stops after the last of them: nothing of the
    weights is decompressed."""
    from weightstore.packaging.unpack import read_archive

    _, result = versions[1]
    archive = next(a for a in result.archives if a.layout == "combined")
    sources = companion_sources(1)
    read = read_archive(result.output / archive.file_name, sha256_of=set(sources),
                        until=set(sources))
    assert not read.whole
    assert read.sha256 == {p: _sha256(d) for p, d in sources.items()}
    assert read.bytes == sum(len(d) for d in sources.values())
    whole = read_archive(result.output / archive.file_name, sha256_of=set(sources))
    assert whole.whole and whole.bytes > 10 * read.bytes and whole.sha256 == read.sha256


def _resign(folder: Path, key_path: Path) -> None:
    """Make ``folder``'s release.json, SHA256SUMS and signature name its archives' bytes as
    they now are (what a signer of a damaged archive would publish)."""
    from weightstore.release.attestation import attestation
    from weightstore.signing.keys import load_private

    doc = json.loads((folder / "release.json").read_text())
    sums = []
    for subject in doc["subject"]:
        if subject["name"].endswith(SUFFIX):
            subject["digest"]["sha256"] = _sha256((folder / subject["name"]).read_bytes())
            sums.append(f"{subject['digest']['sha256']}  {subject['name']}\n")
    provenance = json.dumps(doc).encode()
    (folder / "release.json").write_bytes(provenance)
    (folder / "SHA256SUMS").write_text("".join(sorted(sums, key=lambda s: s.split("  ")[1])))
    (folder / ATTESTATION_NAME).write_bytes(attestation(provenance,
                                                        load_private(key_path)))


@pytest.mark.parametrize("signed_so", [False, True])
def test_release_verify_refuses_a_damaged_companion_in_one_line(versions, tmp_path, capsys,
                                                                signed_so):
    """One byte of a companion flipped in an archive: the archive's SHA-256 is not the
    signed one; and where the damaged archive was signed so (its release.json, SHA256SUMS
    and signature made again), its companion is not what its summary says. Either way one
    line names it and --verify fails."""
    _, result = versions[1]
    copy = tmp_path / "copy"
    shutil.copytree(result.output, copy)
    archive = next(a for a in result.archives if a.layout == "combined").file_name
    _edit_member(copy / archive, "tokenizer.json", copy / archive)
    if signed_so:
        _resign(copy, versions["key_path"])
    assert main(["release", "--verify", str(copy), "--key", versions["key"].text]) == 1
    out, err = capsys.readouterr()
    assert err == "" and out.count("\n") == 1, out
    if signed_so:
        assert out.startswith(f"problem: {archive}: archive member differs from its summary "
                              f"(archive={copy / archive}, member=pkg-1.0.0-combined/"
                              "tokenizer.json, expected=blake3:"), out
    else:
        assert out == f"problem: {archive}: its SHA-256 is not the one the provenance signs\n"
    assert main(["unpack", str(copy / archive), str(tmp_path / "unpacked")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokenizer.json" in err


def test_archives_of_format_1_are_read_and_checked_as_they_were_made(versions, tmp_path,
                                                                     capsys):
    """A release made before the companions came first (archive format 1: every path in
    one sorted order; release.json without an archive format) still verifies, unpacks and
    passes --check (rebuilt in its own format); format 2 is named in release.json."""
    from weightstore.packaging.unpack import read_archive
    from weightstore.signing.keys import load_private

    recipe, result = versions[1]
    doc = json.loads((result.output / "release.json").read_text())
    assert doc["predicate"]["buildDefinition"]["internalParameters"]["archive_format"] == 2
    work = tmp_path / "v1"
    shutil.copytree(recipe.parent, work, ignore=shutil.ignore_patterns("store", "releases"))
    old = release(work / recipe.name, ReleaseOptions(
        jobs=2, archive_format=1, signer=load_private(versions["key_path"])))
    doc = json.loads((old.output / "release.json").read_text())
    assert "archive_format" not in doc["predicate"]["buildDefinition"]["internalParameters"]
    sources = companion_sources(1)
    for archive in old.archives:
        path = old.output / archive.file_name
        dest = tmp_path / archive.layout  # every listed file unpacked and checked
        assert main(["unpack", str(path), str(dest)]) == 0
        assert all((dest / p).read_bytes() == d for p, d in sources.items())
        members = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
        with tarfile.open(fileobj=io.BytesIO(members), mode="r:") as tf:
            order = [m.name.split("/", 1)[1] for m in tf.getmembers()[2:]]
        assert order == sorted(order, key=lambda n: n.split("/")), order  # format 1
        assert order.index("tokenizer.json") > order.index("encoder.onnx")
        assert read_archive(path, sha256_of=set(sources), until=set(sources)).sha256 == {
            p: _sha256(d) for p, d in sources.items()}
    check = verify_release(old.output, [versions["key"]])
    assert check.ok, check.problems
    assert main(["release", "--check", str(work / recipe.name)]) == 0, capsys.readouterr()
    capsys.readouterr()


def test_check_refuses_an_archive_format_it_does_not_write(versions, tmp_path, capsys):
    recipe, _ = versions[1]
    work = tmp_path / "v1"
    shutil.copytree(recipe.parent, work, ignore=shutil.ignore_patterns("store"))
    provenance = work / "out" / "releases" / "pkg-1.0.0" / "release.json"
    doc = json.loads(provenance.read_text())
    doc["predicate"]["buildDefinition"]["internalParameters"]["archive_format"] = 3
    provenance.write_text(json.dumps(doc))
    assert main(["release", "--check", str(work / recipe.name)]) == 2
    err = capsys.readouterr().err
    assert err == ("weightstore: error: the release's archive format is not one this "
                   f"version writes (folder={provenance.parent}, archive_format=3, "
                   "known=1 to 2)\n")
