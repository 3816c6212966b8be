"""kernels.atomic.write_atomic: whole files or none, no leftovers, modes as for any new file."""
from __future__ import annotations

import os
import stat

import pytest

from kernels.atomic import write_atomic


def test_text_bytes_and_writer_functions_replace_the_file(tmp_path):
    path = tmp_path / "f.txt"
    assert write_atomic(path, "é\n") == path and path.read_text(encoding="utf-8") == "é\n"
    write_atomic(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    write_atomic(path, lambda fh: fh.write(b"written"))
    assert path.read_bytes() == b"written" and os.listdir(tmp_path) == ["f.txt"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("old")

    def half(fh):
        fh.write(b"ne")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, half)
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]


def test_a_read_only_file_is_refused_not_replaced(tmp_path, monkeypatch):
    path = tmp_path / "f.txt"
    path.write_text("mine")
    path.chmod(0o444)
    if os.geteuid() == 0:   # root may write anything: show it what anyone else would see
        access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(path) else access(p, mode))
    with pytest.raises(PermissionError, match="read-only") as caught:
        write_atomic(path, "theirs")
    assert caught.value.filename == str(path)
    assert path.read_text() == "mine" and os.listdir(tmp_path) == ["f.txt"]


def test_a_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "f.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.txt").stat().st_mode) == 0o640
