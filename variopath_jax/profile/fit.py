"""Fit (the second of measure / fit / report): from the raw times of
:func:`~variopath_jax.profile.measure.measure` to the parameters of the network model (per link
class β, floor and paced_lossless; o, L, σ, λ) and the measured rate per path class. A pure
function of the raw document, so ``variopath profile --refit FILE`` reproduces it.

- η(k) = delivered(k flows, unpaced) ÷ delivered(1 flow). β is the least-squares slope of
  1/η - 1 over k - 1 (through the origin) on the points above the floor; the floor is the mean η
  of a plateau at the largest flow counts when the data has one (every split is tried; the
  smallest squared relative error wins), else η at the largest k measured, so the model never
  extrapolates a loss beyond what was measured (the convention of ``sim/network.py``). A class
  that loses no more than the tolerance at any k gets β = 0 and floor 0.
- paced_lossless: do paced flows whose caps add up to at most 0.9 of capacity deliver their
  caps (within the tolerance) at every k? Loads of 1.0 and above are reported but not used to
  decide, as a cap at the exact capacity of a link tips into oversubscription with any noise.
  When the fitted η never drops below those loads the question cannot be answered; the fit then
  takes the conservative side (false) and says so.
- The model's error is reported over every point (``max_error``) but the points paced at
  exactly the capacity (``edge_error``): noise tips a cap equal to the capacity either way, and
  a pair of sizes tipped apart gives no rate at all (``edge_unusable`` counts those).
- The posted-write trigger's factor (:mod:`~variopath_jax.profile.trigger`): per situation the
  aggregate of two pushed flows toward two root complexes over two toward one; the median over
  the situations, clipped to (0, 1] (1: no collapse); the same ratio of pulls is the control.
- o is the spacing of posts queued at one endpoint; L the time of one tiny transfer beyond o and
  its data; σ and λ the per-link spacing of a signal chain and a barrier chain beyond o, L and
  data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from variopath_jax.profile.backend import ProfileError
from variopath_jax.profile.measure import delivered_bps
from variopath_jax.profile.trigger import EXPERIMENTS

TOLERANCE = 0.02  # relative: a loss smaller than this is not a loss
DECIDING_LOAD = 0.9  # the largest load paced_lossless is decided on


def eta_curve(beta: float, floor: float, k: np.ndarray) -> np.ndarray:
    """η(k) = max(floor, 1 / (1 + β (k - 1)))."""
    return np.maximum(floor, 1.0 / (1.0 + beta * (np.asarray(k, dtype=np.float64) - 1.0)))


def fit_eta(ks: np.ndarray, etas: np.ndarray, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """β and floor of η(k) from measured (k, η) points (k >= 1); ``plateau_from`` is the
    smallest k of the floor's plateau (None: the floor is η at the largest k)."""
    ks, etas = np.asarray(ks, dtype=np.float64), np.asarray(etas, dtype=np.float64)
    if not (etas > 0).all():
        raise ProfileError(f"η must be positive at every flow count, got {etas.tolist()}")
    if (np.abs(etas[ks >= 2] - 1.0) <= tolerance).all():
        return {"beta": 0.0, "floor": 0.0, "plateau_from": None}
    best: tuple[float, dict[str, Any]] | None = None
    for start in [None, *np.unique(ks[ks >= 2]).tolist()]:
        curve = (ks >= 2) & (ks < start) if start is not None else ks >= 2
        x, y = ks[curve] - 1.0, 1.0 / etas[curve] - 1.0
        if start is not None:
            floor = float(min(1.0, np.mean(etas[ks >= start])))
            beta = (
                float(max(0.0, x @ y / (x @ x))) if curve.any() else (1 / floor - 1) / (start - 1)
            )
        else:
            beta = float(max(0.0, x @ y / (x @ x)))
            floor = float(eta_curve(beta, 0.0, ks.max()))
        err = float(np.sum((eta_curve(beta, floor, ks) / etas - 1.0) ** 2))
        if best is None or err < best[0] * (1 - 1e-9):
            plateau = None if start is None else int(start)
            best = (err, {"beta": beta, "floor": floor, "plateau_from": plateau})
    assert best is not None
    return best[1]


