// variopath's model-aware choice (choice.h; docs/planner.md "The choice"): the deployment's
// tables, the gates on what a candidate's planning may cost, the robust choice and `choose`,
// which builds every family (families.cc, split.cc, rotation.cc, chained.cc), predicts each
// (predict.cc) and picks one.
#include "choice_detail.h"

#include <chrono>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace variopath {

using namespace choice_detail;

void ChoiceDeployment::check() const {
  const size_t g2 = size_t(n_groups) * size_t(n_groups);
  require(ranks > 0 && n_groups > 0, "ranks and n_groups must be positive");
  require(group_of.size() == size_t(ranks), "group_of must have one entry per rank");
  for (int32_t g : group_of) require(g >= 0 && g < n_groups, "group_of names a group out of range");
  require(endpoint_up.size() == size_t(ranks) && endpoint_down.size() == size_t(ranks),
          "endpoint_up/endpoint_down must have one entry per rank");
  require(route_ptr.size() == g2 + 1 && route_ptr[0] == 0, "route_ptr must have G*G + 1 entries from 0");
  const size_t routes = route_rate.size();
  for (size_t k = 0; k < g2; ++k)
    require(route_ptr[k] <= route_ptr[k + 1] && size_t(route_ptr[k + 1]) <= routes, "route_ptr is not monotone");
  require(memory_route.size() == g2, "memory_route must have G*G entries");
  for (int64_t r : memory_route) require(r >= -1 && r < int64_t(routes), "memory_route out of range");
  require(route_root.size() == routes && route_staged.size() == routes && route_via.size() == routes &&
              route_link_ptr.size() == routes + 1,
          "route arrays disagree in length");
  require(route_link_ptr[0] == 0 && size_t(route_link_ptr.back()) == route_links.size(), "route_link_ptr");
  const size_t n_links = link_cap.size();
  require(link_class.size() == n_links && link_nic.size() == n_links, "link arrays disagree in length");
  for (int32_t l : route_links) require(l >= 0 && size_t(l) < n_links, "a route names a link out of range");
  for (int32_t r = 0; r < ranks; ++r)
    require(endpoint_up[r] >= 0 && size_t(endpoint_up[r]) < n_links && endpoint_down[r] >= 0 &&
                size_t(endpoint_down[r]) < n_links,
            "an endpoint link is out of range");
  for (int32_t c : link_class) require(c >= -1 && c < kLinkClasses, "link_class out of range");
  for (double r : route_rate) require(r > 0 && std::isfinite(r), "route rates must be positive");
  require(near_staged.size() == g2, "near_staged must have G*G entries");
  require(algorithm2_cells >= 0, "algorithm2_cells must not be negative");
  require(link_root_complex.size() == n_links && link_uplink.size() == n_links,
          "link_root_complex/link_uplink must have one entry per link");
  require(root_complexes >= 1 && root_complexes <= kMaxRootComplexes,
          "root_complexes must be 1 to " + std::to_string(kMaxRootComplexes));
  for (size_t l = 0; l < n_links; ++l)
    require(link_root_complex[l] >= -1 && link_root_complex[l] < root_complexes &&
                (!link_uplink[l] || link_root_complex[l] >= 0),
            "link_root_complex out of range");
  require(trigger_factor > 0 && trigger_factor <= 1, "trigger_factor must be in (0, 1]");
}

double NetParams::efficiency(int cls, double k) const {
  k = std::max(k, 1.0);
  return std::max(floor[cls], 1.0 / (1.0 + beta[cls] * (k - 1.0)));
}

void ChoiceSchedule::add(int32_t i, int32_t j, int32_t r, int64_t x, double rate_gbs, const ChoiceDeployment& dep) {
  src.push_back(i);
  dst.push_back(j);
  route.push_back(r);
  carries_i.push_back(i);
  carries_j.push_back(j);
  lane_kind.push_back(-1);
  lane_inst.push_back(-1);
  bytes.push_back(x);
  rate.push_back(rate_gbs);
  staged.push_back(dep.route_staged[r]);
  if (with_links) {
    if (dep.route_via[r]) links.push_back(dep.endpoint_up[i]);
    links.insert(links.end(), dep.route_links.begin() + dep.route_link_ptr[r],
                 dep.route_links.begin() + dep.route_link_ptr[r + 1]);
    if (dep.route_via[r]) links.push_back(dep.endpoint_down[j]);
  }
  link_ptr.push_back(int64_t(links.size()));
  after_ptr.push_back(int64_t(after_step.size()));
}

