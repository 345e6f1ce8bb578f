"""What a package write and a pull make durable, and when: each weight file fsynced before
it is renamed, its folder once; a blob waiting for its store commit holds no download."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from weightstore.io import files
from weightstore.layout import writer
from weightstore.layout.plan import LayoutPlan, PlannedFile, PlannedPayload
from weightstore.store import BytesPayload

from .helpers import TWO_LAYOUTS
from .registry_server import needs_registry, running_registry


def _plan(names: list[str]) -> tuple[LayoutPlan, dict[str, bytes]]:
    payloads = {name: BytesPayload.of(os.urandom(3000 + i)) for i, name in enumerate(names)}
    plan = LayoutPlan("separate", 1, tuple(
        PlannedFile(name, p.size, (PlannedPayload(p.key, p.size, name, 0),))
        for name, p in payloads.items()))
    return plan, {p.key: p.data for p in payloads.values()}


def test_every_weight_file_is_durable_before_it_is_renamed_and_its_folder_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The files of a batch are fsynced by the workers that read them back, side by side,
    each before its rename; the folders are fsynced once for the batch, not once a file
    (a separate layout of a hundred weights made a hundred folder fsyncs, one after
    another)."""
    names = [f"w{i}.bin" for i in range(6)] + [f"group/v{i}.bin" for i in range(3)]
    plan, data = _plan(names)
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    real_fsync, real_replace, real_fsync_dir = os.fsync, os.replace, files.fsync_dir

    def fsync(fd: int) -> None:
        real_fsync(fd)
        with lock:
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_replace(src, dst)
        with lock:
            events.append(("rename", os.fspath(src)))

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        real_fsync_dir(path)
        with lock:
            events.append(("folder", os.fspath(path)))

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc/self/fd to name a descriptor's file")
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(files, "fsync_dir", fsync_dir)  # where atomic_writer finds it
    monkeypatch.setattr(writer, "fsync_dir", fsync_dir, raising=False)
    folder = tmp_path / "pkg"
    writer.write_plan(plan, folder, data.__getitem__, jobs=3)
    assert {name: (folder / name).read_bytes() for name in names} == \
        {f.name: data[f.payloads[0].key] for f in plan.files}
    renamed = [path for kind, path in events if kind == "rename"]
    assert len(renamed) == len(names)
    for path in renamed:  # the temp file was durable before it took the name
        assert events.index(("fsync", path)) < events.index(("rename", path))
    folders = [(i, path) for i, (kind, path) in enumerate(events) if kind == "folder"]
    assert sorted(path for _, path in folders) == [str(folder), str(folder / "group")]
    last_rename = max(i for i, (kind, _) in enumerate(events) if kind == "rename")
    assert all(i > last_rename for i, _ in folders)


@needs_registry
def test_a_blob_waiting_for_its_store_commit_holds_no_download(
        tmp_path: Path, encoder_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """A downloaded blob goes into the store in a group commit; while it waits for one,
    the next blob downloads (--jobs bounds the blobs in flight, not the blobs waiting to
    be committed). With --jobs 1 and the first commit held, the pull used to stop until
    it was released."""
    import onnx

    from weightstore.builder.run import build
    from weightstore.registry.pull import pull
    from weightstore.registry.push import push
    from weightstore.store import WeightStore

    onnx.save(encoder_model, tmp_path / "model.onnx")
    (tmp_path / "recipe.yaml").write_text(TWO_LAYOUTS)
    package = {p.layout: p.path for p in build(tmp_path / "recipe.yaml").packages}["per-weight"]
    store = WeightStore(tmp_path / "pull-store")
    real = store.adopt_many
    commits: list[int] = []
    held = threading.Event()
    another = threading.Event()
    overlapped: list[bool] = []

    def held_first(paths):  # the first commit waits until another blob downloads
        commits.append(len(paths))
        if len(commits) == 1:
            held.set()
            overlapped.append(another.wait(10))
        return real(paths)

    def starting(*args, **kwargs):
        if held.is_set():
            another.set()  # a download started while the first commit was held
        return real_download(*args, **kwargs)

    import weightstore.registry.fetch as pulling

    real_download = pulling._download_payload
    with running_registry(tmp_path / "registry") as server:
        ref = f"{server.host}/pipe/pkg:1"
        push(package, ref, store=WeightStore(os.environ["WEIGHTSTORE_DIR"]))
        store.adopt_many = held_first  # type: ignore[method-assign]
        monkeypatch.setattr(pulling, "_download_payload", starting)
        pull(ref, tmp_path / "pulled", store=store, jobs=1)
    assert overlapped == [True] and len(commits) > 1
    assert (tmp_path / "pulled" / "summary.json").read_bytes() == \
        (package / "summary.json").read_bytes()
    assert store.verify().ok


@pytest.mark.parametrize("block", [512, 1024, 4096])
def test_a_gap_is_written_where_it_holds_a_whole_block_of_the_file_system(block):
    """Padding is judged against the file system's block, not a fixed 4 KiB: on 1 KiB
    blocks a 2 KiB gap can be a hole, and a gap that holds no aligned block never is."""
    assert writer.spans_block(0, block, block)
    assert not writer.spans_block(1, block + 1, block)  # straddles two blocks
    assert writer.spans_block(1, 2 * block, block)
    assert not writer.spans_block(block - 1, 2 * block - 1, block)
    assert writer.spans_block(3 * block, 4 * block, block)
    assert not writer.spans_block(5, 5, block)


def test_the_block_of_a_written_file_is_the_file_systems_own(tmp_path: Path) -> None:
    """What a file's gaps are judged against: its file system's fundamental block, at
    most 4 KiB; then a written file is dense, with a payload placed between padding that
    straddles blocks and padding that spans them."""
    with open(tmp_path / "f", "wb") as f:
        block = writer.hole_block(f.fileno())
        assert block == min(os.fstatvfs(f.fileno()).f_frsize, writer.HOLE_BLOCK)
    data = os.urandom(100)
    key = BytesPayload.of(data).key
    plan = LayoutPlan("combined", 1, (PlannedFile("w", 5 * block + 300, (
        PlannedPayload(key, 100, "w", 3 * block + 7),)),))
    writer.write_plan(plan, tmp_path / "out", lambda key: data)
    written = (tmp_path / "out" / "w").read_bytes()
    assert written == bytes(3 * block + 7) + data + bytes(2 * block + 193)
    st = (tmp_path / "out" / "w").stat()
    assert st.st_blocks * 512 >= st.st_size
