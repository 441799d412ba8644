// How one thread of the batched copy (kernels.cu) moves its part of a segment, written once for
// the GPU and the host: the kernel runs it, and the host runs the same code over every thread
// index (batched_copy_on_host in module.cc), so the splitting arithmetic is tested on CPU.
//
// A segment is split into a head (its bytes before the destination's first 16-byte boundary), a
// middle of whole 16-byte destination words, stored with one 16-byte store each, and a tail (the
// bytes after them). Where the source is 16-byte aligned at the middle too, each word is one
// 16-byte load; else (the source misaligned, possibly differently from the destination) each is
// assembled from the two aligned 16-byte source words around it: their 32-bit parts picked by
// the misalignment's whole words, shifted by its bytes (a funnel shift). The loads then read up
// to 15 bytes before and after the segment, never past the 16-byte block holding its first or
// last byte, so never outside the allocations holding them.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define VARIOPATH_HD __host__ __device__ __forceinline__
#else
#define VARIOPATH_HD inline
#endif

namespace variopath::cuda {

#if defined(__CUDACC__)
using Word16 = uint4;
#else
struct alignas(16) Word16 {
  uint32_t x, y, z, w;
};
#endif

struct SegmentSplit {
  int64_t head;   // bytes before dst + head, the first 16-byte boundary (all of them if shorter)
  int64_t words;  // whole 16-byte destination words after the head
  int64_t tail;   // bytes after the words
  uint32_t skew;  // (src + head) mod 16: 0 means plain 16-byte loads
};

VARIOPATH_HD SegmentSplit split_segment(uintptr_t src, uintptr_t dst, int64_t nbytes) {
  SegmentSplit s{};
  const int64_t boundary = static_cast<int64_t>((16 - (dst & 15)) & 15);
  s.head = boundary < nbytes ? boundary : nbytes;
  s.words = (nbytes - s.head) / 16;
  s.tail = nbytes - s.head - 16 * s.words;
  s.skew = static_cast<uint32_t>((src + static_cast<uintptr_t>(s.head)) & 15);
  return s;
}

// The 32 bits starting `bytes` (0-3) bytes into lo, continued by hi (little-endian).
VARIOPATH_HD uint32_t funnel(uint32_t lo, uint32_t hi, uint32_t bytes) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, 8 * bytes);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (8 * bytes));
#endif
}

VARIOPATH_HD Word16 load16(const uint8_t* p) {  // p: 16-byte aligned
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const Word16*>(p);
#else
  Word16 w;
  std::memcpy(&w, p, sizeof w);
  return w;
#endif
}

VARIOPATH_HD void store16(uint8_t* p, const Word16& w) {  // p: 16-byte aligned
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<Word16*>(p) = w;
#else
  std::memcpy(p, &w, sizeof w);
#endif
}

// The 16 bytes starting `skew` (1-15) bytes into the 32 of a then b.
VARIOPATH_HD Word16 shifted(const Word16& a, const Word16& b, uint32_t skew) {
  uint32_t v0, v1, v2, v3, v4;  // the five 32-bit parts the result overlaps (skew is uniform per segment)
  switch (skew >> 2) {
    case 0:
      v0 = a.x, v1 = a.y, v2 = a.z, v3 = a.w, v4 = b.x;
      break;
    case 1:
      v0 = a.y, v1 = a.z, v2 = a.w, v3 = b.x, v4 = b.y;
      break;
    case 2:
      v0 = a.z, v1 = a.w, v2 = b.x, v3 = b.y, v4 = b.z;
      break;
    default:
      v0 = a.w, v1 = b.x, v2 = b.y, v3 = b.z, v4 = b.w;
      break;
  }
  const uint32_t r = skew & 3;
  return Word16{funnel(v0, v1, r), funnel(v1, v2, r), funnel(v2, v3, r), funnel(v3, v4, r)};
}

// Thread `first` of `stride` threads copies its bytes of the segment (nbytes from src to dst).
VARIOPATH_HD void copy_part(const uint8_t* src, uint8_t* dst, int64_t nbytes, int64_t first, int64_t stride) {
  const SegmentSplit s = split_segment(reinterpret_cast<uintptr_t>(src), reinterpret_cast<uintptr_t>(dst), nbytes);
  for (int64_t i = first; i < s.head; i += stride) dst[i] = src[i];
  uint8_t* out = dst + s.head;
  if (s.skew == 0) {
    const uint8_t* in = src + s.head;
    for (int64_t i = first; i < s.words; i += stride) store16(out + 16 * i, load16(in + 16 * i));
  } else {
    const uint8_t* in = src + s.head - s.skew;  // the aligned source word holding the middle's first byte
    for (int64_t i = first; i < s.words; i += stride)
      store16(out + 16 * i, shifted(load16(in + 16 * i), load16(in + 16 * i + 16), s.skew));
  }
  const int64_t done = s.head + 16 * s.words;
  for (int64_t i = first; i < s.tail; i += stride) dst[done + i] = src[done + i];
}

}  // namespace variopath::cuda
