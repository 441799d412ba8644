// Control of the CPU stand-in for the CUDA runtime (runtime.cc; issue 52 item 6): the machine
// it pretends to be, the allocation kinds XLA may hand the handlers, and the faults it injects or
// saw. Tests only: linked into the `_native_cuda_standin` test module, never into `_native`.
//
// What the stand-in models: devices (a current device per host thread), device memory (host
// memory in POSIX shared-memory segments, tagged with its device and allocation kind: cudaMalloc,
// a stream-ordered pool with per-device access, a VMM mapping with per-device access), pinned
// and registered host memory, streams (a thread each, running its operations in order after a
// random delay), events (a record completes when its stream reaches it; a wait waits for the
// record enqueued before it; a query of an incomplete one leaves cudaErrorNotReady as the
// thread's last error), peer access (which devices may access which, enabled per process), IPC
// handles (a segment's name, mapped by the peer process), kernels by their host twins (the
// batched and paced copies run copy_split.h's per-thread code over the launch's thread grid).
// A kernel that touches memory its device may not (a peer's cudaMalloc memory without peer
// access enabled, pool or VMM memory not granted, pageable host memory, outside any allocation)
// is an illegal address: the device's error becomes sticky, as on a GPU, and the fault is kept
// for the test to read.
//
// What it does not model (the tests say so too): the driver's timing (copy engines, bandwidth,
// PCIe contention, the posted-write trigger), memory consistency beyond what its mutexes give
// (a GPU's weaker ordering between streams without events), CUDA-graph capture, the legacy
// default stream's implicit synchronisation, cudaFree's implicit device synchronisation, a
// peer's use of an IPC mapping after its owner freed it, and NCCL.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace variopath::standin {

// The machine: `devices` GPUs, peer[a][b]: whether device a can access device b's memory
// (cudaDeviceCanAccessPeer; empty: every pair can); `max_delay_s`: each stream operation waits
// up to this long first (seeded by `seed` and the stream); `readonly_register`: whether
// cudaHostRegister accepts cudaHostRegisterReadOnly (some drivers refuse it). Peer access enabled
// before is forgotten; existing memory, streams and events stay.
void configure(int devices, const std::vector<std::vector<bool>>& peer, uint64_t seed, double max_delay_s,
               bool readonly_register);

// Fault injection: the streams of `device` run `after` more operations each, then never run
// another (a wedged GPU): their events never complete. -1: no device.
void wedge(int device, int64_t after);

// Illegal accesses seen so far (kernels touching memory their device may not), oldest first.
std::vector<std::string> faults();

// What the calls so far did, by name: peer_access_enabled, peer_copy (cudaMemcpyPeerAsync),
// ipc_export, ipc_open, host_register, host_register_refused, event_not_ready (polls of an
// incomplete event) and each kernel twin launched (batched_copy_kernel, paced_copy_kernel,
// stamp_kernel, hold_kernel), and launch_saw_stale_error (a launch found the thread's last error
// set after check.h's clear: a stale error would be reported as the launch's).
std::map<std::string, int64_t> counters();

// Operations each stream has run so far, summed per device (tests: that work went where it should).
std::vector<int64_t> operations();

// How XLA's buffers are allocated: cudaMalloc, a stream-ordered pool or a VMM mapping; pool and
// VMM memory grant read-write access to their own device and to `granted` devices only.
enum class Kind : int { kPlain = 0, kPool = 1, kVmm = 2 };
void* allocate(int device, size_t bytes, Kind kind, const std::vector<int>& granted);
void release(void* ptr);

// Unlink every shared-memory segment of this process's device memory (its names go; mappings
// stay valid). Also at exit; a process that leaves by os._exit calls it first.
void unlink_segments();

}  // namespace variopath::standin
