// The chained hybrid plan (issue 27; docs/planner.md "chained"): every root-complex link carries
// its root entries one after another, chained by signals and paced at a reserved rate; every other
// column is paced once over the horizon on what the reservation leaves. The split of each
// reserved rate is the paced split's mirror prox (split.cc solve) over the resources of
// chain_problem.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>

#include "choice.h"

namespace variopath {

namespace {

constexpr int kRootClass = 0;  // sim/network.py link_classes: root_p2p stands for both root classes

// whole_bytes: each pair's split as whole bytes summing to its volume.
std::vector<int64_t> whole_bytes(const std::vector<double>& x, const Columns& col) {
  std::vector<int64_t> out(x.size());
  for (size_t c = 0; c < x.size(); ++c) out[c] = int64_t(std::floor(x[c]));
  for (size_t p = 0; p < col.volume.size(); ++p) {
    const auto lo = size_t(col.pair_first[p]);
    const size_t hi = p + 1 < col.volume.size() ? size_t(col.pair_first[p + 1]) : x.size();
    const int64_t small = std::max<int64_t>(kPacedMinBytes, col.volume[p] / 1000000);
    size_t top = lo;
    int64_t sum = 0;
    for (size_t c = lo; c < hi; ++c) {
      if (out[c] < small) out[c] = 0;
      if (x[c] > x[top]) top = c;
      sum += out[c];
    }
    out[top] += col.volume[p] - sum;
  }
  return out;
}

}  // namespace

double ChoiceCore::chained_work_s(const DemandCells& cells) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  int64_t columns = 0;  // every pair with demand, on each of its kPacedRoutes fastest routes
  for (int32_t i = 0; i < n; ++i)
    for (int32_t d = 0; d < G; ++d) {
      const int64_t pair = int64_t(dep_.group_of[i]) * G + d;
      columns += cells.out_count[size_t(i) * G + size_t(d)] *
                 std::min<int64_t>(dep_.route_ptr[pair + 1] - dep_.route_ptr[pair], kPacedRoutes);
    }
  const int64_t rates = int64_t(sizeof(kChainRates) / sizeof(kChainRates[0]));
  const int64_t iterations = kSplitIterations + (rates - 1) * kWarmIterations;
  return double(columns * iterations) * kChainedSPerColumnIteration;
}

double ChoiceCore::endpoint_bound_s(const DemandCells& cells) const {
  std::vector<int64_t> out, in;  // the cells hold no self traffic
  rank_totals(cells.out_bytes, cells.in_bytes, dep_.ranks, dep_.n_groups, out, in);
  double bound = 0;
  for (int32_t i = 0; i < dep_.ranks; ++i) {
    bound = std::max(bound, double(out[size_t(i)]) / dep_.link_cap[size_t(dep_.endpoint_up[i])]);
    bound = std::max(bound, double(in[size_t(i)]) / dep_.link_cap[size_t(dep_.endpoint_down[i])]);
  }
  return bound;
}

Columns ChoiceCore::route_columns(const int64_t* demand) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  Columns col;
  for (int32_t i = 0; i < n; ++i)
    for (int32_t j = 0; j < n; ++j) {
      const int64_t volume = demand[int64_t(i) * n + j];
      if (volume == 0) continue;
      const int64_t pair = int64_t(dep_.group_of[i]) * G + dep_.group_of[j];
      const int64_t lo = dep_.route_ptr[pair], hi = std::min(dep_.route_ptr[pair + 1], lo + kPacedRoutes);
      if (lo == hi)
        throw std::invalid_argument("no path from rank " + std::to_string(i) + " to rank " + std::to_string(j) +
                                    ", which have demand");
      col.pair_first.push_back(int64_t(col.size()));
      col.volume.push_back(volume);
      for (int64_t r = lo; r < hi; ++r) {
        col.src.push_back(i);
        col.dst.push_back(j);
        col.route.push_back(int32_t(r));
        col.pair_of.push_back(int32_t(col.volume.size() - 1));
        if (dep_.route_via[r]) col.links.push_back(dep_.endpoint_up[i]);
        col.links.insert(col.links.end(), dep_.route_links.begin() + dep_.route_link_ptr[r],
                         dep_.route_links.begin() + dep_.route_link_ptr[r + 1]);
        if (dep_.route_via[r]) col.links.push_back(dep_.endpoint_down[j]);
        col.link_ptr.push_back(int64_t(col.links.size()));
      }
    }
  return col;
}

