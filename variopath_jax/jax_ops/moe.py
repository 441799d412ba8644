"""MoE-shaped dispatch and combine over ``all_to_all_v``, for use inside ``shard_map``.

Two forms. **From the router's output** (``moe_dispatch(x, expert_ids, weights,
num_experts=...)``), as TransformerEngine JAX's ``ep_dispatch``/``ep_combine`` and DeepEP's
``dispatch``/``combine`` are used: each token's top-k expert indices (and gates) in, any leading
batch axes; the dispatch sorts the (token, expert) slots by expert, counts them, exchanges them
and returns the received rows grouped by local expert, their ``group_sizes`` and a
``RoutingHandle``. ``moe_combine(y, handle)`` sends the expert outputs back and sums each token's
slots weighted by its gates. The handle holds the plan of the dispatch (the slot permutation, the
rows sent to and received from every rank, where each received row sits, the configuration), so
the combine is the dispatch's exchange reversed by construction: its counts are the dispatch's
swapped, not found again, and the combine's gradient is the dispatch's exchange (neither
direction exchanges counts first; natively, the combine's demand, the dispatch's transposed,
is served by the dispatch's cached plan reversed: no token naming that plan crosses the FFI yet).
Its receive buffer is bounded by a capacity factor by default
(slots past it dropped and counted), or sized for the worst case with ``dropless=True``.

**The low-level form** (``moe_dispatch_rows``, ``moe_combine_rows``; ``moe_dispatch(x,
send_counts)`` and ``moe_combine(y, MoEDispatch)`` call them): ``moe_dispatch_rows`` takes rows
grouped by destination rank and, within a destination, by that rank's local expert, with counts
per (destination, local expert). It returns the received rows grouped by local expert (expert
0's rows from every source in source order, then expert 1's, ...) with the rows per expert as
``jax.lax.ragged_dot``'s ``group_sizes``. ``moe_combine_rows`` sends expert outputs back to the
positions their inputs came from. The counts travel by ``jax.lax.all_to_all`` (and, in capacity
mode, ``jax.lax.all_gather`` of the per-destination totals); the rows by ``all_to_all_v``.

Per-node deduplication (``token_ids``, issue 30), as DeepEP's normal mode does (its
``docs/legacy.md``; research/peer-systems.md §5): rows that are copies of one token (the same
``token_ids`` entry) bound for several ranks of one node cross between nodes once, to the relay
GPU of that node with the sender's local index, which fans them out inside its node. Three
``all_to_all_v`` calls do it (the deduplicated rows to the relays, which row is which token to the
relays, the fan-out), with the results of the plain path: the same rows in the same places.

Capacity mode (``drop_overflow=True``): each receiver keeps the first ``out_capacity`` rows of its
incoming stream in source rank order and, within a source, in local expert order (within one
(source, expert) segment, in the sender's row order); the rest are dropped, reported per source,
returned as zeros by ``moe_combine`` and get zero gradients. Without it, more than
``out_capacity`` incoming rows is an error, as for ``all_to_all_v``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops.config import OpConfig, current_config
from variopath_jax.jax_ops.ops import all_to_all_v, reverse_all_to_all_v


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


def moe_dispatch_rows(
    x: jax.Array,
    send_counts: jax.Array,
    *,
    axis_name,
    out_capacity: int | None = None,
    drop_overflow: bool = False,
    config: OpConfig | None = None,
    token_ids: jax.Array | None = None,
    gpus_per_node: int | None = None,
) -> MoEDispatch:
    """MoE dispatch, the low-level form (``moe_dispatch(x, send_counts, ...)`` calls it): send
    rows to (destination rank, local expert) and group what arrives by local expert.

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
    token_ids : int array (R,), optional
        Per-node deduplication (module docstring; default off): which token each row of ``x`` is.
        Rows with the same id must hold the same values (copies of one token, as
        ``tokens[token_ids]`` makes); rows past ``send_counts.sum()`` are ignored. The results are
        the plain path's; the gradient with respect to ``x`` lands on the first row of each
        (token, node) (with respect to ``tokens`` it is the same). Not with ``drop_overflow``. The
        relays hold up to (nodes × R) rows in flight.
    gpus_per_node : int, optional
        The ranks per node for deduplication (ranks r·m .. r·m + m - 1 form a node); default the
        configured topology's (its rank map must then be the identity).
    """
    x = jnp.asarray(x)
    if x.ndim < 1:
        raise VarioPathError("moe_dispatch: x needs a leading row axis")
    n = _axis_size(axis_name)
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
    if token_ids is None:
        y, _ = all_to_all_v(x_send, wire, axis_name=axis_name, out_capacity=cap, config=config)
    else:
        if drop_overflow:
            raise VarioPathError("moe_dispatch: token_ids (deduplication) with drop_overflow")
        m = _gpus_per_node(n, gpus_per_node, config)
        ids = jnp.asarray(token_ids)
        if ids.shape != (rows,) or not jnp.issubdtype(ids.dtype, jnp.integer):
            raise VarioPathError(
                f"moe_dispatch: token_ids must be an integer array of shape ({rows},), got "
                f"{ids.dtype}{tuple(ids.shape)}"
            )
        y = _dedup_exchange(x, counts, ids.astype(jnp.int32), m, cap, axis_name, config)
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


def moe_combine_rows(y: jax.Array, dispatched: MoEDispatch) -> jax.Array:
    """MoE combine, the low-level form (``moe_combine(y, dispatched)`` calls it), the inverse of
    ``moe_dispatch_rows``: sends each row of ``y`` (laid out like
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


def _gpus_per_node(n: int, gpus_per_node: int | None, config: OpConfig | None) -> int:
    if gpus_per_node is None:
        cfg = config or current_config(n)
        if tuple(cfg.rank_map) != tuple(range(n)):
            raise VarioPathError(
                "moe_dispatch: pass gpus_per_node: the configured rank map is not the identity"
            )
        gpus_per_node = cfg.topology.gpus_per_node
    m = int(gpus_per_node)
    if m < 1 or n % m:
        raise VarioPathError(f"moe_dispatch: {n} ranks do not split into nodes of {m}")
    return m


def _dedup_exchange(
    x: jax.Array, counts: jax.Array, ids: jax.Array, m: int, cap: int, axis_name, config
) -> jax.Array:
    """What ``all_to_all_v(x, counts.sum(axis=1), out_capacity=cap)`` returns, with each token
    crossing to a node once: to the relay with this rank's local index there (for this rank's
    own node, itself), which forwards it to every rank of its node that gets it."""
    n, rows = counts.shape[0], x.shape[0]
    nodes = n // m
    me = jax.lax.axis_index(axis_name).astype(jnp.int32)
    per_dest = counts.sum(axis=1)
    totals = jax.lax.all_gather(per_dest, axis_name)  # [source, destination] rows
    dest, valid = _segments(per_dest, rows)
    node_row = jnp.where(valid, dest // m, nodes)  # past the end: ignored
    # the unique (node, token) pairs, in (node, token) order: group g of the sorted rows
    r = jnp.arange(rows, dtype=jnp.int32)
    order = jnp.lexsort((r, ids, node_row)).astype(jnp.int32)
    sn, st = node_row[order], ids[order]
    first = (r == 0) | (sn != jnp.roll(sn, 1)) | (st != jnp.roll(st, 1))
    first = first & (sn < nodes)
    gid = jnp.cumsum(first) - 1
    unique = jax.ops.segment_sum(first.astype(jnp.int32), sn, num_segments=nodes + 1)[:nodes]
    start = _exclusive_cumsum(unique)
    u_row = jnp.zeros(rows, jnp.int32).at[order].set(gid - start[jnp.minimum(sn, nodes - 1)])
    rep = jnp.full(rows, rows, jnp.int32).at[jnp.where(first, gid, rows)].set(order, mode="drop")
    x_unique = jnp.take(x, rep, axis=0, mode="fill", fill_value=0)
    rank = jnp.arange(n, dtype=jnp.int32)
    mine = rank % m == me % m  # the relays this rank sends to: its local index on every node
    to_relay = jnp.where(mine, unique[rank // m], 0)
    in_node = per_dest.reshape(nodes, m).sum(axis=1)
    bad = (counts < 0).any() | (counts.sum() > rows)  # let the op report them
    idx_counts = jnp.where(bad, _wire_counts(counts), jnp.where(mine, in_node[rank // m], 0))
    # 1. which unique row each row is, and 2. the unique rows, to the relays
    held = nodes * rows
    idx, idx_from = all_to_all_v(
        u_row[:, None], idx_counts, axis_name=axis_name, out_capacity=held, config=config
    )
    got, got_from = all_to_all_v(
        x_unique, to_relay, axis_name=axis_name, out_capacity=held, config=config
    )
    # 3. as a relay: to each rank j of this node, the rows of each source relayed here, in order
    my_node = rank // m == me // m
    served = rank % m == me % m
    sizes = jnp.where(my_node[:, None] & served[None, :], totals.T, 0)  # [destination, source]
    seg, inside = _segments(sizes.reshape(-1), held)
    j, i = seg // n, seg % n
    within = jnp.arange(held, dtype=jnp.int32) - _exclusive_cumsum(sizes.reshape(-1))[seg]
    before = _exclusive_cumsum(jnp.where(my_node[None, :], totals, 0), axis=1)[i, j]
    at = _exclusive_cumsum(idx_from)[i] + before + within
    which = jnp.take(idx[:, 0], jnp.where(inside, at, held), mode="fill", fill_value=0)
    pick = jnp.where(inside, _exclusive_cumsum(got_from)[i] + which, held)
    fan = jnp.take(got, pick, axis=0, mode="fill", fill_value=0)
    y, _ = all_to_all_v(
        fan, sizes.sum(axis=1), axis_name=axis_name, out_capacity=cap, config=config
    )
    # received by relay, then source; wanted by source: source i came from relay (my node, i % m)
    came = totals[:, me]
    relay_of = (me // m) * m + rank % m
    q_sizes = jnp.where(rank[:, None] == relay_of[None, :], came[None, :], 0)  # [relay, source]
    q_start = _exclusive_cumsum(q_sizes.reshape(-1)).reshape(n, n)[relay_of, rank]
    seg, inside = _segments(came, cap)
    within = jnp.arange(cap, dtype=jnp.int32) - _exclusive_cumsum(came)[seg]
    return jnp.take(
        y, jnp.where(inside, q_start[seg] + within, cap), axis=0, mode="fill", fill_value=0
    )


# ----- the router's form: top-k indices and weights in, a routing handle out ------------------
DEFAULT_CAPACITY_FACTOR = 1.25


def _axis_size(axis_name) -> int:
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    size = 1
    for a in names:
        size *= int(jax.lax.axis_size(a))
    return size


@partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "order",
        "weights",
        "kept",
        "sent",
        "received",
        "recv_counts",
        "combine_index",
        "dropped",
        "dropped_here",
    ],
    meta_fields=["axis_name", "config", "batch_shape", "top_k", "drop_overflow"],
)
@dataclass(frozen=True)
class RoutingHandle:
    """What ``moe_dispatch`` (the router's form) hands ``moe_combine``: the dispatch's plan (a
    pytree; pass it through ``jit``, ``scan`` or ``checkpoint`` like any other).

    order : int32 (S,) the (token, expert) slots (S = tokens × top_k, in token-major order) sorted
        by expert: slot ``order[i]`` was the i-th row sent.
    weights : (S,) each slot's gate, or None (the combine sums the slots unweighted).
    kept : bool (*batch, top_k) whether each slot reached its expert (False: dropped past the
        capacity, or an expert index outside [0, num_experts)).
    sent : int32 (N,) rows this rank sent to each rank (the combine receives them back).
    received : int32 (N,) rows this rank received from each rank (the combine sends them back).
    recv_counts : int32 (N, E_local) of those, per (source rank, local expert).
    combine_index : int32 (capacity,) for each received row in source order, its row in the
        dispatched rows.
    dropped : int32 () this rank's slots that did not reach their expert.
    dropped_here : int32 (N,) rows from each source rank this rank's buffer dropped.
    axis_name, config, batch_shape, top_k, drop_overflow : the exchange axis, the configuration
        (resolved at the dispatch: the combine runs under the same one), the tokens' leading
        shape, the slots per token, whether the buffer may drop.
    """

    order: jax.Array
    weights: jax.Array | None
    kept: jax.Array
    sent: jax.Array
    received: jax.Array
    recv_counts: jax.Array
    combine_index: jax.Array
    dropped: jax.Array
    dropped_here: jax.Array
    axis_name: object
    config: OpConfig
    batch_shape: tuple
    top_k: int
    drop_overflow: bool

    @property
    def capacity(self) -> int:
        """Rows of the receive buffer."""
        return int(self.combine_index.shape[0])


def receive_capacity(
    tokens: int,
    top_k: int,
    ranks: int,
    *,
    capacity: int | None = None,
    capacity_factor: float | None = None,
    dropless: bool = False,
) -> int:
    """Rows of one rank's receive buffer: ``capacity`` if given; with ``dropless`` the worst case,
    every slot of every rank on one rank (``ranks × tokens × top_k``); else
    ``ceil(capacity_factor × tokens × top_k)``, the factor (default 1.25) times the rows a rank
    receives when the router spreads the slots evenly."""
    if dropless:
        if capacity is not None or capacity_factor is not None:
            raise VarioPathError("dropless=True sizes the buffer itself: pass no capacity")
        return ranks * tokens * top_k
    if capacity is not None:
        if capacity_factor is not None:
            raise VarioPathError("pass capacity (rows) or capacity_factor, not both")
        if isinstance(capacity, bool) or int(capacity) != capacity or capacity < 0:
            raise VarioPathError(f"capacity must be a whole number of rows >= 0, got {capacity!r}")
        return int(capacity)
    factor = DEFAULT_CAPACITY_FACTOR if capacity_factor is None else float(capacity_factor)
    if not factor > 0:
        raise VarioPathError(f"capacity_factor must be > 0, got {capacity_factor!r}")
    return max(1, math.ceil(round(factor * tokens * top_k, 6)))


def moe_dispatch(
    x: jax.Array,
    indices: jax.Array,
    weights: jax.Array | None = None,
    *,
    axis_name,
    num_experts: int | None = None,
    capacity: int | None = None,
    capacity_factor: float | None = None,
    dropless: bool = False,
    config: OpConfig | None = None,
    out_capacity: int | None = None,
    drop_overflow: bool = False,
    token_ids: jax.Array | None = None,
    gpus_per_node: int | None = None,
):
    """MoE dispatch inside ``shard_map``, from the router's output.

    ``moe_dispatch(x, expert_ids, weights, axis_name=..., num_experts=E)``:

    x : (*batch, D) this rank's tokens (any leading batch axes).
    expert_ids : int (*batch, top_k) each token's experts, in [0, E) (others are dropped).
    weights : (*batch, top_k), optional: the gates ``moe_combine`` weights the slots by.
    axis_name : the expert axis (a mesh axis or a tuple of them, N ranks); rank r holds experts
        r·E/N .. (r+1)·E/N - 1 (E must be a multiple of N).
    capacity, capacity_factor, dropless : the receive buffer (``receive_capacity``): default
        1.25 × tokens × top_k rows, the first that arrive kept (sources in rank order) and the
        rest dropped; ``dropless=True`` sizes it for the worst case, N × tokens × top_k rows
        (N times the default's memory, and the expert FFN's work over it unless it skips the
        empty rows, as ``moe_block`` does).
    config : the op's configuration (default the process's).

    Returns ``(rows, group_sizes, handle)``: the received rows (capacity, D) grouped by local
    expert (zeros past ``group_sizes.sum()``), int32 (E/N,) rows per local expert (``ragged_dot``'s
    ``group_sizes``), and the ``RoutingHandle`` for ``moe_combine``.

    **The low-level form** ``moe_dispatch(x, send_counts, axis_name=..., out_capacity=...,
    drop_overflow=..., token_ids=..., gpus_per_node=...)`` (no ``num_experts``): rows already
    grouped by (destination, local expert) with their counts; returns a ``MoEDispatch``
    (``moe_dispatch_rows``).
    """
    if num_experts is None:
        if weights is not None or capacity is not None or capacity_factor is not None or dropless:
            raise VarioPathError(
                "moe_dispatch: the router's form (expert ids and weights) needs num_experts=; "
                "without it the second argument is send_counts (the low-level form)"
            )
        return moe_dispatch_rows(
            x,
            indices,
            axis_name=axis_name,
            out_capacity=out_capacity,
            drop_overflow=drop_overflow,
            config=config,
            token_ids=token_ids,
            gpus_per_node=gpus_per_node,
        )
    if out_capacity is not None or drop_overflow or token_ids is not None:
        raise VarioPathError(
            "moe_dispatch: out_capacity, drop_overflow and token_ids belong to the low-level form; "
            "with num_experts pass capacity, capacity_factor or dropless"
        )
    return _dispatch_routed(
        x,
        indices,
        weights,
        axis_name=axis_name,
        num_experts=num_experts,
        capacity=capacity,
        capacity_factor=capacity_factor,
        dropless=dropless,
        config=config,
    )


def _dispatch_routed(
    x, indices, weights, *, axis_name, num_experts, capacity, capacity_factor, dropless, config
):
    x, ids = jnp.asarray(x), jnp.asarray(indices)
    if x.ndim < 2:
        raise VarioPathError(
            f"moe_dispatch: x must be (*batch, d_model) tokens, got shape {tuple(x.shape)}"
        )
    batch_shape = tuple(x.shape[:-1])
    if (
        ids.ndim != x.ndim
        or tuple(ids.shape[:-1]) != batch_shape
        or not jnp.issubdtype(ids.dtype, jnp.integer)
    ):
        raise VarioPathError(
            f"moe_dispatch: expert ids must be an integer array of shape {batch_shape} + "
            f"(top_k,) for x of shape {tuple(x.shape)}, got {ids.dtype}{tuple(ids.shape)}"
        )
    top_k = int(ids.shape[-1])
    experts = int(num_experts)
    n = _axis_size(axis_name)
    if experts < 1 or experts % n:
        raise VarioPathError(
            f"moe_dispatch: num_experts={num_experts} does not split over the {n} ranks of the "
            "expert axis (it must be a positive multiple of them)"
        )
    if not 1 <= top_k <= experts:
        raise VarioPathError(f"moe_dispatch: top_k={top_k} is outside [1, {experts}]")
    if weights is not None:
        weights = jnp.asarray(weights)
        if tuple(weights.shape) != tuple(ids.shape):
            raise VarioPathError(
                f"moe_dispatch: weights must have the expert ids' shape {tuple(ids.shape)}, got "
                f"{tuple(weights.shape)}"
            )
    local = experts // n
    tokens = int(np.prod(batch_shape))
    slots = tokens * top_k
    cap = receive_capacity(
        tokens,
        top_k,
        n,
        capacity=capacity,
        capacity_factor=capacity_factor,
        dropless=dropless,
    )
    cfg = config or current_config(n)
    flat = ids.reshape(-1).astype(jnp.int32)
    valid = (flat >= 0) & (flat < experts)
    key = jnp.where(valid, flat, experts)  # out of range: sorted last and never sent
    order = jnp.argsort(key, stable=True).astype(jnp.int32)
    counts = jnp.bincount(key, length=experts + 1)[:experts].reshape(n, local).astype(jnp.int32)
    d = moe_dispatch_rows(
        x.reshape(tokens, -1)[order // top_k],
        counts,
        axis_name=axis_name,
        out_capacity=cap,
        drop_overflow=not dropless,
        config=cfg,
    )
    dest = jnp.minimum(key[order] // local, n - 1)
    sent = jax.ops.segment_sum(d.kept.astype(jnp.int32), dest, num_segments=n)
    kept = jnp.zeros(slots, bool).at[order].set(d.kept)
    handle = RoutingHandle(
        order=order,
        weights=None if weights is None else weights.reshape(-1),
        kept=kept.reshape(*batch_shape, top_k),
        sent=sent,
        received=d.recv_counts.sum(axis=1),
        recv_counts=d.recv_counts,
        combine_index=d.combine_index,
        dropped=(slots - kept.sum()).astype(jnp.int32),
        dropped_here=d.dropped,
        axis_name=axis_name,
        config=cfg,
        batch_shape=batch_shape,
        top_k=top_k,
        drop_overflow=not dropless,
    )
    return d.rows, d.group_sizes, handle


def moe_combine(y: jax.Array, handle) -> jax.Array:
    """MoE combine inside ``shard_map``, the dispatch's exchange reversed.

    ``moe_combine(y, handle)`` with a ``RoutingHandle``: ``y`` (capacity, ...) laid out like the
    dispatched rows (any trailing shape); returns (*batch, ...): each token's slots summed,
    weighted by the handle's gates (a dropped slot adds nothing).

    With a ``MoEDispatch`` (the low-level form, ``moe_combine_rows``): returns (R, ...), each row
    back at the position of ``x`` it came from.
    """
    if isinstance(handle, MoEDispatch):
        return moe_combine_rows(y, handle)
    if not isinstance(handle, RoutingHandle):
        raise VarioPathError(
            "moe_combine: the second argument must be the RoutingHandle or MoEDispatch that "
            f"moe_dispatch returned, got {type(handle).__name__}"
        )
    y = jnp.asarray(y)
    cap = handle.capacity
    if y.ndim < 1 or y.shape[0] != cap:
        raise VarioPathError(
            f"moe_combine: y must have the {cap} rows of the dispatched rows, got shape "
            f"{tuple(y.shape)}"
        )
    slots = handle.order.shape[0]
    by_source = jnp.take(y, handle.combine_index, axis=0, mode="fill", fill_value=0)
    back = reverse_all_to_all_v(
        by_source,
        handle.received,
        handle.sent,
        axis_name=handle.axis_name,
        out_capacity=slots,
        config=handle.config,
    )
    if handle.drop_overflow:
        kept = handle.kept.reshape(-1)[handle.order]  # in the order the rows were sent
        at = jnp.where(kept, jnp.cumsum(kept) - 1, slots)
        back = jnp.take(back, at, axis=0, mode="fill", fill_value=0)
    rest = tuple(y.shape[1:])
    per_slot = jnp.zeros_like(back).at[handle.order].set(back)  # back to (token, slot) order
    per_slot = per_slot.reshape(slots // handle.top_k, handle.top_k, *rest)
    if handle.weights is not None:
        w = handle.weights.astype(y.dtype).reshape(slots // handle.top_k, handle.top_k)
        per_slot = per_slot * w.reshape(w.shape + (1,) * len(rest))
    return per_slot.sum(axis=1).reshape(*handle.batch_shape, *rest)
