#include "cuda/host_staging.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <mutex>

#include "cuda/check.h"
#include "cuda/pull_streams.h"
#include "shm_collective.h"

namespace variopath::cuda {

namespace {

// A rank's copies between its device and the host staging, on its XLA stream.
class GpuBounce final : public Bounce {
 public:
  GpuBounce(int device, cudaStream_t stream, double timeout_s) : device_(device), stream_(stream), timeout_s_(timeout_s) {}

  // Register the mapping as pinned memory, once per mapping, unregistered before it is unmapped.
  // A peer's segment is mapped read-only: where the driver cannot register read-only memory
  // (cudaHostRegisterReadOnly), its rows are read unpinned, which the driver stages itself.
  std::string pin(shm::Segment& segment) override {
    return segment.pin_once([&](shm::Segment::Undo& undo) -> std::string {
      const unsigned flags = cudaHostRegisterPortable | (segment.writable() ? 0u : cudaHostRegisterReadOnly);
      const Status s = VP_CUDA(cudaHostRegister(segment.data(), segment.size(), flags));  // cleared (check.h)
      if (!s.ok()) {
        if (!segment.writable()) {  // said once per process: the reads are slower, not wrong
          static std::once_flag said;
          std::call_once(said, [&] {
            std::fprintf(stderr, "variopath: cuda-host: %s; a peer's read-only staging is read from pageable memory\n",
                         s.message.c_str());
          });
          note_fallback("cudaHostRegisterReadOnly -> pageable: " + s.message);
          return "";
        }
        return s.message + " (cuda-host staging " + segment.name() + ")";
      }
      uint8_t* data = segment.data();
      undo = [data] { VP_CUDA(cudaHostUnregister(data)); };
      return "";
    });
  }

  std::string to_host(const std::vector<Piece>& pieces, double timeout_s) override {
    return copy_and_wait(device_, stream_, pieces, timeout_s, "staging the rows in host memory");
  }

  std::unique_ptr<Streams> streams(const Layout& layout, int32_t me, std::string& error) override {
    auto s = std::make_unique<PullStreams>(device_, stream_, layout, me, timeout_s_);
    error = s->error();
    if (!error.empty()) return nullptr;
    pulling_ = s.get();
    return s;
  }

  bool settle(Streams& streams, Clock::time_point deadline) override {
    return &streams == pulling_ && pulling_->settle(deadline);
  }

 private:
  int device_;
  cudaStream_t stream_;
  double timeout_s_;
  PullStreams* pulling_ = nullptr;
};

}  // namespace

std::string run_host_collective(int64_t run, int64_t site, int64_t group, Contribution mine) {
  std::string err;
  const Configured on = configured(mine.config, "cuda-host", err);
  if (!on.transport) return err;
  if (mine.device < 0 || !mine.stream) return "the GPU cuda-host transport moves GPU devices' rows only";
  GpuBounce bounce(mine.device, static_cast<cudaStream_t>(mine.stream), on.config->timeout_s);
  HostStagedRows rows(bounce, on.config->timeout_s);
  return run_process_collective(*on.transport, *on.config, run, site, group, std::move(mine), rows);
}

}  // namespace variopath::cuda
