"""``push`` publishes only a package that is what its summary says, and, when the store
knows the build, the build itself: every file it uploads is hashed against the summary
before anything is sent, and a summary naming a path outside the folder is refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.release_helpers import make_checkout
from weightstore.builder.run import BuildOptions, build
from weightstore.cli import main
from weightstore.errors import IntegrityError, PackageError
from weightstore.registry import push as push_module
from weightstore.registry.client import Transport
from weightstore.registry.push import push
from weightstore.store import WeightStore

from .helpers import empty_store, tamper_consistently
from .registry_server import needs_registry, running_registry

pytestmark = needs_registry


@pytest.fixture
def built(tmp_path: Path, encoder_model) -> Path:
    """A checkout of the sample encoder built into its store ``store`` (its action
    records under this test's own secret); returns its root."""
    root = tmp_path / "checkout"
    build(make_checkout(root, encoder_model), BuildOptions(jobs=2))
    return root


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    with running_registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture
def package(built: Path, tmp_path: Path) -> Path:
    """A copy of the combined package, to damage."""
    folder = tmp_path / "combined"
    shutil.copytree(built / "out" / "pkg" / "1.0.0" / "combined", folder)
    return folder


def _published(registry, repository: str) -> bool:
    """Did anything of ``repository`` reach the registry (a blob link, an upload)?"""
    return (registry.folder / "data" / "docker" / "registry" / "v2" / "repositories"
            / repository).exists()


def _refused(package: Path, registry, repository: str, store: Path, capsys,
             error: type[Exception], match: str) -> None:
    """The API raises ``error``, the command prints one line and exits 2, and nothing of
    the package reaches the registry."""
    with pytest.raises(error, match=match):
        push(package, f"{registry.host}/{repository}:1", store=WeightStore(store))
    capsys.readouterr()
    assert main(["push", str(package), f"{registry.host}/{repository}:1",
                 "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match in err[0]
    assert not _published(registry, repository)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def test_a_consistently_tampered_package_is_refused_when_the_store_knows_it(
        built: Path, package: Path, registry, capsys) -> None:
    tamper_consistently(package)
    _refused(package, registry, "proof/tampered", built / "store", capsys, PackageError,
             "not the build the store recorded")


def test_a_flipped_byte_in_a_model_file_is_refused(package: Path, registry, tmp_path: Path,
                                                   capsys) -> None:
    _flip(package / "encoder.onnx", 40)
    _refused(package, registry, "proof/model", empty_store(tmp_path / "fresh-store"), capsys,
             IntegrityError, "does not match its summary")


def test_a_flipped_byte_in_the_summary_is_refused(built: Path, package: Path, registry,
                                                  tmp_path: Path, capsys) -> None:
    summary = package / "summary.json"
    data = summary.read_bytes()
    model = json.loads(data)["contents"]
    digest = next(c["digest"] for c in model if c["path"] == "encoder.onnx")
    _flip(summary, data.index(digest.encode()) + len(digest) - 1)  # one bit of its digest
    _refused(package, registry, "proof/summary", empty_store(tmp_path / "fresh-store"), capsys,
             IntegrityError, "does not match its summary")
    # a flipped byte no file digest shows: the store that recorded the build sees it
    summary.write_bytes(data.replace(b'"pkg"', b'"pkh"', 1))
    _refused(package, registry, "proof/summary2", built / "store", capsys, PackageError,
             "not the build the store recorded")


@pytest.mark.parametrize("name", ["../../../../secret.txt", "/etc/passwd", "a/../../b"])
def test_a_summary_naming_a_path_outside_the_folder_is_refused(package: Path, registry,
                                                               tmp_path: Path, name: str,
                                                               capsys) -> None:
    (tmp_path / "secret.txt").write_text("secret")
    summary = json.loads((package / "summary.json").read_bytes())
    summary["contents"].append({"path": name, "size": 6, "digest": "blake3:" + "0" * 64})
    (package / "summary.json").write_text(json.dumps(summary))
    _refused(package, registry, "proof/unsafe", empty_store(tmp_path / "fresh-store"), capsys,
             PackageError, "unsafe path")


def test_unlisted_files_and_links_are_refused(package: Path, registry, tmp_path: Path,
                                              capsys) -> None:
    (package / "notes.txt").write_text("not part of the build")
    _refused(package, registry, "proof/unlisted", empty_store(tmp_path / "fresh-store"), capsys,
             IntegrityError, "does not match its summary")
    os.unlink(package / "notes.txt")
    model = package / "encoder.onnx"
    (tmp_path / "elsewhere.onnx").write_bytes(model.read_bytes())
    model.unlink()
    model.symlink_to(tmp_path / "elsewhere.onnx")
    _refused(package, registry, "proof/link", empty_store(tmp_path / "fresh-store"), capsys,
             PackageError, "regular files")
    model.unlink()
    shutil.copyfile(tmp_path / "elsewhere.onnx", model)
    (package / "linked").symlink_to(tmp_path)  # a folder link: never followed, never skipped
    _refused(package, registry, "proof/dirlink", empty_store(tmp_path / "fresh-store"), capsys,
             PackageError, "regular files")


def test_an_intact_package_still_pushes(built: Path, package: Path, registry) -> None:
    report = push(package, f"{registry.host}/proof/intact:1",
                  store=WeightStore(built / "store"))
    assert report.uploaded and _published(registry, "proof/intact")


def _tag_pushed(registry, repository: str, tag: str = "1") -> bool:
    return (registry.folder / "data" / "docker" / "registry" / "v2" / "repositories"
            / repository / "_manifests" / "tags" / tag).exists()


def _blob(registry, data: bytes) -> Path:
    hex_ = hashlib.sha256(data).hexdigest()
    return (registry.folder / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
            / hex_[:2] / hex_ / "data")


def _changed_after_the_check(monkeypatch, paths: list[Path], offset: int) -> None:
    """Flip one byte of each of ``paths`` once push has checked the whole package against its
    summary and keys and planned the artifact from what it hashed: between the check and
    the upload."""
    plan = push_module.build_artifact

    def planned(*args, **kwargs):
        artifact = plan(*args, **kwargs)
        for path in paths:
            _flip(path, offset)
        return artifact

    monkeypatch.setattr(push_module, "build_artifact", planned)


@pytest.mark.parametrize("chunk", [None, 4096], ids=["monolithic", "chunked"])
def test_a_weight_file_changed_after_the_check_is_never_published(
        package: Path, registry, tmp_path: Path, monkeypatch, capsys, chunk) -> None:
    weights = next(p for p in package.iterdir() if p.suffix not in (".onnx", ".json"))
    original = weights.read_bytes()
    offset = next(i for i, b in enumerate(original) if b)  # a byte of a payload
    _changed_after_the_check(monkeypatch, [weights], offset)
    repository = f"swap/weights-{chunk or 0}"
    transport = Transport(chunk_size=chunk) if chunk else None
    with pytest.raises(IntegrityError, match="changed after it was checked"):
        push(package, f"{registry.host}/{repository}:1", store=WeightStore(tmp_path / "s1"),
             transport=transport, jobs=1)
    assert not _tag_pushed(registry, repository)
    assert not _blob(registry, weights.read_bytes()).exists()  # no upload was completed
    weights.write_bytes(original)
    capsys.readouterr()
    assert main(["push", str(package), f"{registry.host}/{repository}:1",
                 "--store", str(empty_store(tmp_path / "s2"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "changed after it was checked" in err[0] and str(weights) in err[0]
    assert not _tag_pushed(registry, repository)
    # a rerun on the intact file publishes it
    weights.write_bytes(original)
    monkeypatch.undo()
    push(package, f"{registry.host}/{repository}:1", store=WeightStore(tmp_path / "s3"),
         transport=transport, jobs=1)
    assert _tag_pushed(registry, repository)


def test_a_model_file_changed_after_the_check_is_not_what_is_published(
        package: Path, registry, tmp_path: Path, monkeypatch) -> None:
    """A small file goes up from the bytes that were hashed, so the change is never sent;
    a large one (here: every file) is hashed again as it goes and stopped."""
    model = package / "encoder.onnx"
    original = model.read_bytes()
    copies = [p for p in package.rglob("*.onnx") if p.read_bytes() == original]  # one blob
    _changed_after_the_check(monkeypatch, copies, 40)
    push(package, f"{registry.host}/swap/model:1", store=WeightStore(tmp_path / "s1"))
    assert _tag_pushed(registry, "swap/model")
    assert _blob(registry, original).read_bytes() == original
    assert not _blob(registry, model.read_bytes()).exists()

    for path in copies:
        path.write_bytes(original)
    monkeypatch.setattr(push_module, "KEPT_IN_MEMORY", 0)
    with pytest.raises(IntegrityError, match="changed after it was checked"):
        push(package, f"{registry.host}/swap/model-large:1",
             store=WeightStore(tmp_path / "s2"))
    assert not _tag_pushed(registry, "swap/model-large")

def test_a_store_that_does_not_know_the_build_proves_only_consistency(
        built: Path, package: Path, registry, tmp_path: Path, capsys) -> None:
    """Push cannot rebuild: with a store that holds no record of the build it goes on, and
    says in one stderr line that the folder is proven only internally consistent."""
    other = tmp_path / "other-store"
    shutil.copytree(built / "store", other)
    shutil.rmtree(other / "build-actions")
    capsys.readouterr()
    assert main(["push", str(package), f"{registry.host}/proof/unknown:1",
                 "--store", str(other)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "proven only internally consistent, not the build" in err[0]
    assert str(package) in err[0] and _published(registry, "proof/unknown")


@pytest.mark.parametrize("where", ["typo", "empty"])
def test_a_store_that_is_not_one_is_refused(package: Path, registry, tmp_path: Path,
                                            where: str, capsys) -> None:
    store = tmp_path / where
    if where == "empty":
        store.mkdir()
    assert main(["push", str(package), f"{registry.host}/proof/nostore-{where}:1",
                 "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--store is not a weightstore store" in err[0]
    assert str(store) in err[0] and not _published(registry, f"proof/nostore-{where}")


def test_a_damaged_payload_the_registry_already_holds_is_refused(
        built: Path, package: Path, registry, capsys) -> None:
    """The registry holds every blob (the package was pushed before) and the store knows
    every payload's sha256: a flipped weight byte is still read and refused, as verify
    refuses the folder, and the tag is not moved."""
    from weightstore.errors import RegistryNotFoundError
    from weightstore.registry.client import RegistryClient
    from weightstore.registry.reference import parse_reference

    store = built / "store"
    ref = f"{registry.host}/proof/damaged:1"
    push(package, ref, store=WeightStore(store))
    weights = max((p for p in package.iterdir() if p.name != "encoder.onnx"),
                  key=lambda p: p.stat().st_size)
    _flip(weights, weights.stat().st_size // 2)
    assert main(["verify", str(package), "--store", str(store)]) == 1
    capsys.readouterr()
    assert main(["push", str(package), ref.replace(":1", ":2"), "--store", str(store)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "do not match" in err[0], err
    parsed = parse_reference(ref)
    assert RegistryClient(parsed.host).get_manifest(parsed)[0]  # the first push stands
    with pytest.raises(RegistryNotFoundError):
        RegistryClient(parsed.host).get_manifest(parse_reference(ref.replace(":1", ":2")))
