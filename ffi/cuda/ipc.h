// The CUDA IPC transport between the GPU processes of one node (issue 16, "Several processes";
// research/cuda-transport.md): the frame of the shared-memory transport (shm_collective.h: the
// control segment, its call slots, metadata staged in host shared memory, the pull-mode
// executor) with the rows staged in device memory.
// Direction: pull (collective.h direction_of): the receiver's stream reads the sender's device
// staging, a P2P read (non-posted: never the posted-write trigger; not on Intel client CPUs).
//
// Each process owns device staging it allocated itself with cudaMalloc (legacy IPC maps only
// plain cudaMalloc memory, never XLA's buffers), exported with cudaIpcGetMemHandle; the handle
// travels in the staged metadata and a peer opens it once with cudaIpcOpenMemHandle and keeps
// the mapping, keyed by (process, serial, device). Staging grows by generations as the shm pool
// does; a staging a peer may still read is never reused or freed, and a retired generation is
// freed only once every live peer has closed its mapping of it (cudaFree under an open mapping
// is undefined behaviour), which peers acknowledge in the control segment. A sender fills its
// staging on its XLA stream and waits for that copy before joining; receivers pull with
// cudaMemcpyAsync on their own XLA stream and report done only once their copies completed.
#pragma once

#include <cstdint>
#include <string>

#include "collective.h"

namespace variopath::cuda {

// Run one call over the cuda-ipc transport: `mine` from a CUDA handler (device, its stream).
std::string run_ipc_collective(int64_t run, int64_t site, int64_t group, Contribution mine);

}  // namespace variopath::cuda
