"""What a CPU can prove about the op on GPUs (issue 52 item 4): compiled for eight H100s without a
GPU, through JAX's own CUDA plugin (tests/cuda_aot_worker.py), the op's programs name our CUDA
FFI handlers, keep the output alias of the ``_into`` variant and of ``ragged_all_to_all``, and
compile a gradient; a call to a target nobody registered fails to compile, so a compile that
succeeds proves every handler it names is registered for CUDA.

The plugin (``jax-cuda13-plugin`` and ``jax-cuda13-pjrt`` of the installed jaxlib's exact version)
is a test dependency that ``make test`` installs with ``--no-deps`` into ``.venv/gpu-wheels``,
a folder off the virtual environment's path: importable, the plugin makes every jax process on a
machine without a GPU print its failure to start. The compile runs in a subprocess that puts the
folder on PYTHONPATH. Where the wheel could not be installed (offline, no wheel of that version),
these tests skip and say so.

What this cannot catch: anything that happens when the handler runs (the stream work, the
peer copies, the host sync), XLA's GPU runtime placing our buffers differently from this
compile, and a handler whose attribute or buffer signature disagrees with the call (checked when
the handler is first called, on a GPU)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jaxlib
import pytest

from variopath_jax import _native

ROOT = Path(__file__).resolve().parents[1]
WHEELS = Path(os.environ.get("VARIOPATH_GPU_WHEELS", ROOT / ".venv" / "gpu-wheels"))
PLUGIN = WHEELS / "plugin"
TARGET_CONFIG = ROOT / "tests" / "fixtures" / "h100_target_config.txtpb"


def _plugin_version() -> str | None:
    """The installed plugin's version, from its dist-info, or None."""
    found = sorted(PLUGIN.glob("jax_cuda13_plugin-*.dist-info"))
    pjrt = sorted(PLUGIN.glob("jax_cuda13_pjrt-*.dist-info"))
    if not found or not pjrt:
        return None
    version = found[0].name.removeprefix("jax_cuda13_plugin-").removesuffix(".dist-info")
    return version if pjrt[0].name == f"jax_cuda13_pjrt-{version}.dist-info" else None


def _why_skip() -> str | None:
    version = _plugin_version()
    if version is None:
        return (
            f"jax-cuda13-plugin and jax-cuda13-pjrt not installed in {PLUGIN} (`make test` "
            "installs them where PyPI has the installed jaxlib's version)"
        )
    if version != jaxlib.__version__:
        return f"the plugin in {PLUGIN} is {version}, jaxlib is {jaxlib.__version__}"
    if not _native.build_info()["cuda"]:
        return "this build has no CUDA handlers (no nvcc when it was built)"
    return None


pytestmark = [
    pytest.mark.cuda_aot,
    pytest.mark.skipif(_why_skip() is not None, reason=_why_skip() or ""),
]


@pytest.fixture(scope="module")
def compiled() -> dict:
    """One compile of each program, in one subprocess (about 5 s here)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(PLUGIN))
    env.pop("XLA_FLAGS", None)  # the CPU device count is irrelevant to a CUDA compile
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "cuda_aot_worker.py"), str(TARGET_CONFIG)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def _targets(lines: list[str]) -> list[str]:
    return [re.search(r'custom_call_target="([^"]+)"', ln).group(1) for ln in lines]


def test_the_target_is_eight_h100s(compiled) -> None:
    assert compiled["devices"] == ["NVIDIA H100 80GB HBM3"] * 8


@pytest.mark.parametrize(
    ("program", "targets"),
    [
        ("all_to_all_v", ["variopath_all_to_all_v"]),
        ("all_to_all_v_into", ["variopath_all_to_all_v_into"]),
        ("ragged_all_to_all", ["variopath_ragged_all_to_all"]),
        # the forward exchange and its transpose (the reverse exchange) in one program
        ("gradient", ["variopath_all_to_all_v", "variopath_all_to_all_v"]),
    ],
)
def test_each_program_compiles_to_our_cuda_handlers(compiled, program, targets) -> None:
    got = compiled["programs"][program]
    assert _targets(got["custom_calls"]) == targets
    assert "is_scheduled=true" in got["header"]  # compiled by XLA's GPU compiler, not just lowered
    assert all(f"@{t}(" in "".join(got["lowered_custom_calls"]) for t in targets)
    assert all("API_VERSION_TYPED_FFI" in ln for ln in got["custom_calls"])
    # every target it names is one of our handlers registered for CUDA
    assert set(targets) <= set(_native.registrations("cuda"))


@pytest.mark.parametrize(
    ("program", "operand", "parameter", "name"),
    [("all_to_all_v_into", 4, 2, "out"), ("ragged_all_to_all", 1, 1, "out")],
)
def test_the_output_alias_is_kept(compiled, program, operand, parameter, name) -> None:
    """The custom call's result 0 aliases its output operand, that operand is the donated
    parameter itself (no copy in between), and the module's result aliases that parameter: the
    exchange writes into the caller's donated buffer on a GPU too."""
    got = compiled["programs"][program]
    (call,) = got["custom_calls"]
    assert f"output_to_operand_aliasing={{{{0}}: ({operand}, {{}})}}" in call
    operands = re.search(r"custom-call\(([^)]*)\)", call).group(1)
    operands = [re.sub(r"/\*index=\d+\*/", "", o).strip() for o in operands.split(",")]
    (param,) = [p for p in got["parameters"] if f"parameter({parameter})" in p and "sharding=" in p]
    assert f'op_name="{name}"' in param
    assert param.split(" =")[0] == operands[operand]
    assert f"input_output_alias={{ {{}}: ({parameter}, {{}}, may-alias) }}" in got["header"]


def test_an_unregistered_target_fails_to_compile(compiled) -> None:
    assert compiled["bogus"] is not None
    assert "No FFI handler registered for variopath_no_such_target" in compiled["bogus"]
    assert "CUDA" in compiled["bogus"]


def test_each_op_compiles_once_quickly(compiled) -> None:
    """One compile per program: the whole subprocess stays short in CI."""
    assert set(compiled["programs"]) == {
        "all_to_all_v",
        "all_to_all_v_into",
        "ragged_all_to_all",
        "gradient",
    }
    assert compiled["seconds"] < 120
