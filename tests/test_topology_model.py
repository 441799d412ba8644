"""The topology model: presets, validation, relations, fingerprints, spec round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from variopath_jax.errors import ParseError, TopologyError
from variopath_jax.topology import PRESETS, Device, NodeSpec, Topology, preset, spec
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
    topo = preset(name, 3)
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