void ChoiceSchedule::reserve(size_t count, size_t path_links) {
  for (auto* v : {&src, &dst, &route, &carries_i, &carries_j, &lane_kind, &lane_inst}) v->reserve(count);
  bytes.reserve(count);
  rate.reserve(count);
  staged.reserve(count);
  link_ptr.reserve(count + 1);
  after_ptr.reserve(count + 1);
  if (with_links) links.reserve(path_links);
}

void Tally::add_links(const int32_t* links, size_t count, int64_t x, double rate_gbs, bool staged,
                      const ChoiceDeployment& dep) {
  const double cap = rate_gbs * 1e9;
  const double own = x > 0 ? double(x) / cap : 0.0;
  bool through_nic = false;
  for (size_t e = 0; e < count; ++e) through_nic = through_nic || dep.link_nic[size_t(links[e])];
  for (size_t e = 0; e < count; ++e) link[size_t(links[e])].add(1, double(x), cap, staged, through_nic);
  path_writes(dep, links, count, staged, [&](size_t l, int32_t c) { link[l].targets |= uint64_t(1) << c; });
  double& top = through_nic ? own_nic : own_pcie;
  top = std::max(top, own);
}

void Tally::merge(const Tally& other) {
  for (size_t l = 0; l < link.size(); ++l) link[l].add(other.link[l]);
  own_nic = std::max(own_nic, other.own_nic);
  own_pcie = std::max(own_pcie, other.own_pcie);
}

