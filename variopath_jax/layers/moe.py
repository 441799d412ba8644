"""An expert-parallel MoE block on ``moe_dispatch`` / ``jax.lax.ragged_dot`` / ``moe_combine``.

``moe_block`` runs inside ``shard_map``: each device holds its tokens (any leading batch axes)
and the experts of its position on the expert axis (a mesh axis name, or a tuple of them: the
ranks are their linear index in mesh order). The router scores every expert, each token picks
its ``top_k`` experts (gates: the softmax of the picked logits, as Mixtral and Qwen3-MoE do),
``moe_dispatch`` sorts the (token, expert) slots by expert and sends them, a grouped two-matrix
FFN (``ragged_dot``) runs over the rows received, grouped by local expert, and ``moe_combine``
returns them to their tokens weighted by their gates, by the dispatch's routing handle. Optional
shared experts (one dense FFN every token goes through, as DeepSeekMoE's) are added.

The receive buffer is bounded by default: ``capacity_factor`` (default 1.25) times the rows a
device receives when the router spreads the slots evenly (tokens × top_k). A device keeps the
first rows that arrive (sources in rank order, ``moe_dispatch``'s rule) and a dropped slot
contributes nothing (GShard's token dropping: Lepikhin et al., 2020, arXiv:2006.16668); the count
is returned. Why 1.25: it is Switch Transformer's training factor (Fedus et al., 2021,
arXiv:2101.03961: 1.0-1.25 in training, 2.0 for evaluation) and MaxText's usual setting; here the
bound is per device, over all its local experts together, which evens out more than a per-expert
bound (GShard's 2.0 was per expert), so the same factor drops fewer slots. ``dropless=True``
sizes the buffer for the worst case instead (every slot of every device on one device).

The expert FFN runs over the received rows only: the buffer is cut into chunks of
``chunk_rows`` rows and a chunk past the received rows is skipped (``lax.cond`` inside
``lax.map``, forward and backward), so a dropless buffer costs memory, not FLOPs. (On CPU devices
the default is one ``ragged_dot`` over the whole buffer: ``moe_block``'s ``chunk_rows``.)

The router's losses are returned, over the tokens of the expert axis: the load-balancing loss
of Switch Transformer / GShard, ``E · Σ_e f_e · P_e`` (f_e: the fraction of slots routed to
expert e, P_e: the mean router probability of e; 1 when balanced), and ST-MoE's router z-loss
(Zoph et al., 2022, arXiv:2202.08906), the mean of ``logsumexp(logits)²``. Scale them yourself
(Switch: 1e-2 × the balancing loss; ST-MoE: 1e-3 × the z-loss).

``moe_reference`` is the dense single-device reference: every token through every expert,
keeping its top-k outputs; ``router_losses`` the losses of a set of tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from variopath_jax.errors import VarioPathError
from variopath_jax.jax_ops import _compat
from variopath_jax.jax_ops.config import OpConfig
from variopath_jax.jax_ops.moe import moe_combine, moe_dispatch


@partial(
    jax.tree_util.register_dataclass,
    data_fields=["router", "w1", "w2", "shared_w1", "shared_w2"],
    meta_fields=[],
)
@dataclass(frozen=True)
class MoEParams:
    """The block's weights: ``router`` (D, E) replicated; ``w1`` (E, D, F) and ``w2`` (E, F, D)
    the experts (inside ``shard_map``: this device's E_local of them); optionally the shared
    experts' FFN, ``shared_w1`` (D, Fs) and ``shared_w2`` (Fs, D), replicated (None: none)."""

    router: jax.Array
    w1: jax.Array
    w2: jax.Array
    shared_w1: jax.Array | None = None
    shared_w2: jax.Array | None = None


@partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "send_counts",
        "dropped",
        "kept",
        "dropped_slots",
        "aux_loss",
        "z_loss",
        "router_probs",
    ],
    meta_fields=["capacity"],
)
@dataclass(frozen=True)
class MoEStats:
    """What one device's block exchanged and the router's losses.

    send_counts : int32 (N, E_local) slots routed to each (device, local expert).
    dropped : int32 (N,) slots from each source device dropped here (past the capacity).
    kept : bool (*batch, top_k) whether each of this device's slots reached its expert.
    dropped_slots : int32 () this device's (token, expert) slots dropped.
    aux_loss : f32 () the load-balancing loss over the expert axis's tokens (equal on its devices).
    z_loss : f32 () the router z-loss over the expert axis's tokens.
    router_probs : f32 (*batch, E) the router's softmax over all experts, per token.
    capacity : rows of this device's receive buffer (static).
    """

    send_counts: jax.Array
    dropped: jax.Array
    kept: jax.Array
    dropped_slots: jax.Array | None = None
    aux_loss: jax.Array | None = None
    z_loss: jax.Array | None = None
    router_probs: jax.Array | None = None
    capacity: int = 0


