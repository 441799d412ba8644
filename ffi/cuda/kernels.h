// The transport's CUDA kernels (issue 16), launched by the CUDA stream backend (cuda_streams.h):
// a batched copy that moves many segments in one launch (the pack/unpack step: rows grouped by
// destination into one contiguous layout, or scattered from one into the output's), and the two
// halves of a pacing hold (a stamp of the GPU clock when a transfer's first copy begins, and a
// wait until its hold has passed since).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/check.h"

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
Status batched_copy(const Segment* segments, int count, cudaStream_t stream);

// One segment of a paced batched copy: a batched-copy segment that, where `start` is set, moves
// in chunks of kPacedChunk bytes, each beginning no earlier than *start + (before + its offset)
// * ns_per_byte on the GPU's global timer (`before`: its transfer's bytes in earlier segments),
// so its transfer never runs ahead of its cap; `start` null: at full speed.
struct PacedSegment {
  const uint8_t* src;
  uint8_t* dst;
  int64_t nbytes;
  const uint64_t* start;
  double ns_per_byte;
  int64_t before;
};
constexpr int64_t kPacedChunk = 64 << 10;

// Copy `count` (<= kMaxSegments) paced segments on `stream` in one launch: the transfers they
// belong to move together, each throttled per chunk against the global timer.
Status paced_copy(const PacedSegment* segments, int count, cudaStream_t stream);

// Write the GPU's global timer (ns) to *slot on `stream`.
Status stamp_clock(uint64_t* slot, cudaStream_t stream);

// On `stream`: wait until the global timer reads at least *slot + hold_ns.
Status hold_until(const uint64_t* slot, uint64_t hold_ns, cudaStream_t stream);

}  // namespace variopath::cuda