ChoiceCore::ChoiceCore(ChoiceDeployment dep) : dep_(std::move(dep)) {
  dep_.check();
  route_nic_.assign(dep_.route_rate.size(), 0);
  for (size_t r = 0; r < route_nic_.size(); ++r)
    for (int64_t e = dep_.route_link_ptr[r]; e < dep_.route_link_ptr[r + 1]; ++e)
      route_nic_[r] = route_nic_[r] || dep_.link_nic[size_t(dep_.route_links[e])];
  for (size_t r = 0; r + 1 < dep_.route_link_ptr.size(); ++r)
    max_path_links_ = std::max(max_path_links_, size_t(dep_.route_link_ptr[r + 1] - dep_.route_link_ptr[r]) + 2);
  const int64_t pairs = int64_t(dep_.n_groups) * dep_.n_groups;
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  members_ptr_.assign(size_t(G) + 1, 0);
  for (int32_t i = 0; i < n; ++i) ++members_ptr_[size_t(dep_.group_of[i]) + 1];
  for (int32_t g = 0; g < G; ++g) members_ptr_[size_t(g) + 1] += members_ptr_[size_t(g)];
  members_.resize(size_t(n));
  std::vector<int32_t> at(members_ptr_.begin(), members_ptr_.end() - 1);
  for (int32_t i = 0; i < n; ++i) members_[size_t(at[size_t(dep_.group_of[i])]++)] = i;
  for (int32_t g = 0; g < G; ++g)
    most_members_ = std::max(most_members_, size_t(members_ptr_[size_t(g) + 1] - members_ptr_[size_t(g)]));
  // where each route's transfers push writes: from its own links, or path by path where a rank of
  // its group pair sits directly on a root port and the route crosses the endpoint links
  const size_t n_routes = dep_.route_rate.size();
  writes_.per_transfer.assign(n_routes, 0);
  const auto on_port = [&](int32_t g, const std::vector<int32_t>& endpoint) {
    for (int32_t k = members_ptr_[size_t(g)]; k < members_ptr_[size_t(g) + 1]; ++k)
      if (dep_.link_root_complex[size_t(endpoint[size_t(members_[size_t(k)])])] >= 0) return true;
    return false;
  };
  for (int32_t a = 0; a < G; ++a)
    for (int32_t d = 0; d < G; ++d) {
      const int64_t pair = int64_t(a) * G + d;
      if (!on_port(a, dep_.endpoint_up) && !on_port(d, dep_.endpoint_down)) continue;
      for (int64_t r = dep_.route_ptr[pair]; r < dep_.route_ptr[pair + 1]; ++r)
        writes_.per_transfer[size_t(r)] = dep_.route_via[size_t(r)];
      if (const int64_t m = dep_.memory_route[size_t(pair)]; m >= 0)
        writes_.per_transfer[size_t(m)] = dep_.route_via[size_t(m)];
    }
  for (size_t r = 0; r < n_routes; ++r) {
    if (!writes_.per_transfer[r]) {
      const int64_t lo = dep_.route_link_ptr[r];
      path_writes(dep_, dep_.route_links.data() + lo, size_t(dep_.route_link_ptr[r + 1] - lo), dep_.route_staged[r],
                  [&](size_t l, int32_t c) {
                    writes_.link.push_back(int32_t(l));
                    writes_.target.push_back(c);
                  });
    }
    writes_.ptr.push_back(int64_t(writes_.link.size()));
  }
  // RouteTally::add's rule on a route r from group a to group d: whether every rank pair goes
  // through a NIC (1), none does (0), or some do and some do not (2)
  const auto nic_rule = [&](int32_t a, int32_t d, size_t r) {
    int kinds = 0;  // bit 0: through a NIC, bit 1: not
    for (int32_t ka = members_ptr_[size_t(a)]; ka < members_ptr_[size_t(a) + 1]; ++ka)
      for (int32_t kd = members_ptr_[size_t(d)]; kd < members_ptr_[size_t(d) + 1]; ++kd) {
        const int32_t i = members_[size_t(ka)], j = members_[size_t(kd)];
        if (i != j)
          kinds |= route_nic_[r] || (dep_.route_via[r] && (dep_.link_nic[size_t(dep_.endpoint_up[i])] ||
                                                           dep_.link_nic[size_t(dep_.endpoint_down[j])]))
                       ? 1
                       : 2;
      }
    return kinds == 1 ? 1 : kinds == 2 ? 0 : 2;
  };
  fastest_end_.assign(size_t(pairs), 0);
  constexpr size_t kFamilies = std::size(kConcurrentFamilies);
  family_of_.assign(size_t(pairs) * kFamilies, 0);
  shared_cells_.assign(size_t(pairs), SharedCell{});
  split_ptr_.assign(1, 0);
  root_ptr_.assign(1, 0);
  for (int32_t a = 0; a < G; ++a) {
    for (int32_t d = 0; d < G; ++d) {
      const int64_t pair = int64_t(a) * G + d;
      const int64_t lo = dep_.route_ptr[pair], hi = dep_.route_ptr[pair + 1];
      int64_t fastest = lo;
      while (fastest < hi && dep_.route_rate[fastest] == dep_.route_rate[lo]) ++fastest;
      fastest_end_[size_t(pair)] = fastest;
      most_routes_ = std::max(most_routes_, size_t(hi - lo));
      // staged sends a pair as concurrent does unless its route is through a root complex,
      // staged-balanced as multipath unless its first route is or it would take fewer routes
      uint8_t* family_of = family_of_.data() + size_t(pair) * kFamilies;
      for (size_t f = 0; f < kFamilies; ++f) family_of[f] = uint8_t(f);
      if (std::none_of(dep_.route_root.begin() + lo, dep_.route_root.begin() + fastest, [](auto x) { return x; }))
        family_of[2] = 0;
      if (hi > lo && !dep_.route_root[size_t(lo)] &&
          std::min(fastest, lo + kMultipathRoutes) == std::min(hi, lo + kMultipathRoutes))
        family_of[3] = 1;
      if (hi - lo > 1) split_dest_.push_back(d);
      if (hi - lo != 1) continue;
      const int rule = dep_.route_root[lo] || writes_.per_transfer[size_t(lo)] ? 2 : nic_rule(a, d, size_t(lo));
      if (rule == 2) {  // a root route, writes found path by path or a NIC rule that varies: the pairs one by one
        root_dest_.push_back(d);
        continue;
      }
      shared_cells_[size_t(pair)] = {dep_.route_rate[size_t(lo)] * 1e9, int32_t(lo), dep_.route_via[size_t(lo)],
                                     dep_.route_staged[size_t(lo)], uint8_t(rule)};
    }
    split_ptr_.push_back(int32_t(split_dest_.size()));
    root_ptr_.push_back(int32_t(root_dest_.size()));
  }
  other_ptr_.assign(1, 0);
  for (int32_t a = 0; a < G; ++a) {
    for (int32_t d = 0; d < G; ++d)
      if (shared_cells_[size_t(a) * G + size_t(d)].route < 0) other_dest_.push_back(d);
    other_ptr_.push_back(int32_t(other_dest_.size()));
  }
  other_routes_.of_route.assign(dep_.route_rate.size(), -1);
  const auto take = [&](int64_t r) {
    if (r < 0 || other_routes_.of_route[size_t(r)] >= 0) return;
    other_routes_.of_route[size_t(r)] = int32_t(other_routes_.route.size());
    other_routes_.route.push_back(int32_t(r));
  };
  for (int64_t pair = 0; pair < pairs; ++pair) {
    if (shared_cells_[size_t(pair)].route >= 0) continue;
    for (int64_t r = dep_.route_ptr[pair]; r < dep_.route_ptr[pair + 1]; ++r) take(r);
    take(dep_.memory_route[size_t(pair)]);
  }
  solve_reference();
  reference_table_ = complete_table({});
  if (dep_.root_complexes > 1) {  // the routes the rotation keeps (phase_aggregate's rule)
    rotation_count_.assign(size_t(G) * G, 0);
    rotation_route_.assign(size_t(G) * G * kPacedRoutes, -1);
    for (int32_t a = 0; a < G; ++a)
      for (int32_t d = 0; d < G; ++d) {
        const int64_t pair = int64_t(a) * G + d;
        const int64_t lo = dep_.route_ptr[pair], hi = std::min(dep_.route_ptr[pair + 1], lo + kPacedRoutes);
        for (int64_t r = lo; r < hi; ++r)
          if (route_phase(a, d, size_t(r)) != kOwn)
            rotation_route_[size_t(pair) * kPacedRoutes + size_t(rotation_count_[size_t(pair)]++)] = int32_t(r);
      }
  }
}

