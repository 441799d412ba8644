"""Whether a kernel on one GPU may store into another's buffer, or the CUDA backend copies with
cudaMemcpyPeerAsync (issue 52 item 2; ffi/cuda/peer_access.h). cudaDeviceEnablePeerAccess covers
cudaMalloc memory only: pool memory (XLA's cuda_async allocator) needs its pool's grant and a VMM
mapping its own; a kernel storing there without it faults. On a GPU the facts come from
cudaPointerGetAttributes and the driver (once per buffer address); here, the decision on them."""

from __future__ import annotations

import pytest

from variopath_jax import _native

HOST, DEVICE, MANAGED, PAGEABLE, UNKNOWN = 1, 2, 3, 0, -1
RW, READ, NONE = 3, 1, 0


def decide(kind=DEVICE, owner=1, allocation="plain", access=-1, writer=0, peer=True):
    return _native.peer_write_decision(kind, owner, allocation, access, writer, peer)


@pytest.mark.parametrize(
    ("facts", "direct", "says"),
    [
        ({"owner": 0}, True, "own memory"),
        ({"owner": 0, "allocation": "pool", "access": NONE}, True, "own memory"),
        ({}, True, "cudaMalloc memory, peer access enabled from device 0"),
        ({"peer": False}, False, "no peer access to device 1"),
        ({"peer": False, "allocation": "pool", "access": RW}, False, "no peer access"),
        ({"allocation": "pool", "access": RW}, True, "pool grants device 0 read-write"),
        ({"allocation": "pool", "access": READ}, False, "cudaMemPoolSetAccess"),
        ({"allocation": "pool", "access": NONE}, False, "does not cover pools"),
        ({"allocation": "pool", "access": -1}, False, "peer copy"),
        ({"allocation": "vmm", "access": RW}, True, "VMM memory mapped read-write"),
        ({"allocation": "vmm", "access": NONE}, False, "cuMemSetAccess"),
        ({"allocation": "unknown"}, False, "unknown allocation kind"),
        ({"kind": UNKNOWN}, False, "could not be read"),
        ({"kind": PAGEABLE}, False, "pageable host memory"),
        ({"kind": HOST}, False, "pinned host memory"),
        ({"kind": MANAGED}, False, "managed memory"),
    ],
)
def test_the_decision_on_each_kind_of_memory(facts: dict, direct: bool, says: str) -> None:
    got = decide(**facts)
    assert got["direct"] is direct, got
    assert says in got["why"], got
    assert got["why"].endswith("direct stores" if direct else "peer copy"), got


def test_bad_facts_are_refused() -> None:
    with pytest.raises(ValueError, match="allocation one of"):
        decide(allocation="slab")
    with pytest.raises(ValueError, match="cudaMemoryType"):
        decide(kind=7)
