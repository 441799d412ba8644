#include "collective.h"

#include <algorithm>
#include <cstring>
#include <atomic>
#include <map>
#include <sstream>
#include <sys/mman.h>
#include <tuple>
#include <unistd.h>

#include "executor.h"
#include "layout.h"
#include "shm_collective.h"
#include "streams.h"
#include "sync.h"
#ifdef VARIOPATH_HAVE_CUDA
#include "cuda/cuda_streams.h"
#endif

namespace variopath {

namespace {

std::mutex g_config_mu;
std::map<int64_t, std::shared_ptr<OpConfig>> g_configs;

std::mutex g_debug_mu;
std::map<int64_t, ExecutedSchedule> g_debug;

std::atomic<TransferHook> g_transfer_hook{nullptr};

// One call's rendezvous: who came and went, what each brought, and once planned the layout,
// each transfer's state and the streams it runs on.
struct CallState {
  CallSync sync;
  int32_t expected = 0;
  int32_t arrived = 0;
  int32_t departed = 0;
  std::vector<Contribution> parts;
  bool planning = false;  // the last rank to arrive is planning (outside the mutex)
  bool ready = false;
  int64_t site = 0, group = 0;
  std::shared_ptr<OpConfig> config;
  Layout layout;
  std::vector<TransferState> states;
  std::unique_ptr<Streams> streams;
};

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // run, site, group, sequence
std::mutex g_calls_mu;
std::map<Key, std::shared_ptr<CallState>> g_calls;
std::map<std::tuple<int64_t, int64_t, int64_t, int32_t>, int64_t> g_sequence;  // run, site, group, rank
int64_t g_newest_run = 0;

std::string describe_missing(const CallState& st) {
  std::ostringstream out;
  out << "ranks";
  for (size_t r = 0; r < st.parts.size(); ++r)
    if (st.parts[r].rank < 0) out << ' ' << r;
  return out.str();
}

// The streams a laid-out call runs on: the devices' own when its ranks are CUDA devices, else
// the configured CPU transport. "" or the error.
std::string make_streams(CallState& st, const OpConfig& config) {
  const int32_t device = st.parts[0].device;
  for (const auto& p : st.parts)
    if ((p.device >= 0) != (device >= 0))
      return "ranks mix CPU and CUDA devices: rank " + std::to_string(p.rank) + (p.device >= 0 ? " is" : " is not") +
             " on a GPU, rank 0" + (device >= 0 ? " is" : " is not");
  const auto transfers = static_cast<int32_t>(st.layout.transfers.size());
  if (device < 0) {
    st.streams = config.transport == Transport::kEmulated
                     ? emulated_streams(st.expected, transfers, config.emulator_seed ^ uint64_t(st.site),
                                        config.emulator_delay_s)
                     : memcpy_streams(transfers);
    return "";
  }
  if (config.transport == Transport::kEmulated) return "the emulated transport runs on CPU devices only";
#ifdef VARIOPATH_HAVE_CUDA
  std::string err;
  st.streams = cuda::cuda_streams(st.parts, st.layout, config.debug, err);
  return err;
#else
  return "CUDA devices, but variopath_jax was built without CUDA";
#endif
}

// The last rank to arrive, outside the mutex: check what everybody brought, place the rows,
// plan and lay the plan out, and make the streams it runs on. Touches only the call's own
// state, never a rank's buffers (a rank that times out meanwhile may have returned them).
// "" or the error.
std::string plan_call(CallState& st) {
  std::shared_ptr<OpConfig> config;
  std::string err = check_parts(st.parts, st.expected, config);
  if (!err.empty()) return err;
  const auto& first = st.parts[0];
  st.config = config;
  std::vector<int64_t> demand;
  err = place(st.parts, *config, st.layout, demand);
  if (!err.empty()) return err;
  std::shared_ptr<const ExternalPlan> planned;
  // one planner for every rank, so one decision, made ahead from the site's previous demand
  const Decider::Site site{st.site, st.group};
  const Decision decision = decision_for(*config, site, err);
  if (!err.empty()) return err;
  err = plan_for(*config, demand, planned, /*transposed=*/true, -1, decision);
  if (!err.empty()) return err;
  decide_next(*config, site, demand);
  lay_out(st.parts, *planned, *config, first.row_bytes, st.layout);
  const auto transfers = static_cast<int32_t>(st.layout.transfers.size());
  st.states.assign(transfers, TransferState::kWaiting);
  err = make_streams(st, *config);
  if (!err.empty()) return err;
  if (config->debug) {
    ExecutedSchedule log;
    log.ranks = config->ranks;
    log.execution = config->execution;
    log.plan = planned->name;
    log.demand = demand;
    log.step_ptr = planned->plan.step_ptr;
    log.src = planned->plan.src;
    log.dst = planned->plan.dst;
    log.bytes = planned->plan.bytes;
    log.pace_gbs = planned->pace_gbs;
    for (const auto& a : planned->after) {
      log.after.insert(log.after.end(), a.begin(), a.end());
      log.after_ptr.push_back(static_cast<int64_t>(log.after.size()));
    }
    std::lock_guard<std::mutex> lock(g_debug_mu);
    g_debug[st.site] = std::move(log);
  }
  return "";
}

// The last rank to leave a debug call: when each transfer began and ended.
void log_order(const CallState& st) {
  if (!st.config || !st.config->debug || !st.streams) return;
  std::lock_guard<std::mutex> lock(g_debug_mu);
  auto it = g_debug.find(st.site);
  if (it != g_debug.end()) st.streams->order(it->second.began, it->second.ended);
}

}  // namespace

// Fault a large output buffer's pages in with one call before the rendezvous (XLA hands out
// freshly mapped buffers; faulting them in page by page inside the peers' copies costs more
// than the copies themselves), overlapping it with the wait for the other ranks. The 2 MiB
// aligned interior is first advised as transparent huge pages, so a fresh 64 MiB output takes
// 32 faults instead of 16,384 (bench_jax_op.py and bench_multiprocess.py print the op beside a
// memcpy into fresh memory, "of cold"). Both are advice: a kernel
// without THP or MADV_POPULATE_WRITE (Linux < 5.14) refuses them and the copies fault as before.
void prefault(uint8_t* data, int64_t nbytes) {
#ifdef MADV_POPULATE_WRITE
  constexpr int64_t kWorthIt = 1 << 20;
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (!data || nbytes < kWorthIt) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(data), last = first + static_cast<uintptr_t>(nbytes);
  const uintptr_t huge_begin = (first + kHuge - 1) / kHuge * kHuge, huge_end = last / kHuge * kHuge;
  if (huge_begin < huge_end)  // whole huge pages inside the buffer only: no neighbour is touched
    madvise(reinterpret_cast<void*>(huge_begin), huge_end - huge_begin, MADV_HUGEPAGE);
  const uintptr_t begin = first / page * page, end = (last + page - 1) / page * page;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#endif
}

std::string check_parts(const std::vector<Contribution>& parts, int32_t expected, std::shared_ptr<OpConfig>& config) {
  for (const auto& p : parts)
    if (!p.error.empty()) return "rank " + std::to_string(p.rank) + ": " + p.error;
  const auto& first = parts[0];
  for (const auto& p : parts) {
    if (p.config != first.config || p.axis_size != first.axis_size)
      return "ranks disagree on the configuration: rank " + std::to_string(p.rank) + " uses config " +
             std::to_string(p.config) + " over " + std::to_string(p.axis_size) + " ranks, rank 0 uses config " +
             std::to_string(first.config) + " over " + std::to_string(first.axis_size);
    if (p.row_bytes != first.row_bytes || p.dtype != first.dtype || p.ragged != first.ragged)
      return "ranks disagree on the row type: rank " + std::to_string(p.rank) + " sends rows of " +
             std::to_string(p.row_bytes) + " bytes, rank 0 rows of " + std::to_string(first.row_bytes);
    if (p.ragged && p.slices.size() != first.slices.size())
      return "ranks disagree on the number of slices: rank " + std::to_string(p.rank) + " has " +
             std::to_string(p.slices.size()) + ", rank 0 has " + std::to_string(first.slices.size());
  }
  config = find_config(first.config);
  if (!config) return "configuration " + std::to_string(first.config) + " is not registered (call configure())";
  if (config->ranks != expected)
    return "the mesh axis has " + std::to_string(expected) + " devices but the configured topology has " +
           std::to_string(config->ranks) + " ranks";
  return "";
}

void write_local(const Layout& layout, const std::vector<Contribution>& parts, int32_t me, Streams& streams) {
  const Contribution& mine = parts[me];
  const RankResult& result = layout.results[me];
  const auto put = [&](void* to, const std::vector<int32_t>& from) {
    if (to) streams.local(me, static_cast<uint8_t*>(to), reinterpret_cast<const uint8_t*>(from.data()),
                          static_cast<int64_t>(from.size() * sizeof(int32_t)));
  };
  put(mine.recv_counts, result.recv_counts);
  put(mine.recv_offsets, result.recv_offsets);
  put(mine.source_offsets, result.source_offsets);
  int64_t received = 0;
  for (const auto& p : parts)
    for (const auto& s : p.slices)
      if (s.dest == me) received = std::max(received, s.output_row + s.rows);
  if (!mine.ragged && mine.output_rows > received)
    streams.zero(me, mine.output + received * mine.row_bytes, (mine.output_rows - received) * mine.row_bytes);
  for (const auto& s : mine.slices)
    if (s.dest == me && s.rows)
      streams.local(me, mine.output + s.output_row * mine.row_bytes, mine.input + s.input_row * mine.row_bytes,
                    s.rows * mine.row_bytes);
}

void register_config(int64_t id, std::shared_ptr<OpConfig> config) {
  std::lock_guard<std::mutex> lock(g_config_mu);
  g_configs[id] = std::move(config);
}

void unregister_config(int64_t id) {
  std::lock_guard<std::mutex> lock(g_config_mu);
  g_configs.erase(id);
}

std::shared_ptr<OpConfig> find_config(int64_t id) {
  std::lock_guard<std::mutex> lock(g_config_mu);
  auto it = g_configs.find(id);
  return it == g_configs.end() ? nullptr : it->second;
}

bool last_schedule(int64_t site, ExecutedSchedule& out) {
  std::lock_guard<std::mutex> lock(g_debug_mu);
  auto it = g_debug.find(site);
  if (it == g_debug.end()) return false;
  out = it->second;
  return true;
}

void fail_calls(const std::string& why) {
  std::lock_guard<std::mutex> lock(g_calls_mu);
  for (auto& [key, st] : g_calls) {
    std::lock_guard<std::mutex> inner(st->sync.mu);
    st->sync.fail(why);
  }
}

void set_transfer_hook(TransferHook hook) { g_transfer_hook.store(hook); }

TransferHook transfer_hook() { return g_transfer_hook.load(); }

std::string run_collective(int64_t run_id, int64_t site, int64_t group, Contribution contribution) {
  const int32_t n = static_cast<int32_t>(contribution.axis_size);
  const int32_t me = contribution.rank;
  if (n <= 0 || me < 0 || me >= n)
    return "rank " + std::to_string(me) + " is outside the mesh axis of " + std::to_string(n) + " devices";
  auto config = find_config(contribution.config);
  if (config && config->transport == Transport::kShm) {
    try {
      return run_shm_collective(run_id, site, group, std::move(contribution));
    } catch (const std::exception& e) {  // its lock held past the timeout (shm.h), or no memory
      return e.what();
    }
  }
  if (config && config->transport == Transport::kCudaHost) {  // its CPU twin; the CUDA handlers run the GPU one
    try {
      return run_host_staged_collective(run_id, site, group, std::move(contribution));
    } catch (const std::exception& e) {  // its lock held past the timeout (shm.h), or no memory
      return e.what();
    }
  }
  if (config && config->transport == Transport::kNccl)  // the CUDA handlers call it themselves (ffi_cuda.cc)
    return "the nccl transport moves CUDA device buffers only, not a CPU device's";
  if (config && config->transport == Transport::kCudaIpc)  // the CUDA handlers dispatch it themselves
    return "the cuda-ipc transport moves GPU devices' rows only; these are CPU devices (between CPU processes: "
           "transport='shm')";
  const double timeout_s = config ? config->timeout_s : 60.0;
  if (contribution.device < 0) prefault(contribution.output, contribution.output_rows * contribution.row_bytes);
  // join the call's rendezvous
  std::shared_ptr<CallState> st;
  Key key;
  {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    if (run_id > g_newest_run) {
      g_newest_run = run_id;
      if (g_sequence.size() > 65536)  // forget sequence numbers of long-finished runs
        for (auto it = g_sequence.begin(); it != g_sequence.end();)
          it = std::get<0>(it->first) < run_id - 4096 ? g_sequence.erase(it) : std::next(it);
      if (g_calls.size() > 1024)  // forget failed calls whose missing ranks never came
        for (auto it = g_calls.begin(); it != g_calls.end();)
          it = std::get<0>(it->first) < run_id - 4096 && it->second->departed == it->second->arrived ? g_calls.erase(it)
                                                                                                      : std::next(it);
    }
    const int64_t seq = g_sequence[{run_id, site, group, me}]++;
    key = {run_id, site, group, seq};
    auto& slot = g_calls[key];
    if (!slot) {
      slot = std::make_shared<CallState>();
      slot->expected = n;
      slot->site = site;
      slot->group = group;
      slot->parts.resize(n);
      slot->sync.set_ranks(n);
    }
    st = slot;
  }
  // every rank that joined leaves exactly once; the call is forgotten when all have come and gone
  // (a failed call stays, so that a late rank finds the failure instead of waiting for the others)
  auto leave = [&](std::string result) {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    std::lock_guard<std::mutex> inner(st->sync.mu);
    if (++st->departed == st->arrived && st->arrived >= st->expected) {
      log_order(*st);
      auto it = g_calls.find(key);
      if (it != g_calls.end() && it->second == st) g_calls.erase(it);
    }
    return result;
  };
  {
    std::unique_lock<std::mutex> lock(st->sync.mu);
    ++st->arrived;
    if (st->expected != n)
      st->sync.fail("ranks disagree on the mesh axis size: " + std::to_string(st->expected) + " and " + std::to_string(n));
    else if (st->parts[me].rank >= 0)
      st->sync.fail("two devices claim mesh-axis position " + std::to_string(me));
    if (st->sync.failed) {
      const std::string err = st->sync.error;
      lock.unlock();
      return leave(err);
    }
    st->parts[me] = std::move(contribution);
    if (st->arrived == n) {
      st->planning = true;
      lock.unlock();
      const std::string err = plan_call(*st);
      lock.lock();
      if (!err.empty()) st->sync.fail(err);
      st->ready = true;
      st->sync.cv.notify_all();
    } else {
      wait_for(st->sync, lock, timeout_s, [&] { return st->ready; }, [&] {
        return st->planning ? std::string("planning took longer than the timeout")
                            : "waiting for " + describe_missing(*st) + " to join the collective";
      });
    }
    if (st->sync.failed) {
      const std::string err = st->sync.error;
      lock.unlock();
      return leave(err);
    }
  }
  write_local(st->layout, st->parts, me, *st->streams);
  const std::string err = execute(st->sync, st->layout, st->states, *st->streams, st->parts, me, timeout_s,
                                  g_transfer_hook.load());
  return leave(err);
}

}  // namespace variopath