// ----- the choice -----------------------------------------------------------------------------

double planning_slack(const std::vector<double>& best_s, const std::vector<NetParams>& models, double bound_s) {
  double slack = -std::numeric_limits<double>::infinity();
  for (size_t m = 0; m < models.size(); ++m) {
    const NetParams& net = models[m];
    slack = std::max(
        slack, best_s[m] - (net.barrier_s + net.issue_s + bound_s + std::min(net.latency_pcie_s, net.latency_net_s)));
  }
  return slack;
}

bool same_costs_but_contention(const NetParams& a, const NetParams& b) {
  return a.barrier_s == b.barrier_s && a.issue_s == b.issue_s && a.latency_pcie_s == b.latency_pcie_s &&
         a.latency_net_s == b.latency_net_s && a.signal_s == b.signal_s && a.serial_issue == b.serial_issue;
}

bool planning_pays(const std::vector<double>& best_s, const std::vector<NetParams>& models, double work_s,
                   double bound_s) {
  return planning_slack(best_s, models, bound_s) > work_s;
}

namespace {

// _units: split_work_s's units per mirror prox iteration, and beside them (the cold
// start's check, about two iterations, and every rank pair's pieces)
double iteration_units(const Aggregate& agg) { return double(agg.col_links.size() + agg.cap.size()); }
double fixed_units(const Aggregate& agg, const DemandCells& cells) {
  return 2 * iteration_units(agg) + double(cells.nonzero);
}

}  // namespace

double ChoiceCore::split_units(const Aggregate& agg, const DemandCells& cells, int iterations) const {
  return double(iterations) * iteration_units(agg) + fixed_units(agg, cells);
}

