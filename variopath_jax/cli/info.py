"""``variopath info``: versions, the native build, its transports, the devices JAX sees and the
transport between GPU processes of this host (cuda-ipc or cuda-host, with the reason)."""

from __future__ import annotations

import argparse
from typing import Any

from variopath_jax.cli.common import command


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``info``."""
    command(sub, "info", cmd_info, "versions, native build and CUDA devices", human)


def cmd_info(args: argparse.Namespace) -> dict[str, Any]:
    import jax

    from variopath_jax import __version__
    from variopath_jax._native import build_info, cuda_devices
    from variopath_jax.jax_ops import nccl, peers

    info: dict[str, Any] = {"version": __version__, "native": build_info(), "cuda": cuda_devices()}
    info["native"]["ffi_api_version"] = list(info["native"]["ffi_api_version"])
    info["transports"] = info["native"]["transports"]  # what can move the op's bytes
    info["nccl"] = nccl.library_info()  # whether the NCCL transport's library loads (its version)
    # the GPUs seen here, their peer access, and cuda-ipc or cuda-host between their processes
    info["gpu_peers"] = peers.machine()
    info["jax"] = jax.__version__
    info["devices"] = {}
    for platform in ("cpu", "gpu"):
        try:
            info["devices"][platform] = len(jax.devices(platform))
        except RuntimeError:  # no such backend in this process
            info["devices"][platform] = 0
    return info


def human(out: dict[str, Any]) -> None:
    native, cuda = out["native"], out["cuda"]
    print(f"variopath_jax {out['version']}  (jax {out['jax']})")
    devices = ", ".join(f"{n} {platform}" for platform, n in out["devices"].items())
    print(f"transports: {', '.join(out['transports'])}; JAX devices: {devices}")
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
    gp = out["gpu_peers"]
    print(f"GPU processes of this host: {gp['transport'] or 'none'} ({gp['reason']})")
    lib = out["nccl"]
    print(f"NCCL: {lib['version']} ({lib['path']})" if lib["version"] else f"NCCL: {lib['error']}")
