#include "layout.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>

namespace variopath {

namespace {

// Every pair at once in one step, in row-major order.
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
// Signal: signal_waits (choice.h; schedule.signal_driven, step for step). Concurrent: none.
std::vector<std::vector<int32_t>> transfer_dependencies(const PlanResult& plan, Execution execution, int32_t ranks) {
  const size_t transfers = plan.src.size();
  std::vector<std::vector<int32_t>> after(transfers);
  if (execution == Execution::kConcurrent) return after;
  if (execution == Execution::kBarrier) {
    for (size_t a = 1; a + 1 < plan.step_ptr.size(); ++a)
      for (int64_t t = plan.step_ptr[a]; t < plan.step_ptr[a + 1]; ++t)
        for (int64_t u = plan.step_ptr[a - 1]; u < plan.step_ptr[a]; ++u) after[size_t(t)].push_back(int32_t(u));
    return after;
  }
  const size_t n_links = plan.links.empty() ? 0 : size_t(*std::max_element(plan.links.begin(), plan.links.end())) + 1;
  const SignalWaits waits = signal_waits(plan.step_ptr, plan.src, plan.dst, plan.link_ptr, plan.links, size_t(ranks), n_links);
  for (size_t t = 0; t < transfers; ++t)
    after[t].assign(waits.after.begin() + waits.ptr[t], waits.after.begin() + waits.ptr[t + 1]);
  return after;
}

// What lay_out and execute rely on in a plan made outside the core: consistent arrays, ranks in
// range, positive bytes that add up to the demand pair by pair (a rank's plan: the pairs it
// sends or receives in), dependencies on earlier
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
  // bytes served per pair: every pair, or (made.rank >= 0) the rank's row and column
  const int32_t me = made.rank;
  std::vector<int64_t> served(me < 0 ? demand.size() : 2 * size_t(ranks), 0);
  const auto cell = [&](int32_t i, int32_t j) -> int64_t* {
    if (me < 0) return &served[size_t(i) * ranks + j];
    if (i == me) return &served[size_t(j)];
    return j == me ? &served[size_t(ranks) + size_t(i)] : nullptr;
  };
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
    if (int64_t* at = cell(p.src[t], p.dst[t])) *at += p.bytes[t];
  }
  const auto wrong = [&](int32_t i, int32_t j) {
    const int64_t moved = *cell(i, j), want = demand[size_t(i) * ranks + j];
    return moved == want ? std::string()
                         : "it moves " + std::to_string(moved) + " bytes from rank " + std::to_string(i) + " to rank " +
                               std::to_string(j) + ", the demand is " + std::to_string(want);
  };
  for (int32_t i = me < 0 ? 0 : me; i < (me < 0 ? ranks : me + 1); ++i)  // every row, or the rank's
    for (int32_t j = 0; j < ranks; ++j)
      if (std::string bad = wrong(i, j); !bad.empty()) return bad;
  for (int32_t i = 0; i < ranks && me >= 0; ++i)  // and the rank's column
    if (std::string bad = wrong(i, me); !bad.empty()) return bad;
  return "";
}

// The choice's schedule as the op executes it (jax_ops/config.py `op_plan`, step for step): each
// transfer waits for its `after` transfers and, in a step chained to the one before, for every
// transfer of that step; where the choice caps it (cap_bps), its rate is its cap. Relays are refused: the
// op moves each pair's bytes directly (no family of the choice relays).
ExternalPlan executed_choice(const ChoiceSchedule& s) {
  ExternalPlan made;
  made.name = s.plan;
  made.plan.step_ptr = s.step_ptr;
  made.plan.src = s.src;
  made.plan.dst = s.dst;
  made.plan.bytes = s.bytes;
  made.after.resize(s.transfers());
  made.pace_gbs.assign(s.transfers(), 0.0);
  for (size_t k = 0; k + 1 < s.step_ptr.size(); ++k)
    for (int64_t t = s.step_ptr[k]; t < s.step_ptr[k + 1]; ++t) {
      if (s.carries_i[t] != s.src[t] || s.carries_j[t] != s.dst[t])
        throw std::runtime_error("the op cannot execute relays: a transfer " + std::to_string(s.src[t]) + " -> " +
                                 std::to_string(s.dst[t]) + " carries another pair's bytes");
      auto& after = made.after[t];
      if (k > 0 && s.step_chain[k])
        for (int64_t u = s.step_ptr[k - 1]; u < s.step_ptr[k]; ++u) after.push_back(static_cast<int32_t>(u));
      for (int64_t a = s.after_ptr[t]; a < s.after_ptr[t + 1]; ++a)
        after.push_back(static_cast<int32_t>(s.step_ptr[s.after_step[a]] + s.after_index[a]));
      std::sort(after.begin(), after.end());
      after.erase(std::unique(after.begin(), after.end()), after.end());
      if (s.cap_bps[t] > 0) made.pace_gbs[t] = s.rate[t];  // the cap in GB/s, as the plan states it
    }
  return made;
}

}  // namespace