double ChoiceCore::split_work_s(const Aggregate& agg, const DemandCells& cells, int iterations) const {
  return split_units(agg, cells, iterations) * kSplitSPerUnit;
}

double ChoiceCore::rotation_work_s(const Phased& ph, const DemandCells& cells, int iterations) const {
  return split_units(ph.agg, cells, iterations) * kRotationSPerUnit;
}

int ChoiceCore::split_iterations(const Aggregate& agg, const DemandCells& cells, double slack_s) const {
  const double left = slack_s / kSplitSPerUnit - fixed_units(agg, cells);
  if (!(left > 0)) return -1;
  return int(std::floor(std::min<double>(kSplitIterations, left / iteration_units(agg))));
}

int64_t ChoiceCore::algorithm2_activations(const DemandCells& cells) const {
  std::vector<int64_t> out, in;  // each rank's peers, sent to and received from
  rank_totals(cells.out_count, cells.in_count, dep_.ranks, dep_.n_groups, out, in);
  return std::max(*std::max_element(out.begin(), out.end()), *std::max_element(in.begin(), in.end()));
}

double ChoiceCore::algorithm2_work_s(const DemandCells& cells) const {
  const double per_activation =
      kAlgorithm2SPerRank * double(dep_.ranks) + kAlgorithm2SPerScoredCell * double(dep_.algorithm2_cells);
  return double(algorithm2_activations(cells)) * per_activation;
}

int32_t robust_choice(const std::vector<std::vector<double>>& predicted, std::vector<double>& regret, int32_t safe) {
  const size_t cands = predicted[0].size();
  regret.assign(cands, 0.0);
  std::vector<double> sum(cands, 0.0);
  for (const auto& times : predicted) {
    const double best = *std::min_element(times.begin(), times.end());
    for (size_t c = 0; c < cands; ++c) {
      const double t = times[c];
      const double r = best > 0 ? t / best : (t <= 0 ? 1.0 : std::numeric_limits<double>::infinity());
      regret[c] = std::max(regret[c], r);
      sum[c] += r;
    }
  }
  const auto allowed = [&](size_t c) { return safe < 0 || predicted[0][c] <= predicted[0][size_t(safe)]; };
  int32_t choice = -1;  // the first of least regret, then least summed regret (safe is allowed)
  for (size_t c = 0; c < cands; ++c)
    if (allowed(c) && (choice < 0 || regret[c] < regret[size_t(choice)] ||
                       (regret[c] == regret[size_t(choice)] && sum[c] < sum[size_t(choice)])))
      choice = int32_t(c);
  return choice;
}