Phases ChoiceCore::colour(const Columns& col) const {
  Phases ph;
  std::vector<int64_t> load(dep_.link_cap.size(), 0);
  for (size_t c = 0; c < col.size(); ++c) {
    std::vector<int32_t> hit;
    for (int64_t e = col.link_ptr[c]; e < col.link_ptr[c + 1]; ++e)
      if (dep_.link_class[size_t(col.links[e])] == kRootClass) hit.push_back(col.links[e]);
    if (hit.empty()) continue;
    std::sort(hit.begin(), hit.end());
    hit.erase(std::unique(hit.begin(), hit.end()), hit.end());
    for (int32_t lid : hit) ++load[size_t(lid)];
    ph.entry.push_back(int32_t(c));
    ph.root_of.push_back(std::move(hit));
  }
  const int64_t n = std::max<int32_t>(dep_.ranks, 1);
  using Key = std::tuple<int64_t, int64_t, int32_t, int32_t>;
  std::vector<std::pair<Key, size_t>> order;
  for (size_t e = 0; e < ph.entry.size(); ++e) {
    int64_t busiest = 0;
    for (int32_t lid : ph.root_of[e]) busiest = std::max(busiest, load[size_t(lid)]);
    const size_t c = size_t(ph.entry[e]);
    const int64_t distance = ((int64_t(col.dst[c]) - col.src[c]) % n + n) % n;
    order.push_back({Key{-busiest, distance, col.src[c], ph.entry[e]}, e});
  }
  std::sort(order.begin(), order.end());
  ph.phase.assign(ph.entry.size(), -1);
  std::vector<std::set<int32_t>> taken;
  for (const auto& [key, e] : order) {
    size_t k = 0;
    for (; k < taken.size(); ++k) {
      bool clash = false;
      for (int32_t lid : ph.root_of[e]) clash = clash || taken[k].count(lid);
      if (!clash) break;
    }
    if (k == taken.size()) taken.emplace_back();
    taken[k].insert(ph.root_of[e].begin(), ph.root_of[e].end());
    ph.phase[e] = int32_t(k);
  }
  ph.count = int32_t(taken.size());
  return ph;
}

std::vector<double> ChoiceCore::gaps(const Columns& col, const Phases& ph, const NetParams& net) const {
  std::vector<double> out(ph.entry.size());
  for (size_t e = 0; e < ph.entry.size(); ++e) {
    const auto c = size_t(ph.entry[e]);
    bool nic = false;
    for (int64_t k = col.link_ptr[c]; k < col.link_ptr[c + 1]; ++k) nic = nic || dep_.link_nic[size_t(col.links[k])];
    const double latency = nic ? net.latency_net_s : net.latency_pcie_s;
    out[e] = (net.issue_s + latency + net.signal_s) * 1e9;
  }
  return out;
}

