"""Hostile external-data entries: a NUL byte in a location, an offset past the end of the
file, a key given twice. Each is one typed error naming the tensor, for every command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from weightstore.cli import main

from .test_build import write_recipe


def _model(folder: Path, entries: list[tuple[str, str]]) -> Path:
    """One 4 KiB external tensor ``W`` with these external-data entries."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "w.bin").write_bytes(np.arange(1024, dtype=np.float32).tobytes())
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1024],
                    data_location=TensorProto.EXTERNAL)
    for k, v in entries:
        e = t.external_data.add()
        e.key, e.value = k, v
    graph = helper.make_graph([helper.make_node("Identity", ["W"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [t])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _commands(path: Path, tmp_path: Path) -> list[list[str]]:
    recipe = write_recipe(tmp_path, {"m": path}, "\n  - {name: l, external_weight: combined}\n")
    return [["inspect", str(path)], ["convert", "to-inline", str(path), str(tmp_path / "o1")],
            ["convert", "to-external", str(path), str(tmp_path / "o2.onnx")],
            ["resolve", str(path)], ["build", str(recipe), "--store", str(tmp_path / "s")]]


CASES = {
    "nul": ([("location", "w.bin\0x"), ("offset", "0"), ("length", "4096")],
            ["NUL byte", "W", "location=w.bin\\0x"]),
    "offset": ([("location", "w.bin"), ("offset", "100000"), ("length", "4096")],
               ["offset lies past the end", "offset=100000", "file_size=4096"]),
    "offset-no-length": ([("location", "w.bin"), ("offset", "100000")],
                         ["offset lies past the end", "offset=100000", "file_size=4096"]),
    "twice": ([("location", "w.bin"), ("location", "other.bin"), ("offset", "0")],
              ["key twice", "tensor=W", "key=location"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_command_names_the_tensor(tmp_path, capsys, case):
    entries, words = CASES[case]
    path = _model(tmp_path / "model", entries)
    for argv in _commands(path, tmp_path):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("weightstore: error: "), (argv, err)
        for word in words:
            assert word in err[0], (argv, err)
        assert "\0" not in err[0]
