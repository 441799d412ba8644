#include "cuda/kernels.h"

#include "cuda/check.h"
#include "cuda/copy_split.h"

namespace variopath::cuda {

namespace {

struct Batch {
  Segment segment[kMaxSegments];
};

// Blocks of one grid row share a segment (blockIdx.y); within it, a head and a tail of bytes and
// 16-byte words between them, shifted into place where the source is misaligned (copy_split.h).
__global__ void batched_copy_kernel(Batch batch) {
  const Segment s = batch.segment[blockIdx.y];
  copy_part(s.src, s.dst, s.nbytes, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

__device__ uint64_t global_timer() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void stamp_kernel(uint64_t* slot) { *slot = global_timer(); }

struct PacedBatch {
  PacedSegment segment[kMaxSegments];
};

// Blocks of one grid row share a segment; each takes whole chunks (grid-stride), its first thread
// waiting for the chunk's deadline before the block copies it.
__global__ void paced_copy_kernel(PacedBatch batch) {
  const PacedSegment s = batch.segment[blockIdx.y];
  const int64_t chunks = (s.nbytes + kPacedChunk - 1) / kPacedChunk;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t offset = c * kPacedChunk;
    if (s.start && threadIdx.x == 0) {
      const uint64_t due = *s.start + static_cast<uint64_t>(static_cast<double>(s.before + offset) * s.ns_per_byte);
      while (global_timer() < due) __nanosleep(1000);
    }
    __syncthreads();
    const int64_t nbytes = s.nbytes - offset < kPacedChunk ? s.nbytes - offset : kPacedChunk;
    copy_part(s.src + offset, s.dst + offset, nbytes, threadIdx.x, blockDim.x);
    __syncthreads();
  }
}

__global__ void hold_kernel(const uint64_t* slot, uint64_t hold_ns) {
  const uint64_t until = *slot + hold_ns;
  while (global_timer() < until) __nanosleep(1000);
}

}  // namespace

Status batched_copy(const Segment* segments, int count, cudaStream_t stream) {
  if (count <= 0) return {};
  if (count > kMaxSegments) return status_of(cudaErrorInvalidValue, "more segments than one launch carries");
  Batch batch{};
  int64_t largest = 0;
  for (int i = 0; i < count; ++i) {
    batch.segment[i] = segments[i];
    largest = segments[i].nbytes > largest ? segments[i].nbytes : largest;
  }
  constexpr int kThreads = 256;
  // enough blocks per segment to cover its 16-byte words once, at most 1024 (grid-stride beyond)
  const int64_t words = (largest + 15) / 16;
  const unsigned blocks = static_cast<unsigned>(words / kThreads + 1 < 1024 ? words / kThreads + 1 : 1024);
  return VP_LAUNCH(batched_copy_kernel, dim3(blocks, count), kThreads, stream, batch);
}

Status paced_copy(const PacedSegment* segments, int count, cudaStream_t stream) {
  if (count <= 0) return {};
  if (count > kMaxSegments) return status_of(cudaErrorInvalidValue, "more segments than one launch carries");
  PacedBatch batch{};
  int64_t chunks = 0;
  for (int i = 0; i < count; ++i) {
    batch.segment[i] = segments[i];
    const int64_t c = (segments[i].nbytes + kPacedChunk - 1) / kPacedChunk;
    chunks = c > chunks ? c : chunks;
  }
  constexpr int kThreads = 256;
  const unsigned blocks = static_cast<unsigned>(chunks < 256 ? (chunks > 0 ? chunks : 1) : 256);
  return VP_LAUNCH(paced_copy_kernel, dim3(blocks, count), kThreads, stream, batch);
}

Status stamp_clock(uint64_t* slot, cudaStream_t stream) {
  return VP_LAUNCH(stamp_kernel, 1, 1, stream, slot);
}

Status hold_until(const uint64_t* slot, uint64_t hold_ns, cudaStream_t stream) {
  return VP_LAUNCH(hold_kernel, 1, 1, stream, slot, hold_ns);
}

}  // namespace variopath::cuda