std::vector<int64_t> ChoiceCore::concurrent_entries(const Columns& col, const Phases& ph) const {
  std::map<int32_t, std::vector<size_t>> crossing;  // link -> the entries crossing it
  for (size_t e = 0; e < ph.entry.size(); ++e) {
    const auto c = size_t(ph.entry[e]);
    std::vector<int32_t> lids(col.links.begin() + col.link_ptr[c], col.links.begin() + col.link_ptr[c + 1]);
    std::sort(lids.begin(), lids.end());
    lids.erase(std::unique(lids.begin(), lids.end()), lids.end());
    for (int32_t lid : lids) crossing[lid].push_back(e);
  }
  std::vector<int64_t> out(dep_.link_cap.size(), 0);
  for (const auto& [lid, entries] : crossing) {
    std::vector<const std::vector<int32_t>*> left;
    for (size_t e : entries) left.push_back(&ph.root_of[e]);
    while (!left.empty()) {  // a greedy cover by root-complex links, busiest (then lowest) first
      std::map<int32_t, int64_t> counts;
      for (const auto* hit : left)
        for (int32_t root : *hit) ++counts[root];
      int32_t pick = counts.begin()->first;
      for (const auto& [root, count] : counts)
        if (count > counts[pick]) pick = root;
      std::vector<const std::vector<int32_t>*> rest;
      for (const auto* hit : left)
        if (!std::binary_search(hit->begin(), hit->end(), pick)) rest.push_back(hit);
      left.swap(rest);
      ++out[size_t(lid)];
    }
  }
  return out;
}

void ChoiceCore::slots(const Phases& ph, std::vector<int32_t>& slot, std::vector<int32_t>& slot_group) const {
  const size_t m = ph.entry.size();
  std::vector<size_t> parent(m);
  for (size_t e = 0; e < m; ++e) parent[e] = e;
  auto find = [&](size_t e) {
    while (parent[e] != e) {
      parent[e] = parent[parent[e]];
      e = parent[e];
    }
    return e;
  };
  std::map<int32_t, size_t> first;
  for (size_t e = 0; e < m; ++e)
    for (int32_t lid : ph.root_of[e]) {
      auto it = first.find(lid);
      if (it != first.end())
        parent[find(e)] = find(it->second);
      else
        first[lid] = e;
    }
  std::map<size_t, int32_t> group_of_root;  // numbered by their first entry
  for (size_t e = 0; e < m; ++e) group_of_root.emplace(find(e), int32_t(group_of_root.size()));
  std::vector<std::pair<int32_t, int32_t>> keys(m);
  for (size_t e = 0; e < m; ++e) keys[e] = {group_of_root[find(e)], ph.phase[e]};
  std::vector<std::pair<int32_t, int32_t>> sorted_keys = keys;
  std::sort(sorted_keys.begin(), sorted_keys.end());
  sorted_keys.erase(std::unique(sorted_keys.begin(), sorted_keys.end()), sorted_keys.end());
  slot.resize(m);
  for (size_t e = 0; e < m; ++e)
    slot[e] = int32_t(std::lower_bound(sorted_keys.begin(), sorted_keys.end(), keys[e]) - sorted_keys.begin());
  slot_group.clear();
  for (const auto& key : sorted_keys) slot_group.push_back(key.first);
}