def init_moe(
    seed: int,
    d_model: int,
    d_ff: int,
    experts: int,
    dtype: jnp.dtype = jnp.float32,
    *,
    shared_ff: int = 0,
) -> MoEParams:
    """Seeded weights for all ``experts`` (shard ``w1``/``w2`` over the expert axis), with shared
    experts of width ``shared_ff`` if it is positive."""
    rng = np.random.default_rng(seed)
    router = rng.standard_normal((d_model, experts)) / np.sqrt(d_model)
    w1 = rng.standard_normal((experts, d_model, d_ff)) / np.sqrt(d_model)
    w2 = rng.standard_normal((experts, d_ff, d_model)) / np.sqrt(d_ff)
    shared = (None, None)
    if shared_ff > 0:
        s1 = rng.standard_normal((d_model, shared_ff)) / np.sqrt(d_model)
        s2 = rng.standard_normal((shared_ff, d_model)) / np.sqrt(shared_ff)
        shared = (jnp.asarray(s1, dtype), jnp.asarray(s2, dtype))
    return MoEParams(*(jnp.asarray(a, dtype) for a in (router, w1, w2)), *shared)


def route(x: jax.Array, router: jax.Array, top_k: int) -> tuple[jax.Array, jax.Array]:
    """Each token's ``top_k`` experts (int32 (T, k)) and their gates (softmax of their logits)."""
    experts = router.shape[-1]
    if (
        isinstance(top_k, bool)
        or not isinstance(top_k, int | np.integer)
        or not (1 <= top_k <= experts)
    ):
        raise VarioPathError(
            f"top_k must be a whole number of experts per token in [1, {experts}] (the router "
            f"scores {experts}), got {top_k!r}"
        )
    logits, ids = jax.lax.top_k(x @ router, top_k)
    return ids.astype(jnp.int32), jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(
        x.dtype
    )


def _ffn(rows, w1, w2, sizes):
    return jax.lax.ragged_dot(jax.nn.gelu(jax.lax.ragged_dot(rows, w1, sizes)), w2, sizes)


