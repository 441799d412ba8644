"""The user's machine: ``nvidia-smi topo -m`` text never silently assumes Gen5 and P2P (it reads
them from the text's P2P and GPU query blocks, takes them from the caller, or marks them
assumed with a warning); ``topo detect`` (sysfs, the CUDA probe, nvidia-smi) writes a spec with
every fact read or probed, and says so clearly on a machine without GPUs; ``configure()`` on
GPUs plans for it; a topology whose size is not the mesh's names ``topo detect``."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import jax
import pytest
from test_sysfs import _device, _fake_sys

from variopath_jax.cli import main
from variopath_jax.errors import AssumedTopologyWarning, TopologyError, VarioPathError
from variopath_jax.jax_ops import config as op_config
from variopath_jax.topology import load_topology, nvsmi, preset, spec
from variopath_jax.topology.detect import GPU_QUERY, P2P_QUERY, detect

L40S = "nvsmi_l40s_4gpu_nic_legend.txt"
P2P = "nvsmi_p2p_read_4gpu_cns.txt"
QUERY = "nvsmi_query_gpu_pcie_gen4.csv"


# ----- the nvidia-smi parser -----------------------------------------------------------------
def test_topo_m_alone_marks_gen5_and_p2p_as_assumed(fixtures) -> None:
    text = (fixtures / L40S).read_text()
    with pytest.warns(AssumedTopologyWarning, match=r"assumed PCIe Gen5 x16.*peer-to-peer on"):
        topo = nvsmi.parse(text, L40S)
    assert len(topo.assumed) == 2 and topo.p2p
    assert "--pcie-gen" in topo.assumed[0] and "--p2p" in topo.assumed[1]
    assert spec.loads(spec.dumps(topo), "s").assumed == topo.assumed  # a spec keeps the mark
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stated by the caller: nothing assumed, no warning
        given = nvsmi.parse(text, L40S, notes=notes, pcie_gen=4, p2p=False)
    assert not given.assumed and not given.p2p and not notes
    assert {d.up_gbs for d in given.node.gpus} == {32.0}
    assert given.fingerprint != topo.fingerprint  # the rates and P2P differ; the mark does not
    assert spec.loads(spec.dumps(topo), "s").fingerprint == topo.fingerprint


def test_p2p_and_query_blocks_are_read_from_the_text(fixtures) -> None:
    text = "\n".join((fixtures / f).read_text() for f in (L40S, P2P, QUERY))
    notes: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        topo = nvsmi.parse(text, "box.txt", notes=notes)
    assert not topo.assumed and not topo.p2p  # CNS across the sockets
    assert {d.up_gbs for d in topo.node.gpus} == {32.0}  # Gen4 x16 from the query block
    assert any("no P2P between 8 GPU pair(s)" in n and "CNS" in n for n in notes)
    assert topo.relations() == nvsmi.parse(text.replace("CNS", "OK"), "b").relations()
    # the blocks in the other order parse the same
    again = "\n".join((fixtures / f).read_text() for f in (QUERY, P2P, L40S))
    assert nvsmi.parse(again, "box.txt").fingerprint == topo.fingerprint
    bad = text.replace("GPU1\tOK\tX\tCNS", "GPU1\tOK\tX\tMAYBE")
    with pytest.raises(TopologyError, match="unknown P2P status 'MAYBE'"):
        nvsmi.parse(bad, "bad.txt")
    short = text.replace("00000000:AF:00.0, 4, 16\n", "")
    with pytest.raises(
        TopologyError, match="GPU query: lists 3 GPUs, but the topo -m matrix has 4"
    ):
        nvsmi.parse(short, "short.txt")


def test_rendered_text_round_trips_p2p_and_generation() -> None:
    for name, p2p in (("l20-cx7", True), ("fig1", False)):
        topo = load_topology(name, p2p=p2p)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            back = nvsmi.parse(nvsmi.render(topo), name)
        assert back.p2p == p2p and not back.assumed
        assert sorted({d.up_gbs for d in back.node.gpus}) == sorted(
            {d.up_gbs for d in topo.node.gpus}
        )


def test_cli_topo_show_says_what_it_assumed(capsys, fixtures) -> None:
    assert main(["topo", "show", str(fixtures / L40S), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("assumed PCIe Gen5" in n for n in out["notes"])
    assert main(["topo", "show", str(fixtures / L40S), "--pcie-gen", "4", "--p2p", "--json"]) == 0
    assert not any("assumed" in n for n in json.loads(capsys.readouterr().out)["notes"])


# ----- topo detect -------------------------------------------------------------------------
# _fake_sys's three GPUs: two under one switch, one on the other socket
P2P_3GPU = """\
 \tGPU0\tGPU1\tGPU2
 GPU0\tX\tOK\tCNS
 GPU1\tOK\tX\tCNS
 GPU2\tCNS\tCNS\tX

Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
"""


def _smi(fixtures: Path, p2p: bool = True, query: bool = True):
    """A fake nvidia-smi answering the two queries detect asks."""

    def run(args: tuple[str, ...]) -> str | None:
        if args == P2P_QUERY and p2p:
            return P2P_3GPU
        if args == GPU_QUERY and query:
            return (fixtures / QUERY).read_text()
        return None

    return run


def _no_probe() -> dict:
    return {"error": "no CUDA driver", "devices": [], "access": []}


def _probe(access: list[list[bool]]):
    buses = ["00000000:18:00.0", "00000000:19:00.0", "00000000:81:00.0"]
    devices = [{"pci_bus_id": b, "uuid": f"GPU-{i}"} for i, b in enumerate(buses)]
    return lambda: {"error": "", "devices": devices, "access": access}


def test_detect_probes_p2p_with_cuda_then_nvidia_smi(tmp_path, fixtures) -> None:
    sys_root = _fake_sys(tmp_path)
    every = [[True] * 3 for _ in range(3)]
    found = detect(sys_root, probe=_probe(every), nvidia_smi=_smi(fixtures))
    assert found.topology.p2p and "CUDA probe" in found.p2p
    assert found.links.startswith("sysfs") and "nvidia-smi" not in found.links
    assert {d.up_gbs for d in found.topology.node.gpus} == {64.0, 32.0}  # read, not assumed
    assert not found.topology.gdr and "nvidia_peermem" in found.gdr  # a NIC, no module
    partial = [[True, True, False], [True, True, False], [False, False, True]]
    found = detect(sys_root, probe=_probe(partial), nvidia_smi=_smi(fixtures))
    assert not found.topology.p2p and any("no peer access" in n for n in found.notes)
    # the probe fails: nvidia-smi topo -p2p r
    found = detect(sys_root, probe=_no_probe, nvidia_smi=_smi(fixtures))
    assert not found.topology.p2p and found.p2p == "nvidia-smi topo -p2p r"
    with pytest.raises(TopologyError, match=r"no CUDA driver.*pass --p2p or --no-p2p"):
        detect(sys_root, probe=_no_probe, nvidia_smi=_smi(fixtures, p2p=False))
    given = detect(sys_root, p2p=True, gdr=True, probe=_no_probe, nvidia_smi=lambda a: None)
    assert given.topology.p2p and given.topology.gdr and given.p2p == "given (--p2p)"
    (sys_root / "module" / "nvidia_peermem").mkdir(parents=True)
    assert detect(sys_root, p2p=True, nvidia_smi=lambda a: None).topology.gdr


def test_detect_reads_missing_link_speeds_from_nvidia_smi(tmp_path, fixtures) -> None:
    sys_root = _fake_sys(tmp_path)
    for f in sys_root.rglob("max_link_speed"):
        if "pci0000:80" in str(f):
            f.unlink()  # sysfs gives no speed for the GPU on socket 1 nor its root port
    with pytest.raises(TopologyError, match=r"no link speed for 1 device.*--pcie-gen"):
        detect(sys_root, p2p=True, nvidia_smi=_smi(fixtures, query=False))
    found = detect(sys_root, p2p=True, nvidia_smi=_smi(fixtures))
    assert "pcie.link.gen.max (Gen4 x16" in found.links
    assert found.topology.node.gpus[2].up_gbs == 32.0
    stated = detect(sys_root, p2p=True, pcie_gen=3, nvidia_smi=_smi(fixtures, query=False))
    assert stated.topology.node.gpus[2].up_gbs == 16.0 and "--pcie-gen 3" in stated.links


def test_detect_without_gpus_says_so(tmp_path, capsys) -> None:
    _device(tmp_path, ["0000:00", "0000:00:1c.0", "0000:01:00.0"], "0x020000", "0x8086", 0)
    with pytest.raises(TopologyError, match="this machine has no NVIDIA GPU"):
        detect(tmp_path)
    out = tmp_path / "node.json"
    assert main(["topo", "detect", "--sys-root", str(tmp_path), "-o", str(out)]) == 2
    assert "this machine has no NVIDIA GPU" in capsys.readouterr().err and not out.exists()


def test_cli_topo_detect_writes_a_spec(tmp_path, capsys) -> None:
    sys_root = _fake_sys(tmp_path / "sys")
    out = tmp_path / "node.json"
    argv = ["topo", "detect", "--sys-root", str(sys_root), "-o", str(out), "--no-p2p"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpus"] == 3 and doc["nics"] == 1 and doc["p2p"] is False
    assert doc["sources"]["p2p"] == "given (--no-p2p)"
    topo = load_topology(out)
    assert topo.fingerprint == doc["fingerprint"] and not topo.p2p and not topo.assumed
    assert main([*argv, "--nodes", "2"]) == 0
    text = capsys.readouterr().out
    assert "x 2, 3 GPUs" in text and "peer-to-peer off, from given" in text
    assert load_topology(out).nodes == 2


# ----- configure on the user's machine -------------------------------------------------------
def test_configure_on_gpus_plans_for_this_machine(monkeypatch, fixtures) -> None:
    if jax.device_count() < 8:
        pytest.skip("needs 8 host devices (XLA_FLAGS)")
    node = load_topology(fixtures / L40S, pcie_gen=4, p2p=False)  # 4 GPUs, 2 NICs
    monkeypatch.setattr(op_config, "_on_gpus", lambda: True)
    monkeypatch.setitem(op_config._detected, 0, node)
    try:
        cfg = op_config.configure()  # 8 devices: two such nodes
        assert cfg.topology.nodes == 2 and cfg.topology.node == node.node
        monkeypatch.setattr(op_config, "_current", None)  # no configure: the op's own default
        monkeypatch.setattr(op_config, "_defaults", {})
        assert op_config.current_config(8).topology.fingerprint == cfg.topology.fingerprint
        assert op_config.configure(devices=8).topology.name == "r5080-bf3"  # devices= named
        monkeypatch.setitem(op_config._detected, 0, preset("fig1"))  # 6 GPUs: 8 is no multiple
        with pytest.raises(VarioPathError, match=r"has 6 GPUs.*variopath topo detect"):
            op_config.configure()
    finally:
        monkeypatch.undo()
        op_config.configure(devices=8)  # back to the default for the other tests
    with pytest.raises(VarioPathError, match=r"16 ranks but devices=8.*variopath topo detect"):
        op_config.configure("l20-cx7", devices=8)
