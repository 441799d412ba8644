#include "cuda/pull_streams.h"

namespace variopath::cuda {

std::string copy_and_wait(int device, cudaStream_t stream, const std::vector<Piece>& pieces, double timeout_s,
                          const char* what) {
  for (const Piece& p : pieces)
    if (const Status s = VP_CUDA(cudaMemcpyAsync(p.dst, p.src, static_cast<size_t>(p.nbytes), cudaMemcpyDefault,
                                                 stream));
        !s.ok())
      return s.message + " (" + what + ")";
  std::string why;
  void* event = take_event(device, why);
  if (!event) return why;
  const Status recorded = VP_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event), stream));
  const bool done = recorded.ok() && poll_event(event, Clock::now() + seconds_of(timeout_s), why);
  // a record still pending at the deadline keeps its event: it goes back to the pool only once
  // nothing will complete on it
  if (!recorded.ok() || done) give_event(device, event);
  if (!recorded.ok()) return recorded.message;
  if (!done && why.empty()) return "timed out after " + std::to_string(timeout_s) + " s " + what + " on the GPU";
  return why;
}

}  // namespace variopath::cuda
