#include "collective.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

namespace variopath {

namespace {

using Clock = std::chrono::steady_clock;

std::mutex g_config_mu;
std::map<int64_t, std::shared_ptr<OpConfig>> g_configs;

std::mutex g_debug_mu;
std::map<int64_t, ExecutedSchedule> g_debug;

// One byte copy of the laid-out schedule.
struct Copy {
  int32_t src, dst;  // mesh-axis positions
  int64_t src_offset, dst_offset, nbytes;
};

struct CallState {
  std::mutex mu;
  std::condition_variable cv;
  int32_t expected = 0;
  int32_t arrived = 0;
  int32_t departed = 0;
  std::vector<Contribution> parts;
  bool ready = false;
  bool failed = false;
  std::string error;
  std::vector<std::vector<Copy>> activations;  // copies per activation
  int32_t barrier_waiting = 0;
  int64_t barrier_generation = 0;
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

// The last rank to arrive: check what everybody brought, plan, lay the schedule out as copies.
// Returns an error message or "".
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
        st.parts[s.dest].recv_counts[i] = static_cast<int32_t>(s.rows);
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
        dst.recv_offsets[at] = static_cast<int32_t>(s.output_row);
        dst.source_offsets[at] = static_cast<int32_t>(s.input_row);
      }
  }
  // the demand in topology ranks, self traffic excluded (it is a local copy)
  const int32_t R = config->ranks;
  std::vector<int64_t> demand(size_t(R) * R, 0);
  for (int32_t i = 0; i < n; ++i)
    for (const auto& s : st.parts[i].slices)
      if (s.dest != i) demand[size_t(config->rank_map[i]) * R + config->rank_map[s.dest]] += s.rows * rb;
  PlanResult plan;
  try {
    plan = config->planner->plan(demand.data(), config->params);
  } catch (const std::exception& err) {
    return std::string("planning failed: ") + err.what();
  }
  // lay the transfers out as byte copies: the bytes of (i, j) are i's slices to j, in order
  std::vector<std::vector<const Slice*>> streams(size_t(n) * n);
  for (int32_t i = 0; i < n; ++i)
    for (const auto& s : st.parts[i].slices)
      if (s.dest != i && s.rows) streams[size_t(i) * n + s.dest].push_back(&s);
  std::vector<size_t> slice_at(size_t(n) * n, 0);
  std::vector<int64_t> within(size_t(n) * n, 0);
  st.activations.assign(plan.step_ptr.size() - 1, {});
  for (size_t a = 0; a + 1 < plan.step_ptr.size(); ++a) {
    for (int64_t t = plan.step_ptr[a]; t < plan.step_ptr[a + 1]; ++t) {
      const int32_t i = config->axis_of_rank[plan.src[t]], j = config->axis_of_rank[plan.dst[t]];
      const size_t cell = size_t(i) * n + j;
      int64_t left = plan.bytes[t];
      while (left > 0) {
        const Slice* s = streams[cell].at(slice_at[cell]);
        const int64_t room = s->rows * rb - within[cell];
        const int64_t take = std::min(left, room);
        st.activations[a].push_back(
            {i, j, s->input_row * rb + within[cell], s->output_row * rb + within[cell], take});
        within[cell] += take;
        left -= take;
        if (within[cell] == s->rows * rb) {
          ++slice_at[cell];
          within[cell] = 0;
        }
      }
    }
  }
  if (config->debug) {
    ExecutedSchedule log;
    log.ranks = R;
    log.demand = demand;
    log.step_ptr = plan.step_ptr;
    log.src = plan.src;
    log.dst = plan.dst;
    log.bytes = plan.bytes;
    std::lock_guard<std::mutex> lock(g_debug_mu);
    g_debug[site] = std::move(log);
  }
  return "";
}

// A barrier among the call's ranks; false on timeout or when the call failed meanwhile.
bool barrier(CallState& st, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(st.mu);
  const int64_t generation = st.barrier_generation;
  if (++st.barrier_waiting == st.expected) {
    st.barrier_waiting = 0;
    ++st.barrier_generation;
    st.cv.notify_all();
    return true;
  }
  const bool done = st.cv.wait_until(lock, deadline, [&] { return st.barrier_generation != generation || st.failed; });
  if (!done && !st.failed) {
    st.failed = true;
    st.error = "a rank stalled between activations (timeout)";
    st.cv.notify_all();
  }
  return !st.failed;
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

std::string run_collective(int64_t run_id, int64_t site, int64_t group, Contribution contribution) {
  const int32_t n = static_cast<int32_t>(contribution.axis_size);
  const int32_t me = contribution.rank;
  if (n <= 0 || me < 0 || me >= n)
    return "rank " + std::to_string(me) + " is outside the mesh axis of " + std::to_string(n) + " devices";
  auto config = find_config(contribution.config);
  const double timeout_s = config ? config->timeout_s : 60.0;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
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
  auto leave = [&] {
    std::lock_guard<std::mutex> lock(g_calls_mu);
    std::lock_guard<std::mutex> inner(st->mu);
    if (++st->departed == st->arrived) {
      auto it = g_calls.find(key);
      if (it != g_calls.end() && it->second == st) g_calls.erase(it);
    }
  };
  const Contribution* mine = nullptr;
  {
    std::unique_lock<std::mutex> lock(st->mu);
    if (st->expected != n) {
      lock.unlock();
      leave();
      return "ranks disagree on the mesh axis size";
    }
    if (st->parts[me].rank >= 0) {
      lock.unlock();
      leave();
      return "two devices claim mesh-axis position " + std::to_string(me);
    }
    st->parts[me] = std::move(contribution);
    mine = &st->parts[me];
    if (++st->arrived == n && !st->failed) {
      const std::string err = plan_call(*st, site);
      if (!err.empty()) {
        st->failed = true;
        st->error = err;
      }
      st->ready = true;
      st->cv.notify_all();
    } else {
      const bool ok = st->cv.wait_until(lock, deadline, [&] { return st->ready || st->failed; });
      if (!ok && !st->failed) {
        st->failed = true;
        std::vector<int32_t> missing;
        st->error = "timed out after " + std::to_string(timeout_s) + " s waiting for " + describe_missing(*st) +
                    " to join the collective";
        st->cv.notify_all();
      }
    }
    if (st->failed) {
      const std::string err = st->error;
      lock.unlock();
      leave();
      return err;
    }
  }
  // local work: self copies and (all_to_all_v) zeroing past the received rows
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
  // the activations: copy what this rank sends, then wait for everybody
  for (const auto& activation : st->activations) {
    for (const auto& c : activation)
      if (c.src == me)
        std::memcpy(st->parts[c.dst].output + c.dst_offset, st->parts[c.src].input + c.src_offset, c.nbytes);
    if (!barrier(*st, deadline)) {
      std::string err;
      {
        std::lock_guard<std::mutex> lock(st->mu);
        err = st->error;
      }
      leave();
      return err;
    }
  }
  if (st->activations.empty() && !barrier(*st, deadline)) {  // self copies only: still meet once
    std::string err;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      err = st->error;
    }
    leave();
    return err;
  }
  leave();
  return "";
}

}  // namespace variopath
