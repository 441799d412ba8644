#include "collective.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <tuple>

namespace variopath {

namespace {

using Clock = std::chrono::steady_clock;

std::mutex g_config_mu;
std::map<int64_t, std::shared_ptr<OpConfig>> g_configs;

std::mutex g_debug_mu;
std::map<int64_t, ExecutedSchedule> g_debug;

std::atomic<TransferHook> g_transfer_hook{nullptr};

// One byte copy of the laid-out schedule.
struct Copy {
  int64_t src_offset, dst_offset, nbytes;
};

// One planned transfer as executed: its copies and the transfers it waits for.
struct Transfer {
  int32_t src, dst;  // mesh-axis positions
  double pace_gbs = 0;  // the rate it must not exceed; 0: unpaced
  size_t first_copy = 0, end_copy = 0;
  std::vector<int32_t> after;
};

// What a rank's output arrays receive besides the rows (written by the rank itself).
struct RankResult {
  std::vector<int32_t> recv_counts;                   // all_to_all_v
  std::vector<int32_t> recv_offsets, source_offsets;  // ragged
};

struct CallState {
  std::mutex mu;
  std::condition_variable cv;
  int32_t expected = 0;
  int32_t arrived = 0;
  int32_t departed = 0;
  std::vector<Contribution> parts;
  bool planning = false;  // the last rank to arrive is planning (outside mu)
  bool ready = false;
  bool failed = false;
  std::string error;
  // the laid-out schedule (plan_call) and its progress (execute)
  std::vector<RankResult> results;
  std::vector<Copy> copies;
  std::vector<Transfer> transfers;
  std::vector<std::vector<int32_t>> sends;  // per rank: the transfers it sends, in order
  std::vector<uint8_t> done;                // per transfer
  std::vector<int32_t> incoming;            // per rank: transfers into it not yet done
  std::vector<int32_t> writing;             // per rank: transfers copying into it right now

