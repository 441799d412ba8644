"""``all_to_all_v`` and a ``ragged_all_to_all`` drop-in: JAX primitives lowered to XLA FFI calls.

Both run inside ``shard_map`` over one or more manual mesh axes (the collective's ranks are the
linear index over the named axes in mesh order), optionally split into ``axis_index_groups``.
Each call lowers to one FFI custom call per device; the handlers of one collective (same call
site, same ``group`` operand) meet in an in-process rendezvous, plan the gathered demand with the
configured VarioPath planner and copy the planned activations (ffi/collective.cc).

Each op is two primitives: the exchange itself, which also returns where the received slices came
from and landed, and its linear form, which takes those as inputs. Both are linear in the data, so
their JVP applies the linear form to the tangents and the linear form's transpose is the reverse
exchange, itself a linear form. Results vary over every manual axis the inputs vary over and over
the exchange axes. Under ``vmap`` over another axis ``ragged_all_to_all`` runs the batch as one
exchange (more slices per peer); ``all_to_all_v`` runs once per batch element, in order.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import _compat
from variopath_jax.jax_ops.config import DETECT_HINT, OpConfig, current_config

last_site = 0  # the call site lowered most recently (for debug_schedule)


# ----- where this device sits in the collective -----------------------------------------------
class _Collective(NamedTuple):
    names: tuple  # the exchange axes, in mesh order
    groups: tuple[tuple[int, ...], ...] | None
    size: int  # ranks per collective
    rank: jax.Array  # int32: this device's rank in its collective
    group: jax.Array  # int32: which collective (of the other manual axes and the index groups)


def _collective(op: str, axis_name, axis_index_groups) -> _Collective:
    """Resolve ``axis_name`` (a name or a tuple of names) and ``axis_index_groups``."""
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    sizes = {a: _compat.axis_size(a) for a in names}  # NameError for an unbound name, as JAX
    manual = _compat.manual_axes()
    order = [a for a, _ in manual]
    for a in names:
        if a not in order:
            raise NotImplementedError(
                f"{op}: axis {a!r} is not a manual mesh axis of the enclosing shard_map (a vmap "
                "axis?); the exchange runs over shard_map mesh axes only, so vmap over the "
                "exchange's own axis is not supported"
            )
    if not names or len(set(names)) != len(names):
        raise VarioPathError(f"{op}: axis_name must name distinct mesh axes, got {axis_name!r}")
    names = tuple(sorted(names, key=order.index))
    total = math.prod(sizes[a] for a in names)
    index = jnp.int32(0)
    for a in names:
        index = index * sizes[a] + jax.lax.axis_index(a).astype(jnp.int32)
    groups = None if axis_index_groups is None else _check_groups(op, axis_index_groups, total)
    if groups is None:
        size, rank, group = total, index, jnp.int32(0)
    else:
        size = len(groups[0])
        position = np.zeros(total, np.int32)
        which = np.zeros(total, np.int32)
        for g, members in enumerate(groups):
            for p, member in enumerate(members):
                position[member], which[member] = p, g
        rank, group = jnp.asarray(position)[index], jnp.asarray(which)[index]
    outer = jnp.int32(0)  # the position over the other manual axes
    for a, n in manual:
        if a not in names:
            outer = outer * n + jax.lax.axis_index(a).astype(jnp.int32)
    return _Collective(names, groups, size, rank, outer * (total // size) + group)


def _check_groups(op: str, axis_index_groups, total: int) -> tuple[tuple[int, ...], ...]:
    groups = tuple(tuple(int(i) for i in g) for g in axis_index_groups)
    flat = sorted(i for g in groups for i in g)
    if not groups or len({len(g) for g in groups}) != 1 or flat != list(range(total)):
        raise VarioPathError(
            f"{op}: axis_index_groups must be equally sized groups covering the {total} axis "
            f"indices exactly once, got {axis_index_groups!r}"
        )
    return groups


def _config(op: str, coll: _Collective, config: OpConfig | None) -> OpConfig:
    cfg = config or current_config(coll.size)
    if cfg.ranks != coll.size:
        where = (
            f"mesh axis {coll.names[0]!r}" if len(coll.names) == 1 else f"mesh axes {coll.names}"
        )
        if coll.groups:
            where = f"each of the axis_index_groups of {where}"
        raise VarioPathError(
            f"{op}: {where} has {coll.size} devices but the configured topology "
            f"{cfg.topology.name!r} has {cfg.ranks} ranks; call variopath_jax.configure() with a "
            f"matching topology: {DETECT_HINT}"
        )
    return cfg


def _out_varying(avals) -> frozenset:
    """The axes an exchange's results vary over: those of its inputs but the group key (last),
    which includes the exchange axes through the rank."""
    return frozenset().union(*(_compat.aval_varying(a) for a in avals[:-1]))


def _refuse_batched_axes(op: str, dims, axis_name) -> None:
    """A batched rank or group: the exchange axis is (shadowed by) the vmapped axis."""
    if dims[-1] is not None or dims[-2] is not None:
        raise NotImplementedError(
            f"{op}: vmap over the exchange's own axis {axis_name} is not supported; the exchange "
            "runs over shard_map mesh axes only"
        )


def _moved(x, d, size: int, axis: int):
    """``x`` with its batch dimension ``d`` (None: unbatched, broadcast) at ``axis``."""
    if d is None:
        x = jnp.expand_dims(x, axis)
        return jnp.broadcast_to(x, (*x.shape[:axis], size, *x.shape[axis + 1 :]))
    return jnp.moveaxis(x, d, axis)


def _batch_size(args, dims) -> int:
    return next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)


def _attrs(ctx, target: str, params: dict) -> dict:
    """The FFI call's attributes: configuration, call site (content-derived, ``call_site``) and
    the collective's size."""
    global last_site
    static = (params["config_id"], params["axis_size"])
    last_site = _compat.call_site(ctx, target, static)
    return {
        "config": np.int64(params["config_id"]),
        "site": np.int64(last_site),
        "axis_size": np.int64(params["axis_size"]),
    }


