// Internal to the choice's sources (choice.cc, families.cc, split.cc, rotation.cc, predict.cc):
// their shared constants and helpers.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "choice.h"

namespace variopath::choice_detail {

inline constexpr int kRootP2P = 0, kRootDma = 1;

inline constexpr double kRel = 1e-9;  // sim/fluid.py _REL
inline constexpr double kSplitStep = 2.0;  // SPLIT_STEP
inline constexpr int kMeanCheck = 10;  // MEAN_CHECK
inline constexpr double kBetter = 1 - 1e-12;  // BETTER
inline constexpr int kReferenceIterations = 1000;  // REFERENCE_ITERATIONS
inline constexpr double kReferenceTolerance = 1e-3;  // REFERENCE_TOLERANCE
inline constexpr double kStartMix = 1e-3;  // START_MIX
inline constexpr size_t kCutLinks = 6;  // CUT_LINKS
inline constexpr double kCutSlack = 0.03;  // CUT_SLACK
inline constexpr int kFree = -1, kOwn = 0;  // FREE, OWN: a route's phase where it writes on no uplink,
// toward its own root complex or on two uplinks
inline constexpr double kPhaseStartFloor = 1e-12;  // PHASE_START_FLOOR

inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("choice deployment: " + what);
}

// sim/network.py RootPorts.writes (no plan pulls): visit(link, target root complex) for every uplink
// on which a transfer along `links` pushes writes. Staged bytes are DMA writes into the writer's own
// root complex; bytes on their way to a NIC are read by it; anything else is a push toward the root
// complex of the next root port it goes down through, or, going down none, the uplink's own.
template <class Visit>
void path_writes(const ChoiceDeployment& dep, const int32_t* links, size_t count, bool staged, Visit&& visit) {
  size_t to_nic = count;  // the first link through a NIC (count: none)
  for (size_t e = 0; e < count && to_nic == count; ++e)
    if (dep.link_nic[size_t(links[e])]) to_nic = e;
  for (size_t e = 0; e < count; ++e) {
    const auto l = size_t(links[e]);
    if (!dep.link_uplink[l]) continue;
    if (!staged && to_nic < count && e < to_nic) continue;
    int32_t target = dep.link_root_complex[l];
    for (size_t m = e + 1; !staged && m < count; ++m) {
      const auto k = size_t(links[m]);
      if (dep.link_root_complex[k] >= 0 && !dep.link_uplink[k]) {
        target = dep.link_root_complex[k];
        break;
      }
    }
    visit(l, target);
  }
}

// a bitmask of root complexes naming two or more: an uplink writing toward them triggers
inline bool two_or_more(uint64_t targets) { return (targets & (targets - 1)) != 0; }

// path_writes of rank pair (i, j)'s transfer on route r, its path built (endpoint links included)
template <class Visit>
void transfer_writes(const ChoiceDeployment& dep, int32_t i, int32_t j, size_t r, Visit&& visit) {
  thread_local std::vector<int32_t> path;
  path.clear();
  if (dep.route_via[r]) path.push_back(dep.endpoint_up[size_t(i)]);
  path.insert(path.end(), dep.route_links.begin() + dep.route_link_ptr[r],
              dep.route_links.begin() + dep.route_link_ptr[r + 1]);
  if (dep.route_via[r]) path.push_back(dep.endpoint_down[size_t(j)]);
  path_writes(dep, path.data(), path.size(), dep.route_staged[r], visit);
}


// A Tally summed per route first: a route's links are the same for every rank pair of its group
// pair, so each transfer costs O(1) (its endpoint links when it goes through them) and each
// route's links are added once (finish). Sums in another order than Tally::add_links, same values
// within rounding. The sums live per link and per route as LinkSums; the link sums become the
// Tally in finish.
class RouteTally {
 public:
  // slots: the routes it may be given, numbered compactly (ChoiceCore::other_routes_), or null:
  // every route
  RouteTally(const ChoiceDeployment& dep, const std::vector<uint8_t>& route_nic, const RouteWrites& writes,
             const RouteSlots* slots = nullptr)
      : dep_(dep),
        route_nic_(route_nic),
        writes_(writes),
        slots_(slots),
        links_(dep.link_cap.size()),
        routes_(slots ? slots->route.size() : dep.route_rate.size()) {}