  void fail(const std::string& why) {  // with mu held
    if (!failed) {
      failed = true;
      error = why;
    }
    cv.notify_all();
  }
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

// Fault a large output buffer's pages in with one call before the rendezvous (XLA hands out
// freshly mapped buffers; faulting them in page by page inside the peers' copies costs more
// than the copies themselves), overlapping it with the wait for the other ranks. A kernel
// without MADV_POPULATE_WRITE (Linux < 5.14) refuses it and the copies fault as before.
void prefault(uint8_t* data, int64_t nbytes) {
#ifdef MADV_POPULATE_WRITE
  constexpr int64_t kWorthIt = 1 << 20;
  if (!data || nbytes < kWorthIt) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + nbytes + page - 1) / page * page;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#endif
}

// Every pair at once in one step, in row-major order (planner/model_aware.py `concurrent`, whose
// path choice a copy has no use for).
PlanResult concurrent_plan(const std::vector<int64_t>& demand, int32_t ranks) {
  PlanResult plan;
  for (int32_t i = 0; i < ranks; ++i)
    for (int32_t j = 0; j < ranks; ++j)
      if (const int64_t b = demand[size_t(i) * ranks + j]) {
        plan.src.push_back(i);
        plan.dst.push_back(j);
        plan.bytes.push_back(b);
      }
  if (!plan.src.empty()) plan.step_ptr.push_back(static_cast<int64_t>(plan.src.size()));
  return plan;
}

// The transfers each transfer waits for. Barrier: every transfer of the previous activation.
// Signal (schedule.signal_driven, step for step): the transfers of the last activation its
// sender sent in and of the last one its receiver received in. Concurrent: none.
std::vector<std::vector<int32_t>> transfer_dependencies(const PlanResult& plan, Execution execution) {
  const size_t transfers = plan.src.size();
  std::vector<std::vector<int32_t>> after(transfers);
  if (execution == Execution::kConcurrent) return after;
  std::map<int32_t, std::vector<int32_t>> last_send, last_recv;
  for (size_t a = 0; a + 1 < plan.step_ptr.size(); ++a) {
    const int64_t begin = plan.step_ptr[a], end = plan.step_ptr[a + 1];
    for (int64_t t = begin; t < end; ++t) {
      auto& mine = after[t];
      if (execution == Execution::kBarrier) {
        if (a > 0)
          for (int64_t u = plan.step_ptr[a - 1]; u < begin; ++u) mine.push_back(static_cast<int32_t>(u));
        continue;
      }
      const auto& s = last_send[plan.src[t]];
      const auto& r = last_recv[plan.dst[t]];
      mine.insert(mine.end(), s.begin(), s.end());
      mine.insert(mine.end(), r.begin(), r.end());
      std::sort(mine.begin(), mine.end());
      mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
    }
    std::map<int32_t, std::vector<int32_t>> sends, recvs;
    for (int64_t t = begin; t < end; ++t) {
      sends[plan.src[t]].push_back(static_cast<int32_t>(t));
      recvs[plan.dst[t]].push_back(static_cast<int32_t>(t));
    }
    for (auto& [rank, ts] : sends) last_send[rank] = std::move(ts);
    for (auto& [rank, ts] : recvs) last_recv[rank] = std::move(ts);
  }
  return after;
}

// What lay_out and execute rely on in a plan made outside the core: consistent arrays, ranks in
// range, positive bytes that add up to the demand pair by pair, dependencies on earlier
// transfers only, finite non-negative pacing that ends every transfer within the timeout.
// "" or what is wrong.
std::string check_external(const ExternalPlan& made, const std::vector<int64_t>& demand, int32_t ranks,
                           double timeout_s) {
  const PlanResult& p = made.plan;
  const size_t t_count = p.src.size();
  if (p.dst.size() != t_count || p.bytes.size() != t_count || made.after.size() != t_count ||
      made.pace_gbs.size() != t_count)
    return "its arrays differ in length";
  if (p.step_ptr.empty() || p.step_ptr.front() != 0 || p.step_ptr.back() != static_cast<int64_t>(t_count) ||
      !std::is_sorted(p.step_ptr.begin(), p.step_ptr.end()))
    return "step_ptr does not partition its transfers";
  std::vector<int64_t> served(demand.size(), 0);
  for (size_t t = 0; t < t_count; ++t) {
    if (p.src[t] < 0 || p.src[t] >= ranks || p.dst[t] < 0 || p.dst[t] >= ranks || p.src[t] == p.dst[t])
      return "transfer " + std::to_string(t) + " has ranks " + std::to_string(p.src[t]) + " -> " +
             std::to_string(p.dst[t]);
    if (p.bytes[t] <= 0) return "transfer " + std::to_string(t) + " moves " + std::to_string(p.bytes[t]) + " bytes";
    const double pace = made.pace_gbs[t];
    if (!(pace >= 0) || !std::isfinite(pace) || (pace > 0 && p.bytes[t] / (pace * 1e9) > timeout_s))
      return "transfer " + std::to_string(t) + " is paced at " + std::to_string(pace) + " GB/s for " +
             std::to_string(p.bytes[t]) + " bytes (at most the timeout of " + std::to_string(timeout_s) + " s)";
    for (int32_t a : made.after[t])
      if (a < 0 || static_cast<size_t>(a) >= t)
        return "transfer " + std::to_string(t) + " waits for transfer " + std::to_string(a) + ", not an earlier one";
    served[size_t(p.src[t]) * ranks + p.dst[t]] += p.bytes[t];
  }
  for (size_t c = 0; c < demand.size(); ++c)
    if (served[c] != demand[c])
      return "it moves " + std::to_string(served[c]) + " bytes from rank " + std::to_string(c / ranks) + " to rank " +
             std::to_string(c % ranks) + ", the demand is " + std::to_string(demand[c]);
  return "";
}

// Lay the planned transfers out as byte copies (the bytes of (i, j) are i's slices to j, in
// order) and set up the progress counters.
void lay_out(CallState& st, const PlanResult& plan, const std::vector<std::vector<int32_t>>& after,
             const std::vector<double>& pace_gbs, const OpConfig& config, int64_t row_bytes) {
  const int32_t n = st.expected;
  std::vector<std::vector<const Slice*>> streams(size_t(n) * n);
  for (int32_t i = 0; i < n; ++i)
    for (const auto& s : st.parts[i].slices)
      if (s.dest != i && s.rows) streams[size_t(i) * n + s.dest].push_back(&s);
  std::vector<size_t> slice_at(size_t(n) * n, 0);
  std::vector<int64_t> within(size_t(n) * n, 0);
  st.sends.assign(n, {});
  st.incoming.assign(n, 0);
  st.writing.assign(n, 0);
  st.done.assign(plan.src.size(), 0);
  for (size_t t = 0; t < plan.src.size(); ++t) {
    Transfer tr;
    tr.src = config.axis_of_rank[plan.src[t]];
    tr.dst = config.axis_of_rank[plan.dst[t]];
    tr.after = after[t];
    tr.pace_gbs = pace_gbs[t];
    tr.first_copy = st.copies.size();
    const size_t cell = size_t(tr.src) * n + tr.dst;
    int64_t left = plan.bytes[t];
    while (left > 0) {
      const Slice* s = streams[cell].at(slice_at[cell]);
      const int64_t take = std::min(left, s->rows * row_bytes - within[cell]);
      st.copies.push_back({s->input_row * row_bytes + within[cell], s->output_row * row_bytes + within[cell], take});
      within[cell] += take;
      left -= take;
      if (within[cell] == s->rows * row_bytes) {
        ++slice_at[cell];
        within[cell] = 0;
      }
    }
    tr.end_copy = st.copies.size();
    st.sends[tr.src].push_back(static_cast<int32_t>(t));
    ++st.incoming[tr.dst];
    st.transfers.push_back(std::move(tr));
  }
}

// The configuration's plan for a demand (topology ranks): from its cache of recent demands
// (every planner is deterministic, so an equal demand has an equal plan), else planned, checked
// and cached. "" or the error.
std::string plan_for(OpConfig& config, const std::vector<int64_t>& demand, std::shared_ptr<const ExternalPlan>& out) {
  {
    std::lock_guard<std::mutex> lock(config.cache_mu);
    for (auto it = config.plan_cache.begin(); it != config.plan_cache.end(); ++it)
      if (it->first == demand) {
        config.plan_cache.splice(config.plan_cache.begin(), config.plan_cache, it);  // most recent first
        out = it->second;
        return "";
      }
  }
  const int32_t R = config.ranks;
  auto made = std::make_shared<ExternalPlan>();
  try {
    if (config.execution == Execution::kModelAware) {
      *made = config.external(demand, R);
      const std::string bad = check_external(*made, demand, R, config.timeout_s);
      if (!bad.empty()) return "the model-aware plan is unusable: " + bad;
    } else {
      made->plan = config.execution == Execution::kConcurrent ? concurrent_plan(demand, R)
                                                              : config.planner->plan(demand.data(), config.params);
      made->after = transfer_dependencies(made->plan, config.execution);
      made->pace_gbs.assign(made->plan.src.size(), 0.0);
    }
  } catch (const std::exception& err) {
    return std::string("planning failed: ") + err.what();
  }
  out = made;
  std::lock_guard<std::mutex> lock(config.cache_mu);
  config.plan_cache.emplace_front(demand, std::move(made));
  if (config.plan_cache.size() > OpConfig::kPlanCacheSize) config.plan_cache.pop_back();
  return "";
}

// The last rank to arrive, outside mu: check what everybody brought, plan, lay the schedule out
// as copies. Touches only the call's own state, never a rank's buffers (a rank that times out
// meanwhile may have returned them). Returns an error message or "".
std::string plan_call(CallState& st, int64_t site) {
  const int32_t n = st.expected;
  for (const auto& p : st.parts)
    if (!p.error.empty()) return "rank " + std::to_string(p.rank) + ": " + p.error;
  const auto& first = st.parts[0];
  for (const auto& p : st.parts) {
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
  auto config = find_config(first.config);
  if (!config) return "configuration " + std::to_string(first.config) + " is not registered (call configure())";
  if (config->ranks != n)
    return "the mesh axis has " + std::to_string(n) + " devices but the configured topology has " +
           std::to_string(config->ranks) + " ranks";
  const int64_t rb = first.row_bytes;
  st.results.assign(n, {});
  for (auto& r : st.results) {
    r.recv_counts.assign(first.ragged ? 0 : n, 0);
    r.recv_offsets.assign(first.ragged ? first.slices.size() : 0, 0);
    r.source_offsets.assign(r.recv_offsets.size(), 0);
  }
  // receiver-side placement (all_to_all_v) and checks of what each receiver can hold
  if (!first.ragged) {
    std::vector<int64_t> received(n, 0);
    for (int32_t i = 0; i < n; ++i)
      for (auto& s : st.parts[i].slices) {
        s.output_row = 0;  // filled below, in source order
        received[s.dest] += s.rows;
      }
    for (int32_t j = 0; j < n; ++j)
      if (received[j] > st.parts[j].output_rows)
        return "rank " + std::to_string(j) + " receives " + std::to_string(received[j]) +
               " rows but its output holds " + std::to_string(st.parts[j].output_rows) +
               " (raise out_capacity)";
    std::vector<int64_t> next(n, 0);
    for (int32_t i = 0; i < n; ++i)
      for (auto& s : st.parts[i].slices) {
        s.output_row = next[s.dest];
        next[s.dest] += s.rows;
        st.results[s.dest].recv_counts[i] = static_cast<int32_t>(s.rows);
      }
  } else {
    const size_t k = first.slices.size();
    const size_t per = k / n;
    for (int32_t i = 0; i < n; ++i)
      for (size_t t = 0; t < k; ++t) {
        const Slice& s = st.parts[i].slices[t];
        auto& dst = st.parts[s.dest];
        const size_t at = size_t(i) * per + t % per;  // the receiver's slot for this slice
        if (dst.recv_sizes[at] != s.rows)
          return "rank " + std::to_string(i) + " sends " + std::to_string(s.rows) + " rows in slice " +
                 std::to_string(t) + " but rank " + std::to_string(s.dest) + " expects recv_sizes[" +
                 std::to_string(at) + "] = " + std::to_string(dst.recv_sizes[at]);
        if (s.output_row + s.rows > dst.output_rows)
          return "rank " + std::to_string(i) + " writes rows [" + std::to_string(s.output_row) + ", " +
                 std::to_string(s.output_row + s.rows) + ") of rank " + std::to_string(s.dest) +
                 "'s output, which has " + std::to_string(dst.output_rows) + " rows";
        st.results[s.dest].recv_offsets[at] = static_cast<int32_t>(s.output_row);
        st.results[s.dest].source_offsets[at] = static_cast<int32_t>(s.input_row);
      }
  }
  // the demand in topology ranks, self traffic excluded (it is a local copy)
  const int32_t R = config->ranks;
  std::vector<int64_t> demand(size_t(R) * R, 0);
  for (int32_t i = 0; i < n; ++i)
    for (const auto& s : st.parts[i].slices)
      if (s.dest != i) demand[size_t(config->rank_map[i]) * R + config->rank_map[s.dest]] += s.rows * rb;
  std::shared_ptr<const ExternalPlan> planned;
  const std::string err = plan_for(*config, demand, planned);
  if (!err.empty()) return err;
  const ExternalPlan& made = *planned;
  const PlanResult& plan = made.plan;
  const auto& after = made.after;
  lay_out(st, plan, after, made.pace_gbs, *config, rb);
  if (config->debug) {
    ExecutedSchedule log;
    log.ranks = R;
    log.execution = config->execution;
    log.demand = demand;
    log.step_ptr = plan.step_ptr;
    log.src = plan.src;
    log.dst = plan.dst;
    log.bytes = plan.bytes;
    log.pace_gbs = made.pace_gbs;
    for (const auto& a : after) {
      log.after.insert(log.after.end(), a.begin(), a.end());
      log.after_ptr.push_back(static_cast<int64_t>(log.after.size()));
    }
    std::lock_guard<std::mutex> lock(g_debug_mu);
    g_debug[site] = std::move(log);
  }
  return "";
}

// Wait, with mu held, until `done()` holds or the call fails; give up after the timeout with
// `stalled()` as the call's error. True when `done()` holds.
template <typename Done, typename Stalled>
bool wait_for(CallState& st, std::unique_lock<std::mutex>& lock, double timeout_s, Done done, Stalled stalled) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (st.cv.wait_until(lock, deadline, [&] { return st.failed || done(); }) && !st.failed) return true;
  if (!st.failed) st.fail("timed out after " + std::to_string(timeout_s) + " s: " + stalled());
  return false;
}

// This rank's part of the laid-out schedule: send its transfers, each once the transfers it
// waits for are done, then wait until everything sent to it has arrived. "" or the error.
std::string execute(CallState& st, int32_t me, double timeout_s) {
  const auto& mine = st.sends[me];
  for (size_t nth = 0; nth < mine.size(); ++nth) {
    const int32_t t = mine[nth];
    const Transfer& tr = st.transfers[t];
    if (TransferHook hook = g_transfer_hook.load()) hook(me, static_cast<int64_t>(nth));
    {
      std::unique_lock<std::mutex> lock(st.mu);
      const auto open = [&] {
        for (int32_t d : tr.after)
          if (!st.done[d]) return d;
        return -1;
      };
      const bool ok = wait_for(st, lock, timeout_s, [&] { return open() < 0; }, [&] {
        const Transfer& d = st.transfers[open()];
        return "rank " + std::to_string(me) + " waited for rank " + std::to_string(d.src) + "'s transfer to rank " +
               std::to_string(d.dst) + " (a rank stalled mid-exchange)";
      });
      if (!ok) return st.error;
      ++st.writing[tr.dst];  // from here until done, tr.dst must not return
    }
    const auto start = Clock::now();
    const uint8_t* in = st.parts[tr.src].input;
    uint8_t* out = st.parts[tr.dst].output;
    int64_t nbytes = 0;
    for (size_t c = tr.first_copy; c < tr.end_copy; ++c) {
      const Copy& copy = st.copies[c];
      std::memcpy(out + copy.dst_offset, in + copy.src_offset, copy.nbytes);
      nbytes += copy.nbytes;
    }
    {
      std::lock_guard<std::mutex> lock(st.mu);
      --st.writing[tr.dst];
    }
    if (tr.pace_gbs > 0)  // a paced transfer ends no earlier than its bytes at its rate allow
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(nbytes / (tr.pace_gbs * 1e9))));
    std::lock_guard<std::mutex> lock(st.mu);
    st.done[t] = 1;
    --st.incoming[tr.dst];
    st.cv.notify_all();
  }
  std::unique_lock<std::mutex> lock(st.mu);
  const bool ok = wait_for(st, lock, timeout_s, [&] { return st.incoming[me] == 0; }, [&] {
    std::string from;
    for (size_t t = 0; t < st.transfers.size(); ++t)
      if (st.transfers[t].dst == me && !st.done[t]) {
        from = std::to_string(st.transfers[t].src);
        break;
      }
    return "rank " + std::to_string(me) + " waited for its data from rank " + from + " (a rank stalled mid-exchange)";
  });
  return ok ? "" : st.error;
}

}  // namespace

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

