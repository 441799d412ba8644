"""NCCL topology XML parsing."""

from __future__ import annotations

import pytest

from variopath_jax.errors import ParseError
from variopath_jax.topology import PathModel, load_topology, nccl_xml


def test_pcie_4090_dump(fixtures) -> None:
    topo = load_topology(fixtures / "nccl_4090x8_dualport_nic.xml")
    node = topo.node
    assert topo.gpus_per_node == 8 and topo.nics_per_node == 2
    assert [d.label for d in node.nics] == ["mlx5_0", "mlx5_1"]
    assert {d.nic_gbps for d in node.nics} == {100.0}
    assert all(d.up_gbs == 32.0 for d in node.gpus)  # 16 GT/s x16 = Gen4
    rel = topo.relations()
    assert rel[0][1] == "PIX" and rel[0][4] == "SYS"
    # the two ports of one card are PIX to each other under a switch standing for the card
    assert node.relation("nic0", "nic1") == "PIX"
    assert topo.nic_relations()[0] == ["PHB", "PHB"]
    assert topo.gdr
    assert [list(g) for g in PathModel(topo).groups] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_h200_dump_ignores_nvswitch(fixtures) -> None:
    topo = load_topology(fixtures / "nccl_h200_pex_switches.xml", nodes=2)
    node = topo.node
    assert topo.gpus_per_node == 4 and topo.nics_per_node == 4 and topo.nodes == 2
    assert all(d.up_gbs == 64.0 for d in node.gpus)  # 32 GT/s x16 = Gen5
    assert {d.nic_gbps for d in node.nics} == {400.0}
    assert not node.links or all(lk.a.startswith("cpu") for lk in node.links)
    assert topo.nic_relations()[0] == ["PIX", "PHB", "SYS", "SYS"] + ["NET"] * 4
    assert [d.label for d in node.gpus] == [
        "0000:18:00.0",
        "0000:29:00.0",
        "0000:9c:00.0",
        "0000:bc:00.0",
    ]


def test_gdr_flag_follows_the_dump(fixtures) -> None:
    text = (
        (fixtures / "nccl_h200_pex_switches.xml")
        .read_text()
        .replace('gdr="1"/>\n        </nic>', 'gdr="0"/>\n        </nic>', 1)
    )
    assert not nccl_xml.parse(text).gdr


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda t: t.replace("</system>", ""), "malformed XML"),
        (
            lambda t: t.replace('link_speed="32.0 GT/s PCIe"', 'link_speed="fast"', 1),
            "pci 0000:16:00.0: unreadable link_speed 'fast'",
        ),
        (
            lambda t: t.replace('link_speed="32.0 GT/s PCIe"', 'link_speed="20.0 GT/s PCIe"', 1),
            "no PCIe generation",
        ),
        (lambda t: t.replace('speed="400000"', 'speed="-1"', 1), "net mlx5_0: speed must be > 0"),
        (
            lambda t: t.replace('<system version="1">', '<system version="9">'),
            "unsupported version '9'",
        ),
        (
            lambda t: t.replace('<gpu dev="0"', '<gpu dev="zero"'),
            "gpu dev 'zero' is not an integer",
        ),
    ],
)
def test_bad_dumps_name_the_element(fixtures, mutate, message: str) -> None:
    text = mutate((fixtures / "nccl_h200_pex_switches.xml").read_text())
    with pytest.raises(ParseError, match=message):
        nccl_xml.parse(text, "dump.xml")


def test_dump_without_gpus() -> None:
    with pytest.raises(ParseError, match="no <gpu> elements"):
        nccl_xml.parse('<system version="1"><cpu numaid="0"></cpu></system>')


def test_root_ports_stay_their_own_root_complexes(fixtures) -> None:
    """The dump names no root bus: every root port keeps the default (its own root complex)."""
    node = load_topology(fixtures / "nccl_h200_pex_switches.xml").node
    assert not any(d.root_complex for d in node.devices)
    ports = [node.root_port_of(g.name) for g in node.gpus]
    assert list(node.root_complexes) == list(dict.fromkeys(ports)) and len(set(ports)) == 4