std::string place(std::vector<Contribution>& parts, const OpConfig& config, Layout& out, std::vector<int64_t>& demand) {
  const int32_t n = static_cast<int32_t>(parts.size());
  const auto& first = parts[0];
  const int64_t rb = first.row_bytes;
  out.results.assign(n, {});
  for (auto& r : out.results) {
    r.recv_counts.assign(first.ragged ? 0 : n, 0);
    r.recv_offsets.assign(first.ragged ? first.slices.size() : 0, 0);
    r.source_offsets.assign(r.recv_offsets.size(), 0);
  }
  // receiver-side placement (all_to_all_v) and checks of what each receiver can hold
  if (!first.ragged) {
    std::vector<int64_t> received(n, 0);
    for (int32_t i = 0; i < n; ++i)
      for (auto& s : parts[i].slices) {
        s.output_row = 0;  // filled below, in source order
        received[s.dest] += s.rows;
      }
    for (int32_t j = 0; j < n; ++j)
      if (received[j] > parts[j].output_rows)
        return "rank " + std::to_string(j) + " receives " + std::to_string(received[j]) +
               " rows but its output holds " + std::to_string(parts[j].output_rows) +
               " (raise out_capacity)";
    std::vector<int64_t> next(n, 0);
    for (int32_t i = 0; i < n; ++i)
      for (auto& s : parts[i].slices) {
        s.output_row = next[s.dest];
        next[s.dest] += s.rows;
        out.results[s.dest].recv_counts[i] = static_cast<int32_t>(s.rows);
      }
  } else {
    const size_t k = first.slices.size();
    const size_t per = k / n;
    for (int32_t i = 0; i < n; ++i)
      for (size_t t = 0; t < k; ++t) {
        const Slice& s = parts[i].slices[t];
        auto& dst = parts[s.dest];
        const size_t at = size_t(i) * per + t % per;  // the receiver's slot for this slice
        if (dst.recv_sizes[at] != s.rows)
          return "rank " + std::to_string(i) + " sends " + std::to_string(s.rows) + " rows in slice " +
                 std::to_string(t) + " but rank " + std::to_string(s.dest) + " expects recv_sizes[" +
                 std::to_string(at) + "] = " + std::to_string(dst.recv_sizes[at]);
        if (s.output_row + s.rows > dst.output_rows)
          return "rank " + std::to_string(i) + " writes rows [" + std::to_string(s.output_row) + ", " +
                 std::to_string(s.output_row + s.rows) + ") of rank " + std::to_string(s.dest) +
                 "'s output, which has " + std::to_string(dst.output_rows) + " rows";
        out.results[s.dest].recv_offsets[at] = static_cast<int32_t>(s.output_row);
        out.results[s.dest].source_offsets[at] = static_cast<int32_t>(s.input_row);
      }
  }
  // the demand in topology ranks, self traffic excluded (it is a local copy)
  const int32_t R = config.ranks;
  demand.assign(size_t(R) * R, 0);
  for (int32_t i = 0; i < n; ++i)
    for (const auto& s : parts[i].slices)
      if (s.dest != i) demand[size_t(config.rank_map[i]) * R + config.rank_map[s.dest]] += s.rows * rb;
  return "";
}

