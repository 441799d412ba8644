"""Report (the last of measure / fit / report): the network-model file (the format of
``sim/network.py``, with the raw measurements and the fit kept under ``"profile"``), the path
profile the planner reads (``topology/paths.py``, measured GB/s per path class), and the summary
the CLI prints.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from variopath_jax.profile.backend import ProfileError
from variopath_jax.profile.fit import DECIDING_LOAD
from variopath_jax.sim.network import (
    FORMAT,
    LATENCY_NET_S,
    LINK_CLASSES,
    VERSION,
    NetworkModel,
    NetworkModelError,
)
from variopath_jax.topology.paths import PATH_PROFILE_FORMAT, PATH_PROFILE_VERSION

PROFILE_FORMAT = "variopath-profile"
PROFILE_VERSION = 1


def _source(raw: dict[str, Any]) -> str:
    machine = raw["machine"]
    return f"variopath profile, backend {machine.get('backend', '?')}, {raw.get('date', '?')}"


def network_document(raw: dict[str, Any], fitted: dict[str, Any], name: str) -> dict[str, Any]:
    """The network-model file: every fitted value, the raw measurements and the fit kept under
    ``profile``. Classes the backend could not isolate are left out, so the file keeps the
    ``pcie`` defaults for them (the conservative rule) and ``profile.unmeasured`` names them.
    The posted-write trigger stays on with the measured factor (1.0: no collapse), or with none
    (null: the topology's or the conservative default) where the probe could not run."""
    source = _source(raw)
    costs = fitted["costs"]
    trigger = fitted["trigger"]
    contention = {
        cls: {
            "beta": p["beta"],
            "floor": p["floor"],
            "paced_lossless": p["paced_lossless"],
            "paced_source": f"{source}: {p['paced_reason']} (loads <= {DECIDING_LOAD}, "
            f"k = {min(p['eta'])}..{max(p['eta'])})",
        }
        for cls, p in fitted["classes"].items()
    }
    sources = {
        "issue_s": f"{source}: spacing of posts queued at one endpoint",
        "latency_pcie_s": f"{source}: one tiny PCIe transfer beyond o and its data",
        "latency_net_s": f"{source}: one tiny transfer through a NIC beyond o and its data"
        if "latency_net_s" in costs
        else f"not measured by backend {raw['machine'].get('backend')}: the pcie default",
        "signal_s": f"{source}: spacing of a signal chain beyond o, L and data",
        "barrier_s": f"{source}: spacing of a barrier chain beyond o, L and data",
        **{
            f"contention.{c}": f"{source}: η(k) of k = {min(p['eta'])}..{max(p['eta'])} unpaced flows"
            for c, p in fitted["classes"].items()
        },
        "trigger_factor": f"{source}: {trigger['note']}"
        if trigger["factor"] is not None
        else f"not measured ({trigger['note']}): the topology's factor, else the pcie default",
    }
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "barrier_s": costs["barrier_s"],
        "issue_s": costs["issue_s"],
        "latency_pcie_s": costs["latency_pcie_s"],
        "latency_net_s": costs.get("latency_net_s", LATENCY_NET_S),
        "signal_s": costs["signal_s"],
        "serial_issue": True,
        "contention": contention,
        "trigger": True,
        "trigger_factor": trigger["factor"],
        "profile": {
            "format": PROFILE_FORMAT,
            "version": PROFILE_VERSION,
            "sources": sources,
            "unmeasured": [c for c in LINK_CLASSES if c not in contention],
            "fit": fitted,
            "raw": raw,
        },
    }
    try:
        NetworkModel.from_dict(json.loads(json.dumps(doc)), name)
    except NetworkModelError as err:
        raise ProfileError(f"the fitted model is not a valid network model: {err}") from None
    return doc


def path_profile_document(raw: dict[str, Any], fitted: dict[str, Any]) -> dict[str, Any]:
    """The path profile: the measured single-flow GB/s of every path class the backend has."""
    return {
        "format": PATH_PROFILE_FORMAT,
        "version": PATH_PROFILE_VERSION,
        "source": f"{_source(raw)}: single-flow rate per path class",
        "rate_gbs": dict(fitted["rate_gbs"]),
    }


