// variopath's model-aware choice in the C++ core; see choice.h. Every function mirrors the Python
// reference function of the same name (planner/model_aware.py, split.py, predict.py).
#include "choice.h"

#include <chrono>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace variopath {

namespace {

constexpr int kRootP2P = 0, kRootDma = 1;

constexpr double kRel = 1e-9;  // sim/fluid.py _REL
constexpr double kSplitStep = 2.0;  // split.py SPLIT_STEP
constexpr int kMeanCheck = 10;  // split.py MEAN_CHECK
constexpr double kBetter = 1 - 1e-12;  // split.py BETTER
constexpr int kReferenceIterations = 1000;  // split.py REFERENCE_ITERATIONS
constexpr double kReferenceTolerance = 1e-3;  // split.py REFERENCE_TOLERANCE
constexpr double kStartMix = 1e-3;  // split.py START_MIX
constexpr size_t kCutLinks = 6;  // split.py CUT_LINKS
constexpr double kCutSlack = 0.03;  // split.py CUT_SLACK
constexpr int kFree = -1, kOwn = 0;  // split.py FREE, OWN: a route's phase where it writes on no uplink,
// toward its own root complex or on two uplinks
constexpr double kPhaseStartFloor = 1e-12;  // split.py PHASE_START_FLOOR

void require(bool ok, const std::string& what) {
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
bool two_or_more(uint64_t targets) { return (targets & (targets - 1)) != 0; }

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

}  // namespace

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

namespace {

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

}  // namespace

// ----- candidates (model_aware.py) ------------------------------------------------------------

ChoiceSchedule ChoiceCore::barrier(const PlanResult& paper) const {
  ChoiceSchedule s;
  s.plan = "barrier";
  for (size_t st = 0; st + 1 < paper.step_ptr.size(); ++st) {
    for (int64_t t = paper.step_ptr[st]; t < paper.step_ptr[st + 1]; ++t) {
      s.src.push_back(paper.src[t]);
      s.dst.push_back(paper.dst[t]);
      s.route.push_back(-1);
      s.carries_i.push_back(paper.src[t]);
      s.carries_j.push_back(paper.dst[t]);
      s.lane_kind.push_back(paper.lane_kind[t]);
      s.lane_inst.push_back(paper.lane_inst[t]);
      s.bytes.push_back(paper.bytes[t]);
      s.rate.push_back(paper.rate[t]);
      const auto kind = LaneKind(paper.lane_kind[t]);
      uint8_t staged = 0;
      if (kind == LaneKind::kFlat || kind == LaneKind::kIntra) {
        if (paper.lane_inst[t] < 0 || size_t(paper.lane_inst[t]) >= dep_.inst_staged.size())
          throw std::invalid_argument("choice deployment: inst_staged lacks a catalog instance of the plan");
        staged = dep_.inst_staged[size_t(paper.lane_inst[t])];
      } else if (kind == LaneKind::kNet) {
        staged = dep_.net_staged;
      } else {
        staged = dep_.near_staged[size_t(dep_.group_of[paper.src[t]]) * dep_.n_groups + dep_.group_of[paper.dst[t]]];
      }
      s.staged.push_back(staged);
      s.links.insert(s.links.end(), paper.links.begin() + paper.link_ptr[t], paper.links.begin() + paper.link_ptr[t + 1]);
      s.link_ptr.push_back(int64_t(s.links.size()));
      s.after_ptr.push_back(0);
    }
    s.step_ptr.push_back(int64_t(s.src.size()));
    s.step_overhead.push_back(-1.0);
    s.step_chain.push_back(1);
  }
  // behind barriers, no step shares a link with another: exclusive where no step's transfers do
  std::vector<int64_t> crossed_in(dep_.link_cap.size(), -1);  // the last step that crossed each link
  s.link_exclusive = true;
  for (size_t st = 0; st + 1 < s.step_ptr.size() && s.link_exclusive; ++st)
    for (int64_t e = s.link_ptr[size_t(s.step_ptr[st])]; e < s.link_ptr[size_t(s.step_ptr[st + 1])]; ++e) {
      int64_t& last = crossed_in[size_t(s.links[size_t(e)])];
      if (last == int64_t(st)) s.link_exclusive = false;
      last = int64_t(st);
    }
  return s;
}

SignalWaits signal_waits(const std::vector<int64_t>& step_ptr, const std::vector<int32_t>& src,
                         const std::vector<int32_t>& dst, const std::vector<int64_t>& link_ptr,
                         const std::vector<int32_t>& links, size_t ranks, size_t n_links) {
  const size_t transfers = src.size();
  const bool linked = link_ptr.size() == transfers + 1;
  // per sender, receiver and link (keys: ranks, then ranks, then links), the transfers of the last
  // step that touched it, as a range of `kept` (each step's lists appended, grouped by key)
  const size_t keys = 2 * ranks + (linked ? n_links : 0);
  std::vector<std::pair<int64_t, int64_t>> last(keys, {0, 0});
  std::vector<int32_t> kept, waits;
  std::vector<std::pair<int32_t, int32_t>> touched;  // this step's (key, transfer)
  SignalWaits out;
  out.ptr.reserve(transfers + 1);
  for (size_t st = 0; st + 1 < step_ptr.size(); ++st) {
    touched.clear();
    for (int64_t t = step_ptr[st]; t < step_ptr[st + 1]; ++t) {
      waits.clear();
      const auto wait_for = [&](size_t key) {
        const auto [lo, hi] = last[key];
        waits.insert(waits.end(), kept.begin() + lo, kept.begin() + hi);
        touched.emplace_back(int32_t(key), int32_t(t));
      };
      wait_for(size_t(src[t]));
      wait_for(ranks + size_t(dst[t]));
      for (int64_t e = linked ? link_ptr[t] : 0; linked && e < link_ptr[t + 1]; ++e)
        wait_for(2 * ranks + size_t(links[e]));
      std::sort(waits.begin(), waits.end());
      waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
      out.after.insert(out.after.end(), waits.begin(), waits.end());
      out.ptr.push_back(int64_t(out.after.size()));
    }
    std::sort(touched.begin(), touched.end());  // by key, each key's transfers ascending
    for (size_t k = 0; k < touched.size();) {
      const int32_t key = touched[k].first;
      const auto lo = int64_t(kept.size());
      for (; k < touched.size() && touched[k].first == key; ++k) kept.push_back(touched[k].second);
      last[size_t(key)] = {lo, int64_t(kept.size())};
    }
  }
  return out;
}

ChoiceSchedule ChoiceCore::signal_driven(const ChoiceSchedule& in) const {
  // schedule.py signal_driven: the waits of signal_waits, as (step, index) pairs
  ChoiceSchedule s = in;
  s.plan = "signal";
  const SignalWaits waits =
      signal_waits(in.step_ptr, in.src, in.dst, in.link_ptr, in.links, size_t(dep_.ranks), dep_.link_cap.size());
  std::vector<int32_t> step_of(in.src.size());
  for (size_t st = 0; st + 1 < in.step_ptr.size(); ++st) {
    std::fill(step_of.begin() + in.step_ptr[st], step_of.begin() + in.step_ptr[st + 1], int32_t(st));
    s.step_overhead[st] = 0.0;
    s.step_chain[st] = 0;
  }
  s.after_ptr = waits.ptr;
  s.after_step.resize(waits.after.size());
  s.after_index.resize(waits.after.size());
  for (size_t k = 0; k < waits.after.size(); ++k) {
    const int32_t t = waits.after[k], st = step_of[size_t(t)];
    s.after_step[k] = st;
    s.after_index[k] = int32_t(t - in.step_ptr[size_t(st)]);
  }
  return s;
}

template <class Sink>
void ChoiceCore::concurrent_pair(int32_t i, int32_t j, int64_t total, int64_t pair, int paths, bool staged,
                                 bool balanced, Sink& s) const {
  const int64_t lo = dep_.route_ptr[pair], hi = dep_.route_ptr[pair + 1];
  if (lo == hi)
    throw std::invalid_argument("no path from rank " + std::to_string(i) + " to rank " + std::to_string(j) +
                                ", which have demand");
  const int64_t fastest = fastest_end_[size_t(pair)];
  // the routes [first, end): one of the fastest by (i + j), or up to `paths` of them in order
  int64_t first = lo, end = std::min(balanced ? fastest : hi, lo + paths);
  if (paths == 1) {
    first = lo + (int64_t(i) + j) % (fastest - lo);
    end = first + 1;
  }
  if (staged && dep_.route_root[first]) {
    if (dep_.memory_route[pair] < 0) throw std::invalid_argument("staged: a group pair has no memory route");
    first = dep_.memory_route[pair];
    end = first + 1;
  }
  if (end == first + 1) {
    s.add(i, j, int32_t(first), total, dep_.route_rate[first], dep_);
    return;
  }
  double rate_sum = 0;
  for (int64_t r = first; r < end; ++r) rate_sum += dep_.route_rate[r];
  int64_t left = total;
  for (int64_t r = first; r < end; ++r) {
    const int64_t x = r + 1 == end ? left : int64_t(double(total) * dep_.route_rate[r] / rate_sum);
    if (x) {
      s.add(i, j, int32_t(r), x, dep_.route_rate[r], dep_);
      left -= x;
    }
  }
}

template <class Sink>
void ChoiceCore::concurrent_into(const int64_t* demand, int paths, bool staged, bool balanced, Sink& s) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  for (int32_t i = 0; i < n; ++i)
    for (int32_t j = 0; j < n; ++j)
      if (const int64_t total = demand[int64_t(i) * n + j])
        concurrent_pair(i, j, total, int64_t(dep_.group_of[i]) * G + dep_.group_of[j], paths, staged, balanced, s);
}

