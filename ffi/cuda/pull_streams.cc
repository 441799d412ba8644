#include "cuda/pull_streams.h"

namespace variopath::cuda {

std::string copy_and_wait(int device, cudaStream_t stream, const std::vector<Piece>& pieces, double timeout_s,
                          const char* what) {
  for (const Piece& p : pieces)
    if (const cudaError_t status = cudaMemcpyAsync(p.dst, p.src, static_cast<size_t>(p.nbytes), cudaMemcpyDefault,
                                                   stream);
        status != cudaSuccess)
      return describe(status, "cudaMemcpyAsync") + " (" + what + ")";
  std::string why;
  void* event = take_event(device, why);
  if (!event) return why;
  const cudaError_t status = cudaEventRecord(static_cast<cudaEvent_t>(event), stream);
  const bool done = status == cudaSuccess && poll_event(event, Clock::now() + seconds_of(timeout_s), why);
  give_event(device, event);
  if (status != cudaSuccess) return describe(status, "cudaEventRecord");
  if (!done && why.empty()) return "timed out after " + std::to_string(timeout_s) + " s " + what + " on the GPU";
  return why;
}

}  // namespace variopath::cuda
