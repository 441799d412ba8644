// The profiler's CUDA backend (issue 27; variopath_jax/profile/backend.py CudaBackend): one
// experiment's transfers as copies between the GPUs of this process, each on a stream of its own
// on its sending device, timed with CUDA events there. Compiled wherever nvcc exists; it has
// never run on a GPU.
#pragma once

#include <cstdint>
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

// One flow of the posted-write trigger probe (variopath_jax/profile/trigger.py): nbytes from
// device `src` to device `dst`, pushed (a copy kernel on `src` storing into `dst`'s memory: posted
// writes) or pulled (a copy kernel on `dst` loading from `src`'s memory: non-posted reads).
struct TriggerFlow {
  int src = 0;
  int dst = 0;
  bool pull = false;
  int64_t nbytes = 0;
};

// The flows at once, each on a stream of its own on the device that issues it, all held behind
// one gate (a hold on the first flow's issuing device, long enough for the host to enqueue every
// flow) and released together; `ends` are per flow, seconds from its release to its end (CUDA
// events on its issuing device). Needs peer access between each flow's devices. Compiled wherever
// nvcc exists; it has never run on a GPU.
ProfileRun trigger_run(const std::vector<TriggerFlow>& flows, double timeout_s);

}  // namespace variopath::cuda
