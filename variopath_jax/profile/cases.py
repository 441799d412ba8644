"""The injected parameter sets the profiler is checked against on the emulated machine (CI:
tests/test_profile.py; the figures: ``python benchmarks/profile_accuracy.py``), and the
comparison of a fit with what was injected."""

from __future__ import annotations

from typing import Any

from variopath_jax.profile.backend import Injected
from variopath_jax.sim.network import LINK_CLASSES

COST_KEYS = ("issue_s", "latency_pcie_s", "latency_net_s", "signal_s", "barrier_s")


def curve16(beta: float) -> float:
    """η at 16 flows without a floor: the floor a fit reports when no plateau is reached within
    k <= 16 (sim/network.py's convention: never extrapolate a loss), so injected floors are at
    least this to be recoverable."""
    return 1.0 / (1.0 + 15.0 * beta)


def contention(**classes: tuple[float, float, bool]) -> dict[str, dict[str, Any]]:
    """Per class (β, floor, paced_lossless); classes not named lose nothing."""
    out = {c: {"beta": 0.0, "floor": 0.0, "paced_lossless": True} for c in LINK_CLASSES}
    for c, (beta, floor, lossless) in classes.items():
        out[c] = {"beta": beta, "floor": floor, "paced_lossless": lossless}
    return out


_MIXED = Injected(  # mixed rules with plateaus, other costs and slower links
    contention=contention(
        root_p2p=(1.0, 0.25, False),
        root_dma=(0.2, 0.45, True),
        nic_out=(0.3, 0.4, False),
        nic_in=(0.1, curve16(0.1), True),
    ),
    issue_s=0.5e-6,
    latency_pcie_s=2e-6,
    latency_net_s=8e-6,
    signal_s=0.7e-6,
    barrier_s=30e-6,
    root_gbs=16.0,
    host_gbs=12.0,
    nic_gbs=25.0,
)

# The `pcie` model's calibrated root losses (paced lossy); all classes paced-lossless with β > 0
# (the switch too); the mixed set, also under 1% jitter; a steep root loss under 0.2% jitter.
# Cases with jitter repeat every experiment REPEATS_WITH_JITTER times (the median is used).
REPEATS_WITH_JITTER = 5
CASES = {
    "pcie-like": Injected(
        contention=contention(
            root_p2p=(7.5, 2 / 32, False),
            root_dma=(0.389, 18 / 32, False),
            nic_in=(0.2, 0.5, False),
            nic_out=(0.05, curve16(0.05), True),
        )
    ),
    "paced-lossless": Injected(
        contention=contention(
            root_p2p=(0.3, 0.3, True),
            root_dma=(0.1, curve16(0.1), True),
            switch=(0.02, curve16(0.02), True),
            nic_in=(0.5, 0.2, True),
        ),
        issue_s=2e-6,
        latency_pcie_s=0.5e-6,
        latency_net_s=4e-6,
        signal_s=3e-6,
        barrier_s=10e-6,
    ),
    "mixed": _MIXED,
    "mixed-jitter-1%": _MIXED.replace(jitter=0.01, seed=3),
    "jitter": Injected(
        contention=contention(root_p2p=(2.0, 0.1, False), nic_in=(0.15, 0.5, True)),
        jitter=0.002,
        seed=11,
    ),
}


def compare(injected: Injected, fitted: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per injected parameter: its name, the injected and fitted values and the relative
    error (for paced_lossless: 0 when equal, else 1; classes without loss have no rule to
    recover, so theirs is not compared)."""
    rows = []

    def row(name: str, want: float, got: float) -> None:
        err = abs(got - want) / abs(want) if want else abs(got)
        rows.append({"parameter": name, "injected": want, "fitted": got, "error": err})

    for cls, want in injected.contention.items():
        got = fitted["classes"][cls]
        row(f"{cls}.beta", want["beta"], got["beta"])
        row(f"{cls}.floor", want["floor"], got["floor"])
        if want["beta"] > 0:
            row(f"{cls}.paced_lossless", want["paced_lossless"], got["paced_lossless"])
    for key in COST_KEYS:
        row(key, getattr(injected, key), fitted["costs"][key])
    i = injected
    wiring = {"PIX": i.gpu_gbs, "PHB": i.root_gbs, "SYS": i.root_gbs, "SHM": i.host_gbs}
    for cls, gbs in {**wiring, "NET": i.nic_gbs}.items():
        row(f"rate_gbs.{cls}", gbs, fitted["rate_gbs"][cls])
    return rows