ChoiceSchedule ChoiceCore::concurrent(const int64_t* demand, int paths, bool staged, bool balanced,
                                      int32_t rank, bool with_links) const {
  ChoiceSchedule s;
  s.with_links = with_links;
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  const int64_t n2 = int64_t(n) * n;
  bool any = false;
  if (rank < 0) {
    const auto pairs = size_t(std::count_if(demand, demand + n2, [](int64_t x) { return x != 0; }));
    any = pairs > 0;
    s.reserve(pairs * size_t(paths), pairs * size_t(paths) * max_path_links_);
    concurrent_into(demand, paths, staged, balanced, s);
  } else {  // the rank's row and column in row-major order; every rank's plan has the step
    any = std::any_of(demand, demand + n2, [](int64_t x) { return x != 0; });
    s.reserve(2 * size_t(n) * size_t(paths), 2 * size_t(n) * size_t(paths) * max_path_links_);
    for (int32_t i = 0; i < n; ++i)
      for (int32_t j = i == rank ? 0 : rank; j < (i == rank ? n : rank + 1); ++j)
        if (const int64_t total = demand[int64_t(i) * n + j])
          concurrent_pair(i, j, total, int64_t(dep_.group_of[i]) * G + dep_.group_of[j], paths, staged, balanced, s);
  }
  if (any) {
    s.step_ptr.push_back(int64_t(s.transfers()));
    s.step_overhead.push_back(-1.0);
    s.step_chain.push_back(1);
  }
  return s;
}

void rank_totals(const std::vector<int64_t>& out_cells, const std::vector<int64_t>& in_cells, int32_t n, int32_t G,
                 std::vector<int64_t>& sent, std::vector<int64_t>& received) {
  sent.assign(size_t(n), 0);
  received.assign(size_t(n), 0);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t d = 0; d < G; ++d) sent[size_t(i)] += out_cells[size_t(i) * G + size_t(d)];
  for (int32_t a = 0; a < G; ++a)
    for (int32_t j = 0; j < n; ++j) received[size_t(j)] += in_cells[size_t(a) * n + size_t(j)];
}

DemandCells ChoiceCore::cells(const int64_t* demand) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  DemandCells c;
  c.out_count.assign(size_t(n) * G, 0);
  c.out_bytes.assign(size_t(n) * G, 0);
  c.out_top.assign(size_t(n) * G, 0);
  c.in_count.assign(size_t(G) * n, 0);
  c.in_bytes.assign(size_t(G) * n, 0);
  for (int32_t i = 0; i < n; ++i) {
    const int64_t* row = demand + int64_t(i) * n;
    if (row[i] != 0)
      throw std::invalid_argument("demand[" + std::to_string(i) + "][" + std::to_string(i) + "] = " +
                                  std::to_string(row[i]) + ": self traffic is never scheduled");
    int64_t* __restrict in_count = c.in_count.data() + size_t(dep_.group_of[i]) * n;
    int64_t* __restrict in_bytes = c.in_bytes.data() + size_t(dep_.group_of[i]) * n;
    int64_t nonzero = 0;
    for (int32_t j = 0; j < n; ++j) {
      in_count[j] += row[j] != 0;
      in_bytes[j] += row[j];
      nonzero += row[j] != 0;
    }
    c.nonzero += nonzero;
    int64_t* __restrict count = c.out_count.data() + size_t(i) * G;
    int64_t* __restrict bytes = c.out_bytes.data() + size_t(i) * G;
    int64_t* __restrict top = c.out_top.data() + size_t(i) * G;
    for (int32_t d = 0; d < G; ++d) {
      int64_t cell_count = 0, cell_bytes = 0, cell_top = 0;  // in registers: the rows may alias
      for (int32_t k = members_ptr_[size_t(d)]; k < members_ptr_[size_t(d) + 1]; ++k) {
        const int64_t x = row[members_[size_t(k)]];
        cell_count += x != 0;
        cell_bytes += x;
        cell_top = std::max(cell_top, x);
      }
      count[d] = cell_count;
      bytes[d] = cell_bytes;
      top[d] = cell_top;
    }
  }
  return c;
}

Tally ChoiceCore::shared_tally(const DemandCells& cells) const {
  RouteTally tally(dep_, route_nic_, writes_);
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  // every cell (i, d) as RouteTally::add would add its pairs one by one: the route's part, i's
  // endpoint's (summed over d, added once) and the own time (the largest x / cap is top / cap,
  // exactly)
  for (int32_t i = 0; i < n; ++i) {
    LinkSums up;
    double own[2] = {kNone, kNone};
    for (int32_t d = 0; d < G; ++d) {
      const int64_t pair = int64_t(dep_.group_of[i]) * G + d;
      const size_t cell = size_t(i) * G + size_t(d);
      const int64_t count = cells.out_count[cell];
      const SharedCell& s = shared_cells_[size_t(pair)];
      if (count == 0 || s.route < 0) continue;
      const double c = double(count), bytes = double(cells.out_bytes[cell]);
      tally.add_route(s.route, c, bytes, c * s.cap, s.nic ? 1 : 2);
      if (s.via) up.add(c, bytes, s.cap, s.staged, s.nic);
      own[s.nic] = std::max(own[s.nic], double(cells.out_top[cell]) / s.cap);  // count > 0: top > 0
    }
    tally.add_endpoint(size_t(dep_.endpoint_up[i]), up);
    for (int nic = 0; nic < 2; ++nic)
      if (own[nic] > kNone) tally.add_own(nic, own[nic]);
  }
  // and every cell (a, j): j's endpoint's part, summed over a and added once
  std::vector<LinkSums> down(static_cast<size_t>(n));
  for (int32_t a = 0; a < G; ++a) {
    const SharedCell* row = shared_cells_.data() + size_t(a) * G;
    const int64_t* count = cells.in_count.data() + size_t(a) * n;
    const int64_t* bytes = cells.in_bytes.data() + size_t(a) * n;
    for (int32_t j = 0; j < n; ++j) {
      const SharedCell& s = row[dep_.group_of[j]];
      if (count[j] == 0 || s.route < 0 || !s.via) continue;
      down[size_t(j)].add(double(count[j]), double(bytes[j]), s.cap, s.staged, s.nic);
    }
  }
  for (int32_t j = 0; j < n; ++j) tally.add_endpoint(size_t(dep_.endpoint_down[j]), down[size_t(j)]);
  return tally.finish();
}

std::vector<Tally> ChoiceCore::concurrent_tallies(const int64_t* demand, const DemandCells& cells,
                                                  const Tally& shared) const {
  constexpr size_t kFamilies = std::size(kConcurrentFamilies);
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  std::vector<RouteTally> each;
  std::vector<CellSums> cell;
  for (size_t f = 0; f < kFamilies; ++f) {
    each.emplace_back(dep_, route_nic_, writes_, &other_routes_);
    cell.emplace_back(dep_, route_nic_, writes_, most_routes_, most_members_);
  }
  std::vector<std::vector<LinkSums>> down(kFamilies, std::vector<LinkSums>(size_t(n)));
  for (int32_t i = 0; i < n; ++i) {
    LinkSums up[kFamilies];
    double own[kFamilies][2];
    for (auto& o : own) o[0] = o[1] = kNone;
    const int32_t a = dep_.group_of[i];
    for (int32_t s = other_ptr_[size_t(a)]; s < other_ptr_[size_t(a) + 1]; ++s) {
      const int32_t d = other_dest_[size_t(s)];
      const int64_t pair = int64_t(a) * G + d;
      if (cells.out_count[size_t(i) * G + size_t(d)] == 0) continue;
      const uint8_t* family_of = family_of_.data() + size_t(pair) * kFamilies;
      for (size_t f = 0; f < kFamilies; ++f) {
        if (family_of[f] != f) continue;  // sent as an earlier family sends it
        const ConcurrentFamily& family = kConcurrentFamilies[f];
        cell[f].clear(pair);
        for (int32_t k = members_ptr_[size_t(d)]; k < members_ptr_[size_t(d) + 1]; ++k) {
          const int32_t j = members_[size_t(k)];
          if (const int64_t total = demand[int64_t(i) * n + j])
            concurrent_pair(i, j, total, pair, family.paths, family.staged, family.balanced, cell[f]);
        }
      }
      for (size_t f = 0; f < kFamilies; ++f) cell[family_of[f]].flush(each[f], up[f], own[f], down[f]);
    }
    for (size_t f = 0; f < kFamilies; ++f) {
      each[f].add_endpoint(size_t(dep_.endpoint_up[i]), up[f]);
      for (int nic = 0; nic < 2; ++nic)
        if (own[f][nic] > kNone) each[f].add_own(nic, own[f][nic]);
    }
  }
  std::vector<Tally> out;
  for (size_t f = 0; f < kFamilies; ++f) {
    for (int32_t j = 0; j < n; ++j) each[f].add_endpoint(size_t(dep_.endpoint_down[j]), down[f][size_t(j)]);
    out.push_back(each[f].finish());
    out.back().merge(shared);
  }
  return out;
}

Tally ChoiceCore::paced_tally(const PacedPieces& pieces) const {
  // every piece runs at bytes / horizon: a link's summed caps are its bytes over the horizon and
  // every piece's own time is the horizon
  Tally t = pieces.at_route_rates;
  const double h = pieces.horizon_s;
  if (h <= 0) return t;  // no piece
  for (LinkSums& k : t.link) k.cap_sum = k.load / h;
  if (t.own_nic > -std::numeric_limits<double>::infinity()) t.own_nic = h;
  if (t.own_pcie > -std::numeric_limits<double>::infinity()) t.own_pcie = h;
  return t;
}

// ----- the paced split (split.py) -------------------------------------------------------------

