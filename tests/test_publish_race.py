"""Two runs that publish the same new folder at once: exactly one wins, the other gets one
line naming the folder and exit 2, and nothing either wrote is lost or half-replaced.

Each race is real: two threads run the command line, and a barrier holds both just after
they found the folder absent (before the folder's lock, where the command takes one, else
before the rename), so both really reach the publishing step with the same belief.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tests.release_helpers import make_checkout
from weightstore.cli import main
from weightstore.packaging.inventory import verify_package
from weightstore.release.api import ReleaseOptions, release

from .registry_server import needs_registry, running_registry
from .samples import make_encoder

RACE_LINE = "another run published this folder meanwhile"


def _barrier_before(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> None:
    """``owner.name`` waits for the other racer before it runs (both run it, or the wait
    ends after a few seconds: a racer that never gets there, e.g. refused earlier)."""
    barrier = threading.Barrier(2)
    original = getattr(owner, name)

    def waiting(*args, **kwargs):
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=10)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, waiting)


def _race(argvs: Sequence[Sequence[str]]) -> list[int]:
    codes: list[int] = [-1] * len(argvs)

    def run(i: int) -> None:
        codes[i] = main(list(argvs[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(argvs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return codes


def _one_winner(codes: list[int], err: str, folder: Path) -> None:
    assert sorted(codes) == [0, 2], err
    lines = [line for line in err.splitlines() if line.startswith("weightstore:")]
    assert len(lines) == 1, err
    assert RACE_LINE in lines[0] and str(folder) in lines[0], lines[0]


def _no_temps(parent: Path) -> None:
    assert [p.name for p in parent.iterdir() if p.name.startswith(".")
            and p.name.endswith(".tmp")] == []


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("race")
    recipe = make_checkout(root, make_encoder(vocab=200, hidden=32, layers=1, ffn=64))
    result = release(recipe, ReleaseOptions(jobs=1, store=str(root / "store")))
    return recipe, root / "out" / "pkg" / "1.0.0", result.output


def test_publishing_a_folder_made_meanwhile_is_refused(tmp_path):
    """The shared step: a folder that appeared since the run looked is never replaced."""
    from weightstore.errors import PackageError
    from weightstore.io.files import make_temp_dir, publish_dir

    final = tmp_path / "pkg"
    tmp = make_temp_dir(tmp_path, ".pkg.")
    (tmp / "file").write_text("mine")
    final.mkdir()
    (final / "file").write_text("theirs")
    with pytest.raises(PackageError, match=RACE_LINE):
        publish_dir(tmp, final)
    assert (final / "file").read_text() == "theirs"
    publish_dir(tmp, tmp_path / "empty", over_empty=True)  # an empty folder may be taken
    assert (tmp_path / "empty" / "file").read_text() == "mine"


def test_unpack_race(released, tmp_path, monkeypatch, capsys):
    from weightstore.packaging import unpack

    _, _, output = released
    archive = output / "pkg-1.0.0-combined.tar.zst"
    dest = tmp_path / "same"
    _barrier_before(monkeypatch, unpack, "publish_dir")
    codes = _race([["unpack", str(archive), str(dest)]] * 2)
    _one_winner(codes, capsys.readouterr().err, dest)
    assert verify_package(dest).ok
    _no_temps(tmp_path)


def test_bundle_race(released, tmp_path, monkeypatch, capsys):
    from weightstore.packaging import bundles

    _, version, _ = released
    dest = tmp_path / "bundle"
    _barrier_before(monkeypatch, bundles, "publish_dir")
    codes = _race([["bundle", str(version / "separate"), "cpu", "--output", str(dest)]] * 2)
    _one_winner(codes, capsys.readouterr().err, dest)
    assert (dest / "bundle.json").is_file() or any(dest.iterdir())
    _no_temps(tmp_path)


def _lock_barrier(monkeypatch: pytest.MonkeyPatch) -> None:
    from weightstore.io import locks

    _barrier_before(monkeypatch, locks, "target_lock")


def test_build_race_through_two_stores(released, tmp_path, monkeypatch, capsys):
    """Builds through different stores hold different locks: the rename decides."""
    recipe, _, _ = released
    text = recipe.read_text().replace("output: out", f"output: {tmp_path / 'out'}")
    text = text.replace("  - {name: separate, external_weight: separate, "
                        "size_threshold: 1024}\n", "")
    mine = tmp_path / "recipe.yaml"
    mine.write_text(text.replace("path: store", f"path: {recipe.parent / 'store'}"))
    (tmp_path / "models").symlink_to(recipe.parent / "models")
    _lock_barrier(monkeypatch)
    codes = _race([["build", str(mine), "--store", str(tmp_path / f"s{i}")]
                   for i in range(2)])
    target = tmp_path / "out" / "pkg" / "1.0.0" / "combined"
    _one_winner(codes, capsys.readouterr().err, target)
    assert verify_package(target).ok
    _no_temps(target.parent)


def _sums(folder: Path) -> dict[str, str]:
    out = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        out[name.lstrip("*")] = digest
    return out


def test_release_race_leaves_one_whole_release(released, tmp_path, monkeypatch, capsys):
    """release replaces the release in its folder by design: both runs succeed, and the
    folder holds one run's whole set (checksums of the archives it holds), never a mix."""
    from weightstore.release import api

    _, version, _ = released
    out = tmp_path / "rel"
    _barrier_before(monkeypatch, api, "folder_lock")
    codes = _race([["release", str(version / "combined"), "--output", str(out),
                    "--level", str(level)] for level in (1, 9)])
    assert codes == [0, 0], capsys.readouterr().err
    sums = _sums(out)
    assert sums and all(hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
                        for name, digest in sums.items())
    assert main(["unpack", str(out / next(iter(sums))), str(tmp_path / "u")]) == 0
    _no_temps(out)


