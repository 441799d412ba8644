"""The first-contact script for one GPU (scripts/gpu_first.sh, issue 52) stays correct where no
GPU is lent: its dry run on CPU takes the same steps it can (facts, the installed module, the
copy kernel's per-thread code on odd rows, 8 thread-ranks on the stream emulator, gpu_check's
CPU checks each in a process of its own: the test of gpu_check's CPU half too) and ends with
its verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import variopath_jax

ROOT = Path(__file__).resolve().parents[1]


def test_the_dry_run_on_cpu_passes_and_says_so_last(tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", "scripts/gpu_first.sh", "--platform", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-1] == "GPU FIRST: PASS", (
        proc.stdout[-3000:] + proc.stderr[-2000:]
    )
    steps = {ln.split(":")[0][5:] for ln in lines if ln.startswith("STEP ") and ": PASS" in ln}
    assert steps == {"facts", "build", "kernels", "ordering", "checks"}, lines
    # every gpu_check check in a process of its own, preallocation off there too
    for name in ("info", "jit", "small-call"):
        assert any(ln.startswith(f"CHECK {name}: PASS") for ln in lines), lines
    checks = (tmp_path / "checks.log").read_text()
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in checks
    package = os.path.dirname(os.path.abspath(variopath_jax.__file__))  # as this process imports it
    assert f"CHECK info: PASS variopath_jax from {package}," in checks, checks
    assert (tmp_path / "ordering.log").read_text().startswith("48 rank results exact")