Aggregate ChoiceCore::aggregate(const DemandCells& cells) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  std::vector<int64_t> grouped(size_t(G) * G, 0);  // whole bytes: the reference's sums exactly
  for (int32_t i = 0; i < n; ++i)
    for (int32_t d = 0; d < G; ++d)
      grouped[size_t(dep_.group_of[i]) * G + size_t(d)] += cells.out_bytes[size_t(i) * G + size_t(d)];
  const auto pairs = size_t(std::count_if(grouped.begin(), grouped.end(), [](int64_t v) { return v != 0; }));
  Aggregate agg;
  agg.pair_a.reserve(pairs);
  agg.pair_d.reserve(pairs);
  agg.volume.reserve(pairs);
  agg.first_col.reserve(pairs);
  agg.base.assign(dep_.link_cap.size(), 0.0);
  agg.cap = dep_.link_cap;
  agg.col_ptr.push_back(0);
  agg.pair_of_group.assign(size_t(G) * G, -1);
  for (int32_t a = 0; a < G; ++a) {
    for (int32_t d = 0; d < G; ++d) {
      const auto v = double(grouped[size_t(a) * G + d]);
      if (v == 0) continue;
      const int64_t pair = int64_t(a) * G + d;
      const int64_t lo = dep_.route_ptr[pair], hi = std::min(dep_.route_ptr[pair + 1], lo + kPacedRoutes);
      if (lo == hi)
        throw std::invalid_argument("no path between rank groups " + std::to_string(a) + " and " +
                                    std::to_string(d) + ", which have demand");
      const int32_t p = int32_t(agg.pair_a.size());
      agg.pair_of_group[size_t(pair)] = p;
      agg.pair_a.push_back(a);
      agg.pair_d.push_back(d);
      agg.volume.push_back(v);
      if (hi - lo == 1) {
        for (int64_t e = dep_.route_link_ptr[lo]; e < dep_.route_link_ptr[lo + 1]; ++e)
          agg.base[size_t(dep_.route_links[e])] += v;
        agg.first_col.push_back(-1);
        continue;
      }
      agg.first_col.push_back(int64_t(agg.col_pair.size()));
      for (int64_t r = lo; r < hi; ++r) {
        agg.col_pair.push_back(p);
        agg.col_route.push_back(int32_t(r));
        agg.col_links.insert(agg.col_links.end(), dep_.route_links.begin() + dep_.route_link_ptr[r],
                             dep_.route_links.begin() + dep_.route_link_ptr[r + 1]);
        agg.col_ptr.push_back(int64_t(agg.col_links.size()));
        agg.col_coef.resize(agg.col_links.size(), 1.0);
      }
    }
  }
  return agg;
}

std::vector<double> ChoiceCore::initial_fractions(const Aggregate& agg) const {
  std::vector<double> total(agg.volume.size(), 0.0), frac(agg.col_pair.size());
  for (size_t c = 0; c < frac.size(); ++c) total[size_t(agg.col_pair[c])] += dep_.route_rate[agg.col_route[c]];
  for (size_t c = 0; c < frac.size(); ++c) frac[c] = dep_.route_rate[agg.col_route[c]] / total[size_t(agg.col_pair[c])];
  return frac;
}

std::vector<double> ChoiceCore::link_loads(const Aggregate& agg, const std::vector<double>& frac) const {
  std::vector<double> load(agg.base.size());
  link_loads_into(agg, frac, load);
  return load;
}

void ChoiceCore::link_loads_into(const Aggregate& agg, const std::vector<double>& frac, std::vector<double>& load) const {
  std::copy(agg.base.begin(), agg.base.end(), load.begin());
  for (size_t c = 0; c < frac.size(); ++c) {
    const double x = agg.volume[size_t(agg.col_pair[c])] * frac[c];
    for (int64_t e = agg.col_ptr[c]; e < agg.col_ptr[c + 1]; ++e)
      load[size_t(agg.col_links[e])] += x * agg.col_coef[size_t(e)];
  }
}

double ChoiceCore::max_time(const Aggregate& agg, const std::vector<double>& frac) const {
  const std::vector<double> load = link_loads(agg, frac);
  double t = 0;
  for (size_t l = 0; l < load.size(); ++l)
    if (agg.cap[l] > 0) t = std::max(t, load[l] / agg.cap[l]);
  return t;
}

double ChoiceCore::lower_bound(const Aggregate& agg, const std::vector<double>& weight,
                                    std::vector<double>& per_link, std::vector<double>& cheapest) const {
  const size_t n_links = agg.cap.size();
  per_link.assign(n_links, 0.0);
  double fixed = 0, dual = 0;
  for (size_t l = 0; l < n_links; ++l) {
    const double inv = agg.cap[l] > 0 ? 1.0 / agg.cap[l] : 0.0;
    per_link[l] = weight[l] * inv;
    dual += per_link[l] * agg.base[l];
    fixed = std::max(fixed, agg.base[l] * inv);
  }
  cheapest.assign(agg.volume.size(), std::numeric_limits<double>::infinity());
  for (size_t c = 0; c < agg.col_pair.size(); ++c) {
    double cost = 0;
    for (int64_t e = agg.col_ptr[c]; e < agg.col_ptr[c + 1]; ++e)
      cost += per_link[size_t(agg.col_links[e])] * agg.col_coef[size_t(e)];
    auto& low = cheapest[size_t(agg.col_pair[c])];
    low = std::min(low, cost);
  }
  for (size_t p = 0; p < agg.volume.size(); ++p)
    if (agg.first_col[p] >= 0) dual += agg.volume[p] * cheapest[p];
  return std::max(dual, fixed);
}

double ChoiceCore::cut_bound(const Aggregate& agg, const std::vector<double>& frac) const {
  const std::vector<double> load = link_loads(agg, frac);
  const size_t n_links = agg.cap.size();
  std::vector<double> key(n_links, 0.0);
  double top = 0;
  for (size_t l = 0; l < n_links; ++l)
    if (agg.cap[l] > 0) top = std::max(top, load[l] / agg.cap[l]);
  if (top <= 0) return 0.0;
  for (size_t l = 0; l < n_links; ++l)  // np.round(t / top, 9): times equal but for rounding order by link
    key[l] = agg.cap[l] > 0 ? std::nearbyint(load[l] / agg.cap[l] / top * 1e9) / 1e9 : 0.0;
  std::vector<int32_t> order(n_links);
  for (size_t l = 0; l < n_links; ++l) order[l] = int32_t(l);
  const size_t head = std::min<size_t>(kCutLinks, n_links);
  std::partial_sort(order.begin(), order.begin() + ptrdiff_t(head), order.end(), [&](int32_t a, int32_t b) {
    return key[size_t(a)] != key[size_t(b)] ? key[size_t(a)] > key[size_t(b)] : a < b;
  });
  std::vector<int32_t> links;
  for (size_t k = 0; k < head; ++k)
    if (key[size_t(order[k])] >= 1 - kCutSlack && agg.cap[size_t(order[k])] > 0) links.push_back(order[k]);
  const size_t k = links.size();
  std::vector<int32_t> index(n_links, -1);
  for (size_t b = 0; b < k; ++b) index[size_t(links[b])] = int32_t(b);
  // per column, its share on each of the links; only pairs whose every column crosses one count
  const size_t cols = agg.col_pair.size();
  std::vector<double> crossing(cols * k, 0.0);
  std::vector<uint8_t> crosses(cols, 0);
  for (size_t c = 0; c < cols; ++c)
    for (int64_t e = agg.col_ptr[c]; e < agg.col_ptr[c + 1]; ++e)
      if (const int32_t b = index[size_t(agg.col_links[e])]; b >= 0) {
        crossing[c * k + size_t(b)] += agg.col_coef[size_t(e)];
        crosses[c] = 1;
      }
  std::vector<int64_t> counted;  // pairs (by first column) whose every column crosses the links
  for (size_t p = 0; p < agg.volume.size(); ++p) {
    if (agg.first_col[p] < 0) continue;
    bool all = true;
    for (size_t c = size_t(agg.first_col[p]); c < cols && size_t(agg.col_pair[c]) == p; ++c) all = all && crosses[c];
    if (all) counted.push_back(agg.first_col[p]);
  }
  double bound = 0;
  for (uint32_t mask = 1; mask < (1u << k); ++mask) {
    double base = 0, cap = 0, moved = 0;
    for (size_t b = 0; b < k; ++b)
      if (mask >> b & 1) {
        base += agg.base[size_t(links[b])];
        cap += agg.cap[size_t(links[b])];
      }
    for (int64_t c0 : counted) {
      const int32_t p = agg.col_pair[size_t(c0)];
      double least = std::numeric_limits<double>::infinity();
      for (size_t c = size_t(c0); c < cols && agg.col_pair[c] == p; ++c) {
        double on = 0;
        for (size_t b = 0; b < k; ++b)
          if (mask >> b & 1) on += crossing[c * k + b];
        least = std::min(least, on);
      }
      moved += agg.volume[size_t(p)] * least;
    }
    bound = std::max(bound, (base + moved) / cap);
  }
  return bound;
}

namespace {

// split.py used_links: the links some column crosses, in order
std::vector<int32_t> used_links(const Aggregate& agg) {
  std::vector<uint8_t> crossed(agg.cap.size(), 0);
  for (int32_t l : agg.col_links) crossed[size_t(l)] = 1;
  std::vector<int32_t> used;
  for (size_t l = 0; l < crossed.size(); ++l)
    if (crossed[l]) used.push_back(int32_t(l));
  return used;
}

}  // namespace

std::vector<double> ChoiceCore::uniform_weight(const Aggregate& agg) const {
  const std::vector<int32_t> used = used_links(agg);
  std::vector<double> weight(agg.cap.size(), 0.0);
  for (int32_t l : used) weight[size_t(l)] = 1.0 / double(used.size());
  return weight;
}

