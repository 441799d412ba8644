"""The topology model: presets, validation, relations, fingerprints, spec round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from variopath_jax.errors import ParseError, TopologyError
from variopath_jax.topology import PRESETS, Device, NodeSpec, Topology, load_topology, preset, spec
from variopath_jax.topology.presets import pcie_gbs

PAPER_PLATFORMS = {
    "r5080-cx8": (8, 4),
    "r5080-bf3": (8, 4),
    "r5090-bf3": (16, 8),
    "l20-cx7": (16, 8),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_presets_build_and_replicate(name: str, nodes: int) -> None:
    if nodes > 1 and not preset(name).node.nics:
        pytest.skip("a preset without NICs is one node only")
    topo = preset(name, nodes)
    assert topo.nodes == nodes
    assert topo.num_ranks == nodes * topo.gpus_per_node
    g = topo.graph
    assert len(g.gpus) == topo.num_ranks
    assert len(g.nics) == nodes * topo.nics_per_node
    # every link has a positive capacity and both directions exist
    for lk in g.links:
        assert lk.gbs > 0
        assert g.link(lk.dst, lk.src) >= 0


@pytest.mark.parametrize("name, shape", sorted(PAPER_PLATFORMS.items()))
def test_paper_platforms_match_table2(name: str, shape: tuple[int, int]) -> None:
    topo = preset(name)
    assert (topo.gpus_per_node, topo.nics_per_node) == shape


def test_nominal_pcie_rates() -> None:
    assert pcie_gbs(5) == 64.0 and pcie_gbs(4) == 32.0 and pcie_gbs(3, 8) == 8.0
    with pytest.raises(TopologyError, match="generation"):
        pcie_gbs(9)


def test_fig1_relations() -> None:
    topo = preset("fig1")
    rel = topo.relations()
    assert rel[0][0] == "X" and rel[0][1] == "PIX" and rel[0][3] == "PXB"
    assert topo.nic_relations()[0] == ["PIX", "PXB"]
    assert topo.nic_relations()[5] == ["PXB", "PIX"]


def test_relations_span_nodes() -> None:
    topo = preset("r5080-bf3", 2)
    rel = topo.relations()
    assert len(rel) == 16 and all(len(row) == 16 for row in rel)
    assert rel[0][8] == "NET" and rel[0][1] == "PIX" and rel[0][2] == "PXB" and rel[0][4] == "SYS"
    assert rel[9][8] == "PIX"


def test_fingerprint_is_stable_and_physical() -> None:
    a, b = preset("r5080-bf3", 2), preset("r5080-bf3", 2)
    assert a.fingerprint == b.fingerprint
    assert a.fingerprint != preset("r5080-bf3", 1).fingerprint
    assert a.fingerprint != preset("r5080-cx8", 2).fingerprint
    renamed = Topology(a.node, a.nodes, name="something else")
    assert renamed.fingerprint == a.fingerprint
    # the same in a fresh interpreter (no dependence on hash seeds or dict order)
    code = "from variopath_jax.topology import preset; print(preset('r5080-bf3', 2).fingerprint)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == a.fingerprint


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_spec_round_trip_is_exact(name: str, tmp_path) -> None:
    topo = preset(name, 3 if preset(name).node.nics else 1)
    text = spec.dumps(topo)
    again = spec.loads(text)
    assert again == topo
    assert spec.dumps(again) == text
    assert again.fingerprint == topo.fingerprint
    path = tmp_path / "t.json"
    spec.write(topo, path)
    assert spec.read(path) == topo


def test_spec_asymmetric_links_round_trip() -> None:
    base = spec.to_spec(preset("fig1"))
    base["devices"][2] = {**base["devices"][2], "up_gbs": 10.0, "down_gbs": 20.0}
    del base["devices"][2]["gbs"]
    base["links"] = []
    topo = spec.from_spec(base)
    assert spec.to_spec(topo) == base


def _spec() -> dict:
    return spec.to_spec(preset("fig1"))


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda s: s.update(colour="red"), "colour: unknown key"),
        (lambda s: s["devices"][2].update(speed=3), r"devices\[2\].speed: unknown key"),
        (lambda s: s["devices"][3].update(gbs=-5), r"devices\[3\].gbs: must be > 0"),
        (lambda s: s["devices"][6].update(gbps=0), r"devices\[6\].gbps: must be > 0"),
        (lambda s: s["devices"][3].pop("parent"), "a gpu needs a parent"),
        (lambda s: s["devices"][3].update(parent="nowhere"), "parent 'nowhere' does not exist"),
        (lambda s: s["devices"][3].update(kind="tpu"), "unknown kind 'tpu'"),
        (lambda s: s.update(version=7), "version: unsupported version 7"),
        (lambda s: s.update(nodes="two"), "nodes: expected int"),
        (lambda s: s.update(nodes=0), "nodes must be a positive integer"),
        (
            lambda s: s["devices"].append(
                {"name": "gpu0", "kind": "gpu", "parent": "sw0", "gbs": 1}
            ),
            "duplicate device name",
        ),
        (lambda s: s.update(links=[{"a": "gpu0", "b": "sw0", "gbs": 1}]), "extra links join"),
    ],
)
def test_bad_specs_name_the_field(mutate, where: str) -> None:
    s = _spec()
    mutate(s)
    with pytest.raises(ParseError, match=where):
        spec.from_spec(s)


def test_bad_spec_json_names_the_line() -> None:
    with pytest.raises(ParseError, match="line 3"):
        spec.loads('{\n "format": "variopath-topology",\n "version": 1 1\n}')


def test_model_rejects_structural_errors() -> None:
    with pytest.raises(TopologyError, match="no GPUs"):
        NodeSpec((Device("cpu0", "cpu"),))
    with pytest.raises(TopologyError, match="cycle"):
        NodeSpec(
            (
                Device("cpu0", "cpu"),
                Device("a", "switch", "b", 1, 1),
                Device("b", "switch", "a", 1, 1),
                Device("g", "gpu", "a", 1, 1),
            )
        )
    with pytest.raises(TopologyError, match="needs at least one NIC"):
        Topology(NodeSpec((Device("cpu0", "cpu"), Device("g", "gpu", "cpu0", 1, 1))), nodes=2)


def test_oversubscribed_fabric_adds_node_uplinks() -> None:
    base = preset("r5080-bf3", 2)
    topo = Topology(base.node, 2, oversubscription=2.0)
    g = topo.graph
    uplinks = [lk for lk in g.links if lk.kind == "uplink"]
    assert len(uplinks) == 4
    assert all(lk.gbs == pytest.approx(4 * 50.0 / 2.0) for lk in uplinks)
    assert json.loads(json.dumps(spec.to_spec(topo)))["oversubscription"] == 2.0


# ----- root complexes and the posted-write trigger factor ---------------------------------------


def _two_ports(rc_a: str = "", rc_b: str = "") -> NodeSpec:
    """One socket with a switch (two GPUs) and a directly attached GPU on two root ports."""
    return NodeSpec(
        (
            Device("cpu0", "cpu", numa=0),
            Device("swA", "switch", "cpu0", 64, 64, root_complex=rc_a),
            Device("g0", "gpu", "swA", 64, 64),
            Device("g1", "gpu", "swA", 64, 64),
            Device("g2", "gpu", "cpu0", 64, 64, root_complex=rc_b),
        )
    )


def test_root_ports_default_to_their_own_root_complex() -> None:
    node = _two_ports()
    assert [node.root_port_of(n) for n in ("swA", "g0", "g1", "g2")] == ["swA"] * 3 + ["g2"]
    assert node.root_port_of("cpu0") is None
    assert node.root_complex_of("g1") == "swA" and node.root_complex_of("g2") == "g2"
    assert node.root_complexes == ("swA", "g2")
    with pytest.raises(TopologyError, match="'cpu0' is a cpu, not on a root port"):
        node.root_complex_of("cpu0")


def test_named_root_complexes_are_shared_and_ordered() -> None:
    shared = _two_ports("pci0000:40", "pci0000:40")
    assert shared.root_complex_of("g0") == shared.root_complex_of("g2") == "pci0000:40"
    assert shared.root_complexes == ("pci0000:40",)
    apart = _two_ports("pci0000:60", "pci0000:00")
    assert apart.root_complexes == ("pci0000:60", "pci0000:00")  # order of first root port
    mixed = _two_ports("", "pci0000:00")  # a named one and a port left to itself
    assert mixed.root_complexes == ("swA", "pci0000:00")


def test_root_complexes_under_host_bridges() -> None:
    """Devices on the root ports of host bridges count; the host bridges themselves do not."""
    node = NodeSpec(
        (
            Device("cpu0", "cpu", numa=0),
            Device("hb0", "hostbridge", "cpu0", 128, 128),
            Device("hb1", "hostbridge", "cpu0", 128, 128),
            Device("g0", "gpu", "hb0", 64, 64, root_complex="pci0000:00"),
            Device("g1", "gpu", "hb1", 64, 64, root_complex="pci0000:20"),
            Device("g2", "gpu", "hb1", 64, 64, root_complex="pci0000:20"),
        )
    )
    assert node.root_complexes == ("pci0000:00", "pci0000:20")
    assert node.root_port_of("hb0") is None


@pytest.mark.parametrize(
    "devices, match",
    [
        (
            lambda: [
                Device("cpu0", "cpu"),
                Device("sw", "switch", "cpu0", 64, 64),
                Device("g0", "gpu", "sw", 64, 64, root_complex="pci0000:40"),
            ],
            r"device 2 \('g0'\): root_complex 'pci0000:40' is only for a device on a CPU root "
            r"port .*not below a switch \('sw'\)",
        ),
        (
            lambda: [Device("cpu0", "cpu", root_complex="x"), Device("g0", "gpu", "cpu0", 1, 1)],
            r"device 0 \('cpu0'\): root_complex 'x' is only for a device on a CPU root port, "
            "not a cpu",
        ),
        (
            lambda: [
                Device("cpu0", "cpu"),
                Device("hb", "hostbridge", "cpu0", 1, 1, root_complex="x"),
                Device("g0", "gpu", "hb", 1, 1),
            ],
            r"device 1 \('hb'\): .*not a hostbridge",
        ),
    ],
)
def test_root_complex_only_on_root_ports(devices, match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        NodeSpec(tuple(devices()))


def test_root_complex_below_a_switch_in_a_spec_names_the_device() -> None:
    s = _spec()  # fig1: devices[3] is a GPU below a switch
    s["devices"][3]["root_complex"] = "pci0000:40"
    with pytest.raises(ParseError, match=r"device 3 \('gpu0'\): root_complex 'pci0000:40'"):
        spec.from_spec(s)
    s["devices"][3]["root_complex"] = 40
    with pytest.raises(ParseError, match=r"devices\[3\].root_complex: expected str"):
        spec.from_spec(s)


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, float("nan"), True, "0.25"])
def test_invalid_trigger_factor_is_rejected(bad) -> None:
    with pytest.raises(TopologyError, match="trigger_factor"):
        Topology(preset("fig1").node, trigger_factor=bad)
    s = {**_spec(), "trigger_factor": bad}
    with pytest.raises(ParseError, match="trigger_factor"):
        spec.from_spec(s)


def test_spec_round_trip_with_root_complexes_and_trigger_factor(tmp_path) -> None:
    base = preset("trpro-2sw")
    s = spec.to_spec(base)
    assert s["trigger_factor"] == pytest.approx(0.2486, abs=1e-4)
    for dev in s["devices"]:
        if dev.get("parent") == "cpu0":
            dev["root_complex"] = "pci0000:40"
    topo = spec.from_spec(s)
    assert topo.node.root_complexes == ("pci0000:40",)
    assert topo.trigger_factor == base.trigger_factor
    text = spec.dumps(topo)
    again = spec.loads(text)
    assert again == topo and spec.dumps(again) == text
    assert again.fingerprint == topo.fingerprint
    # both are physics: each changes the fingerprint
    assert topo.fingerprint != base.fingerprint
    assert Topology(base.node, name="x").fingerprint != base.fingerprint
    assert json.loads(text)["devices"][1]["root_complex"] == "pci0000:40"
    # load_topology's overrides keep both
    path = tmp_path / "t.json"
    spec.write(topo, path)
    loaded = load_topology(path, p2p=False)
    assert not loaded.p2p and loaded.trigger_factor == topo.trigger_factor
    assert loaded.node == topo.node


# Printed by the code of the commit before root complexes and trigger factors (7e3b79b^): a spec
# without them must keep its fingerprint, so catalogs keyed by it stay valid.
FINGERPRINTS_BEFORE = {
    ("r5080-bf3", 1): "83ace1cea02cf528",
    ("r5080-bf3", 2): "b3266e9d39c35e53",
    ("r5080-cx8", 1): "a1ddcb9079f32a18",
    ("fig1", 2): "cbf0c7f4850128b9",
    ("root4-gen4", 1): "77a4156f94171bea",
}


@pytest.mark.parametrize("name, nodes", sorted(FINGERPRINTS_BEFORE))
def test_presets_without_root_complexes_keep_their_fingerprints(name: str, nodes: int) -> None:
    topo = preset(name, nodes)
    assert topo.trigger_factor is None and not any(d.root_complex for d in topo.node.devices)
    assert "trigger_factor" not in spec.to_spec(topo)
    assert topo.fingerprint == FINGERPRINTS_BEFORE[(name, nodes)]


@pytest.mark.parametrize(
    "name, gpus, complexes, factor",
    [
        ("trpro-4sw", 16, 4, (13.5 / 52.5 + 12.6 / 52.5) / 2),
        ("trpro-2sw", 8, 2, (13.5 / 52.5 + 12.6 / 52.5) / 2),
        ("turin-pex890", 8, 4, None),
    ],
)
def test_published_machine_presets(name: str, gpus: int, complexes: int, factor) -> None:
    topo = preset(name)
    node = topo.node
    assert topo.gpus_per_node == gpus and topo.nics_per_node == 0
    assert len(node.root_complexes) == complexes
    assert topo.trigger_factor == (pytest.approx(factor) if factor else None)
    # every root port is its own root complex, a switch of equal share of the GPUs on each
    assert node.root_complexes == tuple(d.name for d in node.devices if d.kind == "switch")
    per = gpus // complexes
    assert [node.root_complex_of(g.name) for g in node.gpus] == [
        rc for rc in node.root_complexes for _ in range(per)
    ]
    assert all(d.up_gbs == 64.0 for d in node.devices if d.kind in ("switch", "gpu"))
    sockets = [d for d in node.devices if d.kind == "cpu"]
    assert len(sockets) == (2 if name == "turin-pex890" else 1)
    with pytest.raises(TopologyError, match="needs at least one NIC"):
        preset(name, 2)


def test_with_nodes_keeps_root_complexes_and_trigger_factor() -> None:
    s = spec.to_spec(preset("r5080-bf3"))
    s["trigger_factor"] = 0.5
    for dev in s["devices"]:
        if dev["name"] in ("top0", "top1"):
            dev["root_complex"] = f"pci0000:{dev['name'][-1]}0"
    topo = spec.from_spec(s).with_nodes(2)
    assert topo.nodes == 2 and topo.trigger_factor == 0.5
    assert topo.node.root_complexes == ("pci0000:00", "pci0000:10")
    assert topo.fingerprint != preset("r5080-bf3", 2).fingerprint
