"""Every JAX API this package touches beyond the stable surface, in one place.

Supported: jax 0.10.x and newer. Keep version shims and private imports here only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

Zero = ad.Zero
is_undefined_primal = ad.is_undefined_primal
instantiate_zeros = ad.instantiate_zeros
zeros_like_aval = ad.zeros_like_aval


def axis_size(axis_name) -> int:
    """Static size of a bound axis (NameError for an unbound one)."""
    return int(jax.lax.axis_size(axis_name))


def manual_axes() -> list[tuple[str, int]]:
    """The manual mesh axes of the enclosing ``shard_map``, with their sizes, in mesh order."""
    mesh = jax.sharding.get_abstract_mesh()
    names = getattr(mesh, "axis_names", ())
    manual = getattr(mesh, "manual_axes", names)
    return [(a, int(mesh.shape[a])) for a in names if a in manual]


def aval_varying(aval) -> frozenset:
    """The manual axes an abstract value varies over (empty outside ``shard_map`` typing):
    ``aval.vma`` on some jax versions, ``aval.manual_axis_type.varying`` on others (0.10.x)."""
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", None)
    return frozenset() if vma is None else frozenset(vma)


def varying_axes(x) -> frozenset:
    """The manual axes ``x`` varies over."""
    return aval_varying(jax.typeof(x))


def with_varying(aval, vma: frozenset):
    """``aval`` typed as varying over exactly ``vma``."""
    if aval_varying(aval) == vma:
        return aval
    if hasattr(aval, "vma"):
        return aval.update(vma=vma)
    return aval.update(manual_axis_type=jax.sharding.ManualAxisType(varying=vma))


def ensure_varying(x, vma: Iterable[str]):
    """``x`` marked as varying over every axis of ``vma`` too (a no-op where it already is)."""
    missing = tuple(a for a in vma if a not in varying_axes(x))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def tangent_zero(x) -> Zero:
    """The symbolic zero tangent of a primal value (float0 for integers)."""
    return Zero(jax.typeof(x).to_tangent_aval())


def define_primitive(
    name: str,
    *,
    multiple_results: bool,
    abstract_eval: Callable,
    lowering: Callable,
    jvp: Callable,
    transpose: Callable,
    batch: Callable,
) -> Primitive:
    """A primitive with its abstract evaluation, lowering (on every platform; not cached, so that
    every lowered instance is its own call site), JVP, transpose and batching rules."""
    prim = Primitive(name)
    prim.multiple_results = multiple_results
    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, lowering, cacheable=False)
    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose
    batching.primitive_batchers[prim] = lambda args, dims, **params: batch(
        prim, args, dims, **params
    )
    return prim


def ffi_lower(ctx, target: str, operands, avals_in, avals_out, aliases: dict, **attrs) -> list:
    """Emit the FFI custom call ``target`` for ``operands`` (typed ``avals_in``) with results
    typed ``avals_out`` and attributes ``attrs``, inside a primitive's lowering rule."""
    rule = jax.ffi.ffi_lowering(target, operand_output_aliases=aliases)
    return list(rule(ctx.replace(avals_in=avals_in, avals_out=avals_out), *operands, **attrs))


_SITE_COUNTS = "variopath_jax call sites"  # our key in a module context's private cache dict


def call_site(ctx, target: str, static: tuple) -> int:
    """The id of the call being lowered: a hash of what it is (``target``, ``static``, its
    operand and result types) and of how many such calls the module lowered before it. The same
    program gets the same ids in every process and every retrace, so an executable from JAX's
    persistent compilation cache meets its peers under the ids they expect. The count lives in
    the module context (its private lowering cache dict), so it is per module."""
    types = tuple((tuple(a.shape), str(a.dtype)) for a in (*ctx.avals_in, *ctx.avals_out))
    signature = repr((target, static, types))
    counts = ctx.module_context.cached_primitive_lowerings.setdefault(_SITE_COUNTS, {})
    nth = counts.get(signature, 0)
    counts[signature] = nth + 1
    digest = hashlib.blake2b(f"{signature}#{nth}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1 or 1


def register_targets(registrations: dict, platform: str) -> None:
    """Register FFI handlers (name -> capsule) for ``platform`` ("cpu" or "CUDA"). Registering
    for CUDA works on a CPU-only jaxlib too, so the op lowers for ``cuda`` everywhere."""
    for name, capsule in registrations.items():
        jax.ffi.register_ffi_target(name, capsule, platform=platform)


def distributed_client():
    """``(client, process_id, num_processes)`` of ``jax.distributed`` once initialised, else
    None. Reads its global state only: never starts a backend (so ``configure`` may run before
    any computation). The client's key-value store is ``key_value_set(key, value)`` and
    ``blocking_key_value_get(key, timeout_ms)``."""
    from jax._src.distributed import global_state

    if global_state.client is None:
        return None
    return global_state.client, int(global_state.process_id), int(global_state.num_processes)


def jit_key_context():
    """A value in every jitted function's cache key (``jax.make_user_context``): when its global
    value changes, a function jitted before is traced, lowered and compiled again on its next
    call instead of reusing what it built under the old value (jax 0.10 has it)."""
    return jax.make_user_context(default_value=None)