  // the route's part of `count` transfers on route r, `bytes` in all, their caps summing to
  // cap_sum, of the kinds given (bit 0: through a NIC, bit 1: not; p2p is the route's)
  void add_route(int32_t r, double count, double bytes, double cap_sum, int kinds) {
    LinkSums& k = routes_[slot(r)];
    k.flows += count;
    k.load += bytes;
    k.cap_sum += cap_sum;
    k.kinds |= kinds;
  }
  // an endpoint link's part of some transfers
  void add_endpoint(size_t l, const LinkSums& sums) {
    if (sums.flows > 0) links_[l].add(sums);
  }
  // a transfer's own time (s), through a NIC or not
  void add_own(bool nic, double t) {
    double& top = nic ? own_nic_ : own_pcie_;
    top = std::max(top, t);
  }
  // root complexes some transfers push writes toward on link l (those of routes whose writes are
  // found path by path)
  void add_targets(size_t l, uint64_t targets) { links_[l].targets |= targets; }

  void add(int32_t i, int32_t j, int32_t r, int64_t x, double rate_gbs, const ChoiceDeployment&) {
    const auto ri = size_t(r);
    const double cap = rate_gbs * 1e9;
    const bool via = dep_.route_via[ri];
    const auto up = size_t(dep_.endpoint_up[i]), down = size_t(dep_.endpoint_down[j]);
    const bool nic = route_nic_[ri] || (via && (dep_.link_nic[up] || dep_.link_nic[down]));
    add_route(r, 1, double(x), cap, nic ? 1 : 2);
    if (via) {
      const bool staged = dep_.route_staged[ri];
      links_[up].add(1, double(x), cap, staged, nic);
      links_[down].add(1, double(x), cap, staged, nic);
    }
    if (writes_.per_transfer[ri])
      transfer_writes(dep_, i, j, ri, [&](size_t l, int32_t c) { links_[l].targets |= uint64_t(1) << c; });
    add_own(nic, x > 0 ? double(x) / cap : 0.0);
  }

  Tally finish() {
    for (size_t k = 0; k < routes_.size(); ++k) {
      LinkSums sums = routes_[k];
      if (sums.flows == 0) continue;
      const auto r = size_t(slots_ ? slots_->route[k] : int32_t(k));
      sums.p2p = dep_.route_staged[r] ? 0.0 : sums.flows;
      for (int64_t e = dep_.route_link_ptr[r]; e < dep_.route_link_ptr[r + 1]; ++e)
        links_[size_t(dep_.route_links[e])].add(sums);
      for (int64_t w = writes_.ptr[r]; w < writes_.ptr[r + 1]; ++w)
        links_[size_t(writes_.link[size_t(w)])].targets |= uint64_t(1) << writes_.target[size_t(w)];
    }
    Tally out;
    out.link = std::move(links_);
    out.own_nic = own_nic_;
    out.own_pcie = own_pcie_;
    return out;
  }

 private:
  size_t slot(int32_t r) const {
    if (!slots_) return size_t(r);
    const int32_t k = slots_->of_route[size_t(r)];
    if (k < 0) no_slot(r);
    return size_t(k);
  }
  [[noreturn, gnu::cold, gnu::noinline]] static void no_slot(int32_t r) {
    throw std::logic_error("route " + std::to_string(r) + " has no slot in this tally");
  }

  const ChoiceDeployment& dep_;
  const std::vector<uint8_t>& route_nic_;
  const RouteWrites& writes_;
  const RouteSlots* slots_;
  std::vector<LinkSums> links_, routes_;
  double own_nic_ = -std::numeric_limits<double>::infinity();
  double own_pcie_ = -std::numeric_limits<double>::infinity();
};