def read_raw(path: str | Path) -> dict[str, Any]:
    """The raw measurements kept in a network-model file ``variopath profile`` wrote."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as err:
        raise ProfileError(f"{p}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ProfileError(f"{p}: invalid JSON at line {err.lineno}: {err.msg}") from None
    profile = doc.get("profile") if isinstance(doc, dict) else None
    if not isinstance(profile, dict) or profile.get("format") != PROFILE_FORMAT:
        raise ProfileError(
            f"{p}: holds no raw measurements (need a network-model file written by "
            f'variopath profile, with "profile": {{"format": "{PROFILE_FORMAT}", ...}})'
        )
    if profile.get("version") != PROFILE_VERSION:
        raise ProfileError(f"{p}: profile version {profile.get('version')!r} is not supported")
    if not isinstance(profile.get("raw"), dict):
        raise ProfileError(f"{p}: profile.raw must be an object")
    return profile["raw"]


def stamp(raw: dict[str, Any]) -> dict[str, Any]:
    """The raw document with the date it was measured (UTC)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**raw, "date": now}


def write(doc: dict[str, Any], paths: dict[str, Any], out: Path, paths_out: Path) -> None:
    """Write the network-model file and the path profile."""
    try:
        out.write_text(json.dumps(doc, indent=1) + "\n")
        paths_out.write_text(json.dumps(paths, indent=2) + "\n")
    except OSError as err:
        raise ProfileError(f"cannot write {err.filename}: {err.strerror}") from None


def summary(doc: dict[str, Any], out: str | None, paths_out: str | None) -> dict[str, Any]:
    """The CLI's JSON (stable schema): where the files went, and every fitted value."""
    fitted = doc["profile"]["fit"]
    return {
        "network_file": out,
        "path_profile_file": paths_out,
        "backend": doc["profile"]["raw"]["machine"].get("backend"),
        "model": {k: v for k, v in doc.items() if k != "profile"},
        "rate_gbs": fitted["rate_gbs"],
        "staged_over_direct": fitted["staged_over_direct"],
        "classes": {
            c: {k: p[k] for k in ("capacity_gbs", "beta", "floor", "paced_lossless", "max_error")}
            for c, p in fitted["classes"].items()
        },
        "unmeasured": doc["profile"]["unmeasured"],
        "costs": fitted["costs"],
        "trigger": fitted["trigger"],
    }


def human(out: dict[str, Any]) -> None:
    """The summary as text."""
    print(f"profiled with backend {out['backend']}")
    rates = ", ".join(f"{c} {g:.2f}" for c, g in out["rate_gbs"].items())
    print(f"single-flow GB/s per path class: {rates}")
    if out["staged_over_direct"]:
        ratios = ", ".join(f"{c} {r:.2f}x" for c, r in out["staged_over_direct"].items())
        print(f"staged (SHM) against direct: {ratios}")
    print(f"{'class':<10}{'GB/s':>8}{'beta':>10}{'floor':>8}  paced_lossless  max model error")
    for c, p in out["classes"].items():
        print(
            f"{c:<10}{p['capacity_gbs']:>8.2f}{p['beta']:>10.4f}{p['floor']:>8.4f}  "
            f"{str(p['paced_lossless']).lower():<14}  {p['max_error']:.2%}"
        )
    if out["unmeasured"]:
        print(f"not measured (pcie defaults kept): {', '.join(out['unmeasured'])}")
    print("  ".join(f"{k} {v * 1e6:.3f} µs" for k, v in out["costs"].items()))
    trigger = out["trigger"]
    factor = "unset" if trigger["factor"] is None else f"{trigger['factor']:.3f}"
    print(f"posted-write trigger factor {factor}: {trigger['note']}")
    for label, key in (("network model", "network_file"), ("path profile", "path_profile_file")):
        if out[key]:
            print(f"{label}: {out[key]}")
