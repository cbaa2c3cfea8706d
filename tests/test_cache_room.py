"""A coefficient cache on a disk with no room for it: one line, status 1, nothing left behind.

A cache written to a file is memory-mapped; a write through the mapping into a block the disk
cannot give is no error Python sees but SIGBUS, which ended the process ("Bus error", status
135) and left the cache's folder behind. The capture now reserves each file's blocks first.
The real case runs `graphaudit replay` with its `--cache-dir` on a 1 MiB tmpfs, in a mount
namespace of its own (`unshare -m`), where the system allows one; the others fake the answer.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graphaudit.replay.cache_files as cache_files
from graphaudit.errors import GraphAuditError
from graphaudit.replay.capture import capture

from support.cache_files import temporary_folders
from support.models import gated_lm, traced

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "featuregate"  # its calibration cache: 512 KiB per coefficient, past 1 MiB in all

# mounts a 1 MiB tmpfs at $1, runs the rest, then prints its status and what it left there
_ON_A_SMALL_DISK = """
mount -t tmpfs -o size=1m tmpfs "$1" || exit 77
shift
"$@"
echo "status=$?"
echo "left=$(ls -A "$DIR")"
"""


def _no_room(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate on this system")
def test_a_temporary_cache_with_no_room_is_one_error_and_its_folder_goes(monkeypatch):
    trace, coefs, data = traced(gated_lm)
    made = temporary_folders(monkeypatch)
    monkeypatch.setattr(cache_files.os, "posix_fallocate", _no_room)
    with pytest.raises(GraphAuditError, match=r"expected room for the coefficient cache file .*\.npy .* found No "
                                              r"space left on device; free space there, or choose another folder"):
        capture(trace, coefs, data, batch_size=3, memory_limit=0)
    assert len(made) == 1 and not made[0].exists()


def test_a_file_system_that_cannot_reserve_still_gets_its_cache(tmp_path, monkeypatch):
    """EOPNOTSUPP (a file system without fallocate, where glibc does not emulate it): written as before."""
    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(cache_files.os, "posix_fallocate", unsupported, raising=False)
    array, mapping = cache_files.new_npy(tmp_path / "a.npy", (3, 4), np.dtype(np.float32))
    array[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
    mapping.flush()
    del array
    mapping.close()
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), np.arange(12, dtype=np.float32).reshape(3, 4))


def test_a_kept_cache_whose_live_outputs_find_no_room_is_one_error_and_no_manifest(tmp_path, monkeypatch):
    trace, coefs, data = traced(gated_lm)

    def full(f, arrays):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache_files, "_write_npz", full)
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("the user's")
    with pytest.raises(GraphAuditError, match=r"expected room for the coefficient cache file .*live\.npz, found No "
                                              r"space left on device; free space there, or choose another --cache-dir"):
        capture(trace, coefs, data, batch_size=4, cache_dir=tmp_path / "kept")
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["mine.txt"]  # the cache's folder went, partials too


def _small_disk_available(folder: Path) -> bool:
    unshare = shutil.which("unshare")
    if unshare is None or sys.platform != "linux":
        return False
    probe = subprocess.run([unshare, "-m", "sh", "-c", 'mount -t tmpfs -o size=1m tmpfs "$0"', str(folder)],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def test_replay_with_its_cache_on_a_full_disk_stops_in_one_line_and_leaves_nothing(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _small_disk_available(disk):
        pytest.skip("needs `unshare -m` and the right to mount a tmpfs in it (Linux, as root or in a user namespace)")
    command = [sys.executable, "-m", "graphaudit", "replay", str(FIXTURE / "model.onnx"), "--calib",
               str(FIXTURE / "calib.npz"), "--data", str(FIXTURE / "eval.npz"), "--cache-dir", str(disk / "cache"),
               "-q", "--format", "json", "-o", str(tmp_path / "report.json")]
    done = subprocess.run(["unshare", "-m", "sh", "-c", _ON_A_SMALL_DISK, "sh", str(disk), *command],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "DIR": str(disk), "PYTHONPATH": str(ROOT)})
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphaudit: error: expected room for the coefficient cache "
                                                   f"file {disk / 'cache'}"), done.stderr
    assert "No space left on device" in lines[0]
    assert done.stdout.splitlines()[-2:] == ["status=1", "left="], done.stdout  # not SIGBUS (135); no folder left
    assert not (tmp_path / "report.json").exists()


_MAPPED_UNDER_A_LIMIT = """
import resource, sys
from pathlib import Path
import numpy as np
from graphaudit.errors import GraphAuditError
from graphaudit.replay.cache_files import new_npy
with open("/proc/self/status") as f:
    used = int(next(line for line in f if line.startswith("VmSize:")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (used + (64 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
try:
    new_npy(Path(sys.argv[1]) / "big.npy", (256, 1 << 20), np.uint8)  # 256 MiB: past what is left to map
except GraphAuditError as err:
    print(err)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="no /proc to read the address space from")
def test_a_cache_past_the_address_space_limit_says_so_not_that_the_disk_is_full(tmp_path):
    """`ulimit -v` (RLIMIT_AS) leaves no address space to map the file: ENOMEM, which is no lack of disk."""
    done = subprocess.run([sys.executable, "-c", _MAPPED_UNDER_A_LIMIT, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"expected to map the coefficient cache file {tmp_path / 'big.npy'} "
                                   f"({256 << 20:,} bytes) into memory, found Cannot allocate memory: the "
                                   "process's address space is limited (ulimit -v); raise the limit")


def test_a_write_that_fails_for_another_reason_names_it_not_the_room(tmp_path, monkeypatch):
    def failing_header(f, header):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(np.lib.format, "write_array_header_2_0", failing_header)
    with pytest.raises(GraphAuditError, match=r"^expected to write the coefficient cache file .*x\.npy, found "
                                              r"Input/output error; choose another folder"):
        cache_files.new_npy(tmp_path / "x.npy", (4,), np.float32)