Split ChoiceCore::mirror_prox(const Aggregate& agg, std::vector<double> frac, std::vector<double> weight,
                              int iterations, double floor_s, double tolerance) const {
  const size_t cols = agg.col_pair.size(), n_links = agg.cap.size(), pairs = agg.volume.size();
  const std::vector<int32_t> used = used_links(agg);
  const double scale = std::max(max_time(agg, frac), 1e-30);
  std::vector<double> inv(n_links, 0.0);
  for (int32_t l : used) inv[size_t(l)] = 1.0 / (agg.cap[size_t(l)] * scale);
  double unit = 0;  // a route's cost per unit fraction: dimensionless
  for (int32_t l : used) unit = std::max(unit, agg.cap[size_t(l)]);
  unit *= scale;
  std::vector<double> best = frac;
  double best_t = max_time(agg, frac);
  std::vector<double> per_link, cheapest;  // lower_bound's scratch
  double bound = std::max(lower_bound(agg, weight, per_link, cheapest), cut_bound(agg, frac));
  std::vector<double> gf(cols), gw(n_links), half_f(cols), half_w(n_links), total(pairs);

  auto grad_frac = [&](const std::vector<double>& w) {
    for (size_t c = 0; c < cols; ++c) {
      double g = 0;
      for (int64_t e = agg.col_ptr[c]; e < agg.col_ptr[c + 1]; ++e) {
        const auto l = size_t(agg.col_links[e]);
        g += w[l] * inv[l] * agg.col_coef[size_t(e)];
      }
      gf[c] = g * unit;
    }
  };
  double loaded = 0;  // the last grad_weight's max_time (split.py max_time of the same loads)
  std::vector<double> load(n_links);
  auto grad_weight = [&](const std::vector<double>& f) {
    link_loads_into(agg, f, load);
    loaded = 0;
    for (size_t l = 0; l < n_links; ++l) {
      gw[l] = load[l] * inv[l];
      if (agg.cap[l] > 0) loaded = std::max(loaded, load[l] / agg.cap[l]);
    }
  };
  auto step_frac = [&](std::vector<double>& out) {  // out = normalise(frac * exp(-S (gf - min gf)))
    const double lo = *std::min_element(gf.begin(), gf.end());
    std::fill(total.begin(), total.end(), 0.0);
    for (size_t c = 0; c < cols; ++c) {
      out[c] = frac[c] * std::exp(-kSplitStep * (gf[c] - lo));
      total[size_t(agg.col_pair[c])] += out[c];
    }
    for (size_t c = 0; c < cols; ++c) out[c] /= total[size_t(agg.col_pair[c])];
  };
  auto step_weight = [&](std::vector<double>& out) {  // out = w exp(S (gw - max gw[used])), normalised
    double hi = -std::numeric_limits<double>::infinity();
    for (int32_t l : used) hi = std::max(hi, gw[size_t(l)]);
    double sum = 0;  // the weights of links no column crosses stay 0
    for (int32_t li : used) {
      const auto l = size_t(li);
      out[l] = weight[l] * std::exp(kSplitStep * (gw[l] - hi));
      sum += out[l];
    }
    for (int32_t li : used) out[size_t(li)] /= sum;
  };
  const auto certified = [&] { return best_t <= std::max(bound, floor_s) * (1 + tolerance); };
  std::vector<double> next_w(n_links), total_f(cols, 0.0), total_w(n_links, 0.0), mean(cols), mean_w(n_links);
  int done = 0;
  while (done < iterations && !certified()) {
    grad_frac(weight);
    grad_weight(frac);
    step_frac(half_f);
    step_weight(half_w);
    grad_frac(half_w);
    grad_weight(half_f);
    step_frac(frac);
    step_weight(next_w);
    weight.swap(next_w);
    for (size_t c = 0; c < cols; ++c) total_f[c] += half_f[c];
    for (size_t l = 0; l < n_links; ++l) total_w[l] += half_w[l];
    done += 1;
    const double t = loaded;  // max_time(agg, half_f): its loads were just summed
    if (t < best_t * kBetter) {
      best = half_f;
      best_t = t;
    }
    bound = std::max(bound, lower_bound(agg, half_w, per_link, cheapest));
    if (done % kMeanCheck == 0) {
      for (size_t c = 0; c < cols; ++c) mean[c] = total_f[c] / double(done);
      for (size_t l = 0; l < n_links; ++l) mean_w[l] = total_w[l] / double(done);
      const double tm = max_time(agg, mean);
      if (tm < best_t * kBetter) {
        best = mean;
        best_t = tm;
      }
      bound = std::max({bound, lower_bound(agg, mean_w, per_link, cheapest), cut_bound(agg, best)});
    }
  }
  bound = std::max(bound, floor_s);
  if (!done) return {std::move(best), std::move(weight), bound};
  for (size_t l = 0; l < n_links; ++l) mean_w[l] = total_w[l] / double(done);
  for (size_t c = 0; c < cols; ++c) mean[c] = total_f[c] / double(done);
  if (max_time(agg, mean) < best_t * kBetter) best = std::move(mean);  // mirror prox's guarantee: the mean
  return {std::move(best), std::move(mean_w), bound};
}

Split ChoiceCore::solve(const Aggregate& agg, const std::vector<double>& warm, const SplitStart* start,
                        double floor_s, int iterations) const {
  const size_t cols = agg.col_pair.size();
  if (!cols) return {{}, uniform_weight(agg), std::max(floor_s, max_time(agg, {}))};
  if (!warm.empty() && warm.size() != cols)
    throw std::invalid_argument("warm start: " + std::to_string(warm.size()) + " fractions for a split of " +
                                std::to_string(cols) + " columns");
  if (start) {
    Split cold = mirror_prox(agg, initial_fractions(agg), uniform_weight(agg), 0, floor_s, kSplitTolerance);
    if (max_time(agg, cold.frac) <= cold.bound_s * (1 + kSplitTolerance)) return cold;  // moves no byte it need not
    return mirror_prox(agg, start->frac, start->weight, std::min(kSplitIterations, iterations), floor_s,
                       kSplitTolerance);
  }
  if (!warm.empty())
    return mirror_prox(agg, warm, uniform_weight(agg), std::min(kWarmIterations, iterations), floor_s,
                       kSplitTolerance);
  return mirror_prox(agg, initial_fractions(agg), uniform_weight(agg), std::min(kSplitIterations, iterations), floor_s,
                     kSplitTolerance);
}

void ChoiceCore::solve_reference() {
  const int32_t n = dep_.ranks;
  std::vector<int64_t> uniform(size_t(n) * n, 0);  // split.py uniform_demand
  for (int32_t i = 0; i < n; ++i)
    for (int32_t j = 0; j < n; ++j) {
      const int64_t pair = int64_t(dep_.group_of[i]) * dep_.n_groups + dep_.group_of[j];
      uniform[size_t(i) * n + j] = i != j && dep_.route_ptr[pair + 1] > dep_.route_ptr[pair];
    }
  const Aggregate agg = aggregate(cells(uniform.data()));
  reference_frac_.assign(size_t(dep_.n_groups) * dep_.n_groups * kPacedRoutes, -1.0);
  reference_weight_.assign(agg.cap.size(), 0.0);
  if (agg.col_pair.empty()) return;
  Split found = mirror_prox(agg, initial_fractions(agg), uniform_weight(agg), kReferenceIterations, 0.0,
                            kReferenceTolerance);
  const std::vector<double>& frac = found.frac;
  reference_weight_ = std::move(found.weight);
  for (size_t c = 0; c < frac.size(); ++c) {
    const auto p = size_t(agg.col_pair[c]);
    const int64_t pair = int64_t(agg.pair_a[p]) * dep_.n_groups + agg.pair_d[p];
    reference_frac_[size_t(pair) * kPacedRoutes + size_t(agg.col_route[c] - dep_.route_ptr[pair])] = frac[c];
  }
}

SplitStart ChoiceCore::reference_start(const Aggregate& agg) const {
  // the reference table's fractions (a pair the uniform demand leaves out: by route rate)
  SplitStart out{std::vector<double>(agg.col_pair.size()), uniform_weight(agg)};
  for (size_t c = 0; c < out.frac.size(); ++c) {
    const auto p = size_t(agg.col_pair[c]);
    const int64_t pair = int64_t(agg.pair_a[p]) * dep_.n_groups + agg.pair_d[p];
    out.frac[c] = reference_table_[size_t(pair) * kPacedRoutes + size_t(agg.col_route[c] - dep_.route_ptr[pair])];
  }
  double sum = 0;
  for (size_t l = 0; l < out.weight.size(); ++l)
    if (out.weight[l] > 0) sum += reference_weight_[l];
  if (sum > 0)
    for (size_t l = 0; l < out.weight.size(); ++l)
      if (out.weight[l] > 0)
        out.weight[l] = (1 - kStartMix) * reference_weight_[l] / sum + kStartMix * out.weight[l];
  return out;
}

std::vector<int64_t> ChoiceCore::route_bounds(const Aggregate& agg, const std::vector<double>& frac) const {
  std::vector<int64_t> out(frac.size(), 0);
  size_t c0 = 0;
  while (c0 < frac.size()) {
    const int32_t p = agg.col_pair[c0];
    size_t c1 = c0;
    while (c1 < frac.size() && agg.col_pair[c1] == p) ++c1;
    const auto volume = int64_t(std::nearbyint(agg.volume[size_t(p)]));
    double cum = 0;
    int64_t run = std::numeric_limits<int64_t>::min();
    for (size_t c = c0; c < c1; ++c) {
      cum += frac[c];
      int64_t end = c + 1 == c1 ? volume : int64_t(std::floor(double(volume) * cum));
      run = std::max(run, end);
      out[c] = std::min(run, volume);
    }
    c0 = c1;
  }
  return out;
}

void segment(const int64_t* bounds, int64_t count, int64_t offset, int64_t volume, int64_t* share) {
  int64_t sum = 0, top = 0;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t lo = r == 0 ? 0 : bounds[r - 1];
    share[r] = std::max<int64_t>(0, std::min(offset + volume, bounds[r]) - std::max(offset, lo));
    if (share[r] > share[top]) top = r;
  }
  const int64_t floor = std::max<int64_t>(kPacedMinBytes, volume / 1000000);
  for (int64_t r = 0; r < count; ++r) {
    if (share[r] < floor) share[r] = 0;
    sum += share[r];
  }
  share[top] += volume - sum;
}


template <class Visit>
void ChoiceCore::pieces_of(int32_t i, int32_t j, int64_t volume, int64_t offset, const Aggregate& agg,
                           const std::vector<int64_t>& bounds, Visit&& visit) const {
  const int64_t pair = int64_t(dep_.group_of[i]) * dep_.n_groups + dep_.group_of[j];
  const int64_t lo = dep_.route_ptr[pair];
  const int64_t first = agg.first_col[size_t(agg.pair_of_group[size_t(pair)])];
  if (first < 0) {  // one route: the pair is not cut
    visit(i, j, int32_t(lo), volume);
    return;
  }
  int64_t share[kPacedRoutes];
  const int64_t routes = std::min<int64_t>(dep_.route_ptr[pair + 1] - lo, kPacedRoutes);
  segment(bounds.data() + first, routes, offset, volume, share);
  for (int64_t r = 0; r < routes; ++r)
    if (share[r]) visit(i, j, int32_t(lo + r), share[r]);
}

template <class Visit>
void ChoiceCore::for_each_piece(const int64_t* demand, const Aggregate& agg, const std::vector<int64_t>& bounds,
                                Visit&& visit) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  std::vector<int64_t> offset(agg.volume.size(), 0);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < n; ++j) {
      const int64_t volume = demand[int64_t(i) * n + j];
      if (volume == 0) continue;
      int64_t& at = offset[size_t(agg.pair_of_group[size_t(int64_t(dep_.group_of[i]) * G + dep_.group_of[j])])];
      pieces_of(i, j, volume, at, agg, bounds, visit);
      at += volume;
    }
  }
}

