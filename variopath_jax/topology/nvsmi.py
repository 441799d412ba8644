"""``nvidia-smi topo -m`` text: parse it into a node, and render a node back as such text.

The matrix gives, for every pair of GPUs and NICs, the class of the PCIe route between them
(research/topology-formats.md §1). The parser rebuilds the coarsest tree that reproduces every
class exactly:

- SYS separates CPU sockets (NUMA nodes); SOC, the old legend's name, is read as SYS;
- NODE separates host bridges of one socket;
- PHB separates switch trees (or root-port devices) under one host bridge;
- PXB separates leaf switches of one switch tree (one upper switch is synthesised above them);
- PIX joins devices of one leaf switch (a dual-port NIC shows as two NICs PIX to each other).
- ``NV#`` pairs get an NVLink bond of # links; they constrain nothing else.

Deeper cascades collapse to two switch levels: the relation matrix cannot tell them apart.

Neither the PCIe generation nor GPU peer-to-peer is in ``topo -m``'s matrix. The text may carry
them in two more blocks, which ``variopath topo detect`` writes and a user may append:
``nvidia-smi topo -p2p r`` (a matrix of OK / NS / CNS / GNS / TNS / U per GPU pair: P2P is on
when every pair is OK) and ``nvidia-smi --query-gpu=pci.bus_id,pcie.link.gen.max,
pcie.link.width.max --format=csv`` (the slowest GPU's generation and width rate every link).
Where neither the text nor the caller (``pcie_gen=``, ``p2p=``; ``--pcie-gen``, ``--p2p`` on the
command line) says, the value of :class:`LinkDefaults` (Gen5, P2P on) is *assumed*: the topology
lists it in ``Topology.assumed`` and an :class:`~variopath_jax.errors.AssumedTopologyWarning`
names it.

Root complexes: NODE puts two devices under different host bridges, and so different root
complexes, which every root port being its own already says; PHB does not prove that two root
ports share one (this module renders every pair of root ports of a socket PHB, and the per-port
assumption is the one that fits NVIDIA/nccl#1603). So every root port stays its own root complex
(``Device.root_complex`` empty, the model's default and the safe one for the posted-write
trigger); sysfs discovery reads the real ``pci0000:XX`` buses.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from dataclasses import dataclass

from variopath_jax.errors import AssumedTopologyWarning, ParseError
from variopath_jax.topology.model import Device, Link, NodeSpec, Topology, render_relation
from variopath_jax.topology.presets import pcie_gbs

PCIE_CLASSES = ("PIX", "PXB", "PHB", "NODE", "SYS")
_RANK = {c: i for i, c in enumerate(PCIE_CLASSES)}
_NV = re.compile(r"^NV(\d+)$")
_GPU = re.compile(r"^GPU(\d+)$")
_NIC_COLUMN = re.compile(r"^NIC(\d+)$")
_LEGEND_ENTRY = re.compile(r"^\s*NIC(\d+)\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class LinkDefaults:
    """Link speeds for sources that do not carry them.

    Defaults: PCIe Gen5 x16 (64 GB/s nominal per direction), 400 Gb/s NICs, a 64 GB/s
    inter-socket link (as the presets), 128 GB/s between a host bridge and its socket's fabric,
    25 GB/s per NVLink per direction.
    """

    pcie_gen: int = 5
    pcie_width: int = 16
    nic_gbps: float = 400.0
    inter_socket_gbs: float = 64.0
    host_bridge_gbs: float = 128.0
    nvlink_gbs: float = 25.0

    @property
    def pcie(self) -> float:
        return pcie_gbs(self.pcie_gen, self.pcie_width)


@dataclass(frozen=True)
class TopoMatrix:
    """The parsed content of one ``topo -m`` output."""

    gpus: list[str]  # column names, GPU0..
    nics: list[str]  # column names as printed (NIC0.. or mlx5_0..)
    nic_names: list[str]  # RDMA device names (from the legend, or the column names themselves)
    relations: list[list[str]]  # over gpus + nics, "X" on the diagonal, SOC normalised to SYS
    numa: list[int | None]  # NUMA affinity per GPU, None when absent or N/A
    notes: tuple[str, ...] = ()  # what the text left to assumption (e.g. no NIC Legend block)


def looks_like_topo_m(text: str) -> bool:
    """True when the text has a ``topo -m`` header line (``GPU0 GPU1 ...``)."""
    return any(line.split()[:1] == ["GPU0"] for line in text.splitlines()[:60])


def parse_matrix(text: str, source: str = "topo -m") -> TopoMatrix:
    """Parse the relation matrix, the NIC legend and the NUMA affinity column."""
    lines = text.splitlines()
    header_no = next(
        (
            i
            for i, line in enumerate(lines)
            if line.split()[:1] and _GPU.match(line.split()[0]) and "X" not in line.split()
        ),
        None,
    )
    if header_no is None:
        raise ParseError(source, "", "no header line with GPU0... columns found")
    header = lines[header_no].split()
    columns: list[str] = []
    for tok in header:
        if tok in ("CPU", "NUMA", "GPU", "Affinity", "ID") and columns:
            break
        columns.append(tok)
    extras = header[len(columns) :]
    has_numa = (
        "NUMA" in extras
        and extras.index("NUMA") + 1 < len(extras)
        and extras[extras.index("NUMA") + 1] == "Affinity"
    )
    has_cpu = "CPU" in extras
    has_gpu_numa = " ".join(extras).endswith("GPU NUMA ID")
    gpus = [c for c in columns if _GPU.match(c)]
    nics = [c for c in columns if not _GPU.match(c)]
    if columns[: len(gpus)] != gpus or [f"GPU{i}" for i in range(len(gpus))] != gpus:
        raise ParseError(
            source,
            f"line {header_no + 1}",
            f"GPU columns must be GPU0..GPU{len(gpus) - 1} first, got {columns}",
        )

    rows: dict[str, tuple[int, list[str]]] = {}
    for no in range(header_no + 1, len(lines)):
        toks = lines[no].split()
        if not toks:
            if rows:
                break
            continue
        if toks[0].rstrip(":") in ("Legend", "NIC"):
            break
        name = toks[0]
        if name not in columns:
            raise ParseError(
                source,
                f"line {no + 1}",
                f"row {name!r} is not one of the header's columns {columns}",
            )
        if name in rows:
            raise ParseError(source, f"line {no + 1}", f"row {name!r} appears twice")
        rows[name] = (no + 1, toks[1:])
    missing = [c for c in columns if c not in rows]
    if missing:
        raise ParseError(
            source,
            "",
            f"matrix is not square: header names {len(columns)} devices, rows missing for {', '.join(missing)}",
        )

    n = len(columns)
    relations: list[list[str]] = []
    numa: list[int | None] = []
    for name in columns:
        line_no, toks = rows[name]
        where = f"line {line_no}"
        cells = toks[:n]
        if len(cells) < n:
            raise ParseError(
                source, where, f"row {name} has {len(cells)} entries, expected {n} (truncated?)"
            )
        for j, cell in enumerate(cells):
            cell = "SYS" if cell == "SOC" else cell
            if cell != "X" and cell not in _RANK and not _NV.match(cell):
                raise ParseError(
                    source, where, f"unknown class code {cells[j]!r} in column {columns[j]}"
                )
            cells[j] = cell
        if cells[columns.index(name)] != "X":
            raise ParseError(
                source,
                where,
                f"diagonal entry of {name} must be X, got {cells[columns.index(name)]!r}",
            )
        if "X" in cells[: columns.index(name)] + cells[columns.index(name) + 1 :]:
            raise ParseError(source, where, f"row {name} has X off the diagonal")
        relations.append(cells)
        rest = toks[n:]
        if _GPU.match(name):
            expected = int(has_cpu) + int(has_numa) + int(has_gpu_numa)
            if len(rest) > expected:
                raise ParseError(
                    source,
                    where,
                    f"row {name} has {n + len(rest)} entries, expected {n} relations and {expected} affinity columns",
                )
            numa_value = rest[int(has_cpu)] if has_numa and len(rest) > int(has_cpu) else "N/A"
            numa.append(int(numa_value) if numa_value.isdigit() else None)
        elif rest:
            raise ParseError(source, where, f"NIC row {name} has {len(rest)} extra entries")
    for i in range(n):
        for j in range(i + 1, n):
            if relations[i][j] != relations[j][i]:
                raise ParseError(
                    source,
                    f"line {rows[columns[i]][0]}",
                    f"matrix is not symmetric: {columns[i]}/{columns[j]} is {relations[i][j]} "
                    f"but {columns[j]}/{columns[i]} is {relations[j][i]}",
                )
    nic_names, notes = _nic_names(lines, nics, source)
    return TopoMatrix(gpus, nics, nic_names, relations, numa, notes)


def _nic_names(lines: list[str], nics: list[str], source: str) -> tuple[list[str], tuple[str, ...]]:
    """The RDMA device name of every NIC column, and a note when the text does not give them."""
    numbered = [c for c in nics if _NIC_COLUMN.match(c)]
    if not numbered:
        return list(nics), ()
    if len(numbered) != len(nics):
        raise ParseError(source, "header", f"NIC columns mix NICk names with device names: {nics}")
    legend: dict[str, str] = {}
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("NIC Legend")), None)
    if start is None:  # common on single-NIC hosts: the columns are all there is
        span = nics[0] if len(nics) == 1 else f"{nics[0]}..{nics[-1]}"
        note = (
            f"{source}: no 'NIC Legend:' block names the devices of NIC columns {span}; "
            "the NICs are named as printed"
        )
        return list(nics), (note,)
    for no in range(start + 1, len(lines)):
        m = _LEGEND_ENTRY.match(lines[no])
        if m:
            legend[f"NIC{m.group(1)}"] = m.group(2)
        elif lines[no].strip() and legend:
            break
    missing = [c for c in nics if c not in legend]
    if missing:
        raise ParseError(
            source, f"line {start + 1}", f"NIC Legend does not name {', '.join(missing)}"
        )
    return [legend[c] for c in nics], ()


# `nvidia-smi topo -p2p r|w` statuses: OK, chipset / GPU / topology not supported, not supported,
# unknown
P2P_STATUSES = ("OK", "CNS", "GNS", "TNS", "NS", "U")


@dataclass(frozen=True)
class Extras:
    """What a text holds beyond the ``topo -m`` matrix: the P2P matrix (GPU pair -> status)
    and, per GPU of the query block, (PCI bus id or index, generation, width)."""

    p2p: dict[tuple[int, int], str] | None = None
    links: tuple[tuple[str, int, int], ...] = ()


def split_extras(text: str, source: str = "topo -m") -> tuple[str, Extras]:
    """``text`` without its P2P matrix block (``nvidia-smi topo -p2p r``, with its legend) and
    its GPU link query block (``--query-gpu=...pcie.link.gen.max,pcie.link.width.max
    --format=csv``), and what those blocks say."""
    lines = text.splitlines()
    keep = [True] * len(lines)
    p2p: dict[tuple[int, int], str] | None = None
    links: list[tuple[str, int, int]] = []
    i = 0
    while i < len(lines):
        toks = lines[i].split()
        if toks and all(_GPU.match(t) for t in toks) and _is_p2p_block(lines, i):
            p2p, i = _read_p2p(lines, i, toks, keep, source)
            continue
        if "pcie.link.gen.max" in lines[i]:
            i = _read_link_query(lines, i, keep, links, source)
            continue
        i += 1
    rest = "\n".join(line for line, k in zip(lines, keep, strict=True) if k)
    return rest, Extras(p2p, tuple(links))


def _is_p2p_block(lines: list[str], header: int) -> bool:
    """Whether the matrix under the header line ``header`` holds P2P statuses (not classes)."""
    row = next((ln.split() for ln in lines[header + 1 :] if ln.split()), [])
    cells = [c for c in row[1:] if c != "X"]
    return (
        bool(row)
        and _GPU.match(row[0]) is not None
        and bool(cells)
        and all(c in P2P_STATUSES for c in cells)
    )


def _read_p2p(
    lines: list[str], header: int, names: list[str], keep: list[bool], source: str
) -> tuple[dict[tuple[int, int], str], int]:
    n = len(names)
    status: dict[tuple[int, int], str] = {}
    keep[header] = False
    i = header + 1
    while i < len(lines):
        toks = lines[i].split()
        if not toks:
            if status:
                break
            keep[i] = False
            i += 1
            continue
        if not _GPU.match(toks[0]):
            break
        a = int(_GPU.match(toks[0]).group(1))
        cells = toks[1:]
        if len(cells) != n or not 0 <= a < n:
            raise ParseError(
                source, f"line {i + 1}", f"P2P row {toks[0]} has {len(cells)} entries, expected {n}"
            )
        for b, cell in enumerate(cells):
            if a != b and cell not in P2P_STATUSES:
                raise ParseError(
                    source,
                    f"line {i + 1}",
                    f"unknown P2P status {cell!r} (expected one of {', '.join(P2P_STATUSES)})",
                )
            if a != b:
                status[(a, b)] = cell
        keep[i] = False
        i += 1
    # its legend: "Legend:" then entries "OK = Status Ok" ... (the topo -m legend has no "Status")
    j = i
    while j < len(lines) and not lines[j].strip():
        j += 1
    if j < len(lines) and lines[j].strip() == "Legend:":
        end = j + 1
        while end < len(lines) and (not lines[end].strip() or "=" in lines[end]):
            end += 1
        if any("Status Ok" in ln for ln in lines[j:end]):
            for k in range(i, end):
                keep[k] = False
            i = end
    return status, i


def _read_link_query(
    lines: list[str], header: int, keep: list[bool], out: list, source: str
) -> int:
    columns = [c.strip() for c in lines[header].split(",")]
    try:
        gen_col = columns.index("pcie.link.gen.max")
        width_col = columns.index("pcie.link.width.max")
    except ValueError:
        raise ParseError(
            source,
            f"line {header + 1}",
            "a GPU query block needs the columns pcie.link.gen.max and pcie.link.width.max",
        ) from None
    keep[header] = False
    i = header + 1
    while i < len(lines) and lines[i].strip() and "," in lines[i]:
        cells = [c.strip() for c in lines[i].split(",")]
        if len(cells) != len(columns) or not (
            cells[gen_col].isdigit() and cells[width_col].isdigit()
        ):
            raise ParseError(
                source,
                f"line {i + 1}",
                f"GPU query row {lines[i].strip()!r}: expected {len(columns)} fields with the "
                "generation and width as numbers",
            )
        out.append((cells[0], int(cells[gen_col]), int(cells[width_col])))
        keep[i] = False
        i += 1
    return i


def parse(
    text: str,
    source: str = "topo -m",
    defaults: LinkDefaults = LinkDefaults(),
    nodes: int = 1,
    notes: list[str] | None = None,
    *,
    pcie_gen: int | None = None,
    p2p: bool | None = None,
) -> Topology:
    """Parse ``nvidia-smi topo -m`` text into a topology of ``nodes`` identical nodes;
    ``notes``, when given, receives what the text left to assumption.

    The PCIe generation and width come from the text's GPU query block, else ``pcie_gen`` (the
    width from ``defaults``); P2P from its P2P matrix, else ``p2p``. Where neither says,
    ``defaults``' generation and P2P on are assumed: ``Topology.assumed`` names them, and so
    does a note in ``notes`` when given, else an ``AssumedTopologyWarning``."""
    body, extras = split_extras(text, source)
    mat = parse_matrix(body, source)
    if notes is not None:
        notes.extend(mat.notes)
    assumed: list[str] = []
    if extras.links and len(extras.links) != len(mat.gpus):
        raise ParseError(
            source,
            "GPU query",
            f"lists {len(extras.links)} GPUs, but the topo -m matrix has {len(mat.gpus)}",
        )
    if extras.links:
        gens = sorted({g for _, g, _ in extras.links})
        widths = sorted({w for _, _, w in extras.links})
        defaults = dataclasses.replace(defaults, pcie_gen=gens[0], pcie_width=widths[0])
        if (len(gens) > 1 or len(widths) > 1) and notes is not None:
            notes.append(
                f"{source}: the GPUs' links differ (generations {gens}, widths {widths}); every "
                f"link is rated Gen{gens[0]} x{widths[0]}, the slowest"
            )
    elif pcie_gen is not None:
        defaults = dataclasses.replace(defaults, pcie_gen=pcie_gen)
    else:
        assumed.append(
            f"PCIe Gen{defaults.pcie_gen} x{defaults.pcie_width} links (the text gives no link "
            "generation: pass --pcie-gen / pcie_gen=, or append `nvidia-smi --query-gpu="
            "pci.bus_id,pcie.link.gen.max,pcie.link.width.max --format=csv`)"
        )
    n_gpu = len(mat.gpus)
    if extras.p2p is not None:
        p2p_on, blocked = _p2p_of(extras.p2p, n_gpu, source)
        if blocked and notes is not None:
            notes.append(
                f"{source}: no P2P between {len(blocked)} GPU pair(s) (first: GPU{blocked[0][0]}/"
                f"GPU{blocked[0][1]} {extras.p2p[blocked[0]]}): GPU-to-GPU traffic goes through "
                "host memory"
            )
    elif p2p is not None:
        p2p_on = p2p
    else:
        p2p_on = True
        assumed.append(
            "GPU peer-to-peer on (the text has no P2P matrix: pass --p2p / --no-p2p / p2p=, or "
            "append `nvidia-smi topo -p2p r`)"
        )
    node = _build_node(mat, defaults, source)
    topo = Topology(node, nodes, p2p=p2p_on, name=source, assumed=tuple(assumed))
    _check_round_trip(mat, node, source)
    if assumed:  # said once: as a note to a caller that collects them, else as a warning
        what = "; ".join(assumed)
        if notes is not None:
            notes.append(f"{source}: assumed {what}")
        else:
            warnings.warn(
                f"{source}: assumed {what}; `variopath topo detect` writes a spec of this "
                "machine with both probed",
                AssumedTopologyWarning,
                stacklevel=2,
            )
    return topo


def _p2p_of(
    status: dict[tuple[int, int], str], n_gpu: int, source: str
) -> tuple[bool, list[tuple[int, int]]]:
    """P2P on when every ordered GPU pair's status is OK; the pairs that are not."""
    pairs = [(a, b) for a in range(n_gpu) for b in range(n_gpu) if a != b]
    missing = [p for p in pairs if p not in status]
    if missing or len(status) != len(pairs):
        raise ParseError(
            source,
            "P2P matrix",
            f"covers {len({a for a, _ in status}) if status else 0} GPUs, but the topo -m "
            f"matrix has {n_gpu}",
        )
    blocked = [p for p in pairs if status[p] != "OK"]
    return not blocked, blocked


