"""``all_to_all_v`` and a ``ragged_all_to_all`` drop-in, lowered to XLA FFI custom calls.

Both run inside ``shard_map`` over a mesh axis. Each call becomes one FFI custom call per device
whose handlers meet in an in-process rendezvous, plan the gathered demand with the configured
VarioPath planner and copy the planned activations (ffi/collective.cc). Results are
device-varying over the axis. Gradients: the transpose of an AlltoAllv is the reverse exchange
(``jax.custom_vjp``); under ``vmap`` the call runs once per batch element, in order.
"""

from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import _compat
from variopath_jax.jax_ops.config import OpConfig, current_config

_sites = itertools.count(1)
last_site = 0  # the call site traced most recently (for debug_schedule)


def _new_site() -> int:
    global last_site
    last_site = next(_sites)
    return last_site


def _rank_and_group(axis_name) -> tuple[jax.Array, jax.Array]:
    """This device's position on the axis, and which group of the other manual axes it is in."""
    rank = jax.lax.axis_index(axis_name).astype(jnp.int32)
    group = jnp.int32(0)
    for name, size in _compat.other_manual_axes(axis_name):
        group = group * size + jax.lax.axis_index(name).astype(jnp.int32)
    return rank, group


def _config(axis_name, config: OpConfig | None) -> tuple[int, OpConfig]:
    n = _compat.axis_size(axis_name)
    cfg = config or current_config(n)
    if cfg.ranks != n:
        raise VarioPathError(
            f"mesh axis {axis_name!r} has {n} devices but the configured topology {cfg.topology.name!r} has "
            f"{cfg.ranks} ranks; call variopath_jax.configure() with a matching topology"
        )
    return n, cfg


# ----- all_to_all_v ---------------------------------------------------------------------------
def all_to_all_v(
    x, send_counts, *, axis_name, out_capacity: int | None = None, config: OpConfig | None = None
):
    """AlltoAllv of rows, planned by VarioPath.

    Parameters
    ----------
    x : array (R, ...)
        This rank's rows, grouped by destination rank in rank order.
    send_counts : int array (N,)
        How many rows go to each rank (N = the axis size); their sum must not exceed R.
    axis_name
        The ``shard_map`` mesh axis to exchange over.
    out_capacity : int, optional
        Rows of the result (default R). Receiving more is an error.
    config : OpConfig, optional
        Default: the process configuration (``configure``), or the default for N devices.

    Returns
    -------
    y : array (out_capacity, ...)
        Rows received, grouped by source rank in rank order, zero past the received rows.
    recv_counts : int32 array (N,)
        Rows received from each rank.
    """
    x = jnp.asarray(x)
    if x.ndim < 1:
        raise VarioPathError("all_to_all_v: x needs a leading row axis")
    n, cfg = _config(axis_name, config)
    send_counts = jnp.asarray(send_counts)
    if send_counts.shape != (n,) or not jnp.issubdtype(send_counts.dtype, jnp.integer):
        raise VarioPathError(
            f"all_to_all_v: send_counts must be an integer array of shape ({n},), "
            f"got {send_counts.dtype}{tuple(send_counts.shape)}"
        )
    cap = x.shape[0] if out_capacity is None else int(out_capacity)
    if cap < 0:
        raise VarioPathError(f"all_to_all_v: out_capacity must be >= 0, got {out_capacity}")
    return _a2av(x, send_counts.astype(jnp.int32), axis_name, cap, cfg.id)


def _a2av_call(x, counts, axis_name, cap: int, config_id: int):
    n = _compat.axis_size(axis_name)
    rank, group = _rank_and_group(axis_name)
    out = (
        jax.ShapeDtypeStruct((cap, *x.shape[1:]), x.dtype),
        jax.ShapeDtypeStruct((n,), jnp.int32),
    )
    call = jax.ffi.ffi_call("variopath_all_to_all_v", out, vmap_method="sequential")
    attrs = {"config": np.int64(config_id), "site": np.int64(_new_site()), "axis_size": np.int64(n)}
    y, recv = call(x, counts, rank, group, **attrs)
    return _compat.ensure_varying(y, axis_name), _compat.ensure_varying(recv, axis_name)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _a2av(x, counts, axis_name, cap, config_id):
    return _a2av_call(x, counts, axis_name, cap, config_id)


def _a2av_fwd(x, counts, axis_name, cap, config_id):
    y, recv = _a2av_call(x, counts, axis_name, cap, config_id)
    return (y, recv), (counts, recv, x.shape[0])


def _a2av_bwd(axis_name, cap, config_id, res, g):
    counts, recv, rows = res
    dy, _ = g
    dx, _ = _a2av_call(dy, recv, axis_name, rows, config_id)  # the reverse exchange
    return dx, _compat.zero_cotangent(counts)


