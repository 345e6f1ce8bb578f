"""Reproducible release archives, SHA256SUMS, release.json and ``release --check``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import zstandard

from tests.release_helpers import OTHER_UID, make_checkout, released_files, run_as_other_user
from weightstore.cli import main
from weightstore.errors import PackageError
from weightstore.release.api import ReleaseOptions, check_release, release
from weightstore.release.archive import DEFAULT_EPOCH, plan_archive, source_date_epoch
from weightstore.release.compression import Compression
from weightstore.release.provenance import PREDICATE_TYPE, STATEMENT_TYPE

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def released(encoder_model, tmp_path):
    recipe = make_checkout(tmp_path / "checkout", encoder_model)
    result = release(recipe, ReleaseOptions(jobs=2))
    return recipe, result


def _members(path: Path) -> list[tarfile.TarInfo]:
    with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r, \
            tarfile.open(fileobj=r, mode="r|") as tf:
        return list(tf)


def test_release_writes_archives_sums_and_provenance(released):
    recipe, result = released
    out = recipe.parent / "out" / "releases" / "pkg-1.0.0"
    assert result.output == out
    names = sorted(os.listdir(out))
    assert names == ["SHA256SUMS", "pkg-1.0.0-combined.tar.zst", "pkg-1.0.0-separate.tar.zst",
                     "release.json"]
    sums = (out / "SHA256SUMS").read_text().splitlines()
    expected = [f"{hashlib.sha256((out / n).read_bytes()).hexdigest()}  {n}"
                for n in names if n.endswith(".tar.zst")]
    assert sums == expected
    if shutil.which("sha256sum"):
        subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=out, check=True,
                       capture_output=True)


def test_archive_headers_are_pinned(released, monkeypatch):
    _, result = released
    archive = result.output / "pkg-1.0.0-combined.tar.zst"
    members = _members(archive)
    root = "pkg-1.0.0-combined"
    assert members[0].name == root and members[0].isdir()
    assert members[1].name == f"{root}/summary.json"
    rest = [tuple(m.name.split("/")[1:]) for m in members[2:]]
    assert rest == sorted(rest)
    for m in members:
        assert (m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "")
        assert m.mtime == DEFAULT_EPOCH
        assert m.mode == (0o755 if m.isdir() else 0o644)
        assert m.isdir() or m.isreg()
        assert not {"atime", "ctime"} & set(m.pax_headers)
        assert not any(k.startswith("SCHILY.xattr") for k in m.pax_headers)
    with open(archive, "rb") as f:
        data = f.read()
    params = zstandard.get_frame_parameters(data)
    assert params.has_checksum and params.content_size == len(
        zstandard.ZstdDecompressor().decompress(data))
    assert params.content_size % 10240 == 0
    start = members[1].offset_data
    tar = zstandard.ZstdDecompressor().decompress(data)
    summary = json.loads(tar[start:start + members[1].size])
    assert [m.name.split("/", 1)[1] for m in members if m.isfile()][1:] == sorted(
        c["path"] for c in summary["contents"])


def test_source_date_epoch(encoder_model, tmp_path, monkeypatch):
    assert source_date_epoch({}) == DEFAULT_EPOCH
    assert source_date_epoch({"SOURCE_DATE_EPOCH": "1700000000"}) == 1700000000
    with pytest.raises(Exception, match="SOURCE_DATE_EPOCH"):
        source_date_epoch({"SOURCE_DATE_EPOCH": "yesterday"})
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    recipe = make_checkout(tmp_path, encoder_model)
    result = release(recipe, ReleaseOptions(jobs=1))
    archive = result.output / "pkg-1.0.0-separate.tar.zst"
    assert {m.mtime for m in _members(archive)} == {1700000000}
    doc = json.loads((result.output / "release.json").read_text())
    assert doc["predicate"]["buildDefinition"]["externalParameters"]["source_date_epoch"] == \
        1700000000


def test_a_release_of_another_date_is_replaced_only_with_force(encoder_model, tmp_path,
                                                               monkeypatch, capsys):
    """A release made with the commit's SOURCE_DATE_EPOCH is not silently replaced by one
    of another date (a later command that forgot the variable): exit 2, nothing touched."""
    recipe = make_checkout(tmp_path, encoder_model)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert main(["release", str(recipe)]) == 0
    published = released_files(recipe.parent)
    assert main(["release", str(recipe)]) == 0  # the same date: released again, the same
    assert released_files(recipe.parent) == published
    capsys.readouterr()
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert main(["release", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "another date" in err and "--force" in err
    assert "1700000000 (2023-11-14T22:13:20Z)" in err and "315532800" in err
    assert released_files(recipe.parent) == published
    with pytest.raises(PackageError, match="another date"):
        release(recipe, ReleaseOptions(jobs=1))
    assert main(["release", str(recipe), "--force"]) == 0
    doc = json.loads(released_files(recipe.parent)["release.json"])
    assert doc["predicate"]["buildDefinition"]["externalParameters"][
        "source_date_epoch"] == DEFAULT_EPOCH


def test_worker_count_does_not_change_the_bytes(released):
    recipe, result = released
    package = recipe.parent / "out" / "pkg" / "1.0.0" / "combined"
    digests = set()
    for jobs in (1, 2, 3, 5):
        out = release(package, ReleaseOptions(output=str(recipe.parent / f"r{jobs}"), jobs=jobs))
        digests.add(out.archives[0].sha256)
    assert digests == {next(a.sha256 for a in result.archives if a.layout == "combined")}


def test_levels_and_long_distance_give_valid_frames(released, tmp_path):
    recipe, _ = released
    package = recipe.parent / "out" / "pkg" / "1.0.0" / "separate"
    sizes = {}
    for level, long in ((1, False), (19, False), (3, True)):
        out = release(package, ReleaseOptions(output=str(tmp_path / f"l{level}{long}"), jobs=2,
                                              compression=Compression(level, long)))
        sizes[(level, long)] = out.archives[0].size
        data = (out.output / out.archives[0].file_name).read_bytes()
        assert zstandard.get_frame_parameters(data).has_checksum
    assert sizes[(19, False)] < sizes[(1, False)]
    with pytest.raises(ValueError):
        Compression(0)


def test_release_json_is_an_in_toto_slsa_statement(released):
    recipe, result = released
    doc = json.loads((result.output / "release.json").read_text())
    assert doc["_type"] == STATEMENT_TYPE and doc["predicateType"] == PREDICATE_TYPE
    assert set(doc) == {"_type", "subject", "predicateType", "predicate"}
    subjects = {s["name"]: s["digest"]["sha256"] for s in doc["subject"]}
    assert subjects == {a.file_name: a.sha256 for a in result.archives}
    build = doc["predicate"]["buildDefinition"]
    assert set(doc["predicate"]) == {"buildDefinition", "runDetails"}
    deps = {d["name"]: d["digest"] for d in build["resolvedDependencies"]}
    assert deps["recipe/recipe.yaml"] == {
        "sha256": hashlib.sha256(recipe.read_bytes()).hexdigest()}
    summary = json.loads((recipe.parent / "out/pkg/1.0.0/combined/summary.json").read_text())
    assert deps["models/encoder"] == {"blake3": summary["models"][0]["source_digest"][7:]}
    assert build["internalParameters"]["fingerprints"]["combined"] == summary["fingerprint"]
    versions = doc["predicate"]["runDetails"]["builder"]["version"]
    assert {"weightstore", "onnx", "protobuf", "numpy", "zstandard", "python"} <= set(versions)
    text = (result.output / "release.json").read_text()
    assert str(recipe.parent) not in text and os.uname().nodename not in text


def test_release_refuses_a_package_changed_since_its_summary(released, tmp_path):
    recipe, _ = released
    package = recipe.parent / "out" / "pkg" / "1.0.0" / "combined"
    weights = package / "encoder_weight_combined"
    before = weights.stat()
    data = bytearray(weights.read_bytes())
    data[7] ^= 1
    weights.write_bytes(bytes(data))  # same size, in place, times put back
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    out = tmp_path / "bad"
    assert main(["release", str(package), "--output", str(out)]) == 2
    assert not out.exists()  # the temp archive is gone, and the folder the run made


CHILD = """
import os, sys
os.umask(int(sys.argv[1], 8))
from weightstore.cli import main
from weightstore.errors import PackageError
sys.exit(main(sys.argv[2:]))
"""


def _release_in(checkout: Path, umask: str, env: dict[str, str], jobs: int) -> dict[str, bytes]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    full.pop("WEIGHTSTORE_DIR", None)
    subprocess.run([sys.executable, "-c", CHILD, umask, "release", "recipe.yaml", "--jobs",
                    str(jobs)], cwd=checkout, env=full, check=True, capture_output=True)
    return released_files(checkout)


def test_reproducible_across_paths_umask_tz_locale_threads_and_stores(encoder_model, tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "some" / "other place" / "b"
    make_checkout(a, encoder_model)
    make_checkout(b, encoder_model)
    first = _release_in(a, "022", {"TZ": "UTC", "LC_ALL": "C"}, jobs=1)
    other = _release_in(b, "077", {"TZ": "Pacific/Chatham", "LC_ALL": "C.UTF-8",
                                   "LANG": "fr_FR.UTF-8", "HOME": str(b)}, jobs=3)
    assert other == first  # other path, umask, TZ, locale, thread count, cold store
    shutil.rmtree(a / "out")  # warm store, fresh output
    warm = _release_in(a, "002", {"TZ": "America/St_Johns"}, jobs=2)
    assert warm == first
    again = _release_in(a, "022", {}, jobs=2)  # everything up to date
    assert again == first
    assert sorted(first) == ["SHA256SUMS", "pkg-1.0.0-combined.tar.zst",
                             "pkg-1.0.0-separate.tar.zst", "release.json"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="releasing as another user needs root to switch users (CI runs as root)")
def test_reproducible_across_users(encoder_model):
    """Root releases in one checkout, ``nobody`` in another (its own, under another path,
    umask 077, TZ and locale): the same bytes. Any failure to run as ``nobody`` fails."""
    base = Path(tempfile.mkdtemp(prefix="weightstore-users-"))  # not under pytest's 0700 root
    try:
        os.chmod(base, 0o755)
        mine = base / "root"
        theirs = base / "other user" / "b"
        make_checkout(mine, encoder_model)
        make_checkout(theirs, encoder_model)
        for p in [theirs.parent, theirs, *theirs.rglob("*")]:
            os.chown(p, OTHER_UID, OTHER_UID)  # the other user's checkout
        env = {"HOME": str(theirs), "XDG_CACHE_HOME": str(theirs / ".cache"),
               "TZ": "Pacific/Chatham", "LC_ALL": "C.UTF-8", "LANG": "fr_FR.UTF-8",
               "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        report = run_as_other_user(mine, theirs, ["release", "recipe.yaml", "--jobs", "3"],
                                   env, umask=0o077)
        assert "error" not in report, report["error"]
        assert report["warm_exit"] == 0 and report["exit"] == 0, report["output"]
        assert (report["uid"], report["euid"], report["gid"], report["groups"]) == (
            OTHER_UID, OTHER_UID, OTHER_UID, [])
        assert report["umask"] == 0o077 and report["tz"] != "UTC"
        out = theirs / "out" / "releases" / "pkg-1.0.0"
        made = [out, *out.iterdir(), theirs / "store", theirs / "out" / "pkg"]
        assert {p.stat().st_uid for p in made} == {OTHER_UID}  # written by the other user
        assert released_files(theirs) == released_files(mine)
    finally:
        shutil.rmtree(base)


def test_check_passes_and_names_the_first_difference(released, capsys):
    recipe, result = released
    check = check_release(recipe, ReleaseOptions(jobs=2))
    assert check.ok and len(check.compared) == 4
    assert main(["release", "--check", str(recipe)]) == 0
    capsys.readouterr()
    # a published archive that is not what the recipe builds
    bad = result.output / "pkg-1.0.0-separate.tar.zst"
    original = bad.read_bytes()
    other_epoch = release(recipe.parent / "out/pkg/1.0.0/separate",
                          ReleaseOptions(output=str(recipe.parent / "tmp"), epoch=1))
    shutil.copyfile(other_epoch.output / other_epoch.archives[0].file_name, bad)
    assert main(["release", "--check", str(recipe)]) == 1
    out = capsys.readouterr().out
    assert "pkg-1.0.0-separate.tar.zst: member pkg-1.0.0-separate: mtime 1 != 315532800" in out
    (result.output / "release.json").write_text("{}")
    shutil.copyfile(recipe.parent / "tmp" / other_epoch.archives[0].file_name, bad)
    assert main(["release", "--check", str(recipe), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["difference"].startswith("pkg-1.0.0-separate.tar.zst")
    # a published archive cut short is a difference too, named as what it is
    bad.write_bytes(original[:-1])
    assert main(["release", "--check", str(recipe)]) == 1
    assert "the data ends inside a frame" in capsys.readouterr().out


def test_check_names_files_release_does_not_write(released, capsys):
    """An archive the recipe does not build, a note, a folder: the release folder holds
    them beside what release wrote, and --check refuses to call it reproducible."""
    recipe, result = released
    (result.output / "evil.tar.zst").write_bytes(zstandard.compress(b"not a package"))
    (result.output / "notes.txt").write_text("mine")
    (result.output / "extra").mkdir()
    with pytest.raises(PackageError, match="files release does not write") as info:
        check_release(recipe, ReleaseOptions(jobs=1))
    assert info.value.context["files"] == "evil.tar.zst, extra, notes.txt"
    capsys.readouterr()
    assert main(["release", "--check", str(recipe)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "evil.tar.zst, extra, notes.txt" in err[0]
    for name in ("evil.tar.zst", "notes.txt"):
        (result.output / name).unlink()
    (result.output / "extra").rmdir()
    # a killed release's temp folder is removed, as the next release removes it, whatever
    # it holds: nothing of it is taken for part of the release
    dead = Path(tempfile.mkdtemp(prefix=".release.", suffix=".tmp", dir=result.output))
    (dead / "evil.tar.zst").write_bytes(b"x")
    assert check_release(recipe, ReleaseOptions(jobs=1)).ok
    assert not dead.exists()


@pytest.mark.parametrize("kind", ["file", "folder", "link"])
def test_check_names_what_only_looks_like_a_temp_folder(released, tmp_path, capsys,
                                                        kind) -> None:
    """Only a folder a release makes for its files is passed over (a live run's, which
    it holds locked, or a killed run's, named as make_temp_dir names it); a file or a link
    named like one, or a folder whose name release never gives, is named with what is in
    it."""
    from weightstore.io.files import discard_temp_dir, make_temp_dir
    from weightstore.release.api import TEMP_PREFIX

    recipe, result = released
    live = make_temp_dir(result.output, TEMP_PREFIX)  # held by this (live) run
    try:
        (live / "pkg-1.0.0-combined.tar.zst").write_bytes(b"being written")
        name = ".release.x.tmp"
        if kind == "file":
            (result.output / name).write_bytes(b"evil")
        elif kind == "folder":
            (result.output / name).mkdir()
            (result.output / name / "evil.tar.zst").write_bytes(b"evil")
        else:
            (tmp_path / "elsewhere").mkdir()
            name = Path(tempfile.mkdtemp(prefix=".release.", suffix=".tmp",
                                         dir=tmp_path)).name
            (result.output / name).symlink_to(tmp_path / "elsewhere")
        with pytest.raises(PackageError, match="files release does not write") as info:
            check_release(recipe, ReleaseOptions(jobs=1))
        assert info.value.context["files"] == name
        assert main(["release", "--check", str(recipe)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0] and live.name not in err[0]
    finally:
        discard_temp_dir(live)


def test_check_needs_a_recipe_and_a_release(released, tmp_path):
    recipe, _ = released
    assert main(["release", "--check", str(recipe.parent / "out/pkg/1.0.0/combined")]) == 2
    assert main(["release", "--check", str(recipe), "--output", str(tmp_path / "none")]) == 2


def test_plan_is_pure_and_orders_folders_first():
    summary = {"package": "p", "version": "1", "layout": {"name": "l"},
               "contents": [{"path": "z.onnx", "size": 3, "digest": "blake3:" + "0" * 64},
                            {"path": "devices/d/m.onnx", "size": 1,
                             "digest": "blake3:" + "1" * 64},
                            {"path": "a.data", "size": 600, "digest": "blake3:" + "2" * 64}]}
    plan = plan_archive(summary, 10, 0)
    assert [e.name for e in plan.entries] == [
        "p-1-l", "p-1-l/summary.json", "p-1-l/a.data", "p-1-l/devices", "p-1-l/devices/d",
        "p-1-l/devices/d/m.onnx", "p-1-l/z.onnx"]
    headers = 7 * 512
    data = 512 + 1024 + 512 + 512
    assert plan.tar_size == (headers + data + 1024 + 10239) // 10240 * 10240


def test_check_uses_the_published_epoch_and_compression(encoder_model, tmp_path, monkeypatch):
    recipe = make_checkout(tmp_path, encoder_model)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1234567890")
    release(recipe, ReleaseOptions(jobs=2, compression=Compression(1, long_distance=True)))
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert check_release(recipe, ReleaseOptions(jobs=1)).ok


def test_unlisted_files_do_not_make_a_package_stale(released):
    recipe, _ = released
    from weightstore.builder.run import BuildOptions, build

    (recipe.parent / "out/pkg/1.0.0/combined/NOTES.txt").write_text("mine")
    again = build(recipe, BuildOptions(jobs=1))
    assert [p.status for p in again.packages] == ["up-to-date", "up-to-date"]
    assert (recipe.parent / "out/pkg/1.0.0/combined/NOTES.txt").read_text() == "mine"


def test_version_folder_releases_every_layout_and_json_output(released, tmp_path, capsys):
    recipe, result = released
    version = recipe.parent / "out" / "pkg" / "1.0.0"
    assert main(["release", str(version), "--output", str(tmp_path / "v"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc["files"]) == sorted([a.file_name for a in result.archives]
                                          + ["SHA256SUMS", "release.json"])
    # the same archives as from the recipe; release.json differs only by the recipe
    assert (tmp_path / "v" / "SHA256SUMS").read_bytes() == (
        result.output / "SHA256SUMS").read_bytes()
    statement = json.loads((tmp_path / "v" / "release.json").read_text())
    assert statement["predicate"]["buildDefinition"]["externalParameters"]["recipe"] is None


def test_release_refuses_what_is_not_one_package_version(released, tmp_path):
    recipe, _ = released
    assert main(["release", str(tmp_path / "nothing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["release", str(tmp_path / "empty")]) == 2
    mixed = tmp_path / "mixed"
    shutil.copytree(recipe.parent / "out/pkg/1.0.0/combined", mixed / "a")
    shutil.copytree(recipe.parent / "out/pkg/1.0.0/separate", mixed / "b")
    summary = json.loads((mixed / "b" / "summary.json").read_text())
    summary["version"] = "2.0.0"
    (mixed / "b" / "summary.json").write_text(json.dumps(summary))
    assert main(["release", str(mixed), "--output", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_owner_mode_and_times_of_package_files_do_not_enter_the_archive(released, tmp_path):
    recipe, result = released
    package = recipe.parent / "out" / "pkg" / "1.0.0" / "separate"
    before = next(a.sha256 for a in result.archives if a.layout == "separate")
    for p in [package, *package.rglob("*")]:
        if hasattr(os, "chown") and os.geteuid() == 0:
            os.chown(p, 65534, 65534)  # another user's files
        os.chmod(p, 0o700 if p.is_dir() else 0o600)
        os.utime(p, (1, 2))
    again = release(package, ReleaseOptions(output=str(tmp_path / "o"), jobs=1))
    assert again.archives[0].sha256 == before