template <class Visit>
void ChoiceCore::for_each_split_pair(const int64_t* demand, const Aggregate& agg, Visit&& visit) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  std::vector<int64_t> offset(agg.volume.size(), 0);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t a = dep_.group_of[i];
    for (int32_t s = split_ptr_[size_t(a)]; s < split_ptr_[size_t(a) + 1]; ++s) {
      const int32_t d = split_dest_[size_t(s)];
      const int64_t p = agg.pair_of_group[size_t(int64_t(a) * G + d)];
      if (p < 0) continue;  // no demand between the two groups
      for (int32_t k = members_ptr_[size_t(d)]; k < members_ptr_[size_t(d) + 1]; ++k) {
        const int32_t j = members_[size_t(k)];
        const int64_t volume = demand[int64_t(i) * n + j];
        if (volume == 0) continue;
        visit(i, j, p, offset[size_t(p)], volume);
        offset[size_t(p)] += volume;
      }
    }
  }
}

PacedPieces ChoiceCore::paced_pieces(const int64_t* demand, const DemandCells& cells, const Aggregate& agg,
                                     const std::vector<double>& frac, const Tally& shared) const {
  PacedPieces out;
  out.bounds = route_bounds(agg, frac);
  RouteTally tally(dep_, route_nic_, writes_, &other_routes_);
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  const auto add = [&](int32_t i, int32_t j, int32_t r, int64_t x) {
    tally.add(i, j, r, x, dep_.route_rate[size_t(r)], dep_);
    ++out.count;
  };
  // a pair of a one-route group pair is not cut: the shared ones are tallied (shared), the others
  // (root_dest_) one by one; the rest by expand's walk
  int64_t visited = 0;  // the rank pairs added here; every other one is one shared piece
  for (int32_t i = 0; i < n; ++i) {
    const int32_t a = dep_.group_of[i];
    for (int32_t s = root_ptr_[size_t(a)]; s < root_ptr_[size_t(a) + 1]; ++s) {
      const int32_t d = root_dest_[size_t(s)];
      const auto r = int32_t(dep_.route_ptr[int64_t(a) * G + d]);
      for (int32_t k = members_ptr_[size_t(d)]; k < members_ptr_[size_t(d) + 1]; ++k)
        if (const int64_t x = demand[int64_t(i) * n + members_[size_t(k)]]) {
          add(i, members_[size_t(k)], r, x);
          ++visited;
        }
    }
  }
  for_each_split_pair(demand, agg, [&](int32_t i, int32_t j, int64_t, int64_t offset, int64_t volume) {
    pieces_of(i, j, volume, offset, agg, out.bounds, add);
    ++visited;
  });
  out.count += size_t(cells.nonzero - visited);
  out.at_route_rates = tally.finish();
  out.at_route_rates.merge(shared);
  // every link's bytes are whole bytes, exact in any order, so the horizon is split.py's; the
  // longest own time at the routes' rates is the split's own bound
  const Tally& t = out.at_route_rates;
  double link_time = std::max({0.0, t.own_nic, t.own_pcie});
  for (size_t l = 0; l < t.link.size(); ++l)
    if (dep_.link_cap[l] > 0) link_time = std::max(link_time, t.link[l].load / dep_.link_cap[l]);
  out.horizon_s = link_time * (1 + 1e-6);
  return out;
}

ChoiceSchedule ChoiceCore::expand(const int64_t* demand, const Aggregate& agg, const PacedPieces& pieces,
                                  int32_t rank) const {
  ChoiceSchedule s;
  s.plan = "paced";
  const size_t count = rank < 0 ? pieces.count : std::min(pieces.count, 2 * size_t(dep_.ranks) * kPacedRoutes);
  s.reserve(count, count * max_path_links_);
  const double h = pieces.horizon_s;
  const auto emit = [&](int32_t i, int32_t j, int32_t r, int64_t x) {
    const double path_rate = dep_.route_rate[size_t(r)];
    s.add(i, j, r, x, h > 0 ? std::min(path_rate, double(x) / (h * 1e9)) : path_rate, dep_);
  };
  if (rank < 0) {
    for_each_piece(demand, agg, pieces.bounds, emit);
  } else {  // the rank's row and column in row-major order, cut at their offsets in their group pairs
    const int32_t n = dep_.ranks;
    std::vector<int64_t> row_at(size_t(n), 0), column_at(size_t(n), 0);
    for_each_split_pair(demand, agg, [&](int32_t i, int32_t j, int64_t, int64_t offset, int64_t) {
      if (i == rank) row_at[size_t(j)] = offset;
      if (j == rank) column_at[size_t(i)] = offset;
    });
    for (int32_t i = 0; i < n; ++i)
      for (int32_t j = i == rank ? 0 : rank; j < (i == rank ? n : rank + 1); ++j)
        if (const int64_t x = demand[int64_t(i) * n + j])
          pieces_of(i, j, x, i == rank ? row_at[size_t(j)] : column_at[size_t(i)], agg, pieces.bounds, emit);
  }
  s.horizon_s = h;
  if (pieces.count) {  // every rank's plan has the step, with or without its transfers
    s.step_ptr.push_back(int64_t(s.transfers()));
    s.step_overhead.push_back(-1.0);
    s.step_chain.push_back(1);
  }
  return s;
}

bool ChoiceCore::phase_aggregate(const DemandCells& cells, const Aggregate& paced, Phased& out) const {
  // split.py phase_aggregate: the paced split over (link, phase) resources; a route of phase k
  // puts its bytes on (l, k) for its links and each rank's endpoint links (the rank's share of the
  // group pair's bytes), a free one 1/K of them on every (l, k); routes of phase kOwn dropped
  const int32_t R = dep_.root_complexes, n = dep_.ranks, G = dep_.n_groups;
  if (R < 2) return false;
  const int32_t K = R - 1;
  const size_t L = paced.cap.size();
  out = Phased{};
  out.phases = K;
  Aggregate& agg = out.agg;
  agg.pair_a = paced.pair_a;
  agg.pair_d = paced.pair_d;
  agg.volume = paced.volume;
  agg.pair_of_group = paced.pair_of_group;
  agg.base.assign(size_t(K) * L, 0.0);
  agg.cap.resize(size_t(K) * L);
  for (int32_t k = 0; k < K; ++k)
    for (size_t l = 0; l < L; ++l) agg.cap[size_t(k) * L + l] = paced.cap[l] / K;
  agg.col_ptr.push_back(0);
  out.pair_route.assign(paced.volume.size(), -1);
  std::vector<int32_t> on;  // a footprint's resources and shares
  std::vector<double> share;
  const auto footprint = [&](int32_t a, int32_t d, size_t r, double volume, int phase) {
    on.clear();
    share.clear();
    const auto add = [&](int32_t l, double s) {
      on.push_back(l);
      share.push_back(s);
    };
    for (int64_t e = dep_.route_link_ptr[r]; e < dep_.route_link_ptr[r + 1]; ++e) add(dep_.route_links[e], 1.0);
    if (dep_.route_via[r]) {
      for (int32_t k = members_ptr_[size_t(a)]; k < members_ptr_[size_t(a) + 1]; ++k) {
        const int32_t i = members_[size_t(k)];
        if (const int64_t s = cells.out_bytes[size_t(i) * G + size_t(d)]) add(dep_.endpoint_up[size_t(i)], double(s) / volume);
      }
      for (int32_t k = members_ptr_[size_t(d)]; k < members_ptr_[size_t(d) + 1]; ++k) {
        const int32_t j = members_[size_t(k)];
        if (const int64_t s = cells.in_bytes[size_t(a) * n + size_t(j)]) add(dep_.endpoint_down[size_t(j)], double(s) / volume);
      }
    }
    const size_t count = on.size();
    if (phase == kFree) {  // every phase, 1/K of the shares
      for (size_t e = 0; e < count; ++e) share[e] /= K;
      for (int32_t k = 1; k < K; ++k)
        for (size_t e = 0; e < count; ++e) {
          on.push_back(int32_t(size_t(k) * L) + on[e]);
          share.push_back(share[e]);
        }
    } else {
      for (size_t e = 0; e < count; ++e) on[e] += int32_t(size_t(phase - 1) * L);
    }
  };
  int32_t phases[kPacedRoutes];
  for (size_t p = 0; p < paced.volume.size(); ++p) {
    const int32_t a = paced.pair_a[p], d = paced.pair_d[p];
    const int64_t pair = int64_t(a) * G + d;
    const int64_t lo = dep_.route_ptr[pair], hi = std::min(dep_.route_ptr[pair + 1], lo + kPacedRoutes);
    int kept = 0;
    for (int64_t r = lo; r < hi; ++r) {
      phases[r - lo] = route_phase(a, d, size_t(r));
      kept += phases[r - lo] != kOwn;
    }
    if (!kept) return false;
    const double v = paced.volume[p];
    if (kept == 1) {
      for (int64_t r = lo; r < hi; ++r)
        if (phases[r - lo] != kOwn) {
          footprint(a, d, size_t(r), v, phases[r - lo]);
          out.pair_route[p] = int32_t(r);
        }
      for (size_t e = 0; e < on.size(); ++e) agg.base[size_t(on[e])] += v * share[e];
      agg.first_col.push_back(-1);
      continue;
    }
    agg.first_col.push_back(int64_t(agg.col_pair.size()));
    for (int64_t r = lo; r < hi; ++r) {
      if (phases[r - lo] == kOwn) continue;
      footprint(a, d, size_t(r), v, phases[r - lo]);
      agg.col_pair.push_back(int32_t(p));
      agg.col_route.push_back(int32_t(r));
      agg.col_links.insert(agg.col_links.end(), on.begin(), on.end());
      agg.col_coef.insert(agg.col_coef.end(), share.begin(), share.end());
      agg.col_ptr.push_back(int64_t(agg.col_links.size()));
      out.source.push_back(paced.first_col[p] >= 0 ? paced.first_col[p] + (r - lo) : -1);
    }
  }
  return true;
}

