#include "planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <tuple>

namespace variopath {

namespace {

constexpr int64_t kForbidden = -(int64_t(1) << 40);
constexpr double kCreditScale = 1e6;
constexpr int64_t kMinScore = std::numeric_limits<int64_t>::min();

struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return ((next() >> 32) * n) >> 32; }
  void permutation(int32_t n, std::vector<int32_t>& out) {
    out.resize(n);
    std::iota(out.begin(), out.end(), 0);
    for (int32_t k = n - 1; k > 0; --k) std::swap(out[k], out[static_cast<int32_t>(below(k + 1))]);
  }
};

int64_t credit_units(double credit_gbs) { return static_cast<int64_t>(std::floor(credit_gbs * kCreditScale)); }

// Lexicographically smallest max-weight assignment of rows (<= cols) to distinct columns.
//
// The problem is squared with zero-weight dummy rows and solved by the Hungarian algorithm
// (Kuhn-Munkres with shortest augmenting paths and potentials, as Jonker and Volgenant; O(n^3)).
// By LP duality every optimal assignment uses only edges that are tight under the optimal
// potentials, and every perfect matching of tight edges is optimal; so the lexicographically
// smallest optimum is built row by row on the tight graph: each real row takes the smallest tight
// column that still leaves a perfect matching of the rest, checked by one alternating-path search
// from the matching in hand. The same answer as the reference's scipy + row fixing
// (planner/determinism.py), by definition. Weights stay within +-2^50 (the planner's credits and
// its -2^40 forbidden pairs do), so potentials and path lengths never overflow.
class Assignment {
 public:
  void solve(const int64_t* w, int32_t rows, int32_t cols, int32_t* out) {
    w_ = w;
    rows_ = rows;
    n_ = cols;
    hungarian();
    lexicographic(out);
  }

 private:
  static constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

  int64_t cost(int32_t r, int32_t c) const { return r < rows_ ? -w_[size_t(r) * n_ + c] : 0; }
  bool tight(int32_t r, int32_t c) const { return cost(r, c) - u_[r + 1] - v_[c + 1] == 0; }

  // Hungarian algorithm, 1-indexed with a virtual column 0: p_[j] is the row (1-based) of column j.
  void hungarian() {
    const int32_t n = n_;
    u_.assign(n + 1, 0);
    v_.assign(n + 1, 0);
    p_.assign(n + 1, 0);
    way_.assign(n + 1, 0);
    for (int32_t i = 1; i <= n; ++i) {
      p_[0] = i;
      int32_t j0 = 0;
      minv_.assign(n + 1, kInf);
      used_.assign(n + 1, 0);
      do {
        used_[j0] = 1;
        const int32_t i0 = p_[j0];
        int64_t delta = kInf;
        int32_t j1 = 0;
        for (int32_t j = 1; j <= n; ++j) {
          if (used_[j]) continue;
          const int64_t cur = cost(i0 - 1, j - 1) - u_[i0] - v_[j];
          if (cur < minv_[j]) {
            minv_[j] = cur;
            way_[j] = j0;
          }
          if (minv_[j] < delta) {
            delta = minv_[j];
            j1 = j;
          }
        }
        for (int32_t j = 0; j <= n; ++j) {
          if (used_[j]) {
            u_[p_[j]] += delta;
            v_[j] -= delta;
          } else {
            minv_[j] -= delta;
          }
        }
        j0 = j1;
      } while (p_[j0] != 0);
      do {
        const int32_t j1 = way_[j0];
        p_[j0] = p_[j1];
        j0 = j1;
      } while (j0);
    }
    row_of_.assign(n, 0);
    col_of_.assign(n, 0);
    for (int32_t j = 1; j <= n; ++j) {
      row_of_[j - 1] = p_[j] - 1;
      col_of_[p_[j] - 1] = j - 1;
    }
  }

  void lexicographic(int32_t* out) {
    fixed_.assign(n_, 0);
    for (int32_t r = 0; r < rows_; ++r) {
      for (int32_t c = 0; c < n_; ++c) {
        if (fixed_[c] || !tight(r, c)) continue;
        if (col_of_[r] == c) break;
        // r takes c: c's row must move, and r's column frees up for the search to end on
        freed_ = col_of_[r];
        taken_ = c;
        seen_.assign(n_, 0);
        if (reroute(row_of_[c])) {
          col_of_[r] = c;
          row_of_[c] = r;
          break;
        }
      }
      fixed_[col_of_[r]] = 1;
      out[r] = col_of_[r];
    }
  }

