"""`nvidia-smi topo -m` parsing, the exact round trip of its relation matrix, and bad input."""

from __future__ import annotations

import pytest

from variopath_jax.errors import ParseError
from variopath_jax.topology import PRESETS, LinkDefaults, PathModel, load_topology, nvsmi, preset
from variopath_jax.topology.model import render_relation

FILES = [
    "nvsmi_4090x8_dualroot.txt",
    "nvsmi_l40s_4gpu_nic_legend.txt",
    "nvsmi_p40x8_soc.txt",
    "nvsmi_nvlink_pairs_mlx5_columns.txt",
    "nvsmi_8gpu_4nic_node.txt",
    "nvsmi_4gpu_1nic_no_nic_legend.txt",
]


def _rederived(topo) -> list[list[str]]:
    """The GPU+NIC relation matrix re-derived from a parsed model."""
    node = topo.node
    names = [d.name for d in node.gpus] + [d.name for d in node.nics]
    n_gpu = len(node.gpus)
    return [
        [
            render_relation(node, a, b) if i < n_gpu and j < n_gpu else node.relation(a, b)
            for j, b in enumerate(names)
        ]
        for i, a in enumerate(names)
    ]


@pytest.mark.parametrize("name", FILES)
def test_round_trip_reproduces_the_input_matrix(name: str, fixtures) -> None:
    text = (fixtures / name).read_text()
    mat = nvsmi.parse_matrix(text, name)
    topo = nvsmi.parse(text, name)
    assert _rederived(topo) == mat.relations
    # and the model's own GPU x GPU / GPU x NIC views agree with the input blocks
    n = len(mat.gpus)
    assert topo.relations() == [row[:n] for row in mat.relations[:n]]
    assert topo.nic_relations() == [row[n:] for row in mat.relations[:n]]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_render_then_parse_preserves_classes(name: str) -> None:
    topo = preset(name)
    parsed = nvsmi.parse(nvsmi.render(topo), name)
    assert parsed.relations() == topo.relations()
    assert parsed.nic_relations() == topo.nic_relations()
    assert [d.label for d in parsed.node.nics] == [d.name for d in topo.node.nics]


def test_legend_and_columns(fixtures) -> None:
    mat = nvsmi.parse_matrix((fixtures / "nvsmi_l40s_4gpu_nic_legend.txt").read_text())
    assert mat.nics == ["NIC0", "NIC1"] and mat.nic_names == ["mlx5_0", "mlx5_1"]
    assert mat.numa == [0, 0, 1, 1]
    mat = nvsmi.parse_matrix((fixtures / "nvsmi_nvlink_pairs_mlx5_columns.txt").read_text())
    assert mat.nic_names == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    mat = nvsmi.parse_matrix((fixtures / "nvsmi_p40x8_soc.txt").read_text())
    assert mat.relations[0][4] == "SYS" and mat.numa == [None] * 8


def test_structure_of_parsed_models(fixtures) -> None:
    topo = nvsmi.parse((fixtures / "nvsmi_8gpu_4nic_node.txt").read_text())
    kinds = [d.kind for d in topo.node.devices]
    assert kinds.count("cpu") == 2 and kinds.count("hostbridge") == 4 and kinds.count("switch") == 4
    model = PathModel(topo)
    assert [list(g) for g in model.groups] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    nv = nvsmi.parse((fixtures / "nvsmi_nvlink_pairs_mlx5_columns.txt").read_text())
    assert nv.node.nvlinks("gpu0", "gpu1") == 4 and nv.node.nvlinks("gpu0", "gpu2") == 0
    model = PathModel(nv)
    assert model.group_size == 1  # NVLink-bonded GPUs are not interchangeable
    classes = {r.cls for r in model.routes(0, 1)}
    assert "NV4" in classes


def test_link_speed_options_apply(fixtures, tmp_path) -> None:
    path = fixtures / "nvsmi_l40s_4gpu_nic_legend.txt"
    topo = load_topology(path, defaults=LinkDefaults(pcie_gen=4, nic_gbps=200))
    gpu = topo.node.gpus[0]
    assert gpu.up_gbs == 32.0
    assert {n.nic_gbps for n in topo.node.nics} == {200.0}
    assert load_topology(path, nodes=3).nodes == 3


