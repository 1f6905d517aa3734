"""A RAM-backed block device for the benchmarks' --ramdisk (fio_compare.py, offset_bench.py,
random_python.py, stripe_bench.py): a tmpfs holding an image file, attached with
`losetup --direct-io=on`, formatted ext4 and mounted; torn down afterwards, also on Ctrl-C or
SIGTERM. Root only. Also the O_DIRECT probe the benchmarks run on their directory.

Python 3 standard library only.
"""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # python3 -P leaves bench/ off sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import Failure, human, log, run_cmd  # noqa: E402


def check_direct_io(directory: Path) -> None:
    """Writes and reads one aligned 4 KiB block with O_DIRECT in directory, or raises Failure."""
    probe = directory / ".nvio-fio-compare-odirect-probe"
    buf = mmap.mmap(-1, 4096)  # page aligned
    buf.write(b"\x5a" * 4096)
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    except OSError as e:
        raise Failure(f"{directory}: O_DIRECT is not supported here ({e.strerror}); "
                      "both tools need it for a fair comparison") from None
    try:
        if os.pwrite(fd, buf, 0) != 4096:
            raise Failure(f"{directory}: short O_DIRECT write")
        back = mmap.mmap(-1, 4096)
        if os.preadv(fd, [back], 0) != 4096 or back[:] != buf[:]:
            raise Failure(f"{directory}: O_DIRECT read-back mismatch")
    except OSError as e:
        raise Failure(f"{directory}: O_DIRECT I/O failed ({e.strerror})") from None
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


class RamDisk:
    """tmpfs -> image file -> loop device (--direct-io=on) -> ext4 -> mount point.

    Use as a context manager; __exit__ tears down whatever was set up, in reverse order, and
    reports (but does not raise on) a step that fails, so the others still run.
    """

    def __init__(self, size: int):
        self.size = size
        self.base: Path | None = None
        self.tmpfs: Path | None = None
        self.mnt: Path | None = None
        self.loop: str | None = None
        self.tmpfs_mounted = False
        self.ext4_mounted = False
        self.dio = None  # what /sys/block/loopN/loop/dio says

    def __enter__(self) -> "RamDisk":
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def _need(self, tool: str) -> str:
        path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin")
        if not path:
            raise Failure(f"--ramdisk needs `{tool}`, which is not installed")
        return path

    def _setup(self) -> None:
        if os.geteuid() != 0:
            raise Failure("--ramdisk needs root (mount, losetup, mkfs.ext4); run it as root", code=3)
        mount, losetup, mkfs = self._need("mount"), self._need("losetup"), self._need("mkfs.ext4")
        self._need("umount")
        # ext4 needs room for its metadata and journal on top of the file itself.
        image_size = self.size + max(256 << 20, self.size // 16)
        image_size = (image_size + (1 << 20) - 1) // (1 << 20) * (1 << 20)
        self.base = Path(tempfile.mkdtemp(prefix="nvio-ramdisk-"))
        self.tmpfs = self.base / "tmpfs"
        self.mnt = self.base / "mnt"
        self.tmpfs.mkdir()
        self.mnt.mkdir()
        log(f"ramdisk: tmpfs of {human(image_size + (64 << 20))} at {self.tmpfs}")
        p = run_cmd([mount, "-t", "tmpfs", "-o", f"size={image_size + (64 << 20)},mode=0700",
                     "nvio-ramdisk", str(self.tmpfs)], timeout=60, check=False)
        if p.returncode != 0:
            raise Failure("--ramdisk: cannot mount a tmpfs here (mount exit "
                          f"{p.returncode}: {p.stderr.strip()}); this sandbox does not permit it",
                          code=3)
        self.tmpfs_mounted = True
        image = self.tmpfs / "disk.img"
        fd = os.open(image, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, image_size)  # allocate the RAM now, not during the runs
        finally:
            os.close(fd)
        p = run_cmd([losetup, "--direct-io=on", "--find", "--show", str(image)], timeout=60,
                    check=False)
        if p.returncode != 0:
            raise Failure("--ramdisk: `losetup --direct-io=on --find --show` failed (exit "
                          f"{p.returncode}: {p.stderr.strip()}); loop devices are not permitted "
                          "in this sandbox", code=3)
        self.loop = p.stdout.strip()
        try:
            self.dio = Path(f"/sys/block/{Path(self.loop).name}/loop/dio").read_text().strip()
        except OSError:
            self.dio = None
        if self.dio == "0":
            log(f"ramdisk: warning: {self.loop} did not switch to direct I/O on its backing file "
                "(the kernel refused it); the loop device double-caches in the page cache")
        log(f"ramdisk: {self.loop} (direct-io={self.dio}), mkfs.ext4")
        run_cmd([mkfs, "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop],
                timeout=300)
        p = run_cmd([mount, "-t", "ext4", self.loop, str(self.mnt)], timeout=60, check=False)
        if p.returncode != 0:
            raise Failure(f"--ramdisk: cannot mount ext4 from {self.loop} (exit {p.returncode}: "
                          f"{p.stderr.strip()}); this sandbox does not permit it", code=3)
        self.ext4_mounted = True
        check_direct_io(self.mnt)
        log(f"ramdisk: ext4 on {self.loop} mounted at {self.mnt}; O_DIRECT works")

    def teardown(self) -> None:
        # Ignore further Ctrl-C / SIGTERM while tearing down: a half-torn-down loop device is
        # worse than a few more seconds.
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            if self.ext4_mounted and self.mnt is not None:
                if self._try(["umount", str(self.mnt)]) or self._try(["umount", "-l", str(self.mnt)]):
                    self.ext4_mounted = False
            if self.loop:
                if self._try(["losetup", "-d", self.loop]):
                    self.loop = None
            if self.tmpfs_mounted and self.tmpfs is not None:
                if self._try(["umount", str(self.tmpfs)]) or self._try(["umount", "-l", str(self.tmpfs)]):
                    self.tmpfs_mounted = False
            if self.base is not None and not self.ext4_mounted and not self.tmpfs_mounted:
                for d in (self.mnt, self.tmpfs, self.base):
                    try:
                        if d is not None:
                            d.rmdir()
                    except OSError as e:
                        log(f"ramdisk: teardown: rmdir {d}: {e.strerror}")
                self.base = None
            if self.ext4_mounted or self.tmpfs_mounted or self.loop:
                log(f"ramdisk: teardown INCOMPLETE: ext4 mounted={self.ext4_mounted} "
                    f"tmpfs mounted={self.tmpfs_mounted} loop={self.loop}; clean up by hand")
            elif self.tmpfs is not None:
                log("ramdisk: torn down")
                self.tmpfs = None
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)

    @staticmethod
    def _try(cmd: list[str]) -> bool:
        for attempt in range(5):
            try:
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   timeout=60)
            except (OSError, subprocess.TimeoutExpired) as e:
                log(f"ramdisk: teardown: {' '.join(cmd)}: {e}")
                return False
            if p.returncode == 0:
                return True
            if "busy" not in p.stderr.lower() or attempt == 4:
                log(f"ramdisk: teardown: {' '.join(cmd)}: {p.stderr.strip()}")
                return False
            time.sleep(0.5)
        return False
