// rot-paced (docs/planner.md, research/trigger-prototype.md): the paced split over (link, phase)
// resources, each root complex writing to one other per phase, and its expansion into phases
// run in order on every uplink.
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

bool ChoiceCore::phase_aggregate(const DemandCells& cells, const Aggregate& paced, Phased& out) const {
  // phase_aggregate: the paced split over (link, phase) resources; a route of phase k
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
  // expand_rotated: every rank pair cut by the fractions themselves; the horizon T from
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
      double cum = 0;  // _pieces(proportional=True): _segment of the pair's own bounds
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

bool ChoiceCore::rot_paced(const int64_t* demand, const Phased& ph, const std::vector<double>& paced_frac,
                           double floor_s, int iterations, ChoiceSchedule& out,
                           std::vector<double>* route_frac) const {
  // the phase split started from the paced split's fractions
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

}  // namespace variopath
