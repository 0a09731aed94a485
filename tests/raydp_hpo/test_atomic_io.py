"""The one atomic writer: a failed write leaves the old file (or folder) exactly as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

import pytest

from raydp_hpo._atomic_io import atomic_write, atomic_write_bytes, atomic_write_json, replace_dir


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.bin"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]


def test_atomic_write_that_raises_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    def half_then_fail(fh: BinaryIO) -> None:
        fh.write(b"ne")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_atomic_write_json_is_indented_json(tmp_path: Path) -> None:
    target = tmp_path / "r.json"
    atomic_write_json(target, {"a": 1, "p": tmp_path})
    text = target.read_text()
    assert text.endswith("\n") and json.loads(text) == {"a": 1, "p": str(tmp_path)}


def test_replace_dir_swaps_a_whole_folder(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    replace_dir(target, lambda d: (d / "a").write_text("1"))
    replace_dir(target, lambda d: (d / "b").write_text("2"))
    assert sorted(p.name for p in target.iterdir()) == ["b"]  # nothing of the old folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no .partial / .old


def test_replace_dir_whose_build_raises_keeps_the_old_folder(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    replace_dir(target, lambda d: (d / "a").write_text("1"))

    def fail(d: Path) -> None:
        (d / "b").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        replace_dir(target, fail)
    assert [p.name for p in target.iterdir()] == ["a"] and (target / "a").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