int32_t ChoiceCore::route_phase(int32_t a, int32_t d, size_t r) const {
  const int32_t R = dep_.root_complexes;
  const int32_t i = members_[size_t(members_ptr_[size_t(a)])];
  int32_t j = members_[size_t(members_ptr_[size_t(d)])];
  for (int32_t k = members_ptr_[size_t(d)]; k < members_ptr_[size_t(d) + 1] && j == i; ++k) j = members_[size_t(k)];
  int writes = 0, phase = kFree;
  transfer_writes(dep_, i, j, r, [&](size_t l, int32_t c) {
    ++writes;
    phase = ((c - dep_.link_root_complex[l]) % R + R) % R;
  });
  return writes > 1 ? kOwn : phase;
}

RotationSplit ChoiceCore::rotation_split(const Phased& ph, const std::vector<double>& frac) const {
  const int32_t G = dep_.n_groups;
  const Aggregate& agg = ph.agg;
  RotationSplit out{std::vector<int32_t>(size_t(G) * G, 0), std::vector<int32_t>(size_t(G) * G * kPacedRoutes, -1),
                    std::vector<double>(size_t(G) * G * kPacedRoutes, 0.0)};
  for (size_t p = 0; p < agg.volume.size(); ++p) {
    const size_t pair = size_t(agg.pair_a[p]) * G + size_t(agg.pair_d[p]);
    if (agg.first_col[p] < 0) {
      out.count[pair] = 1;
      out.route[pair * kPacedRoutes] = ph.pair_route[p];
      continue;
    }
    for (auto c = size_t(agg.first_col[p]); c < agg.col_pair.size() && size_t(agg.col_pair[c]) == p; ++c) {
      const int32_t k = out.count[pair]++;
      out.route[pair * kPacedRoutes + size_t(k)] = agg.col_route[c];
      out.frac[pair * kPacedRoutes + size_t(k)] = frac[c];
    }
  }
  return out;
}

RotationSplit ChoiceCore::rotation_split(const std::vector<double>& table) const {
  const int32_t G = dep_.n_groups;
  RotationSplit out{rotation_count_, rotation_route_, std::vector<double>(size_t(G) * G * kPacedRoutes, 0.0)};
  for (size_t pair = 0; pair < out.count.size(); ++pair) {
    const int32_t count = out.count[pair];
    if (count < 2) continue;
    double* f = out.frac.data() + pair * kPacedRoutes;
    const int32_t* routes = out.route.data() + pair * kPacedRoutes;
    double total = 0;
    for (int32_t k = 0; k < count; ++k) {
      const double decided = table.empty() ? -1.0 : table[pair * kPacedRoutes + size_t(routes[k] - dep_.route_ptr[pair])];
      total += f[k] = decided;
    }
    if (!(total > 0) || std::any_of(f, f + count, [](double x) { return x < 0; })) {  // not decided: by rate
      total = 0;
      for (int32_t k = 0; k < count; ++k) total += f[k] = dep_.route_rate[size_t(routes[k])];
    }
    for (int32_t k = 0; k < count; ++k) f[k] /= total;
  }
  return out;
}

bool ChoiceCore::expand_rotated(const int64_t* demand, const RotationSplit& split, ChoiceSchedule& out,
                                bool with_links) const {
  // split.py expand_rotated: every rank pair cut by the fractions themselves; the horizon T from
  // every (link, phase)'s K pushed + free bytes and the pieces' own times; a free piece at x / T,
  // one of phase k at K x / T after its uplink's pieces of the nearest earlier phase with some
  const int32_t R = dep_.root_complexes, K = R - 1, n = dep_.ranks, G = dep_.n_groups;
  const size_t L = dep_.link_cap.size();
  struct Piece {
    int32_t i, j, r, uplink, phase;
    int64_t x;
  };
  std::vector<Piece> pieces;
  std::vector<int64_t> pushed(size_t(K) * L, 0), free(L, 0);
  double own = 0;
  std::vector<int64_t> ends(kPacedRoutes), share(kPacedRoutes);
  bool ok = true;
  const auto piece = [&](int32_t i, int32_t j, int32_t r, int64_t x) {
    int writes = 0;
    int32_t uplink = -1, phase = kFree;
    transfer_writes(dep_, i, j, size_t(r), [&](size_t l, int32_t c) {
      ++writes;
      uplink = int32_t(l);
      phase = ((c - dep_.link_root_complex[l]) % R + R) % R;
    });
    if (writes > 1 || (writes && phase == kOwn)) {
      ok = false;
      return;
    }
    int64_t* load = phase == kFree ? free.data() : pushed.data() + size_t(phase - 1) * L;
    if (dep_.route_via[size_t(r)]) load[size_t(dep_.endpoint_up[size_t(i)])] += x;
    for (int64_t e = dep_.route_link_ptr[r]; e < dep_.route_link_ptr[r + 1]; ++e) load[size_t(dep_.route_links[e])] += x;
    if (dep_.route_via[size_t(r)]) load[size_t(dep_.endpoint_down[size_t(j)])] += x;
    own = std::max(own, double(phase == kFree ? x : K * x) / (dep_.route_rate[size_t(r)] * 1e9));
    pieces.push_back({i, j, r, uplink, phase, x});
  };
  for (int32_t i = 0; i < n && ok; ++i)
    for (int32_t j = 0; j < n && ok; ++j) {
      const int64_t volume = demand[int64_t(i) * n + j];
      if (volume == 0) continue;
      const auto pair = size_t(int64_t(dep_.group_of[i]) * G + dep_.group_of[j]);
      const int64_t count = split.count[pair];
      const int32_t* routes = split.route.data() + pair * kPacedRoutes;
      if (count == 0) return false;  // no route the rotation may take
      if (count == 1) {
        piece(i, j, routes[0], volume);
        continue;
      }
      double cum = 0;  // split.py _pieces(proportional=True): _segment of the pair's own bounds
      int64_t run = std::numeric_limits<int64_t>::min();
      for (int64_t k = 0; k < count; ++k) {
        cum += split.frac[pair * kPacedRoutes + size_t(k)];
        const int64_t end = k + 1 == count ? volume : int64_t(std::floor(double(volume) * cum));
        run = std::max(run, end);
        ends[size_t(k)] = std::min(run, volume);
      }
      segment(ends.data(), count, 0, volume, share.data());
      for (int64_t k = 0; k < count && ok; ++k)
        if (share[size_t(k)]) piece(i, j, routes[k], share[size_t(k)]);
    }
  if (!ok) return false;
  // some uplink writes toward two root complexes (else it would be paced)
  std::vector<uint64_t> seen(L, 0);
  bool rotates = false;
  for (const Piece& q : pieces)
    if (q.uplink >= 0) {
      seen[size_t(q.uplink)] |= uint64_t(1) << q.phase;
      rotates = rotates || two_or_more(seen[size_t(q.uplink)]);
    }
  if (!rotates) return false;
  double link_time = 0;
  for (int32_t k = 0; k < K; ++k)
    for (size_t l = 0; l < L; ++l)
      if (dep_.link_cap[l] > 0)
        link_time = std::max(link_time, double(K * pushed[size_t(k) * L + l] + free[l]) / dep_.link_cap[l]);
  const double h = std::max(link_time, own) * (1 + 1e-6);
  std::vector<int32_t> order(pieces.size());
  for (size_t t = 0; t < order.size(); ++t) order[t] = int32_t(t);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t x, int32_t y) { return pieces[size_t(x)].phase < pieces[size_t(y)].phase; });
  std::vector<std::vector<int32_t>> members(L * size_t(R));  // new indices per uplink and phase
  out = ChoiceSchedule{};
  out.with_links = with_links;
  out.plan = "rot-paced";
  out.reserve(pieces.size(), pieces.size() * max_path_links_);
  for (size_t k = 0; k < order.size(); ++k) {
    const Piece& q = pieces[size_t(order[k])];
    const double path_rate = dep_.route_rate[size_t(q.r)];
    const int64_t speed = q.phase == kFree ? 1 : K;
    out.add(q.i, q.j, q.r, q.x, h > 0 ? std::min(path_rate, double(speed * q.x) / (h * 1e9)) : path_rate, dep_);
    if (q.phase == kFree) continue;
    const size_t u = size_t(q.uplink) * size_t(R);
    for (int32_t before = q.phase - 1; before > 0; --before)
      if (!members[u + size_t(before)].empty()) {
        for (int32_t w : members[u + size_t(before)]) {
          out.after_step.push_back(0);
          out.after_index.push_back(w);
        }
        out.after_ptr.back() = int64_t(out.after_step.size());
        break;
      }
    members[u + size_t(q.phase)].push_back(int32_t(k));
  }
  out.step_ptr.push_back(int64_t(out.transfers()));
  out.step_overhead.push_back(-1.0);
  out.step_chain.push_back(1);
  out.horizon_s = h;
  return true;
}

bool ChoiceCore::rot_paced(const int64_t* demand, const DemandCells& cells, const Aggregate& paced_agg,
                           const std::vector<double>& paced_frac, double floor_s, int iterations,
                           ChoiceSchedule& out, std::vector<double>* route_frac) const {
  // model_aware.py rot_paced: split.py rot_paced_online with phase_start's start
  Phased ph;
  if (!phase_aggregate(cells, paced_agg, ph)) return false;
  const Aggregate& agg = ph.agg;
  SplitStart start{std::vector<double>(agg.col_pair.size()), uniform_weight(agg)};
  std::vector<double> total(agg.volume.size(), 0.0);
  for (size_t c = 0; c < start.frac.size(); ++c) {
    start.frac[c] = std::max(paced_frac[size_t(ph.source[c])], 0.0) + kPhaseStartFloor;
    total[size_t(agg.col_pair[c])] += start.frac[c];
  }
  for (size_t c = 0; c < start.frac.size(); ++c) start.frac[c] /= total[size_t(agg.col_pair[c])];
  const Split found = solve(agg, {}, &start, floor_s, iterations);
  if (route_frac) *route_frac = route_table(agg, found.frac);
  return expand_rotated(demand, rotation_split(ph, found.frac), out);
}

// ----- the analytic predictor (predict.py) ----------------------------------------------------

double ChoiceCore::trigger_factor(const NetParams& net) const {
  if (!net.trigger || dep_.root_complexes < 2) return 0.0;
  return net.trigger_factor > 0 ? net.trigger_factor : dep_.trigger_factor;
}

