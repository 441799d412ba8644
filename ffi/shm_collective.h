// One collective call over the shared-memory transport (issue 16, "Several processes": POSIX
// shared memory between the CPU processes of one host; shm_transport.h).
//
// Each rank stages its contribution (metadata and the rows it sends to others) in a staging
// segment of its process, joins the call's slot in the control segment keyed by (site, group,
// per-rank call sequence), and once every rank has come reads every rank's staged metadata and
// computes the same placement, plan and layout as all the others (layout.h). Then it runs the
// executor in pull mode: it copies the transfers it receives, in plan order, from the senders'
// staging into its own XLA output, each once the transfers it depends on are done (transfer
// states in the slot); it returns once the transfers out of its staging are done too, so nobody
// reads its staging afterwards. Every wait has a deadline and looks at the peers' liveness: a
// process that dies or leaves fails the call for every rank, naming it.
#pragma once

#include <cstdint>
#include <string>

#include "collective.h"

namespace variopath {

std::string run_shm_collective(int64_t site, int64_t group, Contribution mine);

}  // namespace variopath
