"""The CUDA transport where no GPU is (issue 16): its sources compile with nvcc and the host
compiler, the build says which transports it has, the CUDA targets exist, and the GPU check
script runs its CPU half (its GPU half runs on a GPU machine: ``make gpu-check``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from variopath_jax import _native

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no nvcc on this machine")


def _cuda_include() -> Path:
    """The CUDA runtime's headers, as nvcc itself finds them (its path may be a wrapper)."""
    done = subprocess.run(
        [NVCC, "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True, text=True
    )
    for line in done.stderr.splitlines():
        if "INCLUDES=" in line:
            for word in line.split("INCLUDES=", 1)[1].strip().strip('"').split():
                path = Path(word.removeprefix("-I").strip('"'))
                if (path / "cuda_runtime.h").exists():
                    return path
    pytest.fail(f"nvcc --dryrun names no include directory with cuda_runtime.h:\n{done.stderr}")


@needs_nvcc
@pytest.mark.parametrize("source", sorted(p.name for p in (ROOT / "ffi" / "cuda").glob("*.cu")))
def test_kernels_compile_with_nvcc(source: str, tmp_path: Path) -> None:
    cmd = [NVCC, "-std=c++17", "-arch=sm_90", "-I", str(ROOT / "ffi"), "-c"]
    cmd += [str(ROOT / "ffi" / "cuda" / source), "-o", str(tmp_path / "out.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@needs_nvcc
@pytest.mark.parametrize(
    "source",
    [
        "ffi_cuda.cc",
        "cuda/cuda_streams.cc",
        "cuda/ipc.cc",
        "cuda/pull_streams.cc",
        "cuda/host_staging.cc",
        "cuda/selftest.cc",
        "nccl/nccl_collective.cc",
    ],
)
def test_cuda_host_sources_compile(source: str) -> None:
    """The handlers and the stream backend are host C++ against the CUDA runtime's headers."""
    import jax

    cxx = (sysconfig.get_config_var("CXX") or "c++").split()[0]
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-DVARIOPATH_HAVE_CUDA=1"]
    cmd += ["-I", str(ROOT / "ffi"), "-I", jax.ffi.include_dir(), "-I", str(_cuda_include())]
    done = subprocess.run(
        [*cmd, str(ROOT / "ffi" / source)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr


def test_the_build_names_its_transports() -> None:
    info = _native.build_info()
    assert info["transports"][0] == "cpu"
    assert ("cuda" in info["transports"]) == info["cuda"]
    if NVCC is not None:  # CMake builds the CUDA parts wherever nvcc is
        assert info["cuda"], "nvcc is on PATH but the CUDA transport was not built"


def test_cuda_targets_exist_when_built() -> None:
    cuda = _native.registrations("cuda")
    assert set(cuda) == (
        set(_native.registrations("cpu")) if _native.build_info()["cuda"] else set()
    )
    with pytest.raises(ValueError, match="no such platform: tpu"):
        _native.registrations("tpu")


def test_info_json_reports_transports_and_devices() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "variopath_jax.cli", "info", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["transports"] == _native.build_info()["transports"]
    assert set(out["transports"]) <= {"cpu", "shm", "cuda", "cuda-ipc", "cuda-host", "nccl"}
    peers = out["gpu_peers"]  # no GPU here: no pair, and why
    assert set(peers) == {"devices", "access", "error", "transport", "reason"}
    if not peers["devices"]:
        assert peers["transport"] is None and peers["reason"]
    assert out["devices"]["cpu"] >= 1


def test_gpu_check_runs_its_cpu_half() -> None:
    """The GPU check script on one CPU device: the op inside jit on a one-device mesh against
    NumPy (dtypes, a rank sending nothing, a full output) and the small-call timing."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--platform", "cpu", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CHECK jit: PASS" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "GPU CHECK: PASS"