  // Alternating path on tight edges from row x to the freed column (Kuhn's augmenting step),
  // avoiding fixed columns and the column being taken; applies the path when it finds one.
  bool reroute(int32_t x) {
    for (int32_t c = 0; c < n_; ++c) {
      if (fixed_[c] || c == taken_ || seen_[c] || !tight(x, c)) continue;
      seen_[c] = 1;
      if (c == freed_ || reroute(row_of_[c])) {
        col_of_[x] = c;
        row_of_[c] = x;
        return true;
      }
    }
    return false;
  }

  const int64_t* w_ = nullptr;
  int32_t rows_ = 0, n_ = 0, freed_ = 0, taken_ = 0;
  std::vector<int64_t> u_, v_, minv_;
  std::vector<int32_t> p_, way_, row_of_, col_of_;
  std::vector<char> used_, fixed_, seen_;
};

}  // namespace

std::vector<int32_t> canonical_assignment(const std::vector<int64_t>& weights, int32_t rows, int32_t cols) {
  if (rows < 0 || cols < rows || weights.size() != size_t(rows) * size_t(cols))
    throw std::invalid_argument("canonical_assignment: need rows <= cols and rows * cols weights");
  for (const int64_t x : weights)  // the solver's sums stay far below int64's range
    if (x < -(int64_t(1) << 50) || x > (int64_t(1) << 50))
      throw std::invalid_argument("canonical_assignment: weights must lie within +-2^50");
  Assignment solver;
  std::vector<int32_t> out(rows);
  solver.solve(weights.data(), rows, cols, out.data());
  return out;
}

PlannerCore::PlannerCore(const CatalogFile& catalog, DeploymentView deployment) : dep_(std::move(deployment)) {
  const auto header = catalog.at("header").as<int64_t>();
  factored_ = header.at(0) == 1;
  free_group_ = static_cast<int32_t>(header.at(1));
  link_offset_ = header.at(2);
  inst_src_ = catalog.at("inst_src").as<int32_t>();
  inst_dst_ = catalog.at("inst_dst").as<int32_t>();
  inst_rate_ = catalog.at("inst_rate").as<double>();
  route_inst_ptr_ = catalog.at("route_inst_ptr").as<int64_t>();
  route_link_ptr_ = catalog.at("route_link_ptr").as<int64_t>();
  route_links_ = catalog.at("route_links").as<int32_t>();
  route_via_ = catalog.at("route_via").as<uint8_t>();
  shapes_ = catalog.at("shapes").as<int16_t>();
  const auto& shape_arr = catalog.at("shapes");
  num_shapes_ = static_cast<int64_t>(shape_arr.shape.at(0));
  cat_groups_ = static_cast<int32_t>(shape_arr.shape.at(1));
  const size_t cells = size_t(cat_groups_) * cat_groups_;
  shape_nz_ptr_.push_back(0);
  for (int64_t sidx = 0; sidx < num_shapes_; ++sidx) {
    for (size_t c = 0; c < cells; ++c)
      if (shapes_[sidx * cells + c]) {
        shape_nz_cell_.push_back(static_cast<int32_t>(c));
        shape_nz_count_.push_back(shapes_[sidx * cells + c]);
      }
    shape_nz_ptr_.push_back(static_cast<int64_t>(shape_nz_cell_.size()));
  }
  fam_ptr_ = catalog.at("fam_ptr").as<int64_t>();
  fam_inst_ = catalog.at("fam_inst").as<int32_t>();
  fam_count_ = catalog.at("fam_count").as<int32_t>();
  const auto fam_shape = catalog.at("fam_shape").as<int32_t>();
  families_of_shape_.assign(num_shapes_, {});
  for (size_t f = 0; f < fam_shape.size(); ++f) families_of_shape_.at(fam_shape[f]).push_back(static_cast<int32_t>(f));
  const int32_t per_node = factored_ ? cat_groups_ - 1 : cat_groups_;
  if (per_node * (factored_ ? dep_.nodes : 1) != dep_.n_groups)
    throw CatalogError("catalog groups do not match the deployment's rank groups");
}