namespace {

// Issue 30: how plan_for met its demands (plan_counts()).
std::atomic<int64_t> g_planned{0}, g_exact{0}, g_transposed{0};

// A cached plan for demand D served for Dᵀ (combine after dispatch, a backward exchange after its
// forward): every transfer reversed (j -> i for i -> j, its bytes, step, dependencies and pacing
// unchanged). The op's plans move each pair's bytes directly (executed_choice refuses relays), so
// the reversed plan serves exactly Dᵀ; its dependencies stay on earlier transfers, and a
// transfer's pair {sender, receiver} is the same set, so the signal-driven and barrier orders
// are those of D's plan. Its predicted time equals D's plan's where links are full duplex with
// equal rates both ways (the presets' PCIe and NIC links; plan_for reverses no chosen plan
// elsewhere). Path lists are directed, so they are
// dropped (nothing the op executes reads them).
std::shared_ptr<const ExternalPlan> transposed_plan(const ExternalPlan& made) {
  auto out = std::make_shared<ExternalPlan>();
  out->name = made.name;
  out->plan.step_ptr = made.plan.step_ptr;
  out->plan.src = made.plan.dst;
  out->plan.dst = made.plan.src;
  out->plan.bytes = made.plan.bytes;
  out->plan.rate = made.plan.rate;
  out->plan.tau_s = made.plan.tau_s;
  out->plan.k = made.plan.k;
  out->plan.link_ptr.assign(made.plan.src.size() + 1, 0);
  out->after = made.after;
  out->pace_gbs = made.pace_gbs;
  return out;
}

}  // namespace

PlanCounts plan_counts() { return {g_planned.load(), g_exact.load(), g_transposed.load()}; }

std::string critical_path(const ChoiceCore& chooser, const Decision& decision, const std::vector<int64_t>& demand,
                          const Algorithm2& algorithm2, const std::vector<NetParams>& models, int32_t rank,
                          double timeout_s, ExternalPlan& out) {
  out = executed_choice(chooser.apply(decision, demand.data(), algorithm2, models, rank, /*with_links=*/false));
  out.rank = rank;
  out.decision = decision.id;
  const std::string bad = check_external(out, demand, chooser.deployment().ranks, timeout_s);
  return bad.empty() ? "" : "the chosen plan (" + out.name + ") is unusable: " + bad;
}

Decision decision_for(const OpConfig& config, const Decider::Site& site, std::string& error) {
  if (config.execution != Execution::kPlanned || !config.decider) return safe_decision();
  return config.decider->take(site, config.timeout_s, error);
}

void decide_next(const OpConfig& config, const Decider::Site& site, const std::vector<int64_t>& demand) {
  if (config.execution == Execution::kPlanned && config.decider) config.decider->submit(site, demand);
}

Decision agreed_decision(const std::vector<Contribution>& parts, const Decision& mine) {
  for (const Contribution& c : parts)
    if (c.decision != mine.id) return safe_decision();
  return mine;
}

