"""Topology model, presets, parsers and paths (DESIGN.md "The model")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from variopath_jax.errors import TopologyError
from variopath_jax.topology import nccl_xml, nvsmi, spec, sysfs
from variopath_jax.topology.model import Device, Link, LinkLayout, NodeSpec, Topology
from variopath_jax.topology.nvsmi import LinkDefaults
from variopath_jax.topology.paths import Path as RankPath
from variopath_jax.topology.paths import PathModel, Route
from variopath_jax.topology.presets import PRESETS, pcie_gbs, preset

__all__ = [
    "PRESETS",
    "Device",
    "Link",
    "LinkDefaults",
    "LinkLayout",
    "NodeSpec",
    "PathModel",
    "RankPath",
    "Route",
    "Topology",
    "detect_format",
    "load_topology",
    "pcie_gbs",
    "preset",
]

FORMATS = ("preset", "spec", "nvsmi", "nccl-xml", "sysfs")


def detect_format(text: str) -> str:
    """Which topology source a file's text is: ``spec``, ``nccl-xml`` or ``nvsmi``."""
    head = text.lstrip()[:2000]
    if head.startswith("{"):
        return "spec"
    if nccl_xml.looks_like_nccl_xml(head):
        return "nccl-xml"
    if nvsmi.looks_like_topo_m(text):
        return "nvsmi"
    raise TopologyError(
        "unrecognised topology file: expected a JSON spec, an NCCL topology XML dump or "
        "`nvidia-smi topo -m` text"
    )


def load_topology(
    source: str | Path,
    nodes: int | None = None,
    *,
    fmt: str | None = None,
    defaults: LinkDefaults | None = None,
    p2p: bool | None = None,
    gdr: bool | None = None,
    notes: list[str] | None = None,
    pcie_gen: int | None = None,
) -> Topology:
    """Load a topology from a preset name, a file path (format detected) or ``"sysfs"``.

    Parameters
    ----------
    source : str or Path
        A preset name (``r5080-bf3``), ``sysfs`` (this machine), or a file.
    nodes : int, optional
        Replicate to this many identical nodes (a spec file's own ``nodes`` otherwise).
    fmt : str, optional
        Force a format: one of ``preset``, ``spec``, ``nvsmi``, ``nccl-xml``, ``sysfs``.
    defaults : LinkDefaults, optional
        Link speeds for sources without them (``nvidia-smi`` text, sysfs gaps, XML gaps).
    p2p, gdr : bool, optional
        Override the peer-to-peer / GPUDirect RDMA flags.
    notes : list of str, optional
        Receives what the source left to assumption (an ``nvidia-smi`` text without a NIC Legend
        block names its NICs as printed, for example).
    pcie_gen : int, optional
        The PCIe generation of a source that gives none (``nvidia-smi`` text), stated: without
        it (or the text's own query block) such a source's generation is assumed
        (``Topology.assumed``, with a warning). ``defaults`` rates the other sources' gaps.
    """
    defaults = defaults or LinkDefaults()
    if pcie_gen is not None:
        defaults = dataclasses.replace(defaults, pcie_gen=pcie_gen)
    name = str(source)
    if fmt is not None and fmt not in FORMATS:
        raise TopologyError(f"unknown topology format {fmt!r}; expected one of {FORMATS}")
    if fmt == "preset" or (fmt is None and name in PRESETS):
        topo = preset(name, 1)
    elif fmt == "sysfs" or (fmt is None and name == "sysfs"):
        topo = sysfs.discover("/sys", defaults)
    else:
        path = Path(name)
        if not path.is_file():
            raise TopologyError(
                f"topology source {name!r} is neither a preset ({', '.join(PRESETS)}), "
                "'sysfs', nor an existing file"
            )
        text = path.read_text()
        kind = fmt or detect_format(text)
        if kind == "spec":
            topo = spec.loads(text, name)
        elif kind == "nccl-xml":
            topo = nccl_xml.parse(text, name, defaults)
        elif kind == "nvsmi":
            topo = nvsmi.parse(text, name, defaults, notes=notes, pcie_gen=pcie_gen, p2p=p2p)
        else:
            raise TopologyError(f"format {kind!r} cannot be read from a file")
    if nodes is not None and nodes != topo.nodes:
        topo = topo.with_nodes(nodes)
    if p2p is not None or gdr is not None:
        topo = dataclasses.replace(
            topo,
            p2p=topo.p2p if p2p is None else p2p,
            gdr=topo.gdr if gdr is None else gdr,
            _graph_cache={},
        )
    return topo
