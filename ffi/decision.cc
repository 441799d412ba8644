// Deciding ahead of a call (issue 51; docs/planner.md "Deciding ahead"): a Decision (the family
// and, for the paced families, their split per group pair and route) made from a previous demand
// off the call path, and ChoiceCore::apply, which makes the current demand's plan from it on the
// call path.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "choice.h"

namespace variopath {

Decision safe_decision() {
  Decision d;
  d.id = decision_id(d);
  return d;
}

uint64_t decision_id(const Decision& decision) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the plan's name and the fractions' bits
  const auto mix = [&h](const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t k = 0; k < size; ++k) h = (h ^ bytes[k]) * 1099511628211ull;
  };
  mix(decision.plan.data(), decision.plan.size());
  mix(decision.route_frac.data(), decision.route_frac.size() * sizeof(double));
  return h;
}

double ChoiceCore::call_path_s(const std::string& plan, double transfers, double work_s) const {
  const double n = dep_.ranks, cells = n * n;
  if (plan == "paced")
    return kCallPathFloorS + kPacedFloorS + 2 * cells * kCallPathSPerSummedCell + 2 * transfers / n * kCallPathSPerTransfer;
  if (plan == "rot-paced")
    return kCallPathFloorS + kRotationFloorS + cells * kCallPathSPerSummedCell + transfers * kCallPathSPerTransfer;
  if (plan == "barrier" || plan == "signal" || plan == "chained")
    return kCallPathFloorS + work_s + transfers * kCallPathSPerTransfer;
  return kCallPathFloorS + cells * kCallPathSPerScannedCell + 2 * transfers / n * kCallPathSPerTransfer;
}

void set_caps(ChoiceSchedule& s) {
  s.cap_bps.assign(s.transfers(), 0.0);
  if (s.plan == "paced" || s.plan == "rot-paced" || s.plan == "chained")
    for (size_t t = 0; t < s.transfers(); ++t) s.cap_bps[t] = s.rate[t] * 1e9;
}

std::vector<double> ChoiceCore::route_table(const Aggregate& agg, const std::vector<double>& frac) const {
  std::vector<double> table(size_t(dep_.n_groups) * dep_.n_groups * kPacedRoutes, -1.0);
  for (size_t c = 0; c < frac.size(); ++c) {
    const auto p = size_t(agg.col_pair[c]);
    const int64_t pair = int64_t(agg.pair_a[p]) * dep_.n_groups + agg.pair_d[p];
    table[size_t(pair) * kPacedRoutes + size_t(agg.col_route[c] - dep_.route_ptr[pair])] = frac[c];
  }
  return table;
}

std::vector<double> ChoiceCore::complete_table(const std::vector<double>& table) const {
  const int32_t G = dep_.n_groups;
  std::vector<double> out(size_t(G) * G * kPacedRoutes, -1.0);
  for (int64_t pair = 0; pair < int64_t(G) * G; ++pair) {
    const int64_t lo = dep_.route_ptr[pair], count = std::min<int64_t>(dep_.route_ptr[pair + 1] - lo, kPacedRoutes);
    if (count < 2) continue;
    double* f = out.data() + pair * kPacedRoutes;
    double total = 0, rates = 0;
    for (int64_t r = 0; r < count; ++r) {
      const size_t at = size_t(pair) * kPacedRoutes + size_t(r);
      f[r] = !table.empty() && table[at] >= 0 ? table[at]
             : reference_frac_[at] >= 0       ? reference_frac_[at]
                                              : dep_.route_rate[size_t(lo + r)];
      total += f[r];
      rates += dep_.route_rate[size_t(lo + r)];
    }
    for (int64_t r = 0; r < count; ++r) f[r] = total > 0 ? f[r] / total : dep_.route_rate[size_t(lo + r)] / rates;
  }
  return out;
}