bool ChoiceCore::chain_problem(const Columns& col, const Phases& ph, const std::vector<double>& gap,
                               const std::vector<int64_t>& held, const std::vector<int32_t>& slot,
                               const std::vector<int32_t>& slot_group, double rate, Aggregate& out) const {
  const size_t n_links = dep_.link_cap.size();
  std::vector<double> cap(n_links), left(n_links);
  for (size_t l = 0; l < n_links; ++l) {
    cap[l] = dep_.link_cap[l] / 1e9;  // GB/s
    left[l] = dep_.link_cap[l] - rate * 1e9 * double(held[l]);  // B/s
  }
  std::vector<int32_t> entry_of(col.size(), -1);
  for (size_t e = 0; e < ph.entry.size(); ++e) entry_of[size_t(ph.entry[e])] = int32_t(e);
  // each column's links, sorted, its slowest
  std::vector<std::vector<int32_t>> path(col.size());
  std::vector<uint8_t> limited(col.size(), 0);
  for (size_t c = 0; c < col.size(); ++c) {
    auto& lids = path[c];
    lids.assign(col.links.begin() + col.link_ptr[c], col.links.begin() + col.link_ptr[c + 1]);
    std::sort(lids.begin(), lids.end());
    lids.erase(std::unique(lids.begin(), lids.end()), lids.end());
    double slowest = std::numeric_limits<double>::infinity();
    for (int32_t lid : lids) slowest = std::min(slowest, cap[size_t(lid)]);
    if (entry_of[c] >= 0) continue;
    for (int32_t lid : lids)
      if (left[size_t(lid)] <= 0) return false;  // the reservation leaves a link no room
    limited[c] = dep_.route_rate[size_t(col.route[c])] < slowest * (1 - 1e-9);
  }
  if (!ph.entry.empty() && rate <= 0) return false;
  std::vector<int64_t> cap_index(col.size(), -1);
  int64_t n_limited = 0;
  for (size_t c = 0; c < col.size(); ++c)
    if (limited[c]) cap_index[c] = int64_t(n_links) + n_limited++;
  const int64_t chain0 = int64_t(n_links) + n_limited;
  const int32_t n_groups = slot_group.empty() ? 0 : *std::max_element(slot_group.begin(), slot_group.end()) + 1;
  std::vector<int64_t> slot_size(slot_group.size(), 0);
  for (int32_t k : slot) ++slot_size[size_t(k)];
  out = Aggregate{};
  out.cap = left;
  for (size_t c = 0; c < col.size(); ++c)
    if (limited[c]) out.cap.push_back(dep_.route_rate[size_t(col.route[c])] * 1e9);
  out.cap.insert(out.cap.end(), size_t(n_groups), rate * 1e9);
  out.base.assign(out.cap.size(), 0.0);
  std::vector<double> slot_gap(slot_group.size(), 0.0);
  for (size_t e = 0; e < slot.size(); ++e) slot_gap[size_t(slot[e])] = std::max(slot_gap[size_t(slot[e])], gap[e]);
  for (size_t k = 0; k < slot_gap.size(); ++k) out.base[size_t(chain0 + slot_group[k])] += slot_gap[k] * 1e-9 * rate * 1e9;
  out.col_ptr.push_back(0);
  std::vector<int32_t> res;
  std::vector<double> coef;
  for (size_t p = 0; p < col.volume.size(); ++p) {
    const auto lo = size_t(col.pair_first[p]);
    const size_t hi = p + 1 < col.volume.size() ? size_t(col.pair_first[p + 1]) : col.size();
    out.volume.push_back(double(col.volume[p]));
    out.first_col.push_back(hi - lo == 1 ? -1 : int64_t(out.col_pair.size()));
    for (size_t c = lo; c < hi; ++c) {
      res.clear();
      coef.clear();
      if (const int32_t e = entry_of[c]; e >= 0) {
        res.push_back(int32_t(chain0 + slot_group[size_t(slot[size_t(e)])]));
        coef.push_back(1.0 / double(slot_size[size_t(slot[size_t(e)])]));
      } else {
        res = path[c];
        if (limited[c]) res.push_back(int32_t(cap_index[c]));
        coef.assign(res.size(), 1.0);
      }
      if (hi - lo == 1) {
        for (size_t k = 0; k < res.size(); ++k) out.base[size_t(res[k])] += coef[k] * out.volume.back();
        continue;
      }
      out.col_pair.push_back(int32_t(p));
      out.col_route.push_back(col.route[c]);
      out.col_links.insert(out.col_links.end(), res.begin(), res.end());
      out.col_coef.insert(out.col_coef.end(), coef.begin(), coef.end());
      out.col_ptr.push_back(int64_t(out.col_links.size()));
    }
  }
  return true;
}

