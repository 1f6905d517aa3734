"""Builds the nvio._nvio extension and the `nvio` command with the project's CMake for `pip install`.

Both have the core compiled in, so the installed package needs no libnvio.so. The command is
shipped inside the package as nvio/_bin/nvio; the console scripts of pyproject.toml (nvio,
nvio-ds-io, nvio-ds-nvme-tune) run it through nvio._cli. Dependencies come from Debian packages
(see scripts/deps.sh); nothing is downloaded.
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# Where the package looks for its command (python/nvio/_cli.py), relative to the package.
BUNDLED_CLI = Path("_bin") / "nvio"
# Read by the interpreter at start from site-packages itself (not from the package): with
# NVIO_DEEPSPEED=1 it runs nvio.deepspeed.install_from_environment(); otherwise it imports nothing.
DEEPSPEED_PTH = "nvio-deepspeed.pth"


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """The extension and, beside it in the package, the command (one CMake build for both)."""

    def build_extension(self, ext: Extension) -> None:
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        # NVIO_PREBUILT_BUILD_DIR: package the extension and the command an existing CMake build
        # of this checkout made (its targets _nvio and nvio_bundled_cli) instead of compiling them
        # again; the test suite's pip test uses it so that CI compiles the project once.
        prebuilt = os.environ.get("NVIO_PREBUILT_BUILD_DIR")
        build_dir = Path(prebuilt) if prebuilt else Path(self.build_temp).resolve() / "cmake"
        if not prebuilt:
            self._cmake_build(build_dir)
        package = build_dir / "python" / "nvio"
        built = next(package.glob("_nvio*.so"), None)
        if built is None or not (package / BUNDLED_CLI).exists():
            raise RuntimeError(f"nvio: no _nvio*.so or {BUNDLED_CLI} in {package}: build the "
                               "targets _nvio and nvio_bundled_cli there first")
        out_dir.mkdir(parents=True, exist_ok=True)
        self.copy_file(str(built), str(out_dir / built.name))
        # copy_file keeps the mode, so the command stays executable in the wheel.
        (out_dir / BUNDLED_CLI.parent).mkdir(parents=True, exist_ok=True)
        self.copy_file(str(package / BUNDLED_CLI), str(out_dir / BUNDLED_CLI))

    def _cmake_build(self, build_dir: Path) -> None:
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "cmake", "-S", str(ROOT), "-B", str(build_dir),
                "-DCMAKE_BUILD_TYPE=Release",
                "-DNVIO_BUILD_TESTS=OFF",
                f"-DPython3_EXECUTABLE={sys.executable}",
            ],
            check=True,
        )
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "_nvio", "nvio_bundled_cli",
                        "-j", jobs], check=True)

    def get_outputs(self) -> "list[str]":
        package = Path(self.get_ext_fullpath("nvio._nvio")).parent
        return super().get_outputs() + [str(package / BUNDLED_CLI)]


class BuildPyWithPth(build_py):
    """The package's modules plus nvio-deepspeed.pth at the top of the built tree, so that it is
    installed next to the nvio folder in site-packages."""

    def run(self) -> None:
        super().run()
        self.copy_file(str(ROOT / "python" / DEEPSPEED_PTH),
                       str(Path(self.build_lib) / DEEPSPEED_PTH))

    def get_outputs(self, include_bytecode: bool = True) -> "list[str]":
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / DEEPSPEED_PTH)]


setup(ext_modules=[CMakeExtension("nvio._nvio")],
      cmdclass={"build_ext": CMakeBuild, "build_py": BuildPyWithPth})
