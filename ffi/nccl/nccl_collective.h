// The NCCL transport (issue 16, "Several processes": GPU processes on different nodes): its
// communicators, made once per configuration at configure time, and one collective call over
// them. No CUDA or NCCL types in this header (collective.cc and module.cc include it).
// Direction: push (collective.h direction_of): NCCL's P2P transport has the sender write over
// PCIe (reads only where NCCL_P2P_READ_ENABLE says); across nodes, RDMA through the NICs.
//
// Bootstrap (jax_ops/nccl.py): process 0 makes the unique id and shares it through the
// jax.distributed key-value store; every process makes one non-blocking communicator per local
// device (several inside one ncclGroupStart/End), whose ranks are the devices' global indices,
// and polls them until they are ready or the timeout passed (then aborts them): a process that
// never arrives gives an error, not a hang.
//
// One call, on the device's XLA stream: all-gather every device's row (nccl/p2p.h) and copy it
// to pinned host memory; decode this collective's contributions and lay the call out as every
// transport does; write this rank's own results and self rows; one ncclGroupStart/End per plan
// step with this rank's sends and receives (nccl/p2p.h p2p_steps); then watch the stream and the
// communicator's asynchronous error until the deadline. On a timeout or an NCCL error the
// communicator is aborted and the configuration marked unusable: later calls fail asking to
// configure again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collective.h"

namespace variopath::nccl {

// A new unique id (process 0), from the library at `library` ("" : the default search).
// Throws std::runtime_error.
std::string unique_id(const std::string& library);

// Make configuration `config`'s communicators: one per local CUDA device `devices[i]`, at
// communicator rank `ranks[i]` of `nranks`, all from `id`; replaces the configuration's earlier
// ones. Throws std::runtime_error (nothing stays registered then).
void init(int64_t config, const std::string& library, const std::string& id, int32_t nranks,
          const std::vector<int32_t>& ranks, const std::vector<int32_t>& devices, double timeout_s);

// Free configuration `config`'s communicators (destroyed, or aborted once it failed).
void release(int64_t config);

// One call for the rank `mine` (its buffers device memory, its device and XLA stream set), of
// collective `group`, whose op has `slots` slices (all_to_all_v: the axis size; ragged: the
// offsets' length). "" or the error.
std::string run_collective(int64_t site, int64_t group, Contribution mine, int64_t slots);

// The GPU check: a one-rank communicator on `device` (init, an all-gather and a self
// send/receive of `nbytes` checked byte for byte, destroy). "" or the error; `detail` says what
// ran.
std::string selftest(int device, const std::string& library, int64_t nbytes, double timeout_s, std::string& detail);

}  // namespace variopath::nccl
