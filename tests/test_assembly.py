"""Package assembly from the store while payloads are still arriving (a pull's downloads)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from weightstore.package.assembly import assemble, weight_file
from weightstore.store import BytesPayload, StoredObject, WeightStore


def test_pieces_wait_for_payloads_that_arrive_later(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "store")
    early, late = BytesPayload.of(b"e" * 700), BytesPayload.of(b"l" * 300)
    store.put([early], kind="separate")
    arriving: dict[str, Future[StoredObject]] = {late.key: Future()}
    files = [weight_file("w", 1536, [(0, 700, early.key), (1024, 300, late.key)])]
    folder = tmp_path / "out"
    folder.mkdir()

    def arrive() -> None:
        time.sleep(0.2)  # assembly is already waiting for it
        store.put([late], kind="separate")
        arriving[late.key].set_result(store.locate([late.key])[late.key])

    threading.Thread(target=arrive).start()
    assemble(store, folder, files, arriving=arriving)
    assert (folder / "w").read_bytes() == b"e" * 700 + bytes(324) + b"l" * 300 + bytes(212)


def test_a_failed_arrival_fails_the_assembly_and_leaves_no_file(tmp_path: Path) -> None:
    store = WeightStore(tmp_path / "store")
    late = BytesPayload.of(b"l" * 300)
    arriving: dict[str, Future[StoredObject]] = {late.key: Future()}
    arriving[late.key].set_exception(ConnectionError("registry went away"))
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(ConnectionError, match="registry went away"):
        assemble(store, folder, [weight_file("w", 300, [(0, 300, late.key)])],
                 arriving=arriving)
    assert list(folder.iterdir()) == []


def test_an_arrived_object_is_still_re_hashed(tmp_path: Path) -> None:
    from weightstore.errors import IntegrityError

    store = WeightStore(tmp_path / "store")
    late = BytesPayload.of(b"l" * 300)
    arriving: dict[str, Future[StoredObject]] = {late.key: Future()}
    folder = tmp_path / "out"
    folder.mkdir()

    def arrive() -> None:
        time.sleep(0.2)
        store.put([late], kind="separate")
        obj = store.locate([late.key])[late.key]
        path = store.path_of(obj)
        path.chmod(0o644)
        with open(path, "r+b") as f:  # damaged after it was verified into the store
            f.seek(obj.offset + 5)
            f.write(b"X")
        arriving[late.key].set_result(obj)

    threading.Thread(target=arrive).start()
    with pytest.raises(IntegrityError):
        assemble(store, folder, [weight_file("w", 300, [(0, 300, late.key)])],
                 arriving=arriving)
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize(("name", "hidden", "inside"), [
    ("a/b", True, True), ("devices/npu/m.onnx", False, True), (".x", True, True),
    (".x", False, False), ("a/.lock", False, False), ("a/../b", True, False),
    ("/a", True, False), ("", True, False), ("a\\b", True, False), ("a\x00", True, False),
    ("a//b", True, False), ("a/./b", True, False), ("..", True, False), (None, True, False),
])
def test_one_rule_keeps_archive_manifest_and_record_paths_inside(name, hidden, inside):
    """Unpacked archive members, artifact file paths and action record names all pass
    through this check."""
    from weightstore.io.files import is_relative_inside

    assert is_relative_inside(name, hidden=hidden) is inside