@needs_registry
@pytest.mark.parametrize("stores", ["one store", "two stores"])
def test_pull_race(released, tmp_path, monkeypatch, capsys, stores):
    _, version, _ = released
    with running_registry(tmp_path / "registry") as registry:
        ref = f"{registry.host}/race/pkg:1"
        assert main(["push", str(version / "combined"), ref, "-q"]) == 0
        capsys.readouterr()  # the push's line: the default store does not know the build
        dest = tmp_path / "pulled"
        _lock_barrier(monkeypatch)
        store: Callable[[int], Path] = ((lambda i: tmp_path / "s")
                                        if stores == "one store" else
                                        (lambda i: tmp_path / f"s{i}"))
        codes = _race([["pull", ref, str(dest), "--store", str(store(i)), "-q"]
                       for i in range(2)])
    _one_winner(codes, capsys.readouterr().err, dest)
    assert verify_package(dest).ok
    _no_temps(tmp_path)


_KILLED_MIDWAY = """
import os, signal, sys
from weightstore.cli import main
from weightstore.packaging import unpack
from weightstore.release import api

def killed(original):
    def run(*args, **kwargs):
        original(*args, **kwargs)  # one archive or file written into the temp folder
        os.kill(os.getpid(), signal.SIGKILL)
    return run

api._write_archive = killed(api._write_archive)
unpack.write_new = killed(unpack.write_new)
sys.exit(main(sys.argv[1:]))
"""

_HOLDER = """
import sys, time
from pathlib import Path
from weightstore.io.files import make_temp_dir
print(make_temp_dir(Path(sys.argv[1]), sys.argv[2]), flush=True)
time.sleep(120)
"""


def _temps(parent: Path, prefix: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(prefix)
                  and p.name.endswith(".tmp"))


@pytest.mark.parametrize("command", ["release", "unpack"])
def test_a_killed_runs_temp_folder_goes_with_the_next_run(released, tmp_path, command):
    """release and unpack killed with SIGKILL midway leave their temp folder; the next run
    into the same place removes it, but never the temp folder of a live run."""
    import subprocess
    import sys

    _, version, output = released
    if command == "release":
        parent, prefix = tmp_path / "rel", ".release."
        argv = ["release", str(version / "combined"), "--output", str(parent)]
    else:
        parent, prefix = tmp_path, ".same."
        argv = ["unpack", str(output / "pkg-1.0.0-combined.tar.zst"), str(tmp_path / "same")]
    left: list[str] = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _KILLED_MIDWAY, *argv],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == -9, done.stderr
        now = _temps(parent, prefix)
        assert len(now) == 1 and now != left  # the earlier kill's went with this run
        left = now
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(parent), prefix],
                              stdout=subprocess.PIPE, text=True)
    try:
        live = Path(holder.stdout.readline().strip())
        assert live.is_dir()
        assert main(argv) == 0
        assert _temps(parent, prefix) == [live.name]  # the live run's is left alone
    finally:
        holder.kill()
        holder.wait()