std::vector<int64_t> ChoiceCore::chain_bytes(const Columns& col, const Aggregate& agg,
                                             const std::vector<double>& frac) const {
  std::vector<double> x(col.size());
  size_t k = 0;  // the split's columns are the chosen pairs' columns, in order
  for (size_t c = 0; c < col.size(); ++c) {
    const auto p = size_t(col.pair_of[c]);
    x[c] = agg.first_col[p] < 0 ? double(col.volume[p]) : agg.volume[size_t(agg.col_pair[k])] * frac[k++];
  }
  return whole_bytes(x, col);
}

double ChoiceCore::free_horizon(const Columns& col, const std::vector<int64_t>& held, double rate,
                                const std::vector<double>& x) const {
  const size_t n_links = dep_.link_cap.size();
  std::vector<double> load(n_links, 0.0);
  double moving = 0;
  for (size_t c = 0; c < col.size(); ++c) {
    if (x[c] == 0) continue;
    for (int64_t e = col.link_ptr[c]; e < col.link_ptr[c + 1]; ++e) load[size_t(col.links[e])] += x[c];
    if (x[c] > 0) moving = std::max(moving, x[c] / dep_.route_rate[size_t(col.route[c])]);
  }
  double horizon = 0;
  for (size_t l = 0; l < n_links; ++l) {
    const double left = dep_.link_cap[l] - rate * 1e9 * double(held[l]);  // B/s
    if (left > 0) horizon = std::max(horizon, load[l] / left);
  }
  return std::max(horizon * 1e9, moving);
}

double ChoiceCore::chain_time(const Columns& col, const Phases& ph, const std::vector<double>& gap,
                              const std::vector<int64_t>& held, double rate, const std::vector<int64_t>& nbytes) const {
  std::vector<double> x(col.size());
  for (size_t c = 0; c < col.size(); ++c) x[c] = double(nbytes[c]);
  for (int32_t c : ph.entry) x[size_t(c)] = 0.0;
  const double horizon = free_horizon(col, held, rate, x);
  std::vector<size_t> order(ph.entry.size());
  for (size_t e = 0; e < order.size(); ++e) order[e] = e;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(ph.phase[a], ph.entry[a]) < std::tie(ph.phase[b], ph.entry[b]);
  });
  std::map<int32_t, double> ready;  // root-complex link -> when its latest entry ends
  double longest = 0;
  for (size_t e : order) {
    const auto c = size_t(ph.entry[e]);
    if (nbytes[c] <= 0) continue;
    double end = 0;
    for (int32_t lid : ph.root_of[e]) {
      auto it = ready.find(lid);
      if (it != ready.end()) end = std::max(end, it->second);
    }
    end += double(nbytes[c]) / std::min(dep_.route_rate[size_t(col.route[c])], rate) + gap[e];
    for (int32_t lid : ph.root_of[e]) ready[lid] = end;
    longest = std::max(longest, end);
  }
  return std::max(horizon, longest);
}