double ChoiceCore::delivered(const NetParams& net, size_t l, double flows, double cap_sum, double p2p,
                             uint64_t targets, double factor) const {
  // sim/fluid.py delivered_capacity, for link l: a root link takes the η of each rule that applies
  // (root_dma's while it carries staged flows, root_p2p's while it carries peer-to-peer ones)
  const double cap = dep_.link_cap[l];
  const int cls = dep_.link_class[l];
  const double k = std::nearbyint(flows);
  double eta = 1.0;
  bool strict = false;
  if (cls == kRootP2P) {
    const double p = std::nearbyint(p2p);
    const bool carries_p2p = p > 0, carries_staged = k - p > 0;
    eta = std::min(carries_staged ? net.efficiency(kRootDma, k) : 1.0, carries_p2p ? net.efficiency(kRootP2P, k) : 1.0);
    strict = (carries_p2p && !net.paced_lossless[kRootP2P]) || (carries_staged && !net.paced_lossless[kRootDma]);
  } else if (cls >= 0) {
    eta = net.efficiency(cls, k);
    strict = !net.paced_lossless[cls];
  }
  const bool over = cap_sum > cap * (1 + kRel) || (strict && k >= 2);
  const double out = over ? cap * eta : cap;
  return factor > 0 && two_or_more(targets) ? std::min(out, cap * factor) : out;  // the posted-write trigger
}

std::vector<std::vector<double>> ChoiceCore::data_times(const ChoiceSchedule& s, const NetParams& net) const {
  // per link of the step's barrier transfers: count, bytes, summed caps, peer-to-peer count
  const size_t n_links = dep_.link_cap.size();
  std::vector<double> flows(n_links, 0.0), load(n_links, 0.0), cap_sum(n_links, 0.0), p2p(n_links, 0.0);
  std::vector<double> bound(n_links, 0.0);
  std::vector<uint64_t> targets(n_links, 0);
  const double factor = trigger_factor(net);
  std::vector<int32_t> touched;
  std::vector<std::vector<double>> out;
  for (size_t st = 0; st + 1 < s.step_ptr.size(); ++st) {
    const int64_t lo = s.step_ptr[st], hi = s.step_ptr[st + 1];
    std::vector<double> own(size_t(hi - lo));
    touched.clear();
    for (int64_t t = lo; t < hi; ++t) {
      const double cap = s.rate[t] * 1e9;
      own[size_t(t - lo)] = s.bytes[t] > 0 ? double(s.bytes[t]) / cap : 0.0;
      if (s.after_ptr[t + 1] > s.after_ptr[t]) continue;
      for (int64_t e = s.link_ptr[t]; e < s.link_ptr[t + 1]; ++e) {
        const auto l = size_t(s.links[e]);
        if (flows[l] == 0) touched.push_back(int32_t(l));
        flows[l] += 1;
        load[l] += double(s.bytes[t]);
        cap_sum[l] += cap;
        p2p[l] += s.staged[t] ? 0.0 : 1.0;
      }
      if (factor > 0)
        path_writes(dep_, s.links.data() + s.link_ptr[t], size_t(s.link_ptr[t + 1] - s.link_ptr[t]), s.staged[t],
                    [&](size_t l, int32_t c) { targets[l] |= uint64_t(1) << c; });
    }
    for (int32_t li : touched) {
      const auto l = size_t(li);
      const double cap = dep_.link_cap[l];
      const double deliv = delivered(net, l, flows[l], cap_sum[l], p2p[l], targets[l], factor);
      const bool over = deliv < cap * (1 - 1e-12) || (cap_sum[l] > cap * (1 + 1e-9) && flows[l] >= 2);
      bound[l] = over ? load[l] / std::max(deliv, 1e-30) : 0.0;
    }
    if (!touched.empty()) {
      for (int64_t t = lo; t < hi; ++t) {
        if (s.after_ptr[t + 1] > s.after_ptr[t]) continue;
        for (int64_t e = s.link_ptr[t]; e < s.link_ptr[t + 1]; ++e)
          own[size_t(t - lo)] = std::max(own[size_t(t - lo)], bound[size_t(s.links[e])]);
      }
    }
    for (int32_t li : touched) {
      flows[size_t(li)] = load[size_t(li)] = cap_sum[size_t(li)] = p2p[size_t(li)] = 0.0;
      targets[size_t(li)] = 0;
    }
    out.push_back(std::move(own));
  }
  return out;
}

namespace {

// One flow moving on a link, as predict.py's on_link entries: (end, cap B/s, staged, B/s, the
// root complex it pushes writes toward on the link or -1).
struct Moving {
  double end, cap;
  bool staged;
  double speed;
  int32_t target;
};

// predict.py _share: the rate a transfer gets on link l beside the flows moving there from t,
// whether the link's rule charges by flow count, and what it delivers. caps is scratch.
struct Share {
  double rate;
  bool strict;
  double deliver;
};

// target: the root complex the transfer pushes writes toward on the link (-1: none); factor:
// ChoiceCore::trigger_factor (0: no trigger)
Share share(const ChoiceDeployment& dep, const NetParams& net, double own, bool staged, int32_t target, int32_t lid,
            const std::vector<Moving>& moving, double t, std::vector<double>& caps, double factor) {
  const double cap = dep.link_cap[size_t(lid)];
  caps.clear();
  caps.push_back(own);
  bool any_p2p = !staged, any_dma = staged;
  uint64_t targets = target >= 0 ? uint64_t(1) << target : 0;
  for (const Moving& x : moving) {
    if (!(x.end > t)) continue;
    caps.push_back(x.cap);
    any_p2p = any_p2p || !x.staged;
    any_dma = any_dma || x.staged;
    if (x.target >= 0) targets |= uint64_t(1) << x.target;
  }
  const auto k = int(caps.size());
  if (k == 1) return {own, false, cap};
  const int cls = dep.link_class[size_t(lid)];
  bool strict = false;
  double eta = 1.0;
  if (cls == kRootP2P) {
    eta = std::min(any_dma ? net.efficiency(kRootDma, k) : 1.0, any_p2p ? net.efficiency(kRootP2P, k) : 1.0);
    strict = (any_p2p && !net.paced_lossless[kRootP2P]) || (any_dma && !net.paced_lossless[kRootDma]);
  } else if (cls >= 0) {
    eta = net.efficiency(cls, k);
    strict = !net.paced_lossless[cls];
  }
  const bool triggered = factor > 0 && two_or_more(targets);
  std::sort(caps.begin(), caps.end());
  double sum = 0;
  for (double c : caps) sum += c;
  const bool over = sum > cap * (1 + 1e-9) || strict;
  if (!over && !triggered) return {own, false, cap};
  const double deliver = triggered ? std::min(over ? cap * eta : cap, cap * factor) : cap * eta;
  strict = strict || triggered;
  double left = deliver;
  for (int idx = 0; idx < k; ++idx) {  // progressive filling of the caps
    if (caps[size_t(idx)] * (k - idx) > left) return {std::min(own, left / (k - idx)), strict, deliver};
    left -= caps[size_t(idx)];
  }
  return {own, strict, deliver};
}

}  // namespace

bool ChoiceCore::tally(const ChoiceSchedule& s, Tally& out) const {
  if (s.step_ptr.size() != 2 || s.transfers() == 0 || !s.after_step.empty()) return false;
  out = Tally(dep_.link_cap.size());
  out.overhead = s.step_overhead[0];
  for (size_t t = 0; t < s.transfers(); ++t)
    out.add_links(&s.links[size_t(s.link_ptr[t])], size_t(s.link_ptr[t + 1] - s.link_ptr[t]), s.bytes[t], s.rate[t],
                  s.staged[t], dep_);
  return true;
}

double ChoiceCore::predict_tally(const Tally& t, const NetParams& net) const {
  const double overhead = t.overhead < 0 ? net.barrier_s : t.overhead;
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  if (!(t.own_nic > kNone || t.own_pcie > kNone)) return 0.0;  // no transfer: the plan has no step
  double end = std::max(t.own_nic + net.latency_net_s, t.own_pcie + net.latency_pcie_s);
  const double factor = trigger_factor(net);
  for (size_t l = 0; l < t.link.size(); ++l) {
    const LinkSums& k = t.link[l];
    if (k.flows <= 0) continue;
    const double cap = dep_.link_cap[l];
    const double deliv = delivered(net, l, k.flows, k.cap_sum, k.p2p, k.targets, factor);
    if (!(deliv < cap * (1 - 1e-12) || (k.cap_sum > cap * (1 + 1e-9) && k.flows >= 2))) continue;
    const double latency = std::max(k.kinds & 1 ? net.latency_net_s : kNone, k.kinds & 2 ? net.latency_pcie_s : kNone);
    end = std::max(end, k.load / std::max(deliv, 1e-30) + latency);
  }
  return overhead + net.issue_s + end;
}