int64_t PlannerCore::global_link(int32_t local, int32_t node) const {
  if (local < link_offset_) return int64_t(node) * dep_.links_per_node + local;
  return int64_t(dep_.nodes) * dep_.links_per_node + int64_t(node) * dep_.net_links_per_node + (local - link_offset_);
}

void PlannerCore::flat_candidates(const std::vector<int64_t>& dhat, std::vector<std::vector<Lane>>& out) const {
  const size_t cells = size_t(cat_groups_) * cat_groups_;
  int64_t best = kMinScore;
  int64_t best_shape = 0;
  for (int64_t s = 0; s < num_shapes_; ++s) {
    int64_t score = 0;
    for (int64_t p = shape_nz_ptr_[s]; p < shape_nz_ptr_[s + 1]; ++p) score += dhat[shape_nz_cell_[p]] * shape_nz_count_[p];
    if (score > best) {
      best = score;
      best_shape = s;
    }
  }
  out.clear();
  for (int32_t f : families_of_shape_[best_shape]) {
    std::vector<Lane> lanes;
    for (int64_t p = fam_ptr_[f]; p < fam_ptr_[f + 1]; ++p) {
      const int32_t inst = fam_inst_[p];
      for (int32_t c = 0; c < fam_count_[p]; ++c)
        lanes.push_back({inst_src_[inst], inst_dst_[inst], inst_rate_[inst], 0, 0, inst, 0, 0});
    }
    out.push_back(std::move(lanes));
  }
}