void set_transfer_hook(TransferHook hook) { g_transfer_hook.store(hook); }

std::string run_collective(int64_t run_id, int64_t site, int64_t group, Contribution contribution) {
  const int32_t n = static_cast<int32_t>(contribution.axis_size);
  const int32_t me = contribution.rank;
  if (n <= 0 || me < 0 || me >= n)
    return "rank " + std::to_string(me) + " is outside the mesh axis of " + std::to_string(n) + " devices";
  auto config = find_config(contribution.config);
  const double timeout_s = config ? config->timeout_s : 60.0;
  prefault(contribution.output, contribution.output_rows * contribution.row_bytes);
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
      slot->parts.resize(n);
    }
    st = slot;
  }
  // every rank that joined leaves exactly once; the call is forgotten when all have come and gone
  // (a failed call stays, so that a late rank finds the failure instead of waiting for the others)
  auto leave = [&](std::string result) {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    std::lock_guard<std::mutex> inner(st->mu);
    if (++st->departed == st->arrived && st->arrived >= st->expected) {
      auto it = g_calls.find(key);
      if (it != g_calls.end() && it->second == st) g_calls.erase(it);
    }
    return result;
  };
  const Contribution* mine = nullptr;
  {
    std::unique_lock<std::mutex> lock(st->mu);
    ++st->arrived;
    if (st->expected != n)
      st->fail("ranks disagree on the mesh axis size: " + std::to_string(st->expected) + " and " + std::to_string(n));
    else if (st->parts[me].rank >= 0)
      st->fail("two devices claim mesh-axis position " + std::to_string(me));
    if (st->failed) {
      const std::string err = st->error;
      lock.unlock();
      return leave(err);
    }
    st->parts[me] = std::move(contribution);
    mine = &st->parts[me];
    if (st->arrived == n) {
      st->planning = true;
      lock.unlock();
      const std::string err = plan_call(*st, site);
      lock.lock();
      if (!err.empty()) st->fail(err);
      st->ready = true;
      st->cv.notify_all();
    } else {
      wait_for(*st, lock, timeout_s, [&] { return st->ready; }, [&] {
        return st->planning ? std::string("planning took longer than the timeout")
                            : "waiting for " + describe_missing(*st) + " to join the collective";
      });
    }
    if (st->failed) {
      const std::string err = st->error;
      lock.unlock();
      return leave(err);
    }
  }
  // local work: this rank's result arrays, self copies and (all_to_all_v) zeroing past the
  // received rows
  const RankResult& result = st->results[me];
  if (mine->recv_counts) std::copy(result.recv_counts.begin(), result.recv_counts.end(), mine->recv_counts);
  if (mine->recv_offsets) std::copy(result.recv_offsets.begin(), result.recv_offsets.end(), mine->recv_offsets);
  if (mine->source_offsets)
    std::copy(result.source_offsets.begin(), result.source_offsets.end(), mine->source_offsets);
  int64_t received = 0;
  for (const auto& p : st->parts)
    for (const auto& s : p.slices)
      if (s.dest == me) received = std::max(received, s.output_row + s.rows);
  if (!mine->ragged && mine->output_rows > received)
    std::memset(mine->output + received * mine->row_bytes, 0, (mine->output_rows - received) * mine->row_bytes);
  for (const auto& s : mine->slices)
    if (s.dest == me && s.rows)
      std::memmove(mine->output + s.output_row * mine->row_bytes, mine->input + s.input_row * mine->row_bytes,
                   s.rows * mine->row_bytes);
  std::string err = execute(*st, me, timeout_s);
  if (!err.empty()) {
    // no copy starts after a failure; wait out those writing into this rank's output now (each a
    // bounded memcpy already under way), so nothing writes here once XLA has the buffer back
    std::unique_lock<std::mutex> lock(st->mu);
    st->fail(err);
    st->cv.wait(lock, [&] { return st->writing[me] == 0; });
  }
  return leave(err);
}

}  // namespace variopath