def default_chunk_rows(tokens: int, top_k: int) -> int:
    """The expert FFN's chunk: half the rows a device receives when the router spreads the slots
    evenly, rounded up to 8 (at most half a chunk of work past the received rows is done, and a
    dropless buffer of N devices is 2N chunks, most skipped)."""
    return max(8, -(-max(1, tokens * top_k // 2) // 8) * 8)


def expert_ffn(
    rows: jax.Array, w1: jax.Array, w2: jax.Array, sizes: jax.Array, chunk_rows: int | None = None
) -> jax.Array:
    """The grouped FFN ``gelu(rows @ w1[e]) @ w2[e]`` over rows grouped by local expert
    (``sizes`` rows each, ``ragged_dot``), computed only for the chunks of ``chunk_rows`` rows
    that hold received rows (rows past ``sizes.sum()`` give zeros). ``chunk_rows=None``: one
    ``ragged_dot`` over the whole buffer."""
    cap = rows.shape[0]
    if chunk_rows is None or chunk_rows >= cap:
        return _ffn(rows, w1, w2, sizes)
    chunk = int(chunk_rows)
    if chunk < 1:
        raise VarioPathError(f"chunk_rows must be >= 1, got {chunk_rows!r}")
    nc = -(-cap // chunk)
    buf = jnp.pad(rows, [(0, nc * chunk - cap)] + [(0, 0)] * (rows.ndim - 1))
    buf = buf.reshape(nc, chunk, *rows.shape[1:])
    ends = jnp.cumsum(sizes)
    starts = ends - sizes
    lo = jnp.arange(nc, dtype=ends.dtype)[:, None] * chunk
    per = jnp.clip(ends[None], lo, lo + chunk) - jnp.clip(starts[None], lo, lo + chunk)
    used = ends[-1]
    out_dtype = jnp.result_type(rows.dtype, w1.dtype, w2.dtype)
    vma = _compat.varying_axes(rows) | _compat.varying_axes(w1) | _compat.varying_axes(w2)

    def one(args):
        block, gs, first = args

        def run():
            return _ffn(block, w1, w2, gs).astype(out_dtype)

        def skip():
            zero = jnp.zeros((chunk, w2.shape[-1]), out_dtype)
            return _compat.ensure_varying(zero, vma)

        return jax.lax.cond(first < used, run, skip)

    out = jax.lax.map(one, (buf, per.astype(sizes.dtype), lo[:, 0]))
    return out.reshape(nc * chunk, -1)[:cap]


def _router(x: jax.Array, router: jax.Array, top_k: int):
    """(ids, gates, logits f32) of tokens ``x`` (T, D)."""
    ids, gates = route(x, router, top_k)
    return ids, gates, (x @ router).astype(jnp.float32)


def _loss_terms(logits: jax.Array, ids: jax.Array, experts: int):
    """Per expert: slots routed to it and the sum of its router probabilities; the sum of
    logsumexp²; over the tokens given."""
    probs = jax.nn.softmax(logits, axis=-1)
    routed = jnp.zeros(experts, jnp.float32).at[ids.reshape(-1)].add(1.0)
    z = jax.nn.logsumexp(logits, axis=-1)
    return routed, probs.sum(axis=0), (z * z).sum(), probs


def _losses(routed, prob_sum, z_sum, tokens, top_k: int, experts: int):
    f = routed / (tokens * top_k)
    p = prob_sum / tokens
    return experts * (f * p).sum(), z_sum / tokens


def router_losses(x: jax.Array, router: jax.Array, *, top_k: int) -> tuple[jax.Array, jax.Array]:
    """The load-balancing loss and the router z-loss of tokens ``x`` (*batch, D) (module
    docstring), as ``moe_block`` computes them over the expert axis's tokens."""
    xt = x.reshape(-1, x.shape[-1])
    experts = router.shape[-1]
    ids, _, logits = _router(xt, router, top_k)
    routed, prob_sum, z_sum, _ = _loss_terms(logits, ids, experts)
    return _losses(routed, prob_sum, z_sum, xt.shape[0], top_k, experts)


def _shared(x: jax.Array, params: MoEParams) -> jax.Array | None:
    if params.shared_w1 is None and params.shared_w2 is None:
        return None
    if params.shared_w1 is None or params.shared_w2 is None:
        raise VarioPathError("moe_block: shared experts need both shared_w1 and shared_w2")
    return jax.nn.gelu(x @ params.shared_w1) @ params.shared_w2


def moe_block(
    x: jax.Array,
    params: MoEParams,
    *,
    axis_name,
    top_k: int,
    capacity_factor: float | None = None,
    capacity: int | None = None,
    dropless: bool = False,
    chunk_rows: int | None = None,
    config: OpConfig | None = None,
) -> tuple[jax.Array, MoEStats]:
    """One device's MoE block inside ``shard_map``: ``x`` (*batch, D) its tokens (any leading
    batch axes, T tokens in all), ``params`` with its local experts (``w1`` (E_local, D, F));
    returns (*batch, D) and ``MoEStats`` (drops, the router's losses and probabilities).

    axis_name : the expert axis (or axes), N devices; the router scores N × E_local experts.
    capacity_factor : the receive buffer, ``ceil(capacity_factor × T × top_k)`` rows (default
        1.25; module docstring); the slots past it are dropped and counted.
    capacity : the receive buffer in rows instead.
    dropless : size the buffer for the worst case, every slot of every device on one device:
        N × T × top_k rows of D per device, N / capacity_factor times the default's memory
        (64-way, 4096 tokens, top-8, D 7168 in bf16: 64·4096·8 rows × 14 KiB = 30 GB per device),
        for the buffer, the rows received, their gradient and the combine's copy of them. The
        expert FFN's FLOPs stay those of the rows received, rounded up to a chunk, where it
        runs in chunks (``chunk_rows``; on CPU devices it runs over the whole buffer).
    chunk_rows : the expert FFN's chunk (``expert_ffn``); 0: one ``ragged_dot`` over the whole
        buffer. Default: ``default_chunk_rows`` on GPUs, the whole buffer on CPU devices (XLA:CPU
        runs a program with conditionals on its small intra-op thread pool, and with more
        devices than cores a collective waiting there starved the devices it waited for: seen
        with 8 devices on 2 cores, forward and backward on a (2, 4) mesh).
    config : the op's configuration (its ranks must equal the expert axis size).
    """
    if x.ndim < 2:
        raise VarioPathError(
            f"moe_block: x must be (*batch, d_model) tokens, got shape {tuple(x.shape)}"
        )
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    n = int(np.prod([jax.lax.axis_size(a) for a in names]))
    local = params.w1.shape[0]
    experts = params.router.shape[1]
    if experts != n * local:
        raise VarioPathError(
            f"moe_block: the router scores {experts} experts but the expert axis has {n} devices "
            f"of {local} local experts each"
        )
    batch_shape = x.shape[:-1]
    xt = x.reshape(-1, x.shape[-1])
    tokens = xt.shape[0]
    ids, gates, logits = _router(xt, params.router, top_k)
    rows, sizes, handle = moe_dispatch(
        xt,
        ids,
        gates,
        axis_name=axis_name,
        num_experts=experts,
        capacity=capacity,
        capacity_factor=capacity_factor,
        dropless=dropless,
        config=config,
    )
    chunk = chunk_rows
    if chunk is None and jax.default_backend() != "cpu":
        chunk = default_chunk_rows(tokens, top_k)
    elif chunk == 0:
        chunk = None
    y = moe_combine(expert_ffn(rows, params.w1, params.w2, sizes, chunk), handle)
    shared = _shared(xt, params)
    if shared is not None:
        y = y + shared.astype(y.dtype)
    routed, prob_sum, z_sum, probs = _loss_terms(logits, ids, experts)
    routed, prob_sum, z_sum, total = jax.lax.psum(
        (routed, prob_sum, z_sum, jnp.float32(tokens)), axis_name
    )
    aux, z = _losses(routed, prob_sum, z_sum, total, top_k, experts)
    counts = jnp.bincount(ids.reshape(-1), length=experts).reshape(n, local).astype(jnp.int32)
    stats = MoEStats(
        send_counts=counts,
        dropped=handle.dropped_here,
        kept=handle.kept.reshape(*batch_shape, top_k),
        dropped_slots=handle.dropped,
        aux_loss=aux,
        z_loss=z,
        router_probs=probs.reshape(*batch_shape, experts),
        capacity=handle.capacity,
    )
    return y.reshape(*batch_shape, -1), stats


def moe_reference(
    x: jax.Array, params: MoEParams, *, top_k: int, kept: jax.Array | None = None
) -> jax.Array:
    """The dense reference on one device: ``x`` (*batch, D) through all experts, each token
    keeping its top-k outputs weighted by their gates (``kept`` (*batch, top_k): drop the slots
    it marks False), plus the shared experts."""
    batch_shape = x.shape[:-1]
    xt = x.reshape(-1, x.shape[-1])
    ids, gates = route(xt, params.router, top_k)
    h = jax.nn.gelu(jnp.einsum("md,edf->mef", xt, params.w1))
    y = jnp.einsum("mef,efd->med", h, params.w2)
    picked = jnp.take_along_axis(y, ids[..., None], axis=1)
    if kept is not None:
        gates = jnp.where(kept.reshape(ids.shape), gates, 0)
    out = (picked * gates[..., None]).sum(axis=1)
    shared = _shared(xt, params)
    if shared is not None:
        out = out + shared
    return out.reshape(*batch_shape, -1)