void PlannerCore::factored_candidates(const std::vector<int64_t>& dhat, std::vector<std::vector<Lane>>& out,
                                      int32_t max_candidates) const {
  const int32_t gl = cat_groups_ - 1, nodes = dep_.nodes, G = dep_.n_groups, g = dep_.group_size;
  const int32_t pw = gl + 1;  // pattern width
  std::vector<int64_t> price_out(G, 0), price_in(G, 0);
  for (int32_t a = 0; a < G; ++a)
    for (int32_t d = 0; d < G; ++d) {
      const int64_t v = (a / gl != d / gl) ? dhat[size_t(a) * G + d] : 0;
      price_out[a] = std::max(price_out[a], v);
      price_in[d] = std::max(price_in[d], v);
    }
  // per node: scores of every pattern and the chosen one
  std::vector<std::vector<int64_t>> scores(nodes, std::vector<int64_t>(num_shapes_));
  std::vector<int64_t> choice(nodes);
  std::vector<int64_t> w(size_t(pw) * pw);
  for (int32_t k = 0; k < nodes; ++k) {
    std::fill(w.begin(), w.end(), 0);
    for (int32_t a = 0; a < gl; ++a) {
      for (int32_t d = 0; d < gl; ++d) w[size_t(a) * pw + d] = 2 * dhat[size_t(k * gl + a) * G + (k * gl + d)];
      w[size_t(a) * pw + gl] = price_out[k * gl + a];
      w[size_t(gl) * pw + a] = price_in[k * gl + a];
    }
    int64_t best = kMinScore;
    for (int64_t s = 0; s < num_shapes_; ++s) {
      int64_t score = 0;
      for (int64_t p = shape_nz_ptr_[s]; p < shape_nz_ptr_[s + 1]; ++p) score += w[shape_nz_cell_[p]] * shape_nz_count_[p];
      scores[k][s] = score;
      if (score > best) {
        best = score;
        choice[k] = s;
      }
    }
  }
  auto pat = [&](int64_t s, int32_t r, int32_t c) { return int64_t(shapes_[size_t(s) * pw * pw + size_t(r) * pw + c]); };
  std::vector<int64_t> limit_out(size_t(nodes) * gl, g), limit_in(size_t(nodes) * gl, g);
  std::vector<int64_t> outs(G), ins(G), left_out(G), left_in(G);
  std::vector<std::tuple<int32_t, int32_t, int64_t>> pairs;
  std::vector<std::tuple<int64_t, int32_t, int32_t>> cand;
  for (int64_t iter = 0; iter < int64_t(nodes) * gl * g + 1; ++iter) {
    for (int32_t k = 0; k < nodes; ++k)
      for (int32_t a = 0; a < gl; ++a) {
        outs[k * gl + a] = pat(choice[k], a, gl);
        ins[k * gl + a] = pat(choice[k], gl, a);
      }
    left_out = outs;
    left_in = ins;
    cand.clear();
    for (int32_t a = 0; a < G; ++a) {
      if (!left_out[a]) continue;
      for (int32_t d = 0; d < G; ++d)
        if (left_in[d] && a / gl != d / gl) cand.emplace_back(-dhat[size_t(a) * G + d], a, d);
    }
    std::sort(cand.begin(), cand.end());
    pairs.clear();
    for (const auto& [neg, a, d] : cand) {
      const int64_t m = std::min(left_out[a], left_in[d]);
      if (m) {
        pairs.emplace_back(a, d, m);
        left_out[a] -= m;
        left_in[d] -= m;
      }
    }
    bool leftover = false;
    for (int32_t a = 0; a < G; ++a) leftover = leftover || left_out[a] || left_in[a];
    if (!leftover) break;
    for (int32_t k = 0; k < nodes; ++k) {
      bool mine = false;
      for (int32_t a = 0; a < gl; ++a) mine = mine || left_out[k * gl + a] || left_in[k * gl + a];
      if (!mine) continue;
      for (int32_t a = 0; a < gl; ++a) {
        limit_out[k * gl + a] = std::min(limit_out[k * gl + a], outs[k * gl + a] - left_out[k * gl + a]);
        limit_in[k * gl + a] = std::min(limit_in[k * gl + a], ins[k * gl + a] - left_in[k * gl + a]);
      }
      int64_t best = kMinScore, best_s = 0;
      for (int64_t s = 0; s < num_shapes_; ++s) {
        bool ok = true;
        for (int32_t a = 0; a < gl && ok; ++a)
          ok = pat(s, a, gl) <= limit_out[k * gl + a] && pat(s, gl, a) <= limit_in[k * gl + a];
        const int64_t sc = ok ? scores[k][s] : kMinScore;
        if (sc > best) {
          best = sc;
          best_s = s;
        }
      }
      choice[k] = best_s;
    }
  }
  size_t count = 0;
  for (int32_t k = 0; k < nodes; ++k) count = std::max(count, families_of_shape_[choice[k]].size());
  count = std::min<size_t>(count, max_candidates);
  out.clear();
  std::vector<std::vector<std::pair<double, int32_t>>> out_halves(G), in_halves(G);
  for (size_t c = 0; c < count; ++c) {
    std::vector<Lane> lanes;
    for (auto& v : out_halves) v.clear();
    for (auto& v : in_halves) v.clear();
    for (int32_t k = 0; k < nodes; ++k) {
      const auto& fams = families_of_shape_[choice[k]];
      const int32_t f = fams[c % fams.size()];
      for (int64_t p = fam_ptr_[f]; p < fam_ptr_[f + 1]; ++p) {
        const int32_t inst = fam_inst_[p];
        for (int32_t n = 0; n < fam_count_[p]; ++n) {
          if (inst_dst_[inst] == gl)
            out_halves[k * gl + inst_src_[inst]].emplace_back(-inst_rate_[inst], inst);
          else if (inst_src_[inst] == gl)
            in_halves[k * gl + inst_dst_[inst]].emplace_back(-inst_rate_[inst], inst);
          else
            lanes.push_back({k * gl + inst_src_[inst], k * gl + inst_dst_[inst], inst_rate_[inst], 1, k, inst, 0, 0});
        }
      }
    }
    for (auto& v : out_halves) std::sort(v.begin(), v.end());
    for (auto& v : in_halves) std::sort(v.begin(), v.end());
    std::vector<size_t> next_out(G, 0), next_in(G, 0);
    for (const auto& [a, d, m] : pairs) {
      for (int64_t n = 0; n < m; ++n) {
        const auto& [ro, oi] = out_halves[a][next_out[a]++];
        const auto& [ri, ii] = in_halves[d][next_in[d]++];
        lanes.push_back({a, d, std::min(-ro, -ri), 2, a / gl, oi, d / gl, ii});
      }
    }
    out.push_back(std::move(lanes));
  }
}

