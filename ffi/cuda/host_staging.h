// The cuda-host transport between the GPU processes of one node that have no peer access
// (issue 29: consumer PCIe cards on stock drivers, or per-rank CUDA_VISIBLE_DEVICES): the frame
// of shm_collective.h with the rows bounced through host memory (direction: pull, collective.h
// direction_of: the receiver reads host staging by DMA; no peer traffic). A sender copies the rows it
// sends from its device into its host staging segment (POSIX shared memory, registered with
// cudaHostRegister so the copy is a DMA) on its XLA stream and waits for that copy before it
// joins; a receiver maps the sender's segment read-only, registers it as well, and pulls its
// rows into its own output on its own XLA stream (cuda/pull_streams.h), reporting done only once
// its copies completed. The segments are the shared-memory transport's, with its generations,
// its reclamation and the configuration's staging budget; HostStagedRows (shm_collective.h) is
// shared with the CPU twin, which runs in CI.
#pragma once

#include <cstdint>
#include <string>

#include "collective.h"

namespace variopath::cuda {

// Run one call over the cuda-host transport: `mine` from a CUDA handler (device, its stream).
std::string run_host_collective(int64_t run, int64_t site, int64_t group, Contribution mine);

}  // namespace variopath::cuda
