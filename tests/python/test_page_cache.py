"""nvio.evict / nvio.page_cache (and `nvio report --cached` in tests/cli): a file written through
the page cache is all cached, none of it after evict, part of it after a partial read."""

from __future__ import annotations

import os

import pytest

import nvio


def _on_tmpfs(path) -> bool:
    with open("/proc/mounts") as mounts:
        best = ("", "")
        for line in mounts:
            _, mnt, fstype = line.split()[:3]
            if str(path).startswith(mnt) and len(mnt) > len(best[0]):
                best = (mnt, fstype)
    return best[1] == "tmpfs"


def test_evict_and_page_cache(tmp_path):
    if _on_tmpfs(tmp_path):
        pytest.skip("tmpfs: its pages are the file and stay cached")
    path = tmp_path / "f.bin"
    size = (1 << 20) + 123
    path.write_bytes(os.urandom(size))
    st = nvio.page_cache(path)
    assert st["file_bytes"] == size and st["cached_bytes"] == size
    assert st["method"] in ("cachestat", "mincore")
    nvio.evict(str(path).encode())  # bytes paths too
    assert nvio.page_cache(path)["cached_bytes"] == 0
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        assert len(os.pread(fd, 65536, 131072)) == 65536
    finally:
        os.close(fd)
    cached = nvio.page_cache(path)["cached_bytes"]
    assert 65536 <= cached < size


def test_errors_name_the_path(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(nvio.FileNotFound, match="missing"):
        nvio.evict(missing)
    with pytest.raises(nvio.FileNotFound, match="missing"):
        nvio.page_cache(missing)
    with pytest.raises(nvio.IOFailure):
        nvio.page_cache(tmp_path)  # a directory
    with pytest.raises(nvio.InvalidArgument):
        nvio.evict("a\0b")
