// XLA FFI handlers for CUDA devices: all_to_all_v and ragged_all_to_all between the GPUs of one
// process (issue 16; research/cuda-transport.md "Single process, several GPUs").
//
// XLA runs each local device's program on a host thread of its own, so the handlers meet in the
// same in-process rendezvous as the CPU ones (collective.h) and block their thread until the
// call is done. Each copies its counts and offsets to pinned host memory and waits for its
// stream (planning needs them on the host), records an entry event on its stream, and joins the
// call; the executor then puts every copy on the senders' streams (cuda/cuda_streams.h) and the
// handler returns once every transfer into its device is enqueued and its stream waits for them
// (stream-ordered: the counts' copy is the call's one host sync; no allocation on the call path).
// The handlers carry no command-buffer trait: they read the counts on the host and plan there. Between the GPU processes of
// one node the call goes over CUDA IPC instead (configure's transport="cuda-ipc"; cuda/ipc.h).
#include "ffi_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "arguments.h"
#include "collective.h"
#include "cuda/check.h"
#include "cuda/cuda_streams.h"
#include "cuda/host_staging.h"
#include "cuda/ipc.h"
#include "nccl/nccl_collective.h"

namespace ffi = xla::ffi;

namespace variopath {

namespace {

ffi::Error cuda_error(const cuda::Status& status, const char* what) {
  return ffi::Error(ffi::ErrorCode::kInternal, std::string("variopath all_to_all: ") + what + ": " + status.message);
}

// A device's pinned host buffer for the operands planning reads on the host, grown as needed.
// Held under its mutex from the copy until the values are in the contribution.
struct Pinned {
  std::mutex mu;
  int32_t* data = nullptr;
  size_t capacity = 0;
};

Pinned& pinned_for(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<Pinned>> buffers;  // live for the process: never freed
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = buffers[device];
  if (!slot) slot = std::make_unique<Pinned>();
  return *slot;
}

// The host waits' limit for configuration `config` (its timeout; the default where it is unknown,
// which the call then reports).
double timeout_of(int64_t config) {
  const auto c = find_config(config);
  return c ? c->timeout_s : 60.0;
}

// Copy `parts` (device int32 arrays) into `pinned` back to back and wait for the stream, polling
// against `timeout_s` (a stalled stream fails the call instead of hanging the device's thread).
// "" or the error.
std::string to_host(Pinned& pinned, const std::vector<const ffi::Buffer<ffi::S32>*>& parts, cudaStream_t stream,
                    int device, double timeout_s, std::vector<int32_t*>& at) {
  size_t total = 0;
  for (const auto* p : parts) total += p->element_count();
  if (total > pinned.capacity) {
    // grown rarely (the counts of the largest call so far): a free here synchronises the device
    if (pinned.data) VP_CUDA(cudaFreeHost(pinned.data));
    pinned.data = nullptr;
    pinned.capacity = 0;
    void* p = nullptr;
    if (const cuda::Status s = VP_CUDA(cudaMallocHost(&p, std::max<size_t>(total, 256) * sizeof(int32_t))); !s.ok())
      return s.message;
    pinned.data = static_cast<int32_t*>(p);
    pinned.capacity = std::max<size_t>(total, 256);
  }
  size_t offset = 0;
  at.clear();
  for (const auto* p : parts) {
    at.push_back(pinned.data + offset);
    if (const cuda::Status s = VP_CUDA(cudaMemcpyAsync(pinned.data + offset, p->typed_data(),
                                                       p->element_count() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                                       stream));
        !s.ok())
      return s.message;
    offset += p->element_count();
  }
  std::string why;
  void* copied = cuda::take_event(device, why);
  if (!copied) return why;
  const cuda::Status recorded = VP_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(copied), stream));
  const bool done = recorded.ok() && cuda::poll_event(copied, Clock::now() + seconds_of(timeout_s), why);
  // a record still pending at the deadline keeps its event: it goes back to the pool only once
  // nothing will complete on it
  if (!recorded.ok() || done) cuda::give_event(device, copied);
  if (!recorded.ok()) return recorded.message;
  if (!done)
    return "timed out after " + std::to_string(timeout_s) + " s: device " + std::to_string(device) +
           " waited for its stream to copy the counts to the host (the stream is stalled)";
  return why;
}