// One cell's (rank i, destination group d) pieces of one concurrent family (concurrent_pair's
// sink), summed before they reach the family's RouteTally: per route, i's endpoint and the own
// times once per cell, each destination's endpoint once per rank of d. Two families that send a
// cell's pairs alike (ChoiceCore::family_of_) share its sums.
class CellSums {
 public:
  // most_routes: the most candidate routes of a group pair
  CellSums(const ChoiceDeployment& dep, const std::vector<uint8_t>& route_nic, const RouteWrites& writes,
           size_t most_routes, size_t most_members)
      : dep_(dep), route_nic_(route_nic), writes_(writes), routes_(most_routes + 1), down_(most_members) {}

  // a new cell of group pair `pair` (its routes, then its memory route)
  void clear(int64_t pair) {
    lo_ = dep_.route_ptr[pair];
    hi_ = dep_.route_ptr[pair + 1];
    memory_ = dep_.memory_route[size_t(pair)];
    std::fill(routes_.begin(), routes_.begin() + (hi_ - lo_ + 1), LinkSums{});
    down_count_ = 0;
    last_j_ = -1;
    up_ = {};
    targets_.clear();
    own_[0] = own_[1] = -std::numeric_limits<double>::infinity();
  }
  void add(int32_t i, int32_t j, int32_t r, int64_t x, double rate_gbs, const ChoiceDeployment&) {
    const auto ri = size_t(r);
    const double cap = rate_gbs * 1e9;
    const bool via = dep_.route_via[ri];
    const bool nic = route_nic_[ri] ||
                     (via && (dep_.link_nic[size_t(dep_.endpoint_up[i])] || dep_.link_nic[size_t(dep_.endpoint_down[j])]));
    LinkSums& k = routes_[size_t(r == memory_ ? hi_ - lo_ : r - lo_)];
    k.flows += 1;
    k.load += double(x);
    k.cap_sum += cap;
    k.kinds |= nic ? 1 : 2;
    if (via) {
      const bool staged = dep_.route_staged[ri];
      up_.add(1, double(x), cap, staged, nic);
      if (last_j_ != j) {
        down_[down_count_++] = {j, LinkSums{}};
        last_j_ = j;
      }
      down_[down_count_ - 1].second.add(1, double(x), cap, staged, nic);
    }
    if (writes_.per_transfer[ri])
      transfer_writes(dep_, i, j, ri, [&](size_t l, int32_t c) { targets_.emplace_back(l, uint64_t(1) << c); });
    double& top = own_[nic ? 1 : 0];
    top = std::max(top, x > 0 ? double(x) / cap : 0.0);
  }
  // the cell's sums into a family's tally, its rank's endpoint sums and own times
  // ([0]: not through a NIC, [1]: through one) and its destinations' endpoint sums
  void flush(RouteTally& t, LinkSums& up, double own[2], std::vector<LinkSums>& down) const {
    for (int64_t k = 0; k <= hi_ - lo_; ++k) {
      const LinkSums& sums = routes_[size_t(k)];
      if (sums.flows > 0) t.add_route(int32_t(k == hi_ - lo_ ? memory_ : lo_ + k), sums.flows, sums.load, sums.cap_sum, sums.kinds);
    }
    up.add(up_);
    for (size_t e = 0; e < down_count_; ++e) down[size_t(down_[e].first)].add(down_[e].second);
    for (const auto& [l, bits] : targets_) t.add_targets(l, bits);
    own[0] = std::max(own[0], own_[0]);
    own[1] = std::max(own[1], own_[1]);
  }

 private:
  const ChoiceDeployment& dep_;
  const std::vector<uint8_t>& route_nic_;
  const RouteWrites& writes_;
  std::vector<std::pair<size_t, uint64_t>> targets_;  // writes of routes found path by path
  int64_t lo_ = 0, hi_ = 0, memory_ = -1;
  std::vector<LinkSums> routes_;  // [r - lo_] for the pair's routes, [hi_ - lo_] its memory route
  std::vector<std::pair<int32_t, LinkSums>> down_;
  size_t down_count_ = 0;
  int32_t last_j_ = -1;
  LinkSums up_;
  double own_[2] = {-std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
};

}  // namespace variopath::choice_detail
