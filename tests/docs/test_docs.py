"""Every code block of README.md and docs/*.md is compiled or run, so that the documentation cannot
drift from the code (issue 28: the README's C++ example did not compile).

By the block's language:
- cpp: compiled against the build's headers and libnvio (wrapped in main() when it has none), then
  run;
- python: run by this interpreter with PYTHONPATH=<build>/python;
- sh: run by bash -eu with `nvio` on PATH (the build's) and PYTHONPATH as for python;
- cmake: each line must be in a file of the repository that a test builds (`in: FILE`);
- text: output or a listing, not code: nothing to run.
Each runs in a fresh temporary directory (its working directory), where the absolute example paths
/nvme..., /mnt/... are moved (their parent directories made), and with NVIO_CONFIG naming a file
there, so that nothing outside it is touched.

An HTML comment right before a block tells the test more, one `key: value` per line:

    <!-- docs-test: skip (why: a benchmark of minutes, needs root, ...) -->
    <!-- docs-test:
    setup: model = torch.nn.Linear(4, 4)     (code run first; {source} is the repository)
    replace: budget=60 => budget=1           (text of the block to change before running it)
    in: tests/downstream/CMakeLists.txt      (cmake: the file that holds its lines)
    -->
    <!-- docs-test: synopsis -->                (sh: `nvio SUB ...` lines, not run: every --flag
                                                 must be in `nvio SUB --help`)

Every sh block, run or not, must parse (bash -n) and name only scripts of the repository that exist.

A skip needs its reason, a `replace` must match, and a block in a language this test does not know,
without a skip, fails: leaving a block out is a visible decision.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("NVIO_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BUILD = Path(os.environ.get("NVIO_BUILD_DIR", SOURCE / "build"))
DOCS = [SOURCE / "README.md", *sorted((SOURCE / "docs").glob("*.md"))]
LANGUAGES = {"cpp", "python", "sh", "cmake", "text"}
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
# The example paths of the documents, as a whole word: "/nvme/x.bin", "/mnt/nvme0", "/nvme2".
EXAMPLE_PATH = re.compile(r"(?<![\w./-])/(?:nvme\d*|mnt)(?:/[\w.-]+)*")


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip: str | None = None
    setup: list[str] = field(default_factory=list)
    replace: list[tuple[str, str]] = field(default_factory=list)
    within: str | None = None
    synopsis: bool = False

    @property
    def name(self) -> str:
        return f"{self.doc.relative_to(SOURCE)}:{self.line}"


def parse_directive(text: str, where: str, block: Block) -> None:
    for raw in text.strip().splitlines():
        line = raw.strip()
        if not line:
            continue
        key, _, value = line.partition(":") if not line.startswith("skip") else ("skip", "", line)
        value = value.strip()
        if line == "synopsis":
            block.synopsis = True
        elif key == "skip":
            m = re.fullmatch(r"skip\s*\((.+)\)", line)
            if not m or not m.group(1).strip():
                raise ValueError(f"{where}: a skip needs its reason in parentheses: {line!r}")
            block.skip = m.group(1).strip()
        elif key == "setup":
            block.setup.append(value)
        elif key == "replace":
            old, sep, new = value.partition(" => ")
            if not sep:
                raise ValueError(f"{where}: replace needs 'OLD => NEW': {line!r}")
            block.replace.append((old, new))
        elif key == "in":
            block.within = value
        else:
            raise ValueError(f"{where}: unknown docs-test key {key!r}")


def blocks_of(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    found = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, language = m.group(1), m.group(2)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence)), None)
        if end is None:
            raise ValueError(f"{doc}:{i + 1}: unclosed code block")
        block = Block(doc, i + 1, language, "\n".join(lines[i + 1:end]) + "\n")
        # The comment that ends on the last non-blank line above the fence.
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        if k >= 0 and lines[k].rstrip().endswith("-->"):
            start = k
            while start >= 0 and "<!--" not in lines[start]:
                start -= 1
            comment = "\n".join(lines[start:k + 1])
            body = comment[comment.index("<!--") + 4:comment.rindex("-->")].strip()
            if body.startswith("docs-test:"):
                parse_directive(body[len("docs-test:"):], block.name, block)
        found.append(block)
        i = end + 1
    return found


BLOCKS = [b for doc in DOCS for b in blocks_of(doc)]


def prepared(block: Block, tmp: Path, with_setup: bool = True) -> str:
    """The block as it runs: its replacements made, its setup first, its example paths moved."""
    code = block.code
    for old, new in block.replace:
        assert old in code, f"{block.name}: replace {old!r}: not in the block (stale directive?)"
        code = code.replace(old, new)
    if with_setup:
        code = "".join(s.replace("{source}", str(SOURCE)) + "\n" for s in block.setup) + code

    def move(m: re.Match) -> str:
        path = tmp / m.group(0).lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        return str(path)

    return EXAMPLE_PATH.sub(move, code)


def environment(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVIO_")}
    env["NVIO_CONFIG"] = str(tmp / "nvio-config.json")
    env["PYTHONPATH"] = str(BUILD / "python")
    bin_dir = tmp / ".bin"
    bin_dir.mkdir(exist_ok=True)
    nvio_bin = Path(os.environ.get("NVIO_BIN", BUILD / "bin" / "nvio")).resolve()
    if nvio_bin.exists() and not (bin_dir / "nvio").is_symlink():
        (bin_dir / "nvio").symlink_to(nvio_bin)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def run(args, block: Block, tmp: Path, timeout=120):
    r = subprocess.run(args, cwd=tmp, env=environment(tmp), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{block.name} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def run_cpp(block: Block, tmp: Path) -> None:
    lib = Path(os.environ.get("NVIO_LIB", BUILD / "src" / "libnvio.so"))
    if not lib.exists():
        pytest.skip(f"no libnvio at {lib} (set NVIO_LIB)")
    assert not block.setup, f"{block.name}: a C++ block takes no setup: make it whole"
    code = prepared(block, tmp)
    if not re.search(r"\bint\s+main\s*\(", code):
        lines = code.splitlines()
        head = [ln for ln in lines if ln.startswith("#include")]
        body = [ln for ln in lines if not ln.startswith("#include")]
        code = "\n".join(head + ["", "int main() {"] +
                         ["  " + ln for ln in body] + ["  return 0;", "}", ""])
    (tmp / "example.cpp").write_text(code)
    cxx = os.environ.get("NVIO_CXX", "c++")
    run([cxx, "-std=c++20", "-Wall", "-Wextra", "-Werror", "-I", str(SOURCE / "include"),
         "example.cpp", "-o", "example", str(lib), f"-Wl,-rpath,{lib.parent}"], block, tmp)
    run([str(tmp / "example")], block, tmp)


def run_python(block: Block, tmp: Path) -> None:
    if not (BUILD / "python" / "nvio" / "__init__.py").exists():
        pytest.skip(f"no Python package in {BUILD / 'python'}")
    (tmp / "example.py").write_text(prepared(block, tmp))
    run([sys.executable, "example.py"], block, tmp)


def check_synopsis(block: Block, tmp: Path) -> None:
    helps = {}
    sub = None
    for line in block.code.splitlines():
        m = re.match(r"nvio ([\w-]+)", line)
        if m:
            sub = m.group(1)
        if sub is None or sub.startswith("-"):
            continue  # `nvio --version`
        if sub not in helps:
            helps[sub] = run(["nvio", sub, "--help"], block, tmp).stdout
        code = line.split("#", 1)[0]
        for no, flag in re.findall(r"--(\[no-\])?([a-z][\w-]*)", code):
            for f in [f"--{flag}"] + ([f"--no-{flag}"] if no else []):
                assert re.search(re.escape(f) + r"(?![\w-])", helps[sub]), \
                    f"{block.name}: nvio {sub} --help does not list {f}"


def run_sh(block: Block, tmp: Path) -> None:
    if block.synopsis:
        return check_synopsis(block, tmp)
    (tmp / "example.sh").write_text(prepared(block, tmp))
    run(["bash", "-eu", "example.sh"], block, tmp)


def check_cmake(block: Block, tmp: Path) -> None:
    assert block.within, f"{block.name}: a cmake block needs 'in: FILE' (a file a test builds)"
    text = (SOURCE / block.within).read_text()
    for line in prepared(block, tmp).splitlines():
        if line.strip():
            assert line.strip() in text, f"{block.name}: {line.strip()!r} not in {block.within}"


RUNNERS = {"cpp": run_cpp, "python": run_python, "sh": run_sh, "cmake": check_cmake}


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_code_block(block, tmp_path):
    if block.skip:
        pytest.skip(block.skip)
    assert block.language in LANGUAGES, (
        f"{block.name}: a block in {block.language or 'no language'!r}, which this test cannot "
        f"check: give it one of {sorted(LANGUAGES)}, or mark it "
        f"<!-- docs-test: skip (reason) -->")
    if block.language in RUNNERS:
        RUNNERS[block.language](block, tmp_path)


SH_BLOCKS = [b for b in BLOCKS if b.language == "sh"]


@pytest.mark.parametrize("block", SH_BLOCKS, ids=[b.name for b in SH_BLOCKS])
def test_shell_blocks_parse_and_name_scripts_that_exist(block):
    """Also those not run: a renamed script or a broken quote shows here."""
    if not block.synopsis:
        r = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
        assert r.returncode == 0, f"{block.name}: {r.stderr}"
    for path in re.findall(r"(?<![\w/.-])((?:bench|scripts|tools|examples|tests)/[\w./-]+)",
                           block.code):
        assert (SOURCE / path).exists(), f"{block.name}: {path} is not in the repository"


def test_the_documents_have_blocks():
    """The extraction itself: a document format change must not turn this test into a no-op."""
    # 21 blocks since the dated benchmark log (30 blocks) moved to bench/results.md, a log that
    # keeps past commands as they ran and is not checked here.
    assert len(BLOCKS) > 15 and {b.language for b in BLOCKS} >= {"cpp", "python", "sh"}


# ---- signatures written in prose ---------------------------------------------------------------


def documented_signature(doc: Path, call: str) -> inspect.Signature:
    """The signature in a `call(...)` code span of `doc`, read as a Python def."""
    text = doc.read_text().replace("\n", " ")
    m = re.search(r"`" + re.escape(call) + r"\(([^`]*)\)`", text)
    assert m, f"{doc.name}: no `{call}(...)` span"
    fn = ast.parse(f"def f({m.group(1)}): pass").body[0]
    params = []
    args = fn.args
    defaults = [None] * (len(args.args) - len(args.defaults)) + args.defaults
    for a, d in zip(args.args, defaults):
        params.append(inspect.Parameter(
            a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        params.append(inspect.Parameter(
            a.arg, inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    return inspect.Signature(params)


@pytest.mark.parametrize("call", ["nvio.Handle", "nvio.empty_locked", "nvio.aio_handle"])
def test_documented_signatures_are_the_real_ones(call):
    """Issue 28: docs/python.md's Handle(...) left out gpu_direct and that it takes keywords only,
    and empty_locked(nbytes or shape) took an element count."""
    sys.path.insert(0, str(BUILD / "python"))
    try:
        import nvio
    except ImportError as e:
        pytest.skip(f"nvio cannot be imported from {BUILD / 'python'}: {e}")
    finally:
        sys.path.pop(0)
    real = inspect.signature(getattr(nvio, call.split(".", 1)[1]))
    real = real.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                    for p in real.parameters.values()],
                        return_annotation=inspect.Signature.empty)
    assert documented_signature(SOURCE / "docs" / "python.md", call) == real
