// The paced split online (docs/planner.md "The paced split"): the min-max-load problem over each
// group pair's candidate routes by mirror prox, certified by lower bounds, started from the
// deployment's reference split, and expanded into every rank pair's pieces.
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

// ----- the paced split -------------------------------------------------------------

Aggregate ChoiceCore::aggregate(const DemandCells& cells) const {
  const int32_t n = dep_.ranks, G = dep_.n_groups;
  std::vector<int64_t> grouped(size_t(G) * G, 0);  // whole bytes: exact in any order
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

// used_links: the links some column crosses, in order
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
  double loaded = 0;  // the last grad_weight's max_time
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
  std::vector<int64_t> uniform(size_t(n) * n, 0);  // uniform_demand
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

}  // namespace variopath
