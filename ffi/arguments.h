// Turning an FFI call's arguments into the rank's Contribution (collective.h), checked: shared
// by the CPU handlers (ffi_cpu.cc) and the CUDA ones (ffi_cuda.cc), which read the counts and
// offsets from host memory (CPU: XLA's buffers; CUDA: pinned copies of the device's).
#pragma once

#include <cstdint>
#include <utility>

#include "collective.h"
#include "xla/ffi/api/ffi.h"

namespace variopath {

// The rows a buffer's leading axis holds and the bytes of one (0 for a scalar or no rows).
int64_t rows_of(const xla::ffi::AnyBuffer& buf);
int64_t row_bytes_of(const xla::ffi::AnyBuffer& buf);

// all_to_all_v: `send_counts` (host, `counts` entries) rows of `x` go to each mesh position in
// order; the received rows go to `y`, the counts per source to `recv_counts`.
Contribution all_to_all_v_contribution(const xla::ffi::AnyBuffer& x, const int32_t* send_counts, size_t counts,
                                       int32_t rank, xla::ffi::AnyBuffer& y, int32_t* recv_counts, int64_t config,
                                       int64_t axis_size);

// The host copies of ragged_all_to_all's four offset/size operands, `slices` entries each
// (`lengths` holds their element counts, to check they agree).
struct RaggedSlices {
  const int32_t* input_offsets;
  const int32_t* send_sizes;
  const int32_t* output_offsets;
  const int32_t* recv_sizes;
  size_t lengths[4];
};

// ragged_all_to_all (jax.lax.ragged_all_to_all's contract): slice s of `operand` goes to mesh
// position s / (slices / axis_size) at its output offset; `result` starts as a copy of `output`
// (the handler makes it).
Contribution ragged_contribution(const xla::ffi::AnyBuffer& operand, const xla::ffi::AnyBuffer& output,
                                 const RaggedSlices& slices, int32_t rank, xla::ffi::AnyBuffer& result,
                                 int32_t* recv_offsets, int32_t* source_offsets, int64_t config, int64_t axis_size);

// The operands, results and attributes of each op, bound after the platform's context: both
// platforms' handlers take them alike.
template <typename Binding>
auto bind_all_to_all_v(Binding binding) {
  namespace ffi = xla::ffi;
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // x
      .template Arg<ffi::Buffer<ffi::S32>>()              // send_counts
      .template Arg<ffi::Buffer<ffi::S32>>()              // rank
      .template Arg<ffi::Buffer<ffi::S32>>()              // group
      .template Ret<ffi::AnyBuffer>()                     // y
      .template Ret<ffi::Buffer<ffi::S32>>()              // recv_counts
      .template Attr<int64_t>("config")
      .template Attr<int64_t>("site")
      .template Attr<int64_t>("axis_size");
}

// all_to_all_v into a caller's buffer: the same, with `out` (after `group`) aliased to `y` by the
// lowering (jax_ops/ops.py), so that a donated buffer is written in place step after step. The
// op writes every row of `y` (received rows, zeros past them), so `out`'s values are never read.
template <typename Binding>
auto bind_all_to_all_v_into(Binding binding) {
  namespace ffi = xla::ffi;
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // x
      .template Arg<ffi::Buffer<ffi::S32>>()              // send_counts
      .template Arg<ffi::Buffer<ffi::S32>>()              // rank
      .template Arg<ffi::Buffer<ffi::S32>>()              // group
      .template Arg<ffi::AnyBuffer>()                     // out (aliased to y)
      .template Ret<ffi::AnyBuffer>()                     // y
      .template Ret<ffi::Buffer<ffi::S32>>()              // recv_counts
      .template Attr<int64_t>("config")
      .template Attr<int64_t>("site")
      .template Attr<int64_t>("axis_size");
}

template <typename Binding>
auto bind_ragged_all_to_all(Binding binding) {
  namespace ffi = xla::ffi;
  return std::move(binding).template Arg<ffi::AnyBuffer>()  // operand
      .template Arg<ffi::AnyBuffer>()                     // output
      .template Arg<ffi::Buffer<ffi::S32>>()              // input_offsets
      .template Arg<ffi::Buffer<ffi::S32>>()              // send_sizes
      .template Arg<ffi::Buffer<ffi::S32>>()              // output_offsets
      .template Arg<ffi::Buffer<ffi::S32>>()              // recv_sizes
      .template Arg<ffi::Buffer<ffi::S32>>()              // rank
      .template Arg<ffi::Buffer<ffi::S32>>()              // group
      .template Ret<ffi::AnyBuffer>()                     // result
      .template Ret<ffi::Buffer<ffi::S32>>()              // recv_offsets
      .template Ret<ffi::Buffer<ffi::S32>>()              // source_offsets
      .template Attr<int64_t>("config")
      .template Attr<int64_t>("site")
      .template Attr<int64_t>("axis_size");
}

}  // namespace variopath
