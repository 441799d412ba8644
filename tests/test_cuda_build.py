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

import numpy as np
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
        "cuda/profile_cuda.cc",
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


def _copy_on_host(src: bytes, src_offset: int, dst_offset: int, nbytes: int, threads: int) -> dict:
    dst_size = dst_offset + nbytes + 16
    got = _native.batched_copy_on_host(src, src_offset, dst_size, dst_offset, nbytes, threads)
    want = bytearray(dst_size)
    want[dst_offset : dst_offset + nbytes] = src[src_offset : src_offset + nbytes]
    assert got["dst"] == bytes(want), (src_offset, dst_offset, nbytes, threads)
    assert got["guards_intact"], (src_offset, dst_offset, nbytes, threads)
    return got


def test_batched_copy_splits_unaligned_segments_exactly() -> None:
    """The batched copy kernel's per-thread code (ffi/cuda/copy_split.h), run on the host for
    every thread index: every source and destination misalignment mod 16, lengths around the
    word boundaries, 1 to 256 threads; exactly the segment's bytes arrive and nothing else is
    written, and all but at most 30 bytes go in 16-byte words."""
    src = bytes(np.random.default_rng(0).integers(0, 256, 600, dtype=np.uint8))
    for src_offset in range(16):
        for dst_offset in range(16):
            for nbytes in (0, 1, 5, 15, 16, 17, 31, 32, 33, 47, 64, 100, 255, 512):
                for threads in (1, 3, 256):
                    got = _copy_on_host(src, src_offset, dst_offset, nbytes, threads)
                    assert got["head"] + 16 * got["words"] + got["tail"] == nbytes
                    assert got["head"] < 16 and got["tail"] < 16
                    assert (
                        got["skew"] == (src_offset + got["head"]) % 16
                    )  # the buffers are 64-aligned
                    assert got["head"] == min(nbytes, -dst_offset % 16)


def test_batched_copy_keeps_16_byte_words_for_odd_rows() -> None:
    """Rows of 2, 6, 12 and 14 bytes at row offsets (the pack step): a long segment goes in
    16-byte words whatever its misalignment, so it no longer falls back to bytes."""
    rng = np.random.default_rng(1)
    for row in (2, 6, 12, 14):
        src = bytes(rng.integers(0, 256, 64 * row + 4096, dtype=np.uint8))
        for first, at in ((1, 3), (5, 0), (7, 2), (0, 9)):
            nbytes = 4096 - 4096 % row
            got = _copy_on_host(src, first * row, at * row, nbytes, 64)
            assert got["words"] == (nbytes - got["head"]) // 16 >= nbytes // 16 - 1


@needs_nvcc
def test_the_batched_copy_kernel_uses_16_byte_words(tmp_path: Path) -> None:
    """Its PTX moves the middle of a segment with 16-byte loads and stores and funnel shifts, in
    registers (no local memory)."""
    cmd = [NVCC, "-std=c++17", "-arch=sm_90", "-I", str(ROOT / "ffi"), "-ptx"]
    cmd += [str(ROOT / "ffi" / "cuda" / "kernels.cu"), "-o", str(tmp_path / "kernels.ptx")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ptx = (tmp_path / "kernels.ptx").read_text()
    for instruction in ("ld.global.v4.u32", "st.global.v4.u32", "shf.r"):
        assert instruction in ptx, instruction
    assert "ld.local" not in ptx and "st.local" not in ptx
