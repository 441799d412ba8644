"""The posted-write trigger probe (DESIGN.md "Network model"; research/contention-evidence.md
"The posted-write collapse"): which situations to measure on a node, and the factor they give.

A *situation* is an uplink into a CPU root port (a switch's uplink, or a directly attached
GPU's own link) and two other root complexes ``a`` and ``b`` with GPUs. It is measured by four
experiments of two concurrent flows, every flow leaving a GPU behind the uplink (two different
GPUs where the uplink has two):

- ``push_one_root``: both flows written (by their senders) into GPUs of ``a``;
- ``push_two_roots``: one written into a GPU of ``a``, one into a GPU of ``b``;
- ``pull_one_root``, ``pull_two_roots``: the same copies, read by their receivers.

Without the trigger, both push experiments fill the uplink (fair sharing); with it, the second
collapses the uplink to a fraction of its capacity. The trigger's factor is the two-roots
aggregate over the one-root aggregate of the pushes, clipped to (0, 1] (1: no collapse), the
median over the situations measured; the pulls, which never trigger on the published machines,
are the control (the fit: :func:`~variopath_jax.profile.fit.fit_trigger`). One representative of
every distinct situation (how many GPUs send, the path classes to ``a`` and ``b``) is measured
first, then more of each in turn, up to the plan's limit.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

from variopath_jax.topology.model import Topology

EXPERIMENTS = ("push_one_root", "push_two_roots", "pull_one_root", "pull_two_roots")


@dataclass(frozen=True)
class Flow:
    """One flow of a probe: GPU ``src`` to GPU ``dst`` (indices into the node's GPUs), pushed
    (written by ``src``) or pulled (read by ``dst``)."""

    src: int
    dst: int
    pull: bool


@dataclass(frozen=True)
class Situation:
    """An uplink (the device on its root port), its own root complex, the two other root
    complexes ``roots``, the (source, destination) GPU pairs of the one-root and two-roots
    experiments, and ``kind``: what makes it distinct (sending GPUs, path classes to a and b)."""

    uplink: str
    root_complex: str
    roots: tuple[str, str]
    one_root: tuple[tuple[int, int], tuple[int, int]]
    two_roots: tuple[tuple[int, int], tuple[int, int]]
    kind: str

    def experiments(self) -> dict[str, list[Flow]]:
        """The four experiments' flows."""
        return {
            f"{way}_{which}": [Flow(s, d, way == "pull") for s, d in pairs]
            for way in ("push", "pull")
            for which, pairs in (("one_root", self.one_root), ("two_roots", self.two_roots))
        }

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["roots"] = list(self.roots)
        out["one_root"] = [list(p) for p in self.one_root]
        out["two_roots"] = [list(p) for p in self.two_roots]
        return out


def situations(topo: Topology, limit: int) -> tuple[list[Situation], str]:
    """Up to ``limit`` situations of ``topo``'s node (one representative of every distinct kind
    first), and a note: why there are none, or empty."""
    node = topo.node
    gpus = [d.name for d in node.gpus]
    if not topo.p2p:
        return [], "P2P between the GPUs is off in this topology: nothing to push or pull"
    ports: dict[str, list[int]] = {}
    complexes: dict[str, list[int]] = {}
    for i, name in enumerate(gpus):
        ports.setdefault(node.root_port_of(name), []).append(i)
        complexes.setdefault(node.root_complex_of(name), []).append(i)
    if len(complexes) < 3:
        names = ", ".join(complexes) or "none"
        return [], (
            f"{len(complexes)} root complex(es) with GPUs ({names}): the probe needs an uplink "
            "and two other root complexes with GPUs, 3 in all; the trigger factor is left unset"
        )
    groups: dict[str, list[Situation]] = {}
    for port, below in ports.items():
        own = node.root_complex_of(port)
        s1, s2 = below[0], below[1] if len(below) > 1 else below[0]
        others = [rc for rc in complexes if rc != own]
        for a, b in itertools.combinations(others, 2):
            da, db = complexes[a], complexes[b]
            a2 = da[1] if len(da) > 1 else da[0]
            rel = sorted(
                (node.relation(gpus[s1], gpus[da[0]]), node.relation(gpus[s2], gpus[db[0]]))
            )
            kind = f"{len({s1, s2})} sending GPU(s) on the uplink; to a {rel[0]}, to b {rel[1]}"
            groups.setdefault(kind, []).append(
                Situation(
                    port, own, (a, b), ((s1, da[0]), (s2, a2)), ((s1, da[0]), (s2, db[0])), kind
                )
            )
    chosen: list[Situation] = []
    for batch in itertools.zip_longest(*groups.values()):
        chosen += [s for s in batch if s is not None]
    return chosen[: max(0, limit)], ""