ChoiceSchedule ChoiceCore::emit_chains(const Columns& col, const Phases& ph, const std::vector<int64_t>& held,
                                       double rate, const std::vector<int64_t>& nbytes) const {
  ChoiceSchedule s;
  s.plan = "chained";
  std::vector<uint8_t> is_entry(col.size(), 0);
  for (int32_t c : ph.entry) is_entry[size_t(c)] = 1;
  std::vector<double> x(col.size(), 0.0);
  for (size_t c = 0; c < col.size(); ++c)
    if (!is_entry[c] && nbytes[c] > 0) x[c] = double(nbytes[c]);
  const double horizon = free_horizon(col, held, rate, x) * (1 + 1e-6);
  for (size_t c = 0; c < col.size(); ++c)
    if (x[c] > 0) {
      const double path_rate = dep_.route_rate[size_t(col.route[c])];
      s.add(col.src[c], col.dst[c], col.route[c], nbytes[c], std::min(path_rate, double(nbytes[c]) / horizon), dep_);
    }
  std::vector<size_t> order(ph.entry.size());
  for (size_t e = 0; e < order.size(); ++e) order[e] = e;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(ph.phase[a], ph.entry[a]) < std::tie(ph.phase[b], ph.entry[b]);
  });
  std::map<int32_t, int32_t> previous;  // root-complex link -> its latest entry's index
  for (size_t e : order) {
    const auto c = size_t(ph.entry[e]);
    if (nbytes[c] <= 0) continue;
    std::set<int32_t> after;
    for (int32_t lid : ph.root_of[e]) {
      auto it = previous.find(lid);
      if (it != previous.end()) after.insert(it->second);
    }
    const auto index = int32_t(s.transfers());
    for (int32_t lid : ph.root_of[e]) previous[lid] = index;
    s.add(col.src[c], col.dst[c], col.route[c], nbytes[c], std::min(dep_.route_rate[size_t(col.route[c])], rate),
          dep_);
    for (int32_t a : after) {
      s.after_step.push_back(0);
      s.after_index.push_back(a);
    }
    s.after_ptr.back() = int64_t(s.after_step.size());
  }
  if (s.transfers()) {
    s.step_ptr.push_back(int64_t(s.transfers()));
    s.step_overhead.push_back(-1.0);
    s.step_chain.push_back(1);
  }
  return s;
}

SplitStart ChoiceCore::chain_split(const Aggregate& agg, const SplitStart& warm) const {
  if (agg.col_pair.empty()) return {{}, uniform_weight(agg)};
  Split found = warm.frac.empty() ? mirror_prox(agg, initial_fractions(agg), uniform_weight(agg), kSplitIterations,
                                                0.0, kSplitTolerance)
                                  : mirror_prox(agg, warm.frac, warm.weight, kWarmIterations, 0.0, kSplitTolerance);
  return {std::move(found.frac), std::move(found.weight)};
}

bool ChoiceCore::chained(const int64_t* demand, const NetParams& gap_net, ChoiceSchedule& out, double floor_s) const {
  const Columns col = route_columns(demand);
  if (!col.size()) {
    out = ChoiceSchedule{};
    out.plan = "chained";
    return true;
  }
  const Phases ph = colour(col);
  if (ph.entry.empty()) return false;  // nothing crosses a root complex: paced over the same routes
  const std::vector<double> gap = gaps(col, ph, gap_net);
  const std::vector<int64_t> held = concurrent_entries(col, ph);
  std::vector<int32_t> slot, slot_group;
  slots(ph, slot, slot_group);
  double top = 0;
  for (int32_t c : ph.entry) top = std::max(top, dep_.route_rate[size_t(col.route[size_t(c)])]);
  std::vector<double> rates;
  for (double r : kChainRates) rates.push_back(std::min(r, top));
  std::sort(rates.begin(), rates.end(), std::greater<double>());
  rates.erase(std::unique(rates.begin(), rates.end()), rates.end());
  bool found = false;
  double best_t = 0, best_rate = 0;
  std::vector<int64_t> best_bytes;
  SplitStart warm;  // each rate's split starts from the previous rate's fractions and weights
  Aggregate agg;
  for (double rate : rates) {
    if (!chain_problem(col, ph, gap, held, slot, slot_group, rate, agg)) continue;
    warm = chain_split(agg, warm);
    std::vector<int64_t> nbytes = chain_bytes(col, agg, warm.frac);
    const double t = chain_time(col, ph, gap, held, rate, nbytes);
    if (found && t >= best_t * (1 - 1e-9)) break;  // slower than a larger rate's plan: no smaller rate tried
    found = true;
    best_t = t;
    best_rate = rate;
    best_bytes = std::move(nbytes);
    if (best_t <= floor_s * 1e9 * (1 + kSplitTolerance)) break;  // no rate can be more than 1% faster
  }
  if (!found) return false;
  out = emit_chains(col, ph, held, best_rate, best_bytes);
  return true;
}

}  // namespace variopath