BASE = (
    "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tPIX\tPIX\t0-7\t0\n"
    "GPU1\tPIX\t X \tPIX\t0-7\t0\n"
    "NIC0\tPIX\tPIX\t X \n"
    "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
)


def test_base_text_parses() -> None:
    topo = nvsmi.parse(BASE)
    assert topo.gpus_per_node == 2 and topo.nics_per_node == 1


def test_nic_columns_without_a_legend_are_named_as_printed(fixtures) -> None:
    """Single-NIC hosts often print NIC0 columns and no NIC Legend block: accepted, the NICs
    named as printed, and a note says so; with the legend the same matrix names the device."""
    notes: list[str] = []
    path = fixtures / "nvsmi_4gpu_1nic_no_nic_legend.txt"
    topo = load_topology(path, notes=notes, pcie_gen=5, p2p=True)  # nothing else assumed
    assert topo.gpus_per_node == 4 and [d.label for d in topo.node.nics] == ["NIC0"]
    assert topo.nic_relations()[0] == ["PIX"] and topo.nic_relations()[2] == ["NODE"]
    assert len(notes) == 1 and "no 'NIC Legend:' block" in notes[0] and "NIC0" in notes[0]
    bare = BASE.replace("\nNIC Legend:\n\n  NIC0: mlx5_0\n", "")
    assert nvsmi.parse_matrix(bare).nic_names == ["NIC0"]
    assert nvsmi.parse_matrix(BASE).nic_names == ["mlx5_0"] and not nvsmi.parse_matrix(BASE).notes
    assert nvsmi.parse(bare).fingerprint == nvsmi.parse(BASE).fingerprint  # names are cosmetic


@pytest.mark.parametrize(
    "text, message",
    [
        (
            BASE.replace("GPU1\tPIX\t X \tPIX\t0-7\t0\n", "GPU1\tPIX\t X \n"),
            r"line 3: row GPU1 has 2 entries, expected 3",
        ),
        (
            BASE.replace("GPU1\tPIX\t X \tPIX", "GPU1\tPIX\t X \tQPI"),
            r"line 3: unknown class code 'QPI'",
        ),
        (BASE.replace("NIC0\tPIX\tPIX\t X \n", ""), "not square: .* rows missing for NIC0"),
        (
            BASE.replace("GPU0\t X \tPIX\tPIX", "GPU0\t X \tPXB\tPIX"),
            "not symmetric: GPU0/GPU1 is PXB",
        ),
        (BASE.replace("GPU0\t X ", "GPU0\tPIX"), "diagonal entry of GPU0 must be X"),
        ("hello\nworld\n", "no header line"),
        (
            BASE.replace("NIC0\tPIX\tPIX\t X \n", "NIC0\tPIX\tPIX\t X \nGPU9\tPIX\n"),
            "row 'GPU9' is not one of",
        ),
    ],
)
def test_bad_matrices_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        nvsmi.parse(text, "bad.txt")


def test_inconsistent_matrix_is_rejected() -> None:
    # GPU0-GPU1 PIX and GPU1-GPU2 PIX force GPU0-GPU2 PIX; SYS there is impossible
    text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tSYS\nGPU1\tPIX\t X \tPIX\nGPU2\tSYS\tPIX\t X \n"
    with pytest.raises(ParseError, match="inconsistent matrix"):
        nvsmi.parse(text, "bad.txt")


@pytest.mark.parametrize("name", FILES)
def test_root_ports_stay_their_own_root_complexes(name: str, fixtures) -> None:
    """PHB does not prove a shared root complex: every root port keeps the default (its own)."""
    node = nvsmi.parse((fixtures / name).read_text(), name).node
    assert not any(d.root_complex for d in node.devices)
    ports = [d.name for d in node.devices if d.kind in ("switch", "gpu", "nic")]
    ports = [p for p in ports if node.by_name[node.by_name[p].parent].kind in ("cpu", "hostbridge")]
    assert node.root_complexes == tuple(ports)
