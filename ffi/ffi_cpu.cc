// XLA FFI handlers for CPU devices: all_to_all_v and ragged_all_to_all on the in-process
// transport (collective.h). Every failure completes the call with an ffi::Error naming the
// problem.
//
// The handlers are asynchronous: each checks its arguments on XLA's thread, then runs the
// collective on a thread of its own and returns a future that completes with it. A collective
// waits for every rank; blocking XLA's thread instead (possibly one of its small shared intra-op
// pool) starved the devices that had not arrived yet and deadlocked programs with other parallel
// work or collectives (README "Known limitation"). XLA keeps the call's buffers alive until the
// future completes.
#include "ffi_cpu.h"

#include <cstring>
#include <thread>

#include "collective.h"

namespace ffi = xla::ffi;

namespace variopath {

namespace {

int64_t row_bytes_of(const ffi::AnyBuffer& buf) {
  auto dims = buf.dimensions();
  if (dims.size() == 0) return 0;
  int64_t rows = dims[0];
  return rows ? static_cast<int64_t>(buf.size_bytes()) / rows : 0;
}

// Run the collective off XLA's thread; the future completes when it has.
ffi::Future start(int64_t run_id, int64_t site, int64_t group, Contribution c) {
  ffi::Promise promise;
  ffi::Future future(promise);
  std::thread([promise, run_id, site, group, c = std::move(c)]() mutable {
    const std::string err = run_collective(run_id, site, group, std::move(c));
    if (err.empty())
      promise.SetAvailable();
    else
      promise.SetError(ffi::Error(ffi::ErrorCode::kInvalidArgument, "variopath all_to_all: " + err));
  }).detach();
  return future;
}

ffi::Future AllToAllVImpl(ffi::RunId run, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> send_counts,
                         ffi::Buffer<ffi::S32> rank, ffi::Buffer<ffi::S32> group, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::Buffer<ffi::S32>> recv_counts, int64_t config, int64_t site,
                         int64_t axis_size) {
  Contribution c;
  c.rank = rank.typed_data()[0];
  c.config = config;
  c.axis_size = axis_size;
  c.dtype = static_cast<int64_t>(x.element_type());
  c.row_bytes = row_bytes_of(x);
  c.input = static_cast<const uint8_t*>(x.untyped_data());
  c.input_rows = x.dimensions().size() ? x.dimensions()[0] : 0;
  c.output = static_cast<uint8_t*>(y->untyped_data());
  c.output_rows = y->dimensions().size() ? y->dimensions()[0] : 0;
  c.recv_counts = recv_counts->typed_data();
  if (x.dimensions().size() == 0) c.error = "x must have a leading row axis";
  if (send_counts.element_count() != static_cast<size_t>(axis_size))
    c.error = "send_counts has " + std::to_string(send_counts.element_count()) + " entries for a mesh axis of " +
              std::to_string(axis_size) + " devices";
  if (c.output_rows && row_bytes_of(*y) != c.row_bytes && c.input_rows) c.error = "x and y rows differ in size";
  int64_t offset = 0;
  for (int64_t j = 0; c.error.empty() && j < axis_size; ++j) {
    const int64_t rows = send_counts.typed_data()[j];
    if (rows < 0) {
      c.error = "send_counts[" + std::to_string(j) + "] = " + std::to_string(rows) + " is negative";
      break;
    }
    c.slices.push_back({static_cast<int32_t>(j), offset, rows, -1});
    offset += rows;
  }
  if (c.error.empty() && offset > c.input_rows)
    c.error = "send_counts sum to " + std::to_string(offset) + " rows but x has " + std::to_string(c.input_rows);
  std::memset(recv_counts->typed_data(), 0, sizeof(int32_t) * recv_counts->element_count());
  return start(run.run_id, site, group.typed_data()[0], std::move(c));
}

ffi::Future RaggedImpl(ffi::RunId run, ffi::AnyBuffer operand, ffi::AnyBuffer output,
                      ffi::Buffer<ffi::S32> input_offsets, ffi::Buffer<ffi::S32> send_sizes,
                      ffi::Buffer<ffi::S32> output_offsets, ffi::Buffer<ffi::S32> recv_sizes,
                      ffi::Buffer<ffi::S32> rank, ffi::Buffer<ffi::S32> group, ffi::Result<ffi::AnyBuffer> result,
                      ffi::Result<ffi::Buffer<ffi::S32>> recv_offsets, ffi::Result<ffi::Buffer<ffi::S32>> source_offsets,
                      int64_t config, int64_t site, int64_t axis_size) {
  Contribution c;
  c.ragged = true;
  c.rank = rank.typed_data()[0];
  c.config = config;
  c.axis_size = axis_size;
  c.dtype = static_cast<int64_t>(operand.element_type());
  c.row_bytes = row_bytes_of(operand);
  c.input = static_cast<const uint8_t*>(operand.untyped_data());
  c.input_rows = operand.dimensions().size() ? operand.dimensions()[0] : 0;
  c.output = static_cast<uint8_t*>(result->untyped_data());
  c.output_rows = result->dimensions().size() ? result->dimensions()[0] : 0;
  if (result->untyped_data() != output.untyped_data())
    std::memcpy(result->untyped_data(), output.untyped_data(), output.size_bytes());
  c.recv_offsets = recv_offsets->typed_data();
  c.source_offsets = source_offsets->typed_data();
  const size_t k = send_sizes.element_count();
  std::memset(c.recv_offsets, 0, sizeof(int32_t) * k);
  std::memset(c.source_offsets, 0, sizeof(int32_t) * k);
  if (input_offsets.element_count() != k || output_offsets.element_count() != k || recv_sizes.element_count() != k)
    c.error = "input_offsets, send_sizes, output_offsets and recv_sizes must have the same length";
  else if (axis_size <= 0 || k % static_cast<size_t>(axis_size) != 0)
    c.error = "the number of slices (" + std::to_string(k) + ") is not a multiple of the mesh axis size (" +
              std::to_string(axis_size) + ")";
  else if (c.row_bytes != row_bytes_of(output) && c.input_rows && output.dimensions()[0])
    c.error = "operand and output rows differ in size";
  const size_t per = axis_size > 0 ? k / static_cast<size_t>(axis_size) : 1;
  for (size_t s = 0; c.error.empty() && s < k; ++s) {
    const int64_t in = input_offsets.typed_data()[s], rows = send_sizes.typed_data()[s];
    const int64_t out = output_offsets.typed_data()[s], expect = recv_sizes.typed_data()[s];
    if (rows < 0 || expect < 0 || in < 0 || out < 0)
      c.error = "slice " + std::to_string(s) + " has a negative offset or size";
    else if (in + rows > c.input_rows)
      c.error = "slice " + std::to_string(s) + " reads rows [" + std::to_string(in) + ", " + std::to_string(in + rows) +
                ") of an operand with " + std::to_string(c.input_rows) + " rows";
    else
      c.slices.push_back({static_cast<int32_t>(s / per), in, rows, out});
    c.recv_sizes.push_back(expect);
  }
  return start(run.run_id, site, group.typed_data()[0], std::move(c));
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AllToAllVCpu, AllToAllVImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("config")
                                  .Attr<int64_t>("site")
                                  .Attr<int64_t>("axis_size"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedAllToAllCpu, RaggedImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::RunId>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("config")
                                  .Attr<int64_t>("site")
                                  .Attr<int64_t>("axis_size"));

}  // namespace variopath
