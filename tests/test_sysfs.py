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
