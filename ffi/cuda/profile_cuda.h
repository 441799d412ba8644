// The profiler's CUDA backend (issue 27; variopath_jax/profile/backend.py CudaBackend): one
// experiment's transfers as copies between the GPUs of this process, each on a stream of its own
// on its sending device, timed with CUDA events there. Compiled wherever nvcc exists; it has
// never run on a GPU.
#pragma once

#include <string>
#include <vector>

#include "experiment.h"

namespace variopath::cuda {

struct ProfileRoute {
  int src = 0;          // the sending device
  int dst = -1;         // the receiving device, or -1: pinned host memory
  bool staged = false;  // through pinned host memory (device → host → dst)
};

struct ProfileRun {
  std::vector<double> ends;  // per transfer, seconds after the experiment began
  std::string error;
};

// Every transfer must leave one device (the events that time them live there). A paced transfer
// moves in chunks, chunk j held until j · chunk / cap after its first (the GPU clock). A step
// after the first starts once the host saw every transfer of the previous one complete (the
// barrier); a transfer with `after` waits for that transfer's event. Every wait on the host
// gives up after `timeout_s`.
ProfileRun profile_run(const std::vector<ProfileRoute>& routes, const std::vector<ExperimentTransfer>& transfers,
                       double timeout_s);

}  // namespace variopath::cuda