def _components(items: list[int], joined) -> list[list[int]]:
    """Connected components of ``items`` under the relation ``joined``, in first-seen order."""
    parent = {i: i for i in items}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for x, i in enumerate(items):
        for j in items[x + 1 :]:
            if joined(i, j):
                parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in items:
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def _build_node(mat: TopoMatrix, d: LinkDefaults, source: str) -> NodeSpec:
    rel = mat.relations
    n_gpu = len(mat.gpus)
    names = [f"gpu{i}" for i in range(n_gpu)] + [f"nic{k}" for k in range(len(mat.nics))]

    def within(limit: str):
        def joined(i: int, j: int) -> bool:
            cls = rel[i][j]
            return cls in _RANK and _RANK[cls] <= _RANK[limit]

        return joined

    devices: list[Device] = []
    leaves: list[Device] = []
    counter = {"sw": 0, "hb": 0}

    def new(prefix: str) -> str:
        name = f"{prefix}{counter[prefix]}"
        counter[prefix] += 1
        return name

    def attach(i: int, parent: str) -> None:
        if i < n_gpu:
            leaves.append(Device(names[i], "gpu", parent, d.pcie, d.pcie))
        else:
            k = i - n_gpu
            leaves.append(
                Device(
                    names[i],
                    "nic",
                    parent,
                    d.pcie,
                    d.pcie,
                    nic_gbps=d.nic_gbps,
                    label=mat.nic_names[k],
                )
            )

    sockets = _components(list(range(len(names))), within("NODE"))
    for s, socket in enumerate(sockets):
        numas = {mat.numa[i] for i in socket if i < n_gpu and mat.numa[i] is not None}
        cpu = f"cpu{s}"
        devices.append(Device(cpu, "cpu", numa=numas.pop() if len(numas) == 1 else s))
        bridges = _components(socket, within("PHB"))
        for bridge in bridges:
            root = cpu
            if len(bridges) > 1:
                root = new("hb")
                devices.append(
                    Device(root, "hostbridge", cpu, d.host_bridge_gbs, d.host_bridge_gbs)
                )
            for tree in _components(bridge, within("PXB")):
                if len(tree) == 1:
                    attach(tree[0], root)
                    continue
                top = new("sw")
                devices.append(Device(top, "switch", root, d.pcie, d.pcie))
                leaf_groups = _components(tree, within("PIX"))
                for leaf in leaf_groups:
                    parent = top
                    if len(leaf_groups) > 1:
                        parent = new("sw")
                        devices.append(Device(parent, "switch", top, d.pcie, d.pcie))
                    for i in leaf:
                        attach(i, parent)
    order = {name: k for k, name in enumerate(names)}
    devices += sorted(leaves, key=lambda dev: order[dev.name])
    links = [
        Link(cpu_a.name, cpu_b.name, d.inter_socket_gbs, d.inter_socket_gbs)
        for x, cpu_a in enumerate(devices)
        if cpu_a.kind == "cpu"
        for cpu_b in devices[x + 1 :]
        if cpu_b.kind == "cpu"
    ]
    for i in range(n_gpu):
        for j in range(i + 1, n_gpu):
            m = _NV.match(rel[i][j])
            if m:
                count = int(m.group(1))
                links.append(
                    Link(names[i], names[j], count * d.nvlink_gbs, count * d.nvlink_gbs, count)
                )
    try:
        return NodeSpec(tuple(devices), tuple(links))
    except Exception as err:  # a model error here is a parse error of this source
        raise ParseError(source, "", str(err)) from None