Choice ChoiceCore::choose(const int64_t* demand, const Algorithm2& algorithm2, const std::vector<NetParams>& models,
                          const std::vector<double>& warm, int32_t rank, bool hybrid, bool every, bool ahead) const {
  if (models.empty()) throw std::invalid_argument("choose: no network model");
  Choice out;
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto t0 = Clock::now();
  // a candidate: its schedule, or (the concurrent families) only its tally until it is chosen
  struct Candidate {
    std::string plan;
    ChoiceSchedule schedule;
    Tally tally;
    bool tallied = false, built = true;
    int paths = 1;
    bool staged = false, balanced = false;
    double transfers = 0, work_s = 0;  // its whole plan's transfers, its planning if planned anew (call_path_s)
  };
  std::vector<Candidate> cands, families;
  const DemandCells demand_cells = cells(demand);
  const Tally shared = shared_tally(demand_cells);
  std::vector<Tally> tallies = concurrent_tallies(demand, demand_cells, shared);
  double split_pieces = 0;  // the most pieces the multipath families cut the pairs into
  if (ahead)
    for (int32_t i = 0; i < dep_.ranks; ++i)
      for (int32_t d = 0; d < dep_.n_groups; ++d) {
        const int64_t pair = int64_t(dep_.group_of[i]) * dep_.n_groups + d;
        split_pieces += double(demand_cells.out_count[size_t(i) * dep_.n_groups + size_t(d)]) *
                        double(std::min<int64_t>(dep_.route_ptr[pair + 1] - dep_.route_ptr[pair], kMultipathRoutes));
      }
  for (size_t k = 0; k < tallies.size(); ++k) {
    const ConcurrentFamily& f = kConcurrentFamilies[k];
    Candidate c{f.plan, {}, std::move(tallies[k]), true, false};
    c.paths = f.paths;
    c.staged = f.staged;
    c.balanced = f.balanced;
    c.transfers = f.paths > 1 ? split_pieces : double(demand_cells.nonzero);
    families.push_back(std::move(c));
  }
  out.build_s = seconds_since(t0);
  t0 = Clock::now();
  // a link-exclusive plan's prediction under a model is its prediction under an earlier one that
  // differs only in contention
  std::vector<size_t> same_costs(models.size());
  for (size_t m = 0; m < models.size(); ++m) {
    same_costs[m] = m;
    for (size_t e = 0; e < m && same_costs[m] == m; ++e)
      if (same_costs_but_contention(models[e], models[m])) same_costs[m] = e;
  }
  const auto predict_candidate = [&](Candidate& c, std::vector<double>& times) {
    if (c.built) c.tallied = tally(c.schedule, c.tally);
    for (size_t m = 0; m < models.size(); ++m) {
      if (c.tallied)
        times[m] = predict_tally(c.tally, models[m]);
      else if (c.schedule.link_exclusive && same_costs[m] < m)
        times[m] = times[same_costs[m]];
      else
        times[m] = predict(c.schedule, models[m]);
    }
  };
  const auto best_so_far = [&] {
    std::vector<double> best(models.size());
    for (size_t m = 0; m < models.size(); ++m)
      best[m] = *std::min_element(out.predicted[m].begin(), out.predicted[m].end());
    return best;
  };
  // the concurrent families predicted under every model; then the paced plan, Algorithm 2's plans
  // (ahead of them) and chained (which runs the paced split's routes: only where it was solved),
  // each where it may pay for its planning against the best so far and a bound on its data time;
  // then the extra candidates
  out.predicted.assign(models.size(), {});
  std::vector<double> times(models.size());
  const auto add_candidate = [&](Candidate&& c) {
    predict_candidate(c, times);
    for (size_t m = 0; m < models.size(); ++m) out.predicted[m].push_back(times[m]);
    cands.push_back(std::move(c));
  };
  for (Candidate& c : families) add_candidate(std::move(c));
  out.predict_s = seconds_since(t0);
  t0 = Clock::now();
  const Aggregate agg = aggregate(demand_cells);
  const double endpoint_s = endpoint_bound_s(demand_cells);
  out.endpoint_s = endpoint_s;
  Split found;
  PacedPieces pieces;
  std::vector<double> rotation_frac;  // rot-paced's split, as a Decision's table
  const auto pays = [&](double work_s, double bound_s) {
    return every || planning_pays(best_so_far(), models, work_s, bound_s);
  };
  // the split runs as many iterations as it may pay for
  // (ahead: all it needs, off the call path, where applying it costs a pass over the demand)
  const int iterations = every || ahead ? kSplitIterations
                                        : split_iterations(agg, demand_cells, planning_slack(best_so_far(), models, endpoint_s));
  const bool split = iterations >= 0;
  out.split_iterations = iterations;
  if (split) {
    if (warm.empty()) {
      const SplitStart start = reference_start(agg);
      found = solve(agg, warm, &start, endpoint_s, iterations);
    } else {
      found = solve(agg, warm, nullptr, endpoint_s, iterations);
    }
    out.fractions = found.frac;
    pieces = paced_pieces(demand, demand_cells, agg, found.frac, shared);
    Candidate paced{"paced", {}, paced_tally(pieces), true, false};
    paced.transfers = double(pieces.count);
    add_candidate(std::move(paced));
    // its rotation, where a model has the posted-write trigger and the paced plan would set it off,
    // and (its split's iterations and its expansion counted) where it may pay for its planning
    // (ahead: whatever it costs, off the call path)
    bool trigger = false;
    for (const NetParams& net : models) trigger = trigger || trigger_factor(net) > 0;
    Phased ph;
    Candidate c{"rot-paced"};
    if (trigger && phase_aggregate(demand_cells, agg, ph) &&
        (ahead || pays(rotation_work_s(ph, demand_cells, iterations), found.bound_s)) &&
        rot_paced(demand, ph, found.frac, found.bound_s, iterations, c.schedule, &rotation_frac)) {
      c.transfers = double(c.schedule.transfers());
      add_candidate(std::move(c));
    }
  }
  out.split_s = seconds_since(t0);
  if (algorithm2 && pays(algorithm2_work_s(demand_cells), endpoint_s)) {
    t0 = Clock::now();
    const PlanResult paper = algorithm2();
    out.paper_s = seconds_since(t0);
    t0 = Clock::now();
    std::vector<Candidate> front;
    front.push_back({"barrier", barrier(paper)});
    front.push_back({"signal", signal_driven(front[0].schedule)});
    for (Candidate& c : front) {
      c.transfers = double(c.schedule.transfers());
      c.work_s = algorithm2_work_s(demand_cells);
    }
    out.build_s += seconds_since(t0);
    t0 = Clock::now();
    for (size_t k = 0; k < front.size(); ++k) {
      predict_candidate(front[k], times);
      for (size_t m = 0; m < models.size(); ++m) out.predicted[m].insert(out.predicted[m].begin() + ptrdiff_t(k), times[m]);
    }
    cands.insert(cands.begin(), std::make_move_iterator(front.begin()), std::make_move_iterator(front.end()));
    out.predict_s += seconds_since(t0);
  }
  t0 = Clock::now();
  if (hybrid && split && pays(chained_work_s(demand_cells), found.bound_s)) {
    size_t gap_model = 0;  // gap_network: the largest o + L + σ, the first such
    const auto gap_of = [](const NetParams& m) {
      return m.issue_s + std::max(m.latency_pcie_s, m.latency_net_s) + m.signal_s;
    };
    for (size_t m = 1; m < models.size(); ++m)
      if (gap_of(models[m]) > gap_of(models[gap_model])) gap_model = m;
    Candidate c{"chained"};
    if (chained(demand, models[gap_model], c.schedule, found.bound_s)) {
      c.transfers = double(c.schedule.transfers());
      c.work_s = chained_work_s(demand_cells);
      add_candidate(std::move(c));
    }
  }
  out.hybrid_s = seconds_since(t0);
  for (const Candidate& c : cands) out.candidates.push_back(c.plan);
  int32_t safe = -1;  // NCCL's own plan
  for (size_t c = 0; c < cands.size(); ++c)
    if (cands[c].plan == "staged") safe = int32_t(c);
  if (ahead) {  // what each costs on the call path counts against it under every model
    out.call_path_s.assign(out.candidates.size(), 0.0);
    for (size_t c = 0; c < cands.size(); ++c)
      out.call_path_s[c] = call_path_s(cands[c].plan, cands[c].transfers, cands[c].work_s);
    std::vector<std::vector<double>> total = out.predicted;
    for (auto& times : total)
      for (size_t c = 0; c < times.size(); ++c) times[c] += out.call_path_s[c];
    std::vector<double> regret;  // the reported regret stays that of the communication
    out.chosen = robust_choice(total, regret, safe);
    robust_choice(out.predicted, out.regret, safe);
  } else {
    out.chosen = robust_choice(out.predicted, out.regret, safe);
  }
  Candidate& chosen = cands[size_t(out.chosen)];
  if (chosen.plan == "paced")
    out.schedule = expand(demand, agg, pieces, rank);
  else if (!chosen.built)
    out.schedule = concurrent(demand, chosen.paths, chosen.staged, chosen.balanced);
  else
    out.schedule = std::move(chosen.schedule);
  out.schedule.plan = chosen.plan;
  set_caps(out.schedule);
  out.decision.plan = out.schedule.plan;
  if (out.decision.plan == "paced") out.decision.route_frac = complete_table(route_table(agg, found.frac));
  if (out.decision.plan == "rot-paced") out.decision.route_frac = std::move(rotation_frac);
  out.decision.id = decision_id(out.decision);
  return out;
}

}  // namespace variopath