_a2av.defvjp(_a2av_fwd, _a2av_bwd)


# ----- ragged_all_to_all ----------------------------------------------------------------------
def ragged_all_to_all(
    operand,
    output,
    input_offsets,
    send_sizes,
    output_offsets,
    recv_sizes,
    *,
    axis_name,
    axis_index_groups=None,
    config: OpConfig | None = None,
):
    """Drop-in for ``jax.lax.ragged_all_to_all`` (same arguments and semantics: ``output_offsets``
    are sender-side, several slices per peer when the offset arrays are a multiple of the axis
    size), planned by VarioPath and available on CPU devices."""
    if axis_index_groups is not None:
        raise VarioPathError(
            "ragged_all_to_all: axis_index_groups is not supported; use a mesh axis per group"
        )
    operand, output = jnp.asarray(operand), jnp.asarray(output)
    if operand.shape[1:] != output.shape[1:] or operand.dtype != output.dtype:
        raise VarioPathError(
            f"ragged_all_to_all: operand {operand.dtype}{operand.shape} and output "
            f"{output.dtype}{output.shape} must share dtype and trailing shape"
        )
    n, cfg = _config(axis_name, config)
    arrays = [jnp.asarray(a) for a in (input_offsets, send_sizes, output_offsets, recv_sizes)]
    k = arrays[0].shape
    for name, a in zip(
        ("input_offsets", "send_sizes", "output_offsets", "recv_sizes"), arrays, strict=True
    ):
        if a.ndim != 1 or a.shape != k or not jnp.issubdtype(a.dtype, jnp.integer):
            raise VarioPathError(
                f"ragged_all_to_all: {name} must be a 1-D integer array of the same length as "
                f"input_offsets, got {a.dtype}{tuple(a.shape)}"
            )
    if k[0] % n:
        raise VarioPathError(
            f"ragged_all_to_all: {k[0]} slices is not a multiple of the axis size {n}"
        )
    ints = [a.astype(jnp.int32) for a in arrays]
    return _ragged(operand, output, *ints, axis_name, cfg.id, operand.shape[0])


def _ragged_call(operand, output, in_off, send, out_off, recv, axis_name, config_id):
    n = _compat.axis_size(axis_name)
    rank, group = _rank_and_group(axis_name)
    k = in_off.shape[0]
    out = (
        jax.ShapeDtypeStruct(output.shape, output.dtype),
        jax.ShapeDtypeStruct((k,), jnp.int32),
        jax.ShapeDtypeStruct((k,), jnp.int32),
    )
    call = jax.ffi.ffi_call(
        "variopath_ragged_all_to_all", out, vmap_method="sequential", input_output_aliases={1: 0}
    )
    attrs = {"config": np.int64(config_id), "site": np.int64(_new_site()), "axis_size": np.int64(n)}
    outs = call(operand, output, in_off, send, out_off, recv, rank, group, **attrs)
    return tuple(_compat.ensure_varying(o, axis_name) for o in outs)


@partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _ragged(operand, output, in_off, send, out_off, recv, axis_name, config_id, operand_rows):
    return _ragged_call(operand, output, in_off, send, out_off, recv, axis_name, config_id)[0]


def _ragged_fwd(operand, output, in_off, send, out_off, recv, axis_name, config_id, operand_rows):
    result, recv_off, src_off = _ragged_call(
        operand, output, in_off, send, out_off, recv, axis_name, config_id
    )
    return result, (in_off, send, out_off, recv, recv_off, src_off)


def _ragged_bwd(axis_name, config_id, operand_rows, res, g):
    in_off, send, out_off, recv, recv_off, src_off = res
    # d_output: the cotangent wherever no received slice overwrote the output
    rows = jnp.arange(g.shape[0])
    covered = (
        (rows[None, :] >= recv_off[:, None]) & (rows[None, :] < (recv_off + recv)[:, None])
    ).any(axis=0)
    d_output = jnp.where(covered.reshape((-1,) + (1,) * (g.ndim - 1)), jnp.zeros_like(g), g)
    # d_operand: every received slice's cotangent goes back to the slice it came from
    d_operand = _ragged_call(
        g,
        jnp.zeros((operand_rows, *g.shape[1:]), g.dtype),
        recv_off,
        recv,
        src_off,
        send,
        axis_name,
        config_id,
    )[0]
    z = _compat.zero_cotangent
    return d_operand, d_output, z(in_off), z(send), z(out_off), z(recv)


_ragged.defvjp(_ragged_fwd, _ragged_bwd)


def last_schedule(site: int | None = None) -> dict | None:
    """With ``configure(debug=True)``: the demand (bytes, topology ranks) and the transfers executed
    by the most recent call of ``site`` (default: the call site traced last)."""
    from variopath_jax._native import debug_schedule

    return debug_schedule(last_site if site is None else site)