// Record this device's entry event, run the collective, give the event back; the caller's
// current device is restored. A configuration between processes runs the call there instead:
// NCCL (`slots`: the op's slice count, which sizes its gathered rows), or cuda-ipc (cuda/ipc.h:
// each rank writes only its own output, on its own stream, so no entry event).
ffi::Error join(int64_t run_id, int64_t site, int64_t group, Contribution c, int device, cudaStream_t stream,
                int64_t slots) {
  c.device = device;
  c.stream = stream;
  const auto config = find_config(c.config);
  if (config && (config->transport == Transport::kNccl || config->transport == Transport::kCudaIpc ||
                 config->transport == Transport::kCudaHost)) {
    std::string err;
    try {  // no exception may leave an FFI handler: cuda-ipc's shared lock throws past the timeout (shm.h)
      if (config->transport == Transport::kNccl)
        err = nccl::run_collective(site, group, std::move(c), slots);
      else if (config->transport == Transport::kCudaIpc)
        err = cuda::run_ipc_collective(run_id, site, group, std::move(c));
      else
        err = cuda::run_host_collective(run_id, site, group, std::move(c));
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (!err.empty()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "variopath all_to_all: " + err);
    return ffi::Error::Success();
  }
  std::string why;
  void* entry = cuda::take_event(device, why);
  if (!entry) return ffi::Error(ffi::ErrorCode::kInternal, "variopath all_to_all: " + why);
  if (const cuda::Status s = VP_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(entry), stream)); !s.ok()) {
    cuda::give_event(device, entry);
    return cuda_error(s, "the entry event");
  }
  c.entry = entry;
  const std::string err = run_collective(run_id, site, group, std::move(c));
  cuda::give_event(device, entry);
  if (!err.empty()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "variopath all_to_all: " + err);
  return ffi::Error::Success();
}

// Make `device` current for the handler's duration and restore the caller's after.
struct CurrentDevice {
  int previous = 0;
  cuda::Status status;
  explicit CurrentDevice(int device) {
    VP_CUDA(cudaGetDevice(&previous));
    status = VP_CUDA(cudaSetDevice(device));
  }
  ~CurrentDevice() { VP_CUDA(cudaSetDevice(previous)); }
};

ffi::Error AllToAllVImpl(cudaStream_t stream, int32_t device, ffi::RunId run, ffi::AnyBuffer x,
                         ffi::Buffer<ffi::S32> send_counts, ffi::Buffer<ffi::S32> rank, ffi::Buffer<ffi::S32> group,
                         ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::S32>> recv_counts, int64_t config,
                         int64_t site, int64_t axis_size) {
  CurrentDevice current(device);
  if (!current.status.ok()) return cuda_error(current.status, "entering the device");
  Pinned& pinned = pinned_for(device);
  Contribution c;
  int32_t group_id = 0;
  {
    std::lock_guard<std::mutex> lock(pinned.mu);
    std::vector<int32_t*> at;
    if (const std::string err = to_host(pinned, {&send_counts, &rank, &group}, stream, device, timeout_of(config), at);
        !err.empty())
      return ffi::Error(ffi::ErrorCode::kInternal, "variopath all_to_all: reading the counts: " + err);
    c = all_to_all_v_contribution(x, at[0], send_counts.element_count(), at[1][0], *y, recv_counts->typed_data(), config,
                                  axis_size);
    group_id = at[2][0];
  }
  return join(run.run_id, site, group_id, std::move(c), device, stream, axis_size);
}

