// The in-process AlltoAllv transport behind the CPU FFI handlers (DESIGN.md "The JAX op").
//
// XLA runs each device's program on its own thread; every device's handler joins a rendezvous
// keyed by (run id, call site, group, per-rank call sequence), the last to arrive validates what
// all ranks brought, plans the demand with the C++ planner core and lays the schedule out as
// byte copies, and then every rank copies the transfers it sends, activation by activation, with
// a barrier between activations. Every wait has a deadline; a failure anywhere becomes an error
// for every participant, and the process stays usable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "planner.h"

namespace variopath {

// A planner configuration registered from Python (variopath_jax.jax_ops.configure).
struct OpConfig {
  std::unique_ptr<PlannerCore> planner;
  PlanParams params;
  int32_t ranks = 0;                 // topology ranks; the mesh axis must have exactly this many
  std::vector<int32_t> rank_map;     // mesh-axis position -> topology rank
  std::vector<int32_t> axis_of_rank; // topology rank -> mesh-axis position
  double timeout_s = 60.0;
  bool debug = false;
};

void register_config(int64_t id, std::shared_ptr<OpConfig> config);
void unregister_config(int64_t id);
std::shared_ptr<OpConfig> find_config(int64_t id);

// One slice of a rank's input sent to one destination (rows).
struct Slice {
  int32_t dest = 0;
  int64_t input_row = 0;
  int64_t rows = 0;
  int64_t output_row = -1;  // at the receiver; -1: the transport places it (all_to_all_v)
};

// What one rank brings to a collective call.
struct Contribution {
  int32_t rank = -1;  // mesh-axis position
  int64_t config = 0;
  int64_t axis_size = 0;
  int64_t row_bytes = 0;
  int64_t dtype = 0;
  const uint8_t* input = nullptr;
  int64_t input_rows = 0;
  uint8_t* output = nullptr;
  int64_t output_rows = 0;
  std::vector<Slice> slices;
  std::vector<int64_t> recv_sizes;  // ragged: the rows this rank expects from each slice
  // results filled by the transport
  int32_t* recv_counts = nullptr;   // all_to_all_v: rows from each source (axis_size)
  int32_t* recv_offsets = nullptr;  // ragged: where each received slice was written here
  int32_t* source_offsets = nullptr;  // ragged: where each received slice came from at its sender
  bool ragged = false;
  std::string error;  // a local validation failure, reported to every rank
};

// Run one collective call for this rank. Returns an empty string on success, else the error.
std::string run_collective(int64_t run_id, int64_t site, int64_t group, Contribution contribution);

// Debug mode: the demand and the transfers executed by the most recent call of a site.
struct ExecutedSchedule {
  int32_t ranks = 0;
  std::vector<int64_t> demand;  // topology ranks, ranks x ranks bytes
  std::vector<int64_t> step_ptr;
  std::vector<int32_t> src, dst;  // topology ranks
  std::vector<int64_t> bytes;
};
bool last_schedule(int64_t site, ExecutedSchedule& out);

}  // namespace variopath