def predicted_bps(params: dict[str, Any], k: int, load: float | None) -> float:
    """What the network model's rule says k flows of a class deliver: unpaced (``load`` None) or
    paced with caps adding up to ``load`` of capacity."""
    c = params["capacity_gbs"] * 1e9
    lossy = c * float(eta_curve(params["beta"], params["floor"], k))
    if load is None:
        return lossy
    lose = load > 1 + 1e-9 or (not params["paced_lossless"] and k >= 2)
    return min(load * c, lossy if lose else c)


def fit_class(name: str, entry: dict[str, Any], tolerance: float = TOLERANCE) -> dict[str, Any]:
    """β, floor, paced_lossless and the model's worst relative error over every point."""
    capacity = delivered_bps(entry["capacity_point"], 1)
    points = entry["points"]
    edge = [p["load"] is not None and abs(p["load"] - 1) <= tolerance for p in points]
    measured = []
    for p, at_edge in zip(points, edge, strict=True):
        try:
            measured.append(delivered_bps(p, p["k"]))
        except ProfileError as err:
            if not at_edge:
                raise ProfileError(f"link class {name}, k = {p['k']}: {err}") from None
            measured.append(float("nan"))  # noise tipped one size of the pair over the edge
    unpaced = [
        (p["k"], d / capacity) for p, d in zip(points, measured, strict=True) if p["load"] is None
    ]
    if not unpaced:
        raise ProfileError(f"link class {name}: no unpaced points to fit η(k) on")
    ks, etas = np.array(unpaced).T
    eta = fit_eta(ks, etas, tolerance)
    deciding = [
        (p["k"], p["load"], d / (p["load"] * capacity))
        for p, d in zip(points, measured, strict=True)
        if p["load"] is not None and p["load"] <= DECIDING_LOAD + 1e-9 and p["k"] >= 2
    ]
    worst = min((r for _, _, r in deciding), default=1.0)
    visible = any(
        eta_curve(eta["beta"], eta["floor"], k) < load * (1 - tolerance) for k, load, _ in deciding
    )
    if eta["beta"] == 0.0:
        lossless, why = True, "no loss measured at any flow count, paced or not"
    elif worst < 1 - tolerance:
        lossless, why = (
            False,
            (f"paced flows whose caps fit delivered as little as {worst:.3f} of their caps"),
        )
    elif visible:
        lossless, why = (
            True,
            (
                f"paced flows whose caps fit delivered their caps (worst {worst:.3f}) where "
                "unpaced flows lost"
            ),
        )
    else:
        lossless, why = (
            False,
            (
                f"not identifiable: η(k) never fell below the loads ≤ {DECIDING_LOAD} measured; "
                "the conservative side"
            ),
        )
    params = {"capacity_gbs": capacity / 1e9, **eta, "paced_lossless": lossless}
    errors = [
        (at_edge, d / predicted_bps(params, p["k"], p["load"]) - 1.0)
        for p, d, at_edge in zip(points, measured, edge, strict=True)
        if np.isfinite(d)
    ]
    return {
        **params,
        "paced_reason": why,
        "paced_worst": worst,
        "eta": {int(k): float(e) for k, e in zip(ks, etas, strict=True)},
        "max_error": float(max(abs(e) for at_edge, e in errors if not at_edge)),
        "edge_error": float(max((abs(e) for at_edge, e in errors if at_edge), default=0.0)),
        "edge_unusable": int(np.sum(~np.isfinite(measured))),
    }


def _slope(ends: list[float]) -> float:
    return float(np.polyfit(np.arange(len(ends)), np.asarray(ends), 1)[0])