double ChoiceCore::predict(const ChoiceSchedule& s, const NetParams& net) const {
  const size_t n_steps = s.step_ptr.size() - 1;
  if (n_steps == 0) return 0.0;
  if (Tally one_step; tally(s, one_step)) return predict_tally(one_step, net);
  const std::vector<std::vector<double>> duration = data_times(s, net);
  const size_t n_flows = s.transfers();
  std::vector<int32_t> flow_step(n_flows);
  std::vector<double> latency(n_flows);
  for (size_t st = 0; st < n_steps; ++st)
    for (int64_t t = s.step_ptr[st]; t < s.step_ptr[st + 1]; ++t) {
      flow_step[size_t(t)] = int32_t(st);
      bool nic = false;
      for (int64_t e = s.link_ptr[t]; e < s.link_ptr[t + 1]; ++e) nic = nic || dep_.link_nic[size_t(s.links[e])];
      latency[size_t(t)] = nic ? net.latency_net_s : net.latency_pcie_s;
    }
  std::vector<int32_t> waiting(n_steps, 0);
  for (size_t st = 1; st < n_steps; ++st) waiting[st] = s.step_chain[st] ? 1 : 0;
  std::vector<double> overhead(n_steps);
  for (size_t st = 0; st < n_steps; ++st) overhead[st] = s.step_overhead[st] < 0 ? net.barrier_s : s.step_overhead[st];
  std::vector<int64_t> sig_ptr(n_flows + 1, 0);
  std::vector<int64_t> signal_wait(n_flows, 0);
  for (size_t f = 0; f < n_flows; ++f) {
    signal_wait[f] = s.after_ptr[f + 1] - s.after_ptr[f];
    for (int64_t a = s.after_ptr[f]; a < s.after_ptr[f + 1]; ++a)
      ++sig_ptr[size_t(s.step_ptr[size_t(s.after_step[a])] + s.after_index[a]) + 1];
  }
  for (size_t f = 0; f < n_flows; ++f) sig_ptr[f + 1] += sig_ptr[f];
  std::vector<int64_t> sig_dep(static_cast<size_t>(sig_ptr[n_flows]));
  std::vector<int64_t> fill(sig_ptr.begin(), sig_ptr.end() - 1);
  for (size_t f = 0; f < n_flows; ++f)
    for (int64_t a = s.after_ptr[f]; a < s.after_ptr[f + 1]; ++a) {
      const auto g = size_t(s.step_ptr[size_t(s.after_step[a])] + s.after_index[a]);
      sig_dep[size_t(fill[g]++)] = int64_t(f);
    }
  std::vector<double> signal_ready(n_flows, 0.0), step_end(n_steps, 0.0), post_free(size_t(dep_.ranks), 0.0);
  std::vector<uint8_t> started(n_flows, 0);
  std::vector<int64_t> left(n_steps);
  for (size_t st = 0; st < n_steps; ++st) left[st] = s.step_ptr[st + 1] - s.step_ptr[st];
  using Event = std::tuple<double, int, int64_t>;  // (time, kind, id): 0 step, 1 ready, 2 end
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  for (size_t st = 0; st < n_steps; ++st)
    if (waiting[st] == 0) events.emplace(overhead[st], 0, int64_t(st));
  // the flows moving on each link, kept only when a transfer waits for signals (predict.py)
  bool track = false;
  for (size_t f = 0; f < n_flows && !track; ++f) track = s.after_ptr[f + 1] > s.after_ptr[f];
  std::vector<std::vector<Moving>> on_link(track ? dep_.link_cap.size() : 0);
  std::vector<double> ends, caps;
  // where the trigger may fire: per tracked flow, the (link, root complex) of its pushed writes
  const double factor = trigger_factor(net);
  std::vector<int64_t> write_ptr(track && factor > 0 ? n_flows + 1 : 0, 0);
  std::vector<std::pair<int32_t, int32_t>> write_of;
  for (size_t f = 0; f + 1 < write_ptr.size(); ++f) {
    path_writes(dep_, s.links.data() + s.link_ptr[f], size_t(s.link_ptr[f + 1] - s.link_ptr[f]), s.staged[f],
                [&](size_t l, int32_t c) { write_of.emplace_back(int32_t(l), c); });
    write_ptr[f + 1] = int64_t(write_of.size());
  }
  const auto target_on = [&](size_t f, int32_t lid) {
    for (int64_t k = write_ptr.empty() ? 0 : write_ptr[f]; !write_ptr.empty() && k < write_ptr[f + 1]; ++k)
      if (write_of[size_t(k)].first == lid) return write_of[size_t(k)].second;
    return int32_t(-1);
  };

  auto shared_time = [&](size_t f, double start) {  // predict.py _shared_time
    const double own = s.rate[f] * 1e9;
    const bool staged = s.staged[f];
    bool any = false;
    for (int64_t e = s.link_ptr[f]; e < s.link_ptr[f + 1]; ++e) {
      auto& v = on_link[size_t(s.links[e])];
      v.erase(std::remove_if(v.begin(), v.end(), [&](const Moving& x) { return !(x.end > start); }), v.end());
      any = any || !v.empty();
    }
    if (!any || s.bytes[f] <= 0) return s.bytes[f] > 0 ? double(s.bytes[f]) / own : 0.0;
    double work = 0;
    ends.clear();
    for (int64_t e = s.link_ptr[f]; e < s.link_ptr[f + 1]; ++e) {
      const auto& v = on_link[size_t(s.links[e])];
      if (v.empty()) continue;
      const Share sh = share(dep_, net, own, staged, target_on(f, s.links[e]), s.links[e], v, start, caps, factor);
      if (sh.strict && sh.rate < own) {
        double left_bytes = double(s.bytes[f]);
        for (const Moving& x : v) left_bytes += x.speed * (x.end - start);
        work = std::max(work, left_bytes / sh.deliver);
      }
      for (const Moving& x : v) ends.push_back(x.end);
    }
    std::sort(ends.begin(), ends.end());
    ends.erase(std::unique(ends.begin(), ends.end()), ends.end());
    double t = start, rest = double(s.bytes[f]);
    for (double until : ends) {
      double rate = own;
      for (int64_t e = s.link_ptr[f]; e < s.link_ptr[f + 1]; ++e) {
        const auto& v = on_link[size_t(s.links[e])];
        if (!v.empty())
          rate = std::min(rate,
                          share(dep_, net, own, staged, target_on(f, s.links[e]), s.links[e], v, t, caps, factor).rate);
      }
      if (rest <= rate * (until - t)) return std::max(t + rest / rate - start, work);
      rest -= rate * (until - t);
      t = until;
    }
    return std::max(t + rest / own - start, work);
  };

  auto finish_step = [&](size_t st, double when) {
    step_end[st] = when;
    if (st + 1 < n_steps && s.step_chain[st + 1] && --waiting[st + 1] == 0)
      events.emplace(when + overhead[st + 1], 0, int64_t(st + 1));
  };
  auto ended = [&](size_t st, double when) {
    step_end[st] = std::max(step_end[st], when);
    if (--left[st] == 0) finish_step(st, step_end[st]);
  };
  auto post = [&](int32_t src, double t, const int64_t* flows, size_t count) {
    const double begin = net.serial_issue ? std::max(t, post_free[size_t(src)]) : t;
    post_free[size_t(src)] = begin + net.issue_s;
    const double start = post_free[size_t(src)];
    for (size_t k = 0; k < count; ++k) {
      const auto f = size_t(flows[k]);
      const size_t st = size_t(flow_step[f]);
      double data = duration[st][f - size_t(s.step_ptr[st])];
      if (s.after_ptr[f + 1] > s.after_ptr[f]) data = std::max(data, shared_time(f, start));
      const double end = start + data;
      const double speed = data > 0 ? double(s.bytes[f]) / data : 0.0;
      if (track)
        for (int64_t e = s.link_ptr[f]; e < s.link_ptr[f + 1]; ++e)
          on_link[size_t(s.links[e])].push_back(
              Moving{end, s.rate[f] * 1e9, bool(s.staged[f]), speed, target_on(f, s.links[e])});
      if (sig_ptr[f + 1] > sig_ptr[f])
        events.emplace(end + latency[f], 2, int64_t(f));
      else  // no transfer waits for it: it ends without an event
        ended(st, end + latency[f]);
    }
  };


  std::vector<std::pair<int32_t, int64_t>> groups;
  std::vector<int64_t> batch;
  while (!events.empty()) {
    const auto [t, kind, ident] = events.top();
    events.pop();
    if (kind == 0) {
      const auto st = size_t(ident);
      if (s.step_ptr[st] == s.step_ptr[st + 1]) {
        finish_step(st, t);
        continue;
      }
      groups.clear();
      for (int64_t f = s.step_ptr[st]; f < s.step_ptr[st + 1]; ++f) {
        started[size_t(f)] = 1;
        if (s.after_ptr[f + 1] > s.after_ptr[f]) {
          if (signal_wait[size_t(f)] == 0) events.emplace(std::max(t, signal_ready[size_t(f)]), 1, f);
        } else {
          groups.emplace_back(s.src[f], f);
        }
      }
      std::stable_sort(groups.begin(), groups.end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      for (size_t k = 0; k < groups.size();) {
        size_t e = k;
        batch.clear();
        while (e < groups.size() && groups[e].first == groups[k].first) batch.push_back(groups[e++].second);
        post(groups[k].first, t, batch.data(), batch.size());
        k = e;
      }
    } else if (kind == 1) {
      post(s.src[ident], t, &ident, 1);
    } else {
      const auto f = size_t(ident);
      for (int64_t k = sig_ptr[f]; k < sig_ptr[f + 1]; ++k) {
        const auto g = size_t(sig_dep[size_t(k)]);
        --signal_wait[g];
        signal_ready[g] = std::max(signal_ready[g], t + net.signal_s);
        if (signal_wait[g] == 0 && started[g]) events.emplace(signal_ready[g], 1, int64_t(g));
      }
      ended(size_t(flow_step[f]), t);
    }
  }
  return *std::max_element(step_end.begin(), step_end.end());
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

// split.py _units: split_work_s's units per mirror prox iteration, and beside them (the cold
// start's check, about two iterations, and every rank pair's pieces)
double iteration_units(const Aggregate& agg) { return double(agg.col_links.size() + agg.cap.size()); }
double fixed_units(const Aggregate& agg, const DemandCells& cells) {
  return 2 * iteration_units(agg) + double(cells.nonzero);
}

}  // namespace

int ChoiceCore::split_iterations(const Aggregate& agg, const DemandCells& cells, double slack_s) const {
  const double left = slack_s / kSplitSPerUnit - fixed_units(agg, cells);
  if (!(left > 0)) return -1;
  return int(std::floor(std::min<double>(kSplitIterations, left / iteration_units(agg))));
}

double ChoiceCore::algorithm2_work_s(const DemandCells& cells) const {
  std::vector<int64_t> out, in;  // each rank's peers, sent to and received from
  rank_totals(cells.out_count, cells.in_count, dep_.ranks, dep_.n_groups, out, in);
  const int64_t activations = std::max(*std::max_element(out.begin(), out.end()), *std::max_element(in.begin(), in.end()));
  const double per_activation =
      kAlgorithm2SPerRank * double(dep_.ranks) + kAlgorithm2SPerScoredCell * double(dep_.algorithm2_cells);
  return double(activations) * per_activation;
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
  // then the extra candidates (model_aware.py build_candidates)
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
    // its rotation, where a model has the posted-write trigger and the paced plan would set it off
    bool trigger = false;
    for (const NetParams& net : models) trigger = trigger || trigger_factor(net) > 0;
    Candidate c{"rot-paced"};
    if (trigger &&
        rot_paced(demand, demand_cells, agg, found.frac, found.bound_s, iterations, c.schedule, &rotation_frac)) {
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
    size_t gap_model = 0;  // hybrid.py gap_network: the largest o + L + σ, the first such
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