// The configuration's plan for a demand (topology ranks) under a decision: from its cache of
// recent demands (every planner is deterministic, so an equal demand under an equal decision has
// an equal plan), or with `transposed_reuse` a cached plan of the transposed demand reversed
// (transposed_plan; not for a chosen plan on links that differ by direction), else planned,
// checked and cached. "" or the error.
std::string plan_for(OpConfig& config, const std::vector<int64_t>& demand, std::shared_ptr<const ExternalPlan>& out,
                     bool transposed_reuse, int32_t rank, const Decision& decision) {
  if (rank >= 0) transposed_reuse = false;  // a reversed rank's plan would be its peers' transfers
  {
    // a chosen plan is paced for its own direction: reversed, its caps fit only where every link
    // is the same both ways (ChoiceDeployment::symmetric); Algorithm 2's plans carry no caps
    if (config.execution == Execution::kPlanned && config.chooser && !config.chooser->deployment().symmetric)
      transposed_reuse = false;
    const int32_t R = config.ranks;
    std::vector<int64_t> transposed(transposed_reuse ? demand.size() : 0, 0);
    for (int32_t i = 0; transposed_reuse && i < R; ++i)
      for (int32_t j = 0; j < R; ++j) transposed[size_t(j) * R + i] = demand[size_t(i) * R + j];
    std::lock_guard<std::mutex> lock(config.cache_mu);
    for (auto it = config.plan_cache.begin(); it != config.plan_cache.end(); ++it)
      if (it->first == demand && it->second->rank == rank && it->second->decision == decision.id) {
        config.plan_cache.splice(config.plan_cache.begin(), config.plan_cache, it);  // most recent first
        out = it->second;
        ++g_exact;
        return "";
      }
    // a rot-paced plan reversed would write toward several root complexes from one uplink at once
    // (its phases are per sending uplink): the posted-write trigger it exists to avoid
    for (auto it = config.plan_cache.begin(); transposed_reuse && it != config.plan_cache.end(); ++it)
      if (it->first == transposed && it->second->name != "rot-paced" && it->second->decision == decision.id) {
        config.plan_cache.splice(config.plan_cache.begin(), config.plan_cache, it);
        out = transposed_plan(*it->second);
        ++g_transposed;
        return "";
      }
  }
  ++g_planned;
  const int32_t R = config.ranks;
  auto made = std::make_shared<ExternalPlan>();
  try {
    if (config.execution == Execution::kModelAware) {
      *made = config.external(demand, R);
      const std::string bad = check_external(*made, demand, R, config.timeout_s);
      if (!bad.empty()) return "the model-aware plan is unusable: " + bad;
    } else if (config.execution == Execution::kPlanned && config.chooser) {
      // the decision made ahead of the call (from the site's previous demand, which every rank
      // holding the same decision saw), applied to this demand: the call path's only planning
      Algorithm2 paper;
      if (config.algorithm2) paper = [&] { return config.planner->plan(demand.data(), config.params); };
      const std::string bad =
          critical_path(*config.chooser, decision, demand, paper, config.models, rank, config.timeout_s, *made);
      if (!bad.empty()) return bad;
    } else {
      made->plan = config.execution == Execution::kConcurrent || !config.planner
                       ? concurrent_plan(demand, R)  // no core: one rank, no traffic
                       : config.planner->plan(demand.data(), config.params);
      made->after = transfer_dependencies(made->plan, config.execution, R);
      made->pace_gbs.assign(made->plan.src.size(), 0.0);
    }
  } catch (const std::exception& err) {
    return std::string("planning failed: ") + err.what();
  }
  made->rank = rank;  // cached for the rank it was asked for, whole or not, and the decision
  made->decision = decision.id;
  out = made;
  std::lock_guard<std::mutex> lock(config.cache_mu);
  config.plan_cache.emplace_front(demand, std::move(made));
  if (config.plan_cache.size() > OpConfig::kPlanCacheSize) config.plan_cache.pop_back();
  return "";
}

void lay_out(const std::vector<Contribution>& parts, const ExternalPlan& made, const OpConfig& config,
             int64_t row_bytes, Layout& out) {
  const PlanResult& plan = made.plan;
  const int32_t n = static_cast<int32_t>(parts.size());
  // the bytes of (i, j) are i's slices to j, in order
  std::vector<std::vector<const Slice*>> streams(size_t(n) * n);
  for (int32_t i = 0; i < n; ++i)
    for (const auto& s : parts[i].slices)
      if (s.dest != i && s.rows) streams[size_t(i) * n + s.dest].push_back(&s);
  std::vector<size_t> slice_at(size_t(n) * n, 0);
  std::vector<int64_t> within(size_t(n) * n, 0);
  out.sends.assign(n, {});
  out.receives.assign(n, {});
  int32_t step = 0;
  for (size_t t = 0; t < plan.src.size(); ++t) {
    while (plan.step_ptr[step + 1] <= static_cast<int64_t>(t)) ++step;
    Transfer tr;
    tr.step = step;
    tr.src = config.axis_of_rank[plan.src[t]];
    tr.dst = config.axis_of_rank[plan.dst[t]];
    tr.after = made.after[t];
    tr.pace_gbs = made.pace_gbs[t];
    tr.first_copy = out.copies.size();
    const size_t cell = size_t(tr.src) * n + tr.dst;
    int64_t left = plan.bytes[t];
    while (left > 0) {
      const Slice* s = streams[cell].at(slice_at[cell]);
      const int64_t take = std::min(left, s->rows * row_bytes - within[cell]);
      out.copies.push_back({s->input_row * row_bytes + within[cell], s->output_row * row_bytes + within[cell], take});
      within[cell] += take;
      left -= take;
      if (within[cell] == s->rows * row_bytes) {
        ++slice_at[cell];
        within[cell] = 0;
      }
    }
    tr.end_copy = out.copies.size();
    out.sends[tr.src].push_back(static_cast<int32_t>(t));
    out.receives[tr.dst].push_back(static_cast<int32_t>(t));
    out.transfers.push_back(std::move(tr));
  }
}

}  // namespace variopath