def _check_round_trip(mat: TopoMatrix, node: NodeSpec, source: str) -> None:
    """The rebuilt tree must reproduce every class of the input; else the input is inconsistent."""
    names = [d.name for d in node.gpus] + [d.name for d in node.nics]
    columns = mat.gpus + mat.nics
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            want = mat.relations[i][j]
            got = (
                render_relation(node, a, b)
                if i < len(mat.gpus) and j < len(mat.gpus)
                else node.relation(a, b)
            )
            if _NV.match(want) and not (i < len(mat.gpus) and j < len(mat.gpus)):
                raise ParseError(
                    source,
                    columns[i],
                    f"NVLink class {want} between {columns[i]} and {columns[j]}: only GPU pairs can be NVLink-bonded",
                )
            if got != want:
                raise ParseError(
                    source,
                    columns[i],
                    f"inconsistent matrix: no PCIe tree gives {columns[i]}/{columns[j]} = {want} "
                    f"together with the other entries (the nearest tree gives {got})",
                )


def render(topo: Topology) -> str:
    """One node of ``topo`` as ``nvidia-smi topo -m`` text (current legend, NIC legend)."""
    node = topo.node
    names = [d.name for d in node.gpus] + [d.name for d in node.nics]
    columns = [f"GPU{i}" for i in range(len(node.gpus))] + [
        f"NIC{k}" for k in range(len(node.nics))
    ]
    header = "\t" + "\t".join(columns) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    out = [header]
    for i, a in enumerate(names):
        cells = []
        for j, b in enumerate(names):
            if i == j:
                cells.append(" X ")
            elif i < len(node.gpus) and j < len(node.gpus):
                cells.append(render_relation(node, a, b))
            else:
                cells.append(node.relation(a, b))
        row = f"{columns[i]}\t" + "\t".join(cells)
        if i < len(node.gpus):
            numa = node.by_name[node.socket_of(a)].numa
            row += f"\tN/A\t{numa if numa is not None else 'N/A'}\t\tN/A"
        out.append(row)
    out += ["", "Legend:", ""]
    out += [
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
        "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
    ]
    if node.nics:
        out += ["", "NIC Legend:", ""]
        out += [f"  NIC{k}: {d.label or d.name}" for k, d in enumerate(node.nics)]
    # what topo -m lacks, as the blocks `parse` reads: P2P and each GPU's link
    gpus = [f"GPU{i}" for i in range(len(node.gpus))]
    cell = "OK" if topo.p2p else "NS"
    out += ["", "\t" + "\t".join(gpus)]
    out += [
        f"{g}\t" + "\t".join("X" if a == b else cell for b in range(len(gpus)))
        for a, g in enumerate(gpus)
    ]
    out += ["", "Legend:", "", "  X    = Self", "  OK   = Status Ok", "  NS   = Not supported"]
    rated = [_gen_width(d.up_gbs) for d in node.gpus]
    if all(r is not None for r in rated):
        out += ["", "index, pcie.link.gen.max, pcie.link.width.max"]
        out += [f"{i}, {g}, {w}" for i, (g, w) in enumerate(rated)]
    return "\n".join(out) + "\n"


def _gen_width(gbs: float) -> tuple[int, int] | None:
    """The x16 generation of a nominal rate (64 GB/s: Gen5 x16), else the widest match."""
    for width in (16, 8, 4, 32, 12, 2, 1):
        for gen in range(1, 8):
            if abs(pcie_gbs(gen, width) - gbs) < 1e-9:
                return gen, width
    return None