// The same into `out`, which the lowering aliases to `y` (a donated buffer reused step after step).
ffi::Error AllToAllVIntoImpl(cudaStream_t stream, int32_t device, ffi::RunId run, ffi::AnyBuffer x,
                             ffi::Buffer<ffi::S32> send_counts, ffi::Buffer<ffi::S32> rank,
                             ffi::Buffer<ffi::S32> group, ffi::AnyBuffer /*out*/, ffi::Result<ffi::AnyBuffer> y,
                             ffi::Result<ffi::Buffer<ffi::S32>> recv_counts, int64_t config, int64_t site,
                             int64_t axis_size) {
  return AllToAllVImpl(stream, device, run, x, send_counts, rank, group, y, recv_counts, config, site, axis_size);
}

ffi::Error RaggedImpl(cudaStream_t stream, int32_t device, ffi::RunId run, ffi::AnyBuffer operand,
                      ffi::AnyBuffer output, ffi::Buffer<ffi::S32> input_offsets, ffi::Buffer<ffi::S32> send_sizes,
                      ffi::Buffer<ffi::S32> output_offsets, ffi::Buffer<ffi::S32> recv_sizes,
                      ffi::Buffer<ffi::S32> rank, ffi::Buffer<ffi::S32> group, ffi::Result<ffi::AnyBuffer> result,
                      ffi::Result<ffi::Buffer<ffi::S32>> recv_offsets, ffi::Result<ffi::Buffer<ffi::S32>> source_offsets,
                      int64_t config, int64_t site, int64_t axis_size) {
  CurrentDevice current(device);
  if (!current.status.ok()) return cuda_error(current.status, "entering the device");
  if (result->untyped_data() != output.untyped_data())
    if (const cuda::Status s = VP_CUDA(cudaMemcpyAsync(result->untyped_data(), output.untyped_data(),
                                                       output.size_bytes(), cudaMemcpyDeviceToDevice, stream));
        !s.ok())
      return cuda_error(s, "copying output to the result");
  Pinned& pinned = pinned_for(device);
  Contribution c;
  int32_t group_id = 0;
  {
    std::lock_guard<std::mutex> lock(pinned.mu);
    std::vector<int32_t*> at;
    if (const std::string err = to_host(pinned, {&input_offsets, &send_sizes, &output_offsets, &recv_sizes, &rank, &group},
                                        stream, device, timeout_of(config), at);
        !err.empty())
      return ffi::Error(ffi::ErrorCode::kInternal, "variopath all_to_all: reading the offsets and sizes: " + err);
    const RaggedSlices slices{at[0], at[1], at[2], at[3],
                              {input_offsets.element_count(), send_sizes.element_count(),
                               output_offsets.element_count(), recv_sizes.element_count()}};
    c = ragged_contribution(operand, output, slices, at[4][0], *result, recv_offsets->typed_data(),
                            source_offsets->typed_data(), config, axis_size);
    group_id = at[5][0];
  }
  return join(run.run_id, site, group_id, std::move(c), device, stream,
              static_cast<int64_t>(send_sizes.element_count()));
}

}  // namespace

// the context of a CUDA handler: its stream, its device, the run
#define VARIOPATH_CUDA_CONTEXT ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::DeviceOrdinal>().Ctx<ffi::RunId>()
XLA_FFI_DEFINE_HANDLER_SYMBOL(AllToAllVCuda, AllToAllVImpl, bind_all_to_all_v(VARIOPATH_CUDA_CONTEXT));
XLA_FFI_DEFINE_HANDLER_SYMBOL(AllToAllVIntoCuda, AllToAllVIntoImpl, bind_all_to_all_v_into(VARIOPATH_CUDA_CONTEXT));
XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedAllToAllCuda, RaggedImpl, bind_ragged_all_to_all(VARIOPATH_CUDA_CONTEXT));
#undef VARIOPATH_CUDA_CONTEXT

}  // namespace variopath
