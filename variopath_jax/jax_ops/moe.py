"""MoE-shaped dispatch and combine over ``all_to_all_v``, for use inside ``shard_map``.

``moe_dispatch`` takes rows grouped by destination rank and, within a destination, by that rank's
local expert, with counts per (destination, local expert). It returns the received rows grouped by
local expert (expert 0's rows from every source in source order, then expert 1's, ...) with the
rows per expert as ``jax.lax.ragged_dot``'s ``group_sizes``. ``moe_combine`` sends expert outputs
back to the positions their inputs came from. The counts travel by ``jax.lax.all_to_all`` (and, in
capacity mode, ``jax.lax.all_gather`` of the per-destination totals); the rows by ``all_to_all_v``.

Capacity mode (``drop_overflow=True``): each receiver keeps the first ``out_capacity`` rows of its
incoming stream in source rank order and, within a source, in local expert order (within one
(source, expert) segment, in the sender's row order); the rest are dropped, reported per source,
returned as zeros by ``moe_combine`` and get zero gradients. Without it, more than
``out_capacity`` incoming rows is an error, as for ``all_to_all_v``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops.config import OpConfig
from variopath_jax.jax_ops.ops import all_to_all_v


@partial(
    jax.tree_util.register_dataclass,
    data_fields=["rows", "group_sizes", "recv_counts", "dropped", "kept", "combine_index"],
    meta_fields=["axis_name", "drop_overflow", "config"],
)
@dataclass(frozen=True)
class MoEDispatch:
    """The result of ``moe_dispatch`` (a pytree), and what ``moe_combine`` needs to invert it.

    rows : (out_capacity, ...) received rows grouped by local expert, then by source rank; zeros
        past ``group_sizes.sum()``.
    group_sizes : int32 (E_local,) rows received per local expert (``ragged_dot``'s group_sizes).
    recv_counts : int32 (N, E_local) rows received (kept) per (source rank, local expert).
    dropped : int32 (N,) rows dropped per source rank (zeros unless ``drop_overflow``).
    kept : bool (R,) which rows of this rank's ``x`` reached their expert.
    combine_index : int32 (out_capacity,) for each row in source order, its position in ``rows``
        (``out_capacity`` past the received rows).
    """

    rows: jax.Array
    group_sizes: jax.Array
    recv_counts: jax.Array
    dropped: jax.Array
    kept: jax.Array
    combine_index: jax.Array
    axis_name: object
    drop_overflow: bool
    config: OpConfig | None


def _exclusive_cumsum(a: jax.Array, axis: int | None = None) -> jax.Array:
    return jnp.cumsum(a, axis=axis) - a


def _segments(sizes: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
    """For positions 0..length-1 of a concatenation of segments of ``sizes`` (1-D): the segment
    each position falls in (clipped to the last) and whether it falls in any."""
    ends = jnp.cumsum(sizes)
    pos = jnp.arange(length, dtype=jnp.int32)
    seg = jnp.searchsorted(ends, pos, side="right").astype(jnp.int32)
    return jnp.minimum(seg, sizes.shape[0] - 1), pos < ends[-1]


def _wire_counts(counts: jax.Array) -> jax.Array:
    """Rows per destination as ``all_to_all_v`` checks them: the row sums, or a row's most negative
    entry, so that negative counts are reported by the op instead of cancelling out in a sum."""
    return jnp.where((counts < 0).any(axis=1), counts.min(axis=1), counts.sum(axis=1))


def _accepted_sent(counts: jax.Array, cap: int, axis_name) -> jax.Array:
    """Capacity mode, sender side: how many rows of each (destination, expert) segment the
    destination keeps, given the rows earlier source ranks send it."""
    totals = jax.lax.all_gather(counts.sum(axis=1), axis_name)  # (N source, N destination)
    me = jax.lax.axis_index(axis_name)
    earlier = _exclusive_cumsum(totals, axis=0)[me]  # rows earlier sources send each destination
    start = earlier[:, None] + _exclusive_cumsum(counts, axis=1)
    return jnp.clip(cap - start, 0, counts)


def _kept_rows(counts: jax.Array, accepted: jax.Array, rows: int) -> jax.Array:
    """Which rows of x are sent: the first ``accepted`` rows of each (destination, expert)
    segment."""
    flat = counts.reshape(-1)
    seg, inside = _segments(flat, rows)
    within = jnp.arange(rows, dtype=jnp.int32) - _exclusive_cumsum(flat)[seg]
    return inside & (within < accepted.reshape(-1)[seg])


def moe_dispatch(
    x: jax.Array,
    send_counts: jax.Array,
    *,
    axis_name,
    out_capacity: int | None = None,
    drop_overflow: bool = False,
    config: OpConfig | None = None,
) -> MoEDispatch:
    """MoE dispatch: send rows to (destination rank, local expert) and group what arrives by
    local expert.

    Parameters
    ----------
    x : array (R, ...)
        This rank's rows, grouped by destination rank in rank order and, within a destination, by
        its local expert in order.
    send_counts : int array (N, E_local)
        ``send_counts[j, e]`` rows go to local expert ``e`` of rank ``j`` (N = the axis size);
        their sum must not exceed R.
    axis_name
        The ``shard_map`` mesh axis the experts are sharded over.
    out_capacity : int, optional
        Rows of ``MoEDispatch.rows`` (default R).
    drop_overflow : bool
        Capacity mode: keep the first ``out_capacity`` incoming rows (sources in rank order, within
        a source experts in order) and drop the rest. Default: receiving more is an error.
    config : OpConfig, optional
        Passed to ``all_to_all_v``.
    """
    x = jnp.asarray(x)
    if x.ndim < 1:
        raise VarioPathError("moe_dispatch: x needs a leading row axis")
    n = int(jax.lax.axis_size(axis_name))
    counts = jnp.asarray(send_counts)
    if counts.ndim != 2 or counts.shape[0] != n or not jnp.issubdtype(counts.dtype, jnp.integer):
        raise VarioPathError(
            f"moe_dispatch: send_counts must be an integer array of shape ({n}, E_local) "
            f"(destination rank, local expert), got {counts.dtype}{tuple(counts.shape)}"
        )
    if counts.shape[1] < 1:
        raise VarioPathError("moe_dispatch: send_counts needs at least one local expert column")
    rows = x.shape[0]
    cap = rows if out_capacity is None else int(out_capacity)
    if cap < 0:
        raise VarioPathError(f"moe_dispatch: out_capacity must be >= 0, got {out_capacity}")
    counts = counts.astype(jnp.int32)
    n_experts = counts.shape[1]
    incoming = jax.lax.all_to_all(counts, axis_name, 0, 0, tiled=True)  # [source, local expert]
    if drop_overflow:
        accepted = _accepted_sent(counts, cap, axis_name)
        kept = _kept_rows(counts, accepted, rows)
        # the kept rows, in order, at the front (their gradient is the reverse of this gather)
        order = jnp.nonzero(kept, size=rows, fill_value=rows)[0]
        x_send = jnp.take(x, order, axis=0, mode="fill", fill_value=0)
        bad = (counts < 0).any() | (counts.sum() > rows)  # let the op report them
        wire = jnp.where(bad, _wire_counts(counts), accepted.sum(axis=1))
        got = jnp.clip(cap - _exclusive_cumsum(incoming.reshape(-1)), 0, incoming.reshape(-1))
        got = got.reshape(n, n_experts)
        dropped = (incoming - got).sum(axis=1)
    else:
        kept = jnp.arange(rows, dtype=jnp.int32) < counts.sum()
        x_send, wire, got = x, _wire_counts(counts), incoming
        dropped = jnp.zeros((n,), jnp.int32)
    y, _ = all_to_all_v(x_send, wire, axis_name=axis_name, out_capacity=cap, config=config)
    # y holds segments in (source, expert) order; rows wants them in (expert, source) order
    src_off = _exclusive_cumsum(got.reshape(-1)).reshape(n, n_experts)
    by_expert = got.T.reshape(-1)
    seg, inside = _segments(by_expert, cap)
    e, s = seg // n, seg % n
    pos = jnp.arange(cap, dtype=jnp.int32)
    take = jnp.where(inside, src_off[s, e] + pos - _exclusive_cumsum(by_expert)[seg], cap)
    grouped = jnp.take(y, take, axis=0, mode="fill", fill_value=0)
    exp_off = _exclusive_cumsum(by_expert).reshape(n_experts, n)
    seg, inside = _segments(got.reshape(-1), cap)
    s, e = seg // n_experts, seg % n_experts
    back = jnp.where(inside, exp_off[e, s] + pos - src_off.reshape(-1)[seg], cap)
    return MoEDispatch(
        rows=grouped,
        group_sizes=got.sum(axis=0),
        recv_counts=got,
        dropped=dropped,
        kept=kept,
        combine_index=back,
        axis_name=axis_name,
        drop_overflow=bool(drop_overflow),
        config=config,
    )


def moe_combine(y: jax.Array, dispatched: MoEDispatch) -> jax.Array:
    """MoE combine, the inverse of ``moe_dispatch``: sends each row of ``y`` (laid out like
    ``dispatched.rows``, any trailing shape) back to the position in ``x`` its input came from.

    Returns an array (R, ...) with zeros for the rows of ``x`` that were not kept (dropped in
    capacity mode, or past ``send_counts.sum()``).
    """
    y = jnp.asarray(y)
    cap = dispatched.combine_index.shape[0]
    if y.ndim < 1 or y.shape[0] != cap:
        raise VarioPathError(
            f"moe_combine: y must have the {cap} rows of the dispatched rows (out_capacity), "
            f"got shape {tuple(y.shape)}"
        )
    by_source = jnp.take(y, dispatched.combine_index, axis=0, mode="fill", fill_value=0)
    rows = dispatched.kept.shape[0]
    out, _ = all_to_all_v(
        by_source,
        dispatched.recv_counts.sum(axis=1),
        axis_name=dispatched.axis_name,
        out_capacity=rows,
        config=dispatched.config,
    )
    if not dispatched.drop_overflow:
        return out  # kept rows are a prefix already in place; all_to_all_v zeroes the rest
    kept = dispatched.kept
    at = jnp.where(kept, jnp.cumsum(kept) - 1, rows)  # where each kept row is in the compacted rows
    return jnp.take(out, at, axis=0, mode="fill", fill_value=0)
