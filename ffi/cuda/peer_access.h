// Whether a kernel on one GPU may write a buffer of another directly, or the bytes must go by
// cudaMemcpyPeerAsync (issue 52 item 2). cudaDeviceEnablePeerAccess grants a device access to
// its peer's cudaMalloc memory only: memory from a stream-ordered pool (cudaMallocAsync, XLA's
// cuda_async allocator) is reachable from a peer only where the pool grants it
// (cudaMemPoolSetAccess), and a virtual-memory mapping (cuMemCreate/cuMemMap, XLA's VMM modes)
// only where its mapping does (cuMemSetAccess); a kernel writing there faults with an illegal
// address. So the CUDA backend gathers each receiving buffer's facts once per address
// (cuda/cuda_streams.cc: cudaPointerGetAttributes; the pool and the legacy-IPC attribute of the
// pointer and the VMM mapping's access through the driver's entry points, no link to libcuda) and
// decides here. Pure, so that the decision is tested on CPU (_native.peer_write_decision).
#pragma once

#include <string>

namespace variopath::cuda {

// cudaMemoryType's values, and unknown (the attributes could not be read).
enum class MemoryKind : int { kUnknown = -1, kUnregistered = 0, kHost = 1, kDevice = 2, kManaged = 3 };

// How device memory was allocated: cudaMalloc (legacy IPC capable: peer access follows
// cudaDeviceEnablePeerAccess), a stream-ordered pool, a VMM mapping, or unknown.
enum class Allocation : int { kUnknown = 0, kPlain = 1, kPool = 2, kVmm = 3 };

struct BufferFacts {
  MemoryKind kind = MemoryKind::kUnknown;
  int owner = -1;  // the device holding it
  Allocation allocation = Allocation::kUnknown;
  int access = -1;  // pool or VMM: the writer's access flags there (0 none, 1 read, 3 read-write); -1 unknown
};

struct PeerWrite {
  bool direct = false;  // a kernel on the writer may store into it; else cudaMemcpyPeerAsync
  std::string why;
};

constexpr int kReadWrite = 3;  // cudaMemAccessFlagsProtReadWrite, CU_MEM_ACCESS_FLAGS_PROT_READWRITE

// May a kernel on device `writer` store into the buffer `f` describes? `peer_enabled`: the writer
// has peer access to the buffer's device (cudaDeviceEnablePeerAccess succeeded). When in doubt,
// no: a peer copy is slower than a kernel's stores but never faults.
inline PeerWrite decide_peer_write(const BufferFacts& f, int writer, bool peer_enabled) {
  const std::string w = "device " + std::to_string(writer);
  switch (f.kind) {
    case MemoryKind::kUnknown:
      return {false, "its attributes could not be read (cudaPointerGetAttributes): peer copy"};
    case MemoryKind::kUnregistered:
      return {false, "pageable host memory, which no kernel may store into: peer copy"};
    case MemoryKind::kHost:
    case MemoryKind::kManaged:
      return {false, std::string(f.kind == MemoryKind::kHost ? "pinned host" : "managed") +
                         " memory, not a device buffer the transport expects: peer copy"};
    case MemoryKind::kDevice:
      break;
  }
  const std::string where = "device " + std::to_string(f.owner) + "'s ";
  if (f.owner == writer) return {true, where + "own memory: direct stores"};
  if (!peer_enabled) return {false, w + " has no peer access to device " + std::to_string(f.owner) + ": peer copy"};
  switch (f.allocation) {
    case Allocation::kPlain:
      return {true, where + "cudaMalloc memory, peer access enabled from " + w + ": direct stores"};
    case Allocation::kPool:
      if (f.access == kReadWrite) return {true, where + "pool memory whose pool grants " + w + " read-write: direct stores"};
      return {false, where + "pool memory whose pool does not grant " + w +
                         " read-write (cudaMemPoolSetAccess; cudaDeviceEnablePeerAccess does not cover pools): peer copy"};
    case Allocation::kVmm:
      if (f.access == kReadWrite) return {true, where + "VMM memory mapped read-write for " + w + ": direct stores"};
      return {false, where + "VMM memory not mapped read-write for " + w +
                         " (cuMemSetAccess; cudaDeviceEnablePeerAccess does not cover it): peer copy"};
    case Allocation::kUnknown:
      break;
  }
  return {false, where + "memory of an unknown allocation kind: peer copy"};
}

}  // namespace variopath::cuda