void PlannerCore::route_options(const Lane& lane, Options& out) const {
  auto append = [&](int64_t r, int32_t node, bool translate) {
    for (int64_t p = route_link_ptr_[r]; p < route_link_ptr_[r + 1]; ++p)
      out.links.push_back(translate ? static_cast<int32_t>(global_link(route_links_[p], node)) : route_links_[p]);
  };
  auto close = [&](uint8_t via) {
    out.ptr.push_back(static_cast<int64_t>(out.links.size()));
    out.via.push_back(via);
  };
  if (lane.kind == 3) {  // fallback: the nearest route of the group pair
    const size_t cell = size_t(lane.src_group) * dep_.n_groups + lane.dst_group;
    out.links.insert(out.links.end(), dep_.near_links.begin() + dep_.near_ptr[cell],
                     dep_.near_links.begin() + dep_.near_ptr[cell + 1]);
    close(dep_.near_via[cell]);
    return;
  }
  if (lane.kind == 0 || lane.kind == 1) {
    for (int64_t r = route_inst_ptr_[lane.inst]; r < route_inst_ptr_[lane.inst + 1]; ++r) {
      append(r, lane.node, lane.kind == 1);
      close(route_via_[r]);
    }
    return;
  }
  for (int64_t ro = route_inst_ptr_[lane.inst]; ro < route_inst_ptr_[lane.inst + 1]; ++ro)
    for (int64_t ri = route_inst_ptr_[lane.inst2]; ri < route_inst_ptr_[lane.inst2 + 1]; ++ri) {
      append(ro, lane.node, true);
      append(ri, lane.node2, true);
      close(1);
    }
}