ChoiceSchedule ChoiceCore::apply_paced(const int64_t* demand, const std::vector<double>& table, int32_t rank,
                                       bool with_links) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  // pass 1: each group pair's bytes
  std::vector<int64_t> volume(size_t(G) * G, 0);
  for (int32_t i = 0; i < n; ++i) {
    int64_t* to = volume.data() + int64_t(dep_.group_of[i]) * G;
    const int64_t* row = demand + int64_t(i) * n;
    for (int32_t j = 0; j < n; ++j) to[dep_.group_of[j]] += row[j];
  }
  // each group pair's route segments (route_bounds)
  std::vector<int64_t> bounds(size_t(G) * G * kPacedRoutes, 0);
  for (int64_t pair = 0; pair < int64_t(G) * G; ++pair) {
    const int64_t v = volume[size_t(pair)];
    if (!v) continue;
    const int64_t lo = dep_.route_ptr[pair], count = std::min<int64_t>(dep_.route_ptr[pair + 1] - lo, kPacedRoutes);
    if (count == 0)
      throw std::invalid_argument("no path between rank groups " + std::to_string(pair / G) + " and " +
                                  std::to_string(pair % G) + ", which have demand");
    double cum = 0;
    int64_t run = std::numeric_limits<int64_t>::min();
    for (int64_t r = 0; r < count && count > 1; ++r) {
      cum += table[size_t(pair) * kPacedRoutes + size_t(r)];
      const int64_t end = r + 1 == count ? v : int64_t(std::floor(double(v) * cum));
      run = std::max(run, end);
      bounds[size_t(pair) * kPacedRoutes + size_t(r)] = std::min(run, v);
    }
  }
  // pass 2: every rank pair's pieces, their loads per route and endpoint and their own times; the
  // rank's kept
  struct Piece {
    int32_t i, j, r;
    int64_t x;
  };
  std::vector<Piece> kept;
  kept.reserve(rank < 0 ? size_t(n) * n : 2 * size_t(n) * kPacedRoutes);
  std::vector<int64_t> route_load(dep_.route_rate.size(), 0), up(size_t(n), 0), down(size_t(n), 0);
  std::vector<int64_t> offset(size_t(G) * G, 0);
  double own = 0;
  int64_t share[kPacedRoutes];
  const auto piece = [&](int32_t i, int32_t j, int64_t r, int64_t x) {
    route_load[size_t(r)] += x;
    if (dep_.route_via[size_t(r)]) {
      up[size_t(i)] += x;
      down[size_t(j)] += x;
    }
    own = std::max(own, double(x) / (dep_.route_rate[size_t(r)] * 1e9));
    if (rank < 0 || i == rank || j == rank) kept.push_back({i, j, int32_t(r), x});
  };
  bool any = false;
  for (int32_t i = 0; i < n; ++i) {
    const int64_t* row = demand + int64_t(i) * n;
    const int64_t from = int64_t(dep_.group_of[i]) * G;
    for (int32_t j = 0; j < n; ++j) {
      const int64_t x = row[j];
      if (!x) continue;
      any = true;
      const int64_t pair = from + dep_.group_of[j];
      const int64_t lo = dep_.route_ptr[pair], count = std::min<int64_t>(dep_.route_ptr[pair + 1] - lo, kPacedRoutes);
      if (count == 1) {
        piece(i, j, lo, x);
        continue;
      }
      int64_t& at = offset[size_t(pair)];
      segment(bounds.data() + pair * kPacedRoutes, count, at, x, share);
      at += x;
      for (int64_t r = 0; r < count; ++r)
        if (share[r]) piece(i, j, lo + r, share[r]);
    }
  }
  // the horizon: the slowest link at its load, or piece at its route's rate (paced_pieces)
  std::vector<double> link_load(dep_.link_cap.size(), 0.0);
  for (size_t r = 0; r < route_load.size(); ++r)
    if (route_load[r])
      for (int64_t e = dep_.route_link_ptr[r]; e < dep_.route_link_ptr[r + 1]; ++e)
        link_load[size_t(dep_.route_links[size_t(e)])] += double(route_load[r]);
  for (int32_t i = 0; i < n; ++i) {
    link_load[size_t(dep_.endpoint_up[size_t(i)])] += double(up[size_t(i)]);
    link_load[size_t(dep_.endpoint_down[size_t(i)])] += double(down[size_t(i)]);
  }
  double link_time = own;
  for (size_t l = 0; l < link_load.size(); ++l)
    if (dep_.link_cap[l] > 0) link_time = std::max(link_time, link_load[l] / dep_.link_cap[l]);
  const double h = link_time * (1 + 1e-6);
  ChoiceSchedule s;
  s.with_links = with_links;
  s.plan = "paced";
  s.reserve(kept.size(), kept.size() * max_path_links_);
  for (const Piece& q : kept) {
    const double path_rate = dep_.route_rate[size_t(q.r)];
    s.add(q.i, q.j, q.r, q.x, h > 0 ? std::min(path_rate, double(q.x) / (h * 1e9)) : path_rate, dep_);
  }
  s.horizon_s = h;
  if (any) {  // every rank's plan has the step, with or without its transfers
    s.step_ptr.push_back(int64_t(s.transfers()));
    s.step_overhead.push_back(-1.0);
    s.step_chain.push_back(1);
  }
  return s;
}

ChoiceSchedule ChoiceCore::apply(const Decision& decision, const int64_t* demand, const Algorithm2& algorithm2,
                                 const std::vector<NetParams>& models, int32_t rank, bool with_links) const {
  const std::string& plan = decision.plan;
  const size_t table = size_t(dep_.n_groups) * dep_.n_groups * kPacedRoutes;
  if ((plan == "paced" || plan == "rot-paced") && !decision.route_frac.empty() && decision.route_frac.size() != table)
    throw std::invalid_argument("decision " + plan + " has " + std::to_string(decision.route_frac.size()) +
                                " fractions, the deployment's split has " + std::to_string(table));
  ChoiceSchedule s;
  bool made = false;
  for (const ConcurrentFamily& f : kConcurrentFamilies)
    if (plan == f.plan) {
      s = concurrent(demand, f.paths, f.staged, f.balanced, rank, with_links);
      made = true;
    }
  if (plan == "paced") {
    s = apply_paced(demand, decision.route_frac.empty() ? reference_table_ : decision.route_frac, rank, with_links);
    made = true;
  } else if (plan == "rot-paced") {
    made = dep_.root_complexes > 1 && expand_rotated(demand, rotation_split(decision.route_frac), s, with_links);
  } else if ((plan == "barrier" || plan == "signal") && algorithm2) {
    s = barrier(algorithm2());
    if (plan == "signal") s = signal_driven(s);
    made = true;
  } else if (plan == "chained" && !models.empty()) {
    size_t gap_model = 0;  // the gaps the choice built it with (choose: gap_network)
    const auto gap_of = [](const NetParams& m) {
      return m.issue_s + std::max(m.latency_pcie_s, m.latency_net_s) + m.signal_s;
    };
    for (size_t m = 1; m < models.size(); ++m)
      if (gap_of(models[m]) > gap_of(models[gap_model])) gap_model = m;
    made = chained(demand, models[gap_model], s);
  } else if (!made && plan != "barrier" && plan != "signal" && plan != "chained") {
    throw std::invalid_argument("decision names no family the op runs: '" + plan + "'");
  }
  if (!made) s = concurrent(demand, 1, true, false, rank, with_links);  // the demand did not fit the family: staged
  s.plan = made ? plan : "staged";
  set_caps(s);
  return s;
}

}  // namespace variopath
