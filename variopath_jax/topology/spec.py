"""The human-writable topology spec file (JSON) and its exact round trip.

Example (one node; ``nodes`` multiplies it)::

    {
      "format": "variopath-topology", "version": 1, "name": "my-box", "nodes": 2,
      "p2p": true, "gdr": true, "oversubscription": 1.0,
      "devices": [
        {"name": "cpu0", "kind": "cpu", "numa": 0},
        {"name": "sw0", "kind": "switch", "parent": "cpu0", "gbs": 64},
        {"name": "gpu0", "kind": "gpu", "parent": "sw0", "gbs": 64, "label": "0000:18:00.0"},
        {"name": "nic0", "kind": "nic", "parent": "sw0", "gbs": 64, "gbps": 400}
      ],
      "links": [{"a": "cpu0", "b": "cpu1", "gbs": 64}]
    }

A device's link to its parent takes ``gbs`` (both directions) or ``up_gbs`` and ``down_gbs``;
an extra link takes ``gbs`` or ``ab_gbs`` and ``ba_gbs``. A device on a CPU root port may name
the ``root_complex`` its port belongs to (``"pci0000:40"``; omitted: the port is its own), and
``trigger_factor`` gives the CPU's measured posted-write collapse (``variopath profile`` measures
it; topology/model.py ``Topology``); ``assumed`` lists what its source did not say (the link
generation or P2P of ``nvidia-smi topo -m`` text), in words. Every field is checked, and an error names the field
(``devices[3].gbs``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from variopath_jax.errors import ParseError, TopologyError
from variopath_jax.topology.model import Device, Link, NodeSpec, Topology

FORMAT = "variopath-topology"
VERSION = 1

_TOP_KEYS = {
    "format",
    "version",
    "name",
    "nodes",
    "p2p",
    "gdr",
    "oversubscription",
    "trigger_factor",
    "assumed",
    "devices",
    "links",
}
_DEVICE_KEYS = {
    "name",
    "kind",
    "parent",
    "gbs",
    "up_gbs",
    "down_gbs",
    "gbps",
    "numa",
    "label",
    "root_complex",
}
_LINK_KEYS = {"a", "b", "gbs", "ab_gbs", "ba_gbs", "count"}


def to_spec(topo: Topology) -> dict[str, Any]:
    """The spec dict of a topology; ``from_spec(to_spec(t)) == t``."""
    devices = []
    for d in topo.node.devices:
        entry: dict[str, Any] = {"name": d.name, "kind": d.kind}
        if d.parent is not None:
            entry["parent"] = d.parent
            if d.up_gbs == d.down_gbs:
                entry["gbs"] = d.up_gbs
            else:
                entry["up_gbs"], entry["down_gbs"] = d.up_gbs, d.down_gbs
        if d.kind == "nic":
            entry["gbps"] = d.nic_gbps
        if d.numa is not None:
            entry["numa"] = d.numa
        if d.label:
            entry["label"] = d.label
        if d.root_complex:
            entry["root_complex"] = d.root_complex
        devices.append(entry)
    links = []
    for lk in topo.node.links:
        entry = {"a": lk.a, "b": lk.b}
        if lk.ab_gbs == lk.ba_gbs:
            entry["gbs"] = lk.ab_gbs
        else:
            entry["ab_gbs"], entry["ba_gbs"] = lk.ab_gbs, lk.ba_gbs
        if lk.count != 1:
            entry["count"] = lk.count
        links.append(entry)
    spec = {
        "format": FORMAT,
        "version": VERSION,
        "name": topo.name,
        "nodes": topo.nodes,
        "p2p": topo.p2p,
        "gdr": topo.gdr,
        "oversubscription": topo.oversubscription,
    }
    if topo.trigger_factor is not None:
        spec["trigger_factor"] = topo.trigger_factor
    if topo.assumed:
        spec["assumed"] = list(topo.assumed)
    return {**spec, "devices": devices, "links": links}


def dumps(topo: Topology) -> str:
    """Spec file text: one device or link per line, stable, re-readable."""
    spec = to_spec(topo)
    lines = ["{"]
    head = [k for k in spec if k not in ("devices", "links")]
    lines += [f"  {json.dumps(k)}: {json.dumps(spec[k])}," for k in head]
    for key in ("devices", "links"):
        items = [f"    {json.dumps(item)}" for item in spec[key]]
        body = ",\n".join(items)
        tail = "," if key == "devices" else ""
        lines.append(f'  "{key}": [\n{body}\n  ]{tail}' if items else f'  "{key}": []{tail}')
    lines.append("}")
    return "\n".join(lines) + "\n"


def from_spec(spec: Any, source: str = "spec") -> Topology:
    """Build a topology from a spec dict, checking every key and value."""
    if not isinstance(spec, dict):
        raise ParseError(source, "", "the spec must be a JSON object")
    _unknown(spec, _TOP_KEYS, source, "")
    if spec.get("format") != FORMAT:
        raise ParseError(source, "format", f"expected {FORMAT!r}, got {spec.get('format')!r}")
    if spec.get("version") != VERSION:
        raise ParseError(
            source,
            "version",
            f"unsupported version {spec.get('version')!r}; this library reads {VERSION}",
        )
    nodes = _get(spec, "nodes", int, source, "", default=1)
    p2p = _get(spec, "p2p", bool, source, "", default=True)
    gdr = _get(spec, "gdr", bool, source, "", default=True)
    over = _get(spec, "oversubscription", float, source, "", default=1.0)
    name = _get(spec, "name", str, source, "", default="custom")
    factor = _get(spec, "trigger_factor", float, source, "", default=None)
    assumed = _get(spec, "assumed", list, source, "", default=[])
    if not all(isinstance(a, str) for a in assumed):
        raise ParseError(source, "assumed", "must be a list of strings (what was assumed)")
    raw_devices = _get(spec, "devices", list, source, "")
    raw_links = _get(spec, "links", list, source, "", default=[])

    devices = []
    for i, raw in enumerate(raw_devices):
        where = f"devices[{i}]"
        if not isinstance(raw, dict):
            raise ParseError(source, where, "must be an object")
        _unknown(raw, _DEVICE_KEYS, source, where)
        kind = _get(raw, "kind", str, source, where)
        up, down = _capacity(
            raw, ("gbs", "up_gbs", "down_gbs"), source, where, required=kind != "cpu"
        )
        devices.append(
            Device(
                name=_get(raw, "name", str, source, where),
                kind=kind,
                parent=_get(raw, "parent", str, source, where, default=None),
                up_gbs=up,
                down_gbs=down,
                nic_gbps=_positive(raw, "gbps", source, where, required=kind == "nic"),
                numa=_get(raw, "numa", int, source, where, default=None),
                label=_get(raw, "label", str, source, where, default=""),
                root_complex=_get(raw, "root_complex", str, source, where, default=""),
            )
        )
    links = []
    for i, raw in enumerate(raw_links):
        where = f"links[{i}]"
        if not isinstance(raw, dict):
            raise ParseError(source, where, "must be an object")
        _unknown(raw, _LINK_KEYS, source, where)
        ab, ba = _capacity(raw, ("gbs", "ab_gbs", "ba_gbs"), source, where, required=True)
        links.append(
            Link(
                _get(raw, "a", str, source, where),
                _get(raw, "b", str, source, where),
                ab,
                ba,
                _get(raw, "count", int, source, where, default=1),
            )
        )
    try:
        node = NodeSpec(tuple(devices), tuple(links))
        return Topology(node, nodes, p2p, gdr, over, name, factor, tuple(assumed))
    except TopologyError as err:
        raise ParseError(source, "", str(err)) from None


def loads(text: str, source: str = "spec") -> Topology:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise ParseError(source, f"line {err.lineno}", f"invalid JSON: {err.msg}") from None
    return from_spec(spec, source)


def read(path: str | Path) -> Topology:
    path = Path(path)
    return loads(path.read_text(), str(path))


def write(topo: Topology, path: str | Path) -> None:
    Path(path).write_text(dumps(topo))


def _unknown(obj: dict, allowed: set[str], source: str, where: str) -> None:
    for key in obj:
        if key not in allowed:
            field = f"{where}.{key}" if where else key
            raise ParseError(source, field, f"unknown key; allowed: {', '.join(sorted(allowed))}")


def _get(obj: dict, key: str, typ: type, source: str, where: str, **kw: Any) -> Any:
    field = f"{where}.{key}" if where else key
    if key not in obj:
        if "default" in kw:
            return kw["default"]
        raise ParseError(source, field, "missing")
    value = obj[key]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if typ is int and isinstance(value, bool):
        raise ParseError(source, field, f"expected an integer, got {value!r}")
    if not isinstance(value, typ):
        raise ParseError(
            source, field, f"expected {typ.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def _positive(obj: dict, key: str, source: str, where: str, required: bool) -> float:
    if key not in obj:
        if required:
            raise ParseError(source, f"{where}.{key}", "missing")
        return 0.0
    value = _get(obj, key, float, source, where)
    if not value > 0:
        raise ParseError(source, f"{where}.{key}", f"must be > 0, got {value}")
    return value


def _capacity(
    obj: dict, keys: tuple[str, str, str], source: str, where: str, required: bool
) -> tuple[float, float]:
    both, first, second = keys
    if both in obj:
        if first in obj or second in obj:
            raise ParseError(
                source, f"{where}.{both}", f"give either {both} or {first}/{second}, not both"
            )
        value = _positive(obj, both, source, where, True)
        return value, value
    if first in obj or second in obj or required:
        if not (first in obj and second in obj):
            missing = (
                both if not (first in obj or second in obj) else (second if first in obj else first)
            )
            raise ParseError(source, f"{where}.{missing}", "missing")
        return _positive(obj, first, source, where, True), _positive(
            obj, second, source, where, True
        )
    return 0.0, 0.0
