"""``variopath info``: versions, the native build and CUDA devices."""

from __future__ import annotations

import argparse
from typing import Any

from variopath_jax.cli.common import command


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``info``."""
    command(sub, "info", cmd_info, "versions, native build and CUDA devices", human)


def cmd_info(args: argparse.Namespace) -> dict[str, Any]:
    from variopath_jax import __version__
    from variopath_jax._native import build_info, cuda_devices

    info: dict[str, Any] = {"version": __version__, "native": build_info(), "cuda": cuda_devices()}
    info["native"]["ffi_api_version"] = list(info["native"]["ffi_api_version"])
    try:
        import jax

        info["jax"] = jax.__version__
    except ImportError:  # pragma: no cover - jax is a dependency
        info["jax"] = None
    return info


def human(out: dict[str, Any]) -> None:
    native, cuda = out["native"], out["cuda"]
    print(f"variopath_jax {out['version']}  (jax {out['jax']})")
    print(
        f"native module: {native['compiler']}, C++ {native['cxx_standard']}, "
        f"FFI API {native['ffi_api_version']}"
    )
    if cuda["compiled"]:
        print(
            f"CUDA parts: built with nvcc {native['cuda_compiler_version']}; devices: "
            f"{cuda['device_count']}" + (f" ({cuda['error']})" if cuda["error"] else "")
        )
    else:
        print(f"CUDA parts: not built ({cuda['error']})")