PlanResult PlannerCore::plan(const int64_t* demand, const PlanParams& params) const {
  const int32_t N = dep_.ranks, G = dep_.n_groups;
  PlanResult res;
  std::vector<int64_t> rem(demand, demand + size_t(N) * N);
  // τ from the target round count (paper §5 "Global execution granularity")
  double t_est = 0.0;
  for (int32_t i = 0; i < N; ++i) {
    int64_t row = 0, col = 0;
    for (int32_t j = 0; j < N; ++j) {
      row += rem[size_t(i) * N + j];
      col += rem[size_t(j) * N + i];
    }
    t_est = std::max({t_est, double(row) / (dep_.endpoint_up_gbs[i] * 1e9), double(col) / (dep_.endpoint_down_gbs[i] * 1e9)});
  }
  int64_t k = params.k_target ? params.k_target : N;
  if (params.auto_granularity && params.lambda_s > 0)
    k = std::min<int64_t>(k, std::max<int64_t>(1, static_cast<int64_t>(t_est / (10 * params.lambda_s))));
  const double tau = t_est > 0 ? t_est / double(k) : 1.0;
  res.tau_s = tau;
  res.k = k;
  SplitMix64 rng(params.seed);

  std::vector<int64_t> dhat(size_t(G) * G);
  std::vector<std::vector<Lane>> candidates;
  Assignment assignment;
  std::vector<int64_t> w;
  std::vector<int32_t> perm, cols;
  std::vector<int32_t> src, dst, best_src, best_dst, cand_src, cand_dst;
  std::vector<int64_t> vol, best_vol;
  std::vector<std::vector<int32_t>> out_lanes(G), in_lanes(G);
  const int32_t g = dep_.group_size;
  auto group_rank = [&](int32_t grp, int32_t idx) { return dep_.group_ranks[size_t(grp) * g + idx]; };
  auto credit = [&](const Lane& lane, int32_t i, int32_t j) -> int64_t {
    if (i == j) return kForbidden;
    return credit_units(std::min(double(rem[size_t(i) * N + j]) / (tau * 1e9), lane.rate));
  };
  auto evaluate = [&](const std::vector<Lane>& lanes, const std::vector<int32_t>& s, const std::vector<int32_t>& d,
                      std::vector<int64_t>& x) {
    x.assign(lanes.size(), 0);
    double slowest = 0.0;
    int64_t total = 0;
    for (size_t l = 0; l < lanes.size(); ++l) {
      const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(std::floor(tau * lanes[l].rate * 1e9)));
      x[l] = std::min(cap, rem[size_t(s[l]) * N + d[l]]);
      if (x[l]) slowest = std::max(slowest, double(x[l]) / (lanes[l].rate * 1e9));
      total += x[l];
    }
    return total ? double(total) / (params.lambda_s + slowest) : 0.0;
  };

  Options opts;
  std::vector<size_t> live, pick, next;
  std::vector<int32_t> stamp;  // per link id: the activation generation that uses it
  int32_t stamp_generation = 0;
  while (std::any_of(rem.begin(), rem.end(), [](int64_t v) { return v != 0; })) {
    std::fill(dhat.begin(), dhat.end(), 0);
    for (int32_t i = 0; i < N; ++i)
      for (int32_t j = 0; j < N; ++j)
        dhat[size_t(dep_.group_of[i]) * G + dep_.group_of[j]] += rem[size_t(i) * N + j];
    if (factored_)
      factored_candidates(dhat, candidates, params.max_candidates);
    else
      flat_candidates(dhat, candidates);
    double best_u = -1.0;
    const std::vector<Lane>* best_lanes = nullptr;
    for (const auto& lanes : candidates) {
      ++res.candidates;
      const size_t L = lanes.size();
      for (auto& v : out_lanes) v.clear();
      for (auto& v : in_lanes) v.clear();
      for (size_t l = 0; l < L; ++l) {
        out_lanes[lanes[l].src_group].push_back(static_cast<int32_t>(l));
        in_lanes[lanes[l].dst_group].push_back(static_cast<int32_t>(l));
      }
      // multi-start Alternating Algorithm
      bool have = false;
      int64_t best_f = 0;
      for (int32_t start = 0; start < params.starts; ++start) {
        src.assign(L, 0);
        dst.assign(L, 0);
        for (int32_t d = 0; d < G; ++d) {
          const auto& ks = in_lanes[d];
          if (ks.empty()) continue;
          if (start == 0) {  // optimistic start: each lane's best credit over any of its sources
            w.resize(ks.size() * g);
            for (size_t r = 0; r < ks.size(); ++r)
              for (int32_t c = 0; c < g; ++c) {
                int64_t best = std::numeric_limits<int64_t>::min();
                for (int32_t m = 0; m < g; ++m)
                  best = std::max(best, credit(lanes[ks[r]], group_rank(lanes[ks[r]].src_group, m), group_rank(d, c)));
                w[r * g + c] = best;
              }
            perm.resize(ks.size());
            assignment.solve(w.data(), static_cast<int32_t>(ks.size()), g, perm.data());
          } else {
            rng.permutation(static_cast<int32_t>(ks.size()), perm);
          }
          for (size_t n = 0; n < ks.size(); ++n) dst[ks[n]] = group_rank(d, perm[n]);
        }
        bool scored = false;
        int64_t score = 0;
        for (int32_t sweep = 0; sweep < params.sweeps; ++sweep) {
          for (int32_t a = 0; a < G; ++a) {
            const auto& ks = out_lanes[a];
            if (ks.empty()) continue;
            w.resize(ks.size() * g);
            for (size_t r = 0; r < ks.size(); ++r)
              for (int32_t c = 0; c < g; ++c) w[r * g + c] = credit(lanes[ks[r]], group_rank(a, c), dst[ks[r]]);
            cols.resize(ks.size());
            assignment.solve(w.data(), static_cast<int32_t>(ks.size()), g, cols.data());
            for (size_t r = 0; r < ks.size(); ++r) src[ks[r]] = group_rank(a, cols[r]);
          }
          for (int32_t d = 0; d < G; ++d) {
            const auto& ks = in_lanes[d];
            if (ks.empty()) continue;
            w.resize(ks.size() * g);
            for (size_t r = 0; r < ks.size(); ++r)
              for (int32_t c = 0; c < g; ++c) w[r * g + c] = credit(lanes[ks[r]], src[ks[r]], group_rank(d, c));
            cols.resize(ks.size());
            assignment.solve(w.data(), static_cast<int32_t>(ks.size()), g, cols.data());
            for (size_t r = 0; r < ks.size(); ++r) dst[ks[r]] = group_rank(d, cols[r]);
          }
          int64_t f = 0;
          for (size_t l = 0; l < L; ++l) f += credit(lanes[l], src[l], dst[l]);
          if (scored && f <= score) break;
          score = f;
          scored = true;
        }
        if (!have || score > best_f) {
          have = true;
          best_f = score;
          cand_src = src;
          cand_dst = dst;
        }
      }
      const double u = evaluate(lanes, cand_src, cand_dst, vol);
      if (best_lanes == nullptr || u > best_u) {
        best_u = u;
        best_lanes = &lanes;
        best_src = cand_src;
        best_dst = cand_dst;
        best_vol = vol;
      }
    }
    std::vector<Lane> single;
    if (best_lanes == nullptr || best_u <= 0) {
      ++res.fallbacks;
      const auto top = std::max_element(rem.begin(), rem.end()) - rem.begin();
      const int32_t i = static_cast<int32_t>(top / N), j = static_cast<int32_t>(top % N);
      const int32_t a = dep_.group_of[i], d = dep_.group_of[j];
      single.push_back({a, d, dep_.near_rate[size_t(a) * G + d], 3, 0, 0, 0, 0});
      best_src = {i};
      best_dst = {j};
      evaluate(single, best_src, best_dst, best_vol);
      best_lanes = &single;
    }
    // the activation: concrete routes with disjoint links for every lane that moves bytes,
    // the first option in order with backtracking (as the reference), in reused flat buffers
    const auto& lanes = *best_lanes;
    live.clear();
    for (size_t l = 0; l < lanes.size(); ++l)
      if (best_vol[l]) live.push_back(l);
    opts.clear();
    for (size_t n = 0; n < live.size(); ++n) {
      opts.lane_first.push_back(opts.via.size());
      route_options(lanes[live[n]], opts);
    }
    opts.lane_first.push_back(opts.via.size());
    ++stamp_generation;
    auto mark = [&](size_t o, int32_t value) {
      for (int64_t p = opts.ptr[o]; p < opts.ptr[o + 1]; ++p) {
        const int32_t lid = opts.links[p];
        if (static_cast<size_t>(lid) >= stamp.size()) stamp.resize(lid + 1, 0);
        stamp[lid] = value;
      }
    };
    auto free_of_conflicts = [&](size_t o) {
      for (int64_t p = opts.ptr[o]; p < opts.ptr[o + 1]; ++p) {
        const int32_t lid = opts.links[p];
        if (static_cast<size_t>(lid) < stamp.size() && stamp[lid] == stamp_generation) return false;
      }
      return true;
    };
    pick.assign(live.size(), 0);
    next.assign(live.size() + 1, 0);
    size_t depth = 0;
    while (depth < live.size()) {
      bool placed = false;
      for (size_t o = opts.lane_first[depth] + next[depth]; o < opts.lane_first[depth + 1]; ++o) {
        if (!free_of_conflicts(o)) continue;
        pick[depth] = o;
        next[depth] = o - opts.lane_first[depth] + 1;
        mark(o, stamp_generation);
        placed = true;
        break;
      }
      if (placed) {
        ++depth;
        if (depth < live.size()) next[depth] = 0;
        continue;
      }
      if (depth == 0) throw CatalogError("no disjoint concrete routes for a catalog family: the catalog is inconsistent");
      --depth;
      mark(pick[depth], 0);
    }
    for (size_t n = 0; n < live.size(); ++n) {
      const size_t l = live[n];
      const int32_t i = best_src[l], j = best_dst[l];
      res.src.push_back(i);
      res.dst.push_back(j);
      res.bytes.push_back(best_vol[l]);
      res.rate.push_back(lanes[l].rate);
      res.lane_kind.push_back(lanes[l].kind == 2 ? -1 : lanes[l].kind == 3 ? -2 : lanes[l].inst);
      const size_t o = pick[n];
      if (opts.via[o]) res.links.push_back(dep_.endpoint_up[i]);
      res.links.insert(res.links.end(), opts.links.begin() + opts.ptr[o], opts.links.begin() + opts.ptr[o + 1]);
      if (opts.via[o]) res.links.push_back(dep_.endpoint_down[j]);
      res.link_ptr.push_back(static_cast<int64_t>(res.links.size()));
      rem[size_t(i) * N + j] -= best_vol[l];
    }
    res.step_ptr.push_back(static_cast<int64_t>(res.src.size()));
  }
  return res;
}

}  // namespace variopath
