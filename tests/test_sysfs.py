"""Linux sysfs discovery on a synthetic /sys tree, and on this machine (no NVIDIA GPU here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from variopath_jax.errors import TopologyError
from variopath_jax.topology import PathModel, sysfs


def _device(
    root: Path, chain: list[str], cls: str, vendor: str, numa: int, speed: str = "32.0 GT/s PCIe"
) -> Path:
    """Create /sys/devices/pci<bus>/<chain...> with its attribute files and the bus symlink."""
    path = root / "devices" / f"pci{chain[0]}"
    for comp in chain[1:]:
        path = path / comp
        path.mkdir(parents=True, exist_ok=True)
        (path / "numa_node").write_text(f"{numa}\n")
        (path / "max_link_speed").write_text(f"{speed}\n")
        (path / "max_link_width").write_text("16\n")
        (path / "class").write_text("0x060400\n")
        (path / "vendor").write_text("0x1000\n")
    (path / "class").write_text(f"{cls}\n")
    (path / "vendor").write_text(f"{vendor}\n")
    link = root / "bus" / "pci" / "devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        os.symlink(path, link)
    return path


def _fake_sys(root: Path) -> Path:
    # socket 0: root bus 0000:15 -> root port 15:01.0 -> switch USP 16:00.0 -> DSPs -> 2 GPUs + NIC
    for dsp, dev, cls, vendor in [
        ("0000:17:00.0", "0000:18:00.0", "0x030200", "0x10de"),
        ("0000:17:01.0", "0000:19:00.0", "0x030200", "0x10de"),
        ("0000:17:02.0", "0000:1a:00.0", "0x020700", "0x15b3"),
    ]:
        _device(root, ["0000:15", "0000:15:01.0", "0000:16:00.0", dsp, dev], cls, vendor, 0)
    # socket 1: a GPU directly on a root port, Gen4
    _device(
        root, ["0000:80", "0000:80:01.0", "0000:81:00.0"], "0x030000", "0x10de", 1, "16.0 GT/s PCIe"
    )
    # an onboard Ethernet NIC without RDMA must be ignored
    _device(root, ["0000:00", "0000:00:1c.0", "0000:01:00.0"], "0x020000", "0x8086", 0)
    ib = root / "class" / "infiniband" / "mlx5_0"
    (ib / "ports" / "1").mkdir(parents=True)
    (ib / "ports" / "1" / "rate").write_text("400 Gb/sec (4X NDR)\n")
    os.symlink(root / "bus" / "pci" / "devices" / "0000:1a:00.0", ib / "device")
    return root


def test_discovers_a_synthetic_machine(tmp_path: Path) -> None:
    topo = sysfs.discover(_fake_sys(tmp_path))
    node = topo.node
    assert topo.gpus_per_node == 3 and topo.nics_per_node == 1
    assert node.nics[0].label == "mlx5_0" and node.nics[0].nic_gbps == 400.0
    rel = topo.relations()
    assert rel[0][1] == "PIX" and rel[0][2] == "SYS"
    assert topo.nic_relations()[0] == ["PIX"]
    assert node.gpus[2].up_gbs == 32.0 and node.gpus[0].up_gbs == 64.0
    assert [list(g) for g in PathModel(topo).groups] == [[0, 1], [2]]


def test_without_nvidia_gpus_says_so(tmp_path: Path) -> None:
    _device(tmp_path, ["0000:00", "0000:00:1c.0", "0000:01:00.0"], "0x020000", "0x8086", 0)
    with pytest.raises(TopologyError, match="no NVIDIA GPU"):
        sysfs.discover(tmp_path)


def test_this_machine() -> None:
    """This machine has no NVIDIA GPU: discovery must say so, clearly and without crashing."""
    try:
        topo = sysfs.discover("/sys")
    except TopologyError as err:
        assert "no NVIDIA GPU" in str(err) or "does not exist" in str(err)
    else:  # a machine with GPUs: the discovered node must be usable
        assert topo.gpus_per_node >= 1


def test_root_complexes_of_the_synthetic_machine(tmp_path: Path) -> None:
    """The device on each root port names its top-level ``pci0000:XX`` bus; nothing else does."""
    node = sysfs.discover(_fake_sys(tmp_path)).node
    on_ports = {d.name: d.root_complex for d in node.devices if d.root_complex}
    assert on_ports == {"sw0": "pci0000:15", "gpu2": "pci0000:80"}
    assert node.root_complex_of("gpu0") == node.root_complex_of("nic0") == "pci0000:15"
    assert node.root_complexes == ("pci0000:15", "pci0000:80")


def _switches(root: Path, buses: list[str], numa: int = 0) -> Path:
    """One Gen5 switch per entry of ``buses`` (root bus, root port), two GPUs on each; the
    switches are numbered in the order of their upstream ports' bus numbers."""
    for k, (bus, port) in enumerate(buses):
        usp = f"0000:{0x10 * (k + 1) + 1:02x}:00.0"
        for g in range(2):
            dsp = f"0000:{0x10 * (k + 1) + 2:02x}:0{g}.0"
            gpu = f"0000:{0x10 * (k + 1) + 3 + g:02x}:00.0"
            chain = [bus, port, usp, dsp, gpu]
            _device(root, chain, "0x030200", "0x10de", numa, "32.0 GT/s PCIe")
    return root


def test_two_switches_on_one_root_complex(tmp_path: Path) -> None:
    """Two switches on two root ports of the same ``pci0000:40``: one root complex, so pushes
    from one switch to the other reach a single root complex (no posted-write trigger)."""
    sys_root = _switches(tmp_path, [("0000:40", "0000:40:01.1"), ("0000:40", "0000:40:03.1")])
    node = sysfs.discover(sys_root).node
    assert [(d.name, d.parent) for d in node.devices if d.kind == "switch"] == [
        ("sw0", "cpu0"),
        ("sw1", "cpu0"),
    ]
    assert [node.root_port_of(g.name) for g in node.gpus] == ["sw0", "sw0", "sw1", "sw1"]
    assert {node.root_complex_of(g.name) for g in node.gpus} == {"pci0000:40"}
    assert node.root_complexes == ("pci0000:40",)


def test_four_switches_on_four_root_complexes(tmp_path: Path) -> None:
    """Four switches each below its own ``pci0000:XX`` of one socket (the Threadripper PRO build
    of the posted-write collapse): four root complexes, each switch its own."""
    buses = [(b, f"{b}:01.1") for b in ("0000:00", "0000:20", "0000:40", "0000:e0")]
    node = sysfs.discover(_switches(tmp_path, buses)).node
    assert node.root_complexes == ("pci0000:00", "pci0000:20", "pci0000:40", "pci0000:e0")
    assert [node.root_complex_of(g.name) for g in node.gpus] == [
        rc for rc in node.root_complexes for _ in range(2)
    ]
    # four root buses of one NUMA node: four host bridges of one socket (NODE apart)
    assert [d.name for d in node.devices if d.kind == "cpu"] == ["cpu0"]
    assert sorted(d.label for d in node.devices if d.kind == "hostbridge") == [b for b, _ in buses]
    topo = sysfs.discover(tmp_path)
    assert topo.relations()[0][1] == "PIX" and topo.relations()[0][2] == "NODE"
