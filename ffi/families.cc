// The families built from the demand alone or from Algorithm 2's plan (choice.h): barrier and
// signal-driven activations, the concurrent families (concurrent, multipath, staged,
// staged-balanced) and their tallies, summed from the demand's per-rank, per-group cells.
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

// ----- candidates ------------------------------------------------------------

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

}  // namespace variopath
