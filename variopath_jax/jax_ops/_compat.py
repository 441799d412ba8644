"""Every JAX API this package touches beyond the stable surface, in one place.

Supported: jax 0.10.x and newer. Keep version shims and private imports here only.
"""

from __future__ import annotations

import jax
import numpy as np

float0 = jax.dtypes.float0


def axis_size(axis_name) -> int:
    """Static size of a mesh axis inside ``shard_map``."""
    return int(jax.lax.axis_size(axis_name))


def other_manual_axes(axis_name) -> list[tuple[str, int]]:
    """The other manual mesh axes of the enclosing ``shard_map``, with their sizes, in mesh order."""
    mesh = jax.sharding.get_abstract_mesh()
    names = getattr(mesh, "axis_names", ())
    manual = getattr(mesh, "manual_axes", names)
    return [(a, int(mesh.shape[a])) for a in names if a != axis_name and a in manual]


def ensure_varying(x, axis_name):
    """Mark ``x`` as varying over ``axis_name`` under ``shard_map`` (a no-op if it already is):
    a collective's results differ per device whatever its inputs are."""
    vma = varying_axes(x)
    if vma is None or axis_name in vma:
        return x
    return jax.lax.pcast(x, axis_name, to="varying")


def varying_axes(x) -> frozenset | None:
    """The manual axes ``x`` varies over (None outside ``shard_map`` typing): ``aval.vma`` on some
    jax versions, ``aval.manual_axis_type.varying`` on others (0.10.x)."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        mat = getattr(aval, "manual_axis_type", None)
        vma = getattr(mat, "varying", None)
    return None if vma is None else frozenset(vma)


def zero_cotangent(x) -> np.ndarray:
    """The cotangent of an integer input: zeros of dtype float0."""
    return np.zeros(np.shape(x), dtype=float0)


def register_cpu_targets(registrations: dict) -> None:
    for name, capsule in registrations.items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
