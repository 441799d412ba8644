// The transport's CUDA kernels (issue 16), launched by the CUDA stream backend (cuda_streams.h):
// a batched copy that moves many segments in one launch (the pack/unpack step: rows grouped by
// destination into one contiguous layout, or scattered from one into the output's), and the two
// halves of a pacing hold (a stamp of the GPU clock when a transfer's first copy begins, and a
// wait until its hold has passed since).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace variopath::cuda {

// One segment of a batched copy: nbytes from src to dst (device pointers, possibly on a peer
// device with peer access enabled).
struct Segment {
  const uint8_t* src;
  uint8_t* dst;
  int64_t nbytes;
};

// The most segments one launch carries (they travel as a kernel parameter: no device memory).
constexpr int kMaxSegments = 32;

// Copy `count` (<= kMaxSegments) segments on `stream` in one launch.
cudaError_t batched_copy(const Segment* segments, int count, cudaStream_t stream);

// Write the GPU's global timer (ns) to *slot on `stream`.
cudaError_t stamp_clock(uint64_t* slot, cudaStream_t stream);

// On `stream`: wait until the global timer reads at least *slot + hold_ns.
cudaError_t hold_until(const uint64_t* slot, uint64_t hold_ns, cudaStream_t stream);

}  // namespace variopath::cuda
