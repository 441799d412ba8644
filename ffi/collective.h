// The in-process AlltoAllv transport behind the CPU FFI handlers (DESIGN.md "The JAX op").
//
// Every device's handler (ffi_cpu.cc: asynchronous, on a thread of its own) joins a rendezvous
// keyed by (run id, call site, group, per-rank call sequence), the last to arrive validates what
// all ranks brought, plans the demand with the C++ planner core and lays the schedule out as
// byte copies, and then every rank copies the transfers it sends, each once the transfers it
// depends on are done (Execution: behind barriers, signal-driven, or all at once). Every wait
// has its own deadline; a failure anywhere becomes an error for every participant, no copy
// starts after a failure, and a rank returns only once no copy is writing into its memory, so
// no rank writes into a buffer XLA may have released. The process stays usable.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "choice.h"
#include "decider.h"
#include "planner.h"

namespace variopath {

// How the planned activations execute (jax_ops.configure's `execution`).
enum class Execution : int32_t {
  kBarrier = 0,     // Algorithm 2 as the paper runs it: activation k + 1 starts when all of k is done
  kSignal = 1,      // each transfer waits for its sender's and receiver's previous activation and
                    // the last one that crossed each of its links only (schedule.signal_driven)
  kConcurrent = 2,  // no planning: one step, every pair at once (the concurrent family)
  kModelAware = 3,  // the plan of an external planner (the Python `variopath` scheduler), with
                    // its own dependencies and pacing caps: the debugging reference of kPlanned
  kPlanned = 4,     // the default: `variopath`'s choice in the C++ core (choice.h: robust over the
                    // configured models), executed as planned: order, dependencies, pacing caps
};

// A plan as the op executes it, whoever made it (the core, its choice or an external planner):
// transfers (step_ptr, src, dst, bytes in topology ranks), what each waits for (earlier
// transfers), and the rate each is paced at (GB/s; 0: unpaced).
struct ExternalPlan {
  std::string name;  // the chosen family (kPlanned), else ""
  PlanResult plan;
  std::vector<std::vector<int32_t>> after;
  std::vector<double> pace_gbs;
  // -1: every transfer; a topology rank: the plan of that rank's process on the multi-host
  // transport, which may hold only the transfers it sends or receives (layout.h plan_for)
  int32_t rank = -1;
  uint64_t decision = 0;  // the id of the Decision it applies (kPlanned), else the safe one's
};
using ExternalPlanner = std::function<ExternalPlan(const std::vector<int64_t>& demand, int32_t ranks)>;

// What moves the bytes (jax_ops.configure's `transport`), and how (direction_of below).
enum class Transport : int32_t {
  kMemcpy = 0,    // the in-process transport: each rank's thread (CUDA: its stream) copies what it
                  // sends into the receiver's output (push)
  kEmulated = 1,  // the CPU emulator of the stream executor: a thread per stream, random delays (push)
  kShm = 2,       // POSIX shared memory between the processes of one host (shm_collective.h): each
                  // receiver copies from its senders' staging (pull; host memory, no peer traffic)
  kNccl = 3,      // NCCL between GPU processes, across nodes (nccl/nccl_collective.h; CUDA handlers);
                  // NCCL's P2P transport writes over PCIe unless NCCL_P2P_READ_ENABLE says (push)
  kCudaIpc = 4,   // CUDA IPC between the GPU processes of one node (cuda/ipc.h), on shm's frame: each
                  // receiver's stream copies from its senders' device staging, a P2P read (pull)
  kCudaHost = 5,  // rows bounced through pinned shared host memory between GPU processes without peer
                  // access (cuda/host_staging.h; on CPU devices its twin), on shm's frame: each
                  // receiver's stream reads its senders' host staging (pull; DMA, no peer traffic)
};

// Who moves a transfer's bytes across the bus (the schedule IR's Transfer.pull; DESIGN.md
// "Network model"): kPush, the sender writes into the receiver's memory (posted writes, what
// every platform allows and what the posted-write trigger collapses); kPull, the receiver reads
// the sender's memory (non-posted reads: never trigger, but not portable, Intel client CPUs do
// P2P writes only, NVIDIA/open-gpu-kernel-modules#1253). A transport does one or the other for
// every transfer: the planner's plans are pushes (no planner emits a pull yet), and a pull
// transfer on a pushing transport is refused (jax_ops/config.py op_plan).
enum class Direction : int32_t { kPush = 0, kPull = 1 };

constexpr Direction direction_of(Transport transport) {
  switch (transport) {
    case Transport::kMemcpy:    // cuda_streams.h: the sender's stream (batched kernel or peer copy)
    case Transport::kEmulated:  // the same executor, Role::kPush
    case Transport::kNccl:      // ncclSend/ncclRecv: NCCL's P2P transport writes on PCIe
      return Direction::kPush;
    case Transport::kShm:       // executor Role::kPull: a receiver writes only its own output
    case Transport::kCudaIpc:   // cuda/pull_streams.h: cudaMemcpyAsync on the receiver's stream
    case Transport::kCudaHost:  // cuda/pull_streams.h, from pinned host staging
      return Direction::kPull;
  }
  return Direction::kPush;
}

// A planner configuration registered from Python (variopath_jax.jax_ops.configure).
struct OpConfig {
  std::unique_ptr<PlannerCore> planner;  // null for one rank: nothing to plan
  PlanParams params;
  int32_t ranks = 0;                 // topology ranks; the mesh axis must have exactly this many
  std::vector<int32_t> rank_map;     // mesh-axis position -> topology rank
  std::vector<int32_t> axis_of_rank; // topology rank -> mesh-axis position
  Execution execution = Execution::kPlanned;
  ExternalPlanner external;  // kModelAware
  std::unique_ptr<ChoiceCore> chooser;  // kPlanned (null for one rank)
  std::vector<NetParams> models;        // kPlanned: the models it chooses for
  bool algorithm2 = true;               // kPlanned: Algorithm 2's plans are candidates (configure's screen)
  Transport transport = Transport::kMemcpy;
  std::string transport_reason;  // why configure chose it (its info)
  uint64_t emulator_seed = 0;     // kEmulated: the delays' seed (xor the call site)
  double emulator_delay_s = 0;    // kEmulated: each op waits up to this long first
  double timeout_s = 60.0;
  // kShm, kCudaIpc, kCudaHost: the most bytes of staging one process holds (0: unbounded)
  int64_t staging_budget = 0;
  bool debug = false;
  // the plans of the most recent demands, most recent first (collective.cc plan_for)
  static constexpr size_t kPlanCacheSize = 8;
  std::mutex cache_mu;
  std::list<std::pair<std::vector<int64_t>, std::shared_ptr<const ExternalPlan>>> plan_cache;
  // kPlanned: the decisions made ahead of each call site's next call (decider.h); declared last,
  // so that its worker stops before the chooser it calls goes
  std::unique_ptr<Decider> decider;
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
  // CUDA handlers (ffi_cuda.cc): the buffers above are this device's memory, `stream` its XLA
  // stream (cudaStream_t) and `entry` an event (cudaEvent_t) recorded on it as the call began,
  // which peers wait for before writing into `output`. CPU: device -1.
  int32_t device = -1;
  void* stream = nullptr;
  void* entry = nullptr;
  std::string error;  // a local validation failure, reported to every rank
  // the id of the decision this rank's process holds for the call (decision_for), which the
  // multi-process transports compare (agreed_decision)
  uint64_t decision = 0;
};

// Run one collective call for this rank. Returns an empty string on success, else the error.
std::string run_collective(int64_t run_id, int64_t site, int64_t group, Contribution contribution);

// Fail every in-process call in flight with `why`: their ranks stop waiting for each other and
// return (ffi_cpu.h quiesce_handlers, at interpreter exit).
void fail_calls(const std::string& why);

// What every transport does around its rendezvous (collective.cc), shared with the
// shared-memory one: fault a large output in; check that the ranks agree and the configuration
// fits (the configuration in `config`); write rank `me`'s result arrays, self copies and zeroing
// past the received rows, on its stream (parts[me] holds its own buffers, placed). "" or the
// error.
void prefault(uint8_t* data, int64_t nbytes);
std::string check_parts(const std::vector<Contribution>& parts, int32_t expected, std::shared_ptr<OpConfig>& config);
struct Layout;
class Streams;
void write_local(const Layout& layout, const std::vector<Contribution>& parts, int32_t me, Streams& streams);

// Debug mode: the demand and the transfers executed by the most recent call of a site.
struct ExecutedSchedule {
  int32_t ranks = 0;
  Execution execution = Execution::kSignal;
  std::string plan;  // the chosen family (kPlanned), else ""
  std::vector<int64_t> demand;  // topology ranks, ranks x ranks bytes
  std::vector<int64_t> step_ptr;
  std::vector<int32_t> src, dst;  // topology ranks
  std::vector<int64_t> bytes;
  std::vector<int64_t> after_ptr{0};  // transfer t waited for transfers after[after_ptr[t]:after_ptr[t+1]]
  std::vector<int32_t> after;
  std::vector<double> pace_gbs;  // per transfer; 0: unpaced
  std::vector<int64_t> began, ended;  // per transfer: its first copy's start and its end, as
                                      // positions in one order (filled when the call ends)
};
bool last_schedule(int64_t site, ExecutedSchedule& out);

// Fault injection for the rendezvous tests: called by a rank before it starts each transfer it
// sends (its n-th, counted from 0); null in normal use.
using TransferHook = void (*)(int32_t rank, int64_t nth);
void set_transfer_hook(TransferHook hook);
TransferHook transfer_hook();

}  // namespace variopath