# ----- all_to_all_v ---------------------------------------------------------------------------
def all_to_all_v(
    x,
    send_counts,
    *,
    axis_name,
    out_capacity: int | None = None,
    out=None,
    axis_index_groups=None,
    config: OpConfig | None = None,
):
    """AlltoAllv of rows, planned by VarioPath.

    Parameters
    ----------
    x : array (R, ...)
        This rank's rows, grouped by destination rank in rank order.
    send_counts : int array (N,)
        How many rows go to each rank (N = the collective's size); their sum must not exceed R.
    axis_name
        The ``shard_map`` mesh axis, or a tuple of them, to exchange over (ranks: the linear index
        over those axes in mesh order).
    out_capacity : int, optional
        Rows of the result (default R, or ``out``'s rows). Receiving more is an error.
    out : array (C, ...), optional
        A buffer for the result, of x's dtype and trailing shape: the result is written into it
        (the FFI call's result aliases it), so a buffer donated to a jitted step
        (``donate_argnums``) is reused call after call instead of fresh pages each time. Its
        values are never read (every row of the result is written). Not donated, XLA copies it
        first, which changes nothing but the cost.
    axis_index_groups : sequence of sequences of int, optional
        Run one exchange within each group of axis indices (equally sized, covering the axis).
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
    send_counts = jnp.asarray(send_counts)
    if x.ndim < 1:
        raise VarioPathError("all_to_all_v: x needs a leading row axis")
    if send_counts.ndim != 1 or not jnp.issubdtype(send_counts.dtype, jnp.integer):
        raise VarioPathError(
            "all_to_all_v: send_counts must be a 1-D integer array, "
            f"got {send_counts.dtype}{tuple(send_counts.shape)}"
        )
    cap = x.shape[0] if out_capacity is None else int(out_capacity)
    if out is not None:
        out = jnp.asarray(out)
        if out.ndim < 1 or out.shape[1:] != x.shape[1:] or out.dtype != x.dtype:
            raise VarioPathError(
                f"all_to_all_v: out {out.dtype}{out.shape} must have x's dtype {x.dtype} and "
                f"trailing shape {x.shape[1:]}, with a leading row axis"
            )
        if out_capacity is not None and cap != out.shape[0]:
            raise VarioPathError(
                f"all_to_all_v: out_capacity={cap} but out has {out.shape[0]} rows"
            )
        cap = out.shape[0]
    if cap < 0:
        raise VarioPathError(f"all_to_all_v: out_capacity must be >= 0, got {out_capacity}")
    coll = _collective("all_to_all_v", axis_name, axis_index_groups)
    cfg = _config("all_to_all_v", coll, config)
    if send_counts.shape != (coll.size,):
        raise VarioPathError(
            f"all_to_all_v: send_counts must be an integer array of shape ({coll.size},), "
            f"got {send_counts.dtype}{tuple(send_counts.shape)}"
        )
    counts = send_counts.astype(jnp.int32)
    extra = () if out is None else (out,)
    vma = _out_varying([jax.typeof(v) for v in (x, counts, *extra, coll.rank, coll.group)])
    y, recv = _a2av_p.bind(
        _compat.ensure_varying(x, vma),
        counts,
        *(_compat.ensure_varying(o, vma) for o in extra),
        coll.rank,
        coll.group,
        axis_name=coll.names,
        axis_size=coll.size,
        config_id=cfg.id,
        cap=cap,
        into=out is not None,
    )
    return y, recv


def reverse_all_to_all_v(
    y,
    send_counts,
    recv_counts,
    *,
    axis_name,
    out_capacity: int,
    config: OpConfig | None = None,
):
    """``all_to_all_v(y, send_counts)`` when what each rank receives (``recv_counts``) is known
    already: the way back of an exchange whose counts were ``recv_counts`` out and
    ``send_counts`` in (MoE's combine after its dispatch). It binds the exchange's linear form
    directly, so its gradient is that exchange again with the two counts swapped, and neither
    direction exchanges counts first (``all_to_all_v``'s transpose has to).

    ``recv_counts`` must be what the peers send this rank (a wrong one gives a wrong gradient,
    not an error)."""
    y = jnp.asarray(y)
    coll = _collective("moe_combine", axis_name, None)
    cfg = _config("moe_combine", coll, config)
    counts = jnp.asarray(send_counts).astype(jnp.int32)
    recv = jnp.asarray(recv_counts).astype(jnp.int32)
    if counts.shape != (coll.size,) or recv.shape != (coll.size,):
        raise VarioPathError(
            f"moe_combine: send and receive counts must have shape ({coll.size},), got "
            f"{tuple(counts.shape)} and {tuple(recv.shape)}"
        )
    vma = _out_varying([jax.typeof(v) for v in (y, counts, recv, coll.rank, coll.group)])
    return _a2av_lin_p.bind(
        _compat.ensure_varying(y, vma),
        counts,
        recv,
        coll.rank,
        coll.group,
        axis_name=coll.names,
        axis_size=coll.size,
        config_id=cfg.id,
        cap=int(out_capacity),
    )


def _a2av_avals(x, counts, vma: frozenset, cap: int):
    y = x.update(shape=(cap, *x.shape[1:]), weak_type=False)
    return _compat.with_varying(y, vma), _compat.with_varying(counts, vma)


def _a2av_abstract(*args, axis_name, axis_size, config_id, cap, into):
    """(x, counts[, out], rank, group): ``out`` when ``into``."""
    return _a2av_avals(args[0], args[1], _out_varying(list(args)), cap)


def _a2av_lin_abstract(x, counts, recv, rank, group, *, axis_name, axis_size, config_id, cap):
    return _a2av_avals(x, counts, _out_varying([x, counts, recv, rank, group]), cap)[0]


def _a2av_lowering(ctx, *args, **params):
    if not params["into"]:
        return _compat.ffi_lower(
            ctx,
            "variopath_all_to_all_v",
            args,
            ctx.avals_in,
            ctx.avals_out,
            {},
            **_attrs(ctx, "variopath_all_to_all_v", params),
        )
    # into the caller's buffer: operands (x, counts, rank, group, out), out aliased to y
    order = (0, 1, 3, 4, 2)
    return _compat.ffi_lower(
        ctx,
        "variopath_all_to_all_v_into",
        [args[i] for i in order],
        [ctx.avals_in[i] for i in order],
        ctx.avals_out,
        {4: 0},
        **_attrs(ctx, "variopath_all_to_all_v_into", params),
    )


def _a2av_lin_lowering(ctx, x, counts, recv, rank, group, **params):
    x_aval, counts_aval, _, rank_aval, group_aval = ctx.avals_in
    return _compat.ffi_lower(
        ctx,
        "variopath_all_to_all_v",
        (x, counts, rank, group),
        (x_aval, counts_aval, rank_aval, group_aval),
        (ctx.avals_out[0], counts_aval),
        {},
        **_attrs(ctx, "variopath_all_to_all_v", params),
    )[:1]


def _linear_params(params: dict) -> dict:
    """The linear form's parameters: the exchange's but ``into`` (it writes fresh buffers)."""
    return {k: v for k, v in params.items() if k != "into"}


def _a2av_jvp(primals, tangents, **params):
    """``out``'s values are never read, so the result's tangent is the linear form of x's."""
    counts, (rank, group) = primals[1], primals[-2:]
    y, recv = _a2av_p.bind(*primals, **params)
    if type(tangents[0]) is _compat.Zero:
        dy = _compat.tangent_zero(y)
    else:
        dy = _a2av_lin_p.bind(tangents[0], counts, recv, rank, group, **_linear_params(params))
    return (y, recv), (dy, _compat.tangent_zero(recv))


def _a2av_lin_jvp(primals, tangents, **params):
    y = _a2av_lin_p.bind(*primals, **params)
    if type(tangents[0]) is _compat.Zero:
        return y, _compat.tangent_zero(y)
    return y, _a2av_lin_p.bind(tangents[0], *primals[1:], **params)


def _a2av_lin_transpose(ct, x, counts, recv, rank, group, **params):
    """The reverse exchange: every received row's cotangent goes back to the row it came from."""
    if type(ct) is _compat.Zero:
        return [_compat.Zero(x.aval), None, None, None, None]
    rows = x.aval.shape[0]
    dx = _a2av_lin_p.bind(ct, recv, counts, rank, group, **{**params, "cap": rows})
    return [dx, None, None, None, None]


def _a2av_transpose(cts, *args, **params):
    """The transpose without the forward's receive counts: exchange the counts first. ``out``
    (when ``into``) gets a zero cotangent: its values are never read."""
    x, counts, (rank, group) = args[0], args[1], args[-2:]
    n = params["axis_size"]
    lin = _linear_params(params)
    recv, _ = _a2av_p.bind(
        counts.reshape(n, 1),
        jnp.ones(n, jnp.int32),
        rank,
        group,
        **{**params, "cap": n, "into": False},
    )
    dx = _a2av_lin_transpose(cts[0], x, counts, recv[:, 0], rank, group, **lin)[0]
    if not params["into"]:
        return [dx, None, None, None]
    out = args[2]
    d_out = _compat.Zero(out.aval) if _compat.is_undefined_primal(out) else None
    return [dx, None, d_out, None, None]


def _a2av_batch(prim, args, dims, **params):
    """One exchange per batch element, in order (a sequential loop)."""
    _refuse_batched_axes("all_to_all_v", dims, params["axis_name"])
    size = _batch_size(args, dims)
    batched = [_moved(a, d, size, 0) for a, d in zip(args, dims, strict=True) if d is not None]

    def one(elements):
        it = iter(elements)
        return prim.bind(
            *(a if d is None else next(it) for a, d in zip(args, dims, strict=True)), **params
        )

    out = jax.lax.map(one, batched)
    return out, ((0, 0) if prim.multiple_results else 0)


_a2av_p = _compat.define_primitive(
    "variopath_all_to_all_v",
    multiple_results=True,
    abstract_eval=_a2av_abstract,
    lowering=_a2av_lowering,
    jvp=_a2av_jvp,
    transpose=_a2av_transpose,
    batch=_a2av_batch,
)
_a2av_lin_p = _compat.define_primitive(
    "variopath_all_to_all_v_linear",
    multiple_results=False,
    abstract_eval=_a2av_lin_abstract,
    lowering=_a2av_lin_lowering,
    jvp=_a2av_lin_jvp,
    transpose=_a2av_lin_transpose,
    batch=_a2av_batch,
)


# ----- ragged_all_to_all ----------------------------------------------------------------------
_RAGGED_ARRAYS = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")


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
    """Drop-in for ``jax.lax.ragged_all_to_all``: the same arguments, semantics, errors and
    differentiation (``output_offsets`` are sender-side; several slices per peer when the offset
    arrays are a multiple of the collective's size), planned by VarioPath, on CPU devices.
    ``axis_name`` may be a tuple of mesh axes (ranks: the linear index over them in mesh order).
    ``output`` is aliased to the result: donated to a jitted step (``donate_argnums``), the
    exchange writes into it in place, step after step (rows no slice writes keep its values)."""
    operand, output = jnp.asarray(operand), jnp.asarray(output)
    arrays = [jnp.asarray(a) for a in (input_offsets, send_sizes, output_offsets, recv_sizes)]
    for name, a in zip(_RAGGED_ARRAYS, arrays, strict=True):
        if not jnp.issubdtype(a.dtype, jnp.integer):
            raise ValueError(f"ragged_all_to_all {name} must be integer type.")
    for name, a in zip(_RAGGED_ARRAYS, arrays, strict=True):
        if a.ndim != 1 or a.shape[0] < 1:
            raise ValueError(
                f"ragged_all_to_all {name} must be rank 1 with positive dimension size, but got "
                f"shape {a.shape}"
            )
    if len({a.shape for a in arrays}) != 1:
        raise VarioPathError(
            "ragged_all_to_all: input_offsets, send_sizes, output_offsets and recv_sizes must "
            f"have the same length, got {[a.shape[0] for a in arrays]}"
        )
    if operand.ndim < 1 or operand.shape[1:] != output.shape[1:] or operand.dtype != output.dtype:
        raise VarioPathError(
            f"ragged_all_to_all: operand {operand.dtype}{operand.shape} and output "
            f"{output.dtype}{output.shape} must share dtype and trailing shape, with a leading "
            "row axis"
        )
    coll = _collective("ragged_all_to_all", axis_name, axis_index_groups)
    ints = [a.astype(jnp.int32) for a in arrays]
    if coll.size == 1:
        return _ragged_local(operand, output, *ints[:3])
    cfg = _config("ragged_all_to_all", coll, config)
    k = arrays[0].shape[0]
    if k % coll.size:
        raise VarioPathError(
            f"ragged_all_to_all: {k} slices is not a multiple of the collective's size {coll.size}"
        )
    vma = _out_varying([jax.typeof(v) for v in (operand, output, *ints, coll.rank, coll.group)])
    result, _, _ = _ragged_p.bind(
        _compat.ensure_varying(operand, vma),
        _compat.ensure_varying(output, vma),
        *ints,
        coll.rank,
        coll.group,
        axis_name=coll.names,
        axis_index_groups=coll.groups,
        axis_size=coll.size,
        config_id=cfg.id,
    )
    return result


def _ragged_local(operand, output, in_off, send, out_off):
    """A collective of one device (``axis_index_groups`` of one): every slice lands in its own
    output, with nothing to plan or exchange."""
    if operand.shape[0] == 0:
        return output
    rows = jnp.arange(output.shape[0], dtype=jnp.int32)
    shape = (output.shape[0],) + (1,) * (output.ndim - 1)

    def land(s, result):
        take = (rows >= out_off[s]) & (rows < out_off[s] + send[s])
        source = jnp.clip(in_off[s] + rows - out_off[s], 0, operand.shape[0] - 1)
        return jnp.where(take.reshape(shape), operand[source], result)

    return jax.lax.fori_loop(0, in_off.shape[0], land, output)


def _ragged_abstract(operand, output, in_off, send, out_off, recv, rank, group, **params):
    """The result, and per received slice: where it landed here and where it came from there."""
    vma = _out_varying([operand, output, in_off, send, out_off, recv, rank, group])
    offsets = _compat.with_varying(in_off.update(dtype=jnp.int32, weak_type=False), vma)
    return [_compat.with_varying(output.update(weak_type=False), vma), offsets, offsets]


def _ragged_lin_abstract(operand, output, *ints_rank_group, **params):
    vma = _out_varying([operand, output, *ints_rank_group])
    return _compat.with_varying(output.update(weak_type=False), vma)


def _ragged_lowering(ctx, *operands, **params):
    return _compat.ffi_lower(
        ctx,
        "variopath_ragged_all_to_all",
        operands,
        ctx.avals_in,
        ctx.avals_out,
        {1: 0},
        **_attrs(ctx, "variopath_ragged_all_to_all", params),
    )


def _ragged_lin_lowering(ctx, *operands, **params):
    keep = (0, 1, 2, 3, 4, 5, 8, 9)  # the landing and source offsets are the FFI call's outputs
    avals_in = [ctx.avals_in[i] for i in keep]
    offsets = ctx.avals_in[2]
    return _compat.ffi_lower(
        ctx,
        "variopath_ragged_all_to_all",
        [operands[i] for i in keep],
        avals_in,
        (ctx.avals_out[0], offsets, offsets),
        {1: 0},
        **_attrs(ctx, "variopath_ragged_all_to_all", params),
    )[:1]


def _ragged_tangent(tangents, ints, **params):
    """The linear form applied to the (operand, output) tangents; ``ints`` are its other inputs."""
    d_operand, d_output = tangents[:2]
    if type(d_operand) is _compat.Zero and type(d_output) is _compat.Zero:
        return None
    d_operand, d_output = _compat.instantiate_zeros(d_operand), _compat.instantiate_zeros(d_output)
    return _ragged_lin_p.bind(d_operand, d_output, *ints, **params)


def _ragged_jvp(primals, tangents, **params):
    result, recv_off, src_off = _ragged_p.bind(*primals, **params)
    in_off, send, out_off, recv, rank, group = primals[2:]
    ints = (in_off, send, out_off, recv, recv_off, src_off, rank, group)
    d_result = _ragged_tangent(tangents, ints, **params)
    if d_result is None:
        d_result = _compat.tangent_zero(result)
    zero = _compat.tangent_zero(recv_off)
    return (result, recv_off, src_off), (d_result, zero, zero)


def _ragged_lin_jvp(primals, tangents, **params):
    result = _ragged_lin_p.bind(*primals, **params)
    d_result = _ragged_tangent(tangents, primals[2:], **params)
    return result, (_compat.tangent_zero(result) if d_result is None else d_result)


def _ragged_lin_transpose(
    ct, operand, output, in_off, send, out_off, recv, recv_off, src_off, rank, group, **params
):
    """The reverse exchange gives the operand's cotangent; the output's is ``ct`` wherever no
    received slice overwrote the output."""
    undefined = _compat.is_undefined_primal
    if type(ct) is _compat.Zero:
        cts = [_compat.Zero(v.aval) if undefined(v) else None for v in (operand, output)]
        return cts + [None] * 8
    d_operand = d_output = None
    if undefined(operand):
        d_operand = _ragged_lin_p.bind(
            ct,
            _compat.zeros_like_aval(operand.aval),
            recv_off,
            recv,
            src_off,
            send,
            in_off,
            out_off,
            rank,
            group,
            **params,
        )
    if undefined(output):
        rows = ct.shape[0]
        edges = jnp.zeros(rows + 1, jnp.int32).at[recv_off].add(1, mode="drop")
        edges = edges.at[recv_off + recv].add(-1, mode="drop")
        covered = jnp.cumsum(edges)[:rows] > 0
        d_output = jnp.where(
            covered.reshape((rows,) + (1,) * (ct.ndim - 1)), jnp.zeros_like(ct), ct
        )
    return [d_operand, d_output] + [None] * 8


def _ragged_transpose(cts, operand, output, in_off, send, out_off, recv, rank, group, **params):
    """The transpose without the forward's landing and source offsets: exchange them first (each
    slice's (output_offset, input_offset) pair travels as one row to its receiver)."""
    k = in_off.shape[0]
    per = k // params["axis_size"]
    slot = jnp.arange(k, dtype=jnp.int32)
    pairs, _, _ = _ragged_p.bind(
        jnp.stack([out_off, in_off], axis=1),
        jnp.zeros((k, 2), jnp.int32),
        slot,
        jnp.ones(k, jnp.int32),
        rank * per + slot % per,
        jnp.ones(k, jnp.int32),
        rank,
        group,
        **params,
    )
    ints = (in_off, send, out_off, recv, pairs[:, 0], pairs[:, 1], rank, group)
    d_operand, d_output = _ragged_lin_transpose(cts[0], operand, output, *ints, **params)[:2]
    return [d_operand, d_output] + [None] * 6


def _ragged_batch(prim, args, dims, **params):
    """The batch as one exchange: batch element b's slices follow each slice of element b - 1 to
    the same peer, reading rows b·N.. of the merged operand and writing rows b·M.. of the output."""
    _refuse_batched_axes("ragged_all_to_all", dims, params["axis_name"])
    if params["axis_index_groups"] is not None:  # vmap with axis_index_groups: JAX's own message
        raise NotImplementedError("Please open a feature request!")
    size = _batch_size(args, dims)
    operand, output = (_moved(a, d, size, 0) for a, d in zip(args[:2], dims[:2], strict=True))
    n, m = operand.shape[1], output.shape[1]
    # the integer inputs: offsets into the operand (shifted by b·N), sizes (not shifted), offsets
    # into the output (b·M); the linear form's landing (b·M) and source (b·N) offsets
    shifts = (n, 0, m, 0, m, n)[: len(args) - 4]
    batch = jnp.arange(size, dtype=jnp.int32)[None, :]
    ints = [
        _moved(a, d, size, 1) + batch * s
        for a, d, s in zip(args[2:-2], dims[2:-2], shifts, strict=True)
    ]
    merged = prim.bind(
        operand.reshape(size * n, *operand.shape[2:]),
        output.reshape(size * m, *output.shape[2:]),
        *(a.reshape(-1) for a in ints),
        *args[-2:],
        **params,
    )
    if not prim.multiple_results:
        return merged.reshape(size, m, *merged.shape[1:]), 0
    result, recv_off, src_off = merged
    return [
        result.reshape(size, m, *result.shape[1:]),
        recv_off.reshape(-1, size) - batch * m,
        src_off.reshape(-1, size) - batch * n,
    ], [0, 1, 1]


_ragged_p = _compat.define_primitive(
    "variopath_ragged_all_to_all",
    multiple_results=True,
    abstract_eval=_ragged_abstract,
    lowering=_ragged_lowering,
    jvp=_ragged_jvp,
    transpose=_ragged_transpose,
    batch=_ragged_batch,
)
_ragged_lin_p = _compat.define_primitive(
    "variopath_ragged_all_to_all_linear",
    multiple_results=False,
    abstract_eval=_ragged_lin_abstract,
    lowering=_ragged_lin_lowering,
    jvp=_ragged_lin_jvp,
    transpose=_ragged_lin_transpose,
    batch=_ragged_batch,
)


def last_schedule(site: int | None = None) -> dict | None:
    """With ``configure(debug=True)``: the demand (bytes, topology ranks) and the transfers executed
    by the most recent call of ``site`` (default: the call site lowered last)."""
    from variopath_jax._native import debug_schedule

    return debug_schedule(last_site if site is None else site)