def fit_costs(costs: dict[str, Any]) -> dict[str, Any]:
    """o, L (PCIe and, where measured, network), σ and λ from the per-message probes."""
    pcie = costs["pcie"]

    def data_s(probe: dict[str, Any]) -> float:
        return probe["probe_bytes"] / delivered_bps(probe["rate"], 1)

    def median(runs: list[list[float]], f: Any) -> float:
        return float(np.median([f(r) for r in runs]))

    o = median(pcie["issue_ends_s"], lambda r: _slope(r[1:]))
    base = o + data_s(pcie)
    latency = median(pcie["single_end_s"], lambda r: r[0]) - base
    out = {
        "issue_s": o,
        "latency_pcie_s": latency,
        "signal_s": median(pcie["chain_ends_s"], _slope) - base - latency,
        "barrier_s": median(pcie["barrier_ends_s"], _slope) - base - latency,
    }
    if "net" in costs:
        net = costs["net"]
        out["latency_net_s"] = median(net["single_end_s"], lambda r: r[0]) - o - data_s(net)
    negative = {k: v for k, v in out.items() if v < -1e-9}
    if negative:
        raise ProfileError(
            f"per-message costs came out negative {negative}: the probes are too coarse for "
            "this machine's clock (raise --probe-bytes or --posts)"
        )
    return {k: max(0.0, v) for k, v in out.items()}


def fit_trigger(entry: dict[str, Any] | None, tolerance: float) -> dict[str, Any]:
    """The trigger factor from the raw probe (``raw["trigger"]``): per situation the aggregate
    GB/s of each experiment and the push and pull ratios (two roots over one root); the factor
    is the median push ratio, clipped to (0, 1]; None where nothing was measured."""
    if entry is None:
        return {
            "factor": None,
            "collapse": None,
            "pull_ratio": None,
            "note": "the raw measurements predate the trigger probe",
            "situations": [],
        }
    rows = []
    for s in entry["situations"]:
        try:
            gbs = {e: delivered_bps(s["points"][e], 2) / 1e9 for e in EXPERIMENTS}
        except ProfileError as err:
            raise ProfileError(f"trigger probe at uplink {s['uplink']}: {err}") from None
        rows.append(
            {
                "uplink": s["uplink"],
                "roots": list(s["roots"]),
                "kind": s["kind"],
                "gbs": gbs,
                "push_ratio": gbs["push_two_roots"] / gbs["push_one_root"],
                "pull_ratio": gbs["pull_two_roots"] / gbs["pull_one_root"],
            }
        )
    if not rows:
        note = entry.get("note") or "no situation measured"
        return {
            "factor": None,
            "collapse": None,
            "pull_ratio": None,
            "note": note,
            "situations": [],
        }
    push = np.array([r["push_ratio"] for r in rows])
    pull = float(np.median([r["pull_ratio"] for r in rows]))
    factor = float(min(1.0, np.median(push)))
    collapse = factor < 1 - tolerance
    span = f"{push.min():.3f}..{push.max():.3f} over {len(rows)} situation(s)"
    if collapse:
        note = (
            f"pushed writes toward two root complexes kept {factor:.3f} of the one-root rate "
            f"(median; {span}): the posted-write trigger"
        )
    else:
        note = f"no collapse: two roots kept {factor:.3f} of the one-root rate ({span})"
    if pull < 1 - tolerance:
        note += f"; reads lost too (pull ratio {pull:.3f}): more than the posted-write trigger"
    return {
        "factor": factor,
        "collapse": collapse,
        "pull_ratio": pull,
        "note": note,
        "situations": rows,
    }


def fit(raw: dict[str, Any], tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Every fitted parameter from a raw document (:func:`measure`)."""
    for key in ("plan", "machine", "paths", "classes", "costs"):
        if key not in raw:
            raise ProfileError(f"raw measurements lack {key!r}: not written by variopath profile")
    if not 0 < tolerance < 0.5:
        raise ProfileError(f"tolerance {tolerance}: need a relative loss in (0, 0.5)")
    try:
        rates = {c: delivered_bps(p, 1) / 1e9 for c, p in raw["paths"].items()}
        return {
            "tolerance": tolerance,
            "rate_gbs": rates,
            # staged through host memory against each direct path class (> 1: staging wins)
            "staged_over_direct": {
                c: rates["SHM"] / gbs for c, gbs in rates.items() if c not in ("SHM", "NET")
            }
            if "SHM" in rates
            else {},
            "classes": {c: fit_class(c, e, tolerance) for c, e in raw["classes"].items()},
            "costs": fit_costs(raw["costs"]),
            "trigger": fit_trigger(raw.get("trigger"), tolerance),
        }
    except (KeyError, TypeError, ValueError, IndexError) as err:
        if isinstance(err, ProfileError):
            raise
        raise ProfileError(f"raw measurements are malformed: {type(err).__name__} {err}") from None
