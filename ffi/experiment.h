// One experiment of the profiler (issue 27; variopath_jax/profile): transfers over a backend's
// routes, run by the emulated machine (emulated_machine.h) or on GPUs (cuda/profile_cuda.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace variopath {

struct ExperimentTransfer {
  int32_t route = 0;
  int64_t nbytes = 0;
  double cap = 0;      // bytes per second; 0: unpaced
  int32_t step = 0;    // non-decreasing over the transfers
  int32_t after = -1;  // an earlier transfer of the same step it waits for, or -1
};

// "" or what is wrong with the transfers, naming the first bad one.
std::string check_experiment(const std::vector<ExperimentTransfer>& transfers, size_t routes);

}  // namespace variopath
