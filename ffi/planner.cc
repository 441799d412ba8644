#include "planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <tuple>

namespace variopath {

namespace {

constexpr int64_t kForbidden = -(int64_t(1) << 40);
constexpr double kCreditScale = 1e6;
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

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

// floor() of a non-negative double, as a truncating cast (credits and capacities are >= 0).
int64_t floor_nonneg(double x) { return static_cast<int64_t>(x); }

int64_t credit_units(double credit_gbs) { return floor_nonneg(credit_gbs * kCreditScale); }

// Lexicographically smallest max-weight assignment of rows (<= cols) to distinct columns.
//
// Small problems (at most 4 columns, the group sizes of every preset) enumerate the injective
// maps in lexicographic order and keep the first strictly better one, which is the
// lexicographically smallest optimum by definition. Larger ones are squared with zero-weight
// dummy rows and solved by the Hungarian algorithm (Kuhn-Munkres with shortest augmenting paths
// and potentials, as Jonker and Volgenant; O(n^3)). By LP duality every optimal assignment uses
// only edges that are tight under the optimal potentials, and every perfect matching of tight
// edges is optimal; so the lexicographically smallest optimum is built row by row on the tight
// graph: each real row takes the smallest tight column that still leaves a perfect matching of
// the rest, checked by one alternating-path search from the matching in hand. Either way the
// same answer as the reference's scipy + row fixing (planner/determinism.py). Weights stay
// within +-2^50 (the planner's credits and its -2^40 forbidden pairs do), so potentials and path
// lengths never overflow.
class Assignment {
 public:
  void solve(const int64_t* w, int32_t rows, int32_t cols, int32_t* out) {
    w_ = w;
    rows_ = rows;
    n_ = cols;
    if (rows == 0) return;
    if (cols <= 4) {
      enumerate(out);
      return;
    }
    hungarian();
    lexicographic(out);
  }

 private:
  static constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

  void enumerate(int32_t* out) {
    have_ = false;
    out_ = out;
    visit(0, 0, 0);
  }

  // depth-first over the injective maps, in lexicographic order of the column vector
  void visit(int32_t r, int64_t total, uint32_t used) {
    if (r == rows_) {
      if (!have_ || total > best_) {
        have_ = true;
        best_ = total;
        std::copy(cur_, cur_ + rows_, out_);
      }
      return;
    }
    for (int32_t c = 0; c < n_; ++c) {
      if (used & (1u << c)) continue;
      cur_[r] = c;
      visit(r + 1, total + w_[size_t(r) * n_ + c], used | (1u << c));
    }
  }

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
  bool have_ = false;
  int64_t best_ = 0;
  int32_t cur_[4] = {};
  int32_t* out_ = nullptr;
  std::vector<int64_t> u_, v_, minv_;
  std::vector<int32_t> p_, way_, row_of_, col_of_;
  std::vector<char> used_, fixed_, seen_;
};

[[noreturn]] void corrupt(const std::string& what) { throw CatalogError("corrupt catalog: " + what); }

// ptr is a CSR pointer array over `items` entries: items + 1 long, from 0, non-decreasing, to total.
template <typename T>
void check_csr(const std::vector<T>& ptr, size_t items, size_t total, const char* name) {
  if (ptr.size() != items + 1 || ptr.front() != 0 || size_t(ptr.back()) != total)
    corrupt(std::string(name) + " does not index its array");
  for (size_t k = 0; k < items; ++k)
    if (ptr[k] > ptr[k + 1]) corrupt(std::string(name) + " decreases");
}

template <typename T>
void check_range(const std::vector<T>& v, int64_t lo, int64_t hi, const char* name) {
  for (const T x : v)
    if (int64_t(x) < lo || int64_t(x) >= hi)
      corrupt(std::string(name) + " holds " + std::to_string(int64_t(x)) + ", outside [" + std::to_string(lo) +
              ", " + std::to_string(hi) + ")");
}

void need(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

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

// ----- the typed boundary ---------------------------------------------------------------------

void Deployment::check() const {
  const size_t n = size_t(std::max(ranks, 0)), G = size_t(std::max(n_groups, 0));
  need(ranks > 0, "deployment.ranks must be > 0, got " + std::to_string(ranks));
  need(n_groups > 0 && group_size > 0, "deployment.n_groups and group_size must be > 0");
  need(group_ranks.size() == G * size_t(group_size),
       "deployment.group_ranks has " + std::to_string(group_ranks.size()) + " entries, expected n_groups x group_size = " +
           std::to_string(G * size_t(group_size)));
  for (const auto* v : {&group_of, &endpoint_up, &endpoint_down})
    need(v->size() == n, "deployment's per-rank arrays (group_of, endpoint_up/down) need one entry per rank");
  need(endpoint_up_gbs.size() == n && endpoint_down_gbs.size() == n,
       "deployment.endpoint_up_gbs/endpoint_down_gbs need one entry per rank");
  for (const int32_t r : group_ranks) need(r >= 0 && size_t(r) < n, "deployment.group_ranks names a rank out of range");
  for (const int32_t a : group_of) need(a >= 0 && size_t(a) < G, "deployment.group_of names a group out of range");
  for (const double x : endpoint_up_gbs) need(x > 0, "deployment.endpoint_up_gbs must be > 0");
  for (const double x : endpoint_down_gbs) need(x > 0, "deployment.endpoint_down_gbs must be > 0");
  need(layout.nodes > 0 && layout.links_per_node >= 0 && layout.net_links_per_node >= 0,
       "deployment.layout needs nodes > 0 and non-negative link counts");
  const int64_t links = layout.total();
  for (const auto* v : {&endpoint_up, &endpoint_down, &near_links})
    for (const int32_t lid : *v)
      need(lid >= 0 && lid < links, "deployment names link " + std::to_string(lid) + ", outside the layout's " +
                                        std::to_string(links) + " links");
  need(near_ptr.size() == G * G + 1 && near_ptr.front() == 0 && size_t(near_ptr.back()) == near_links.size(),
       "deployment.near_ptr must index near_links for every ordered group pair");
  for (size_t c = 0; c < G * G; ++c) need(near_ptr[c] <= near_ptr[c + 1], "deployment.near_ptr decreases");
  need(near_rate.size() == G * G && near_via.size() == G * G,
       "deployment.near_rate/near_via need one entry per ordered group pair");
}

void PlanParams::check() const {
  need(std::isfinite(lambda_s) && lambda_s >= 0, "lambda_s must be finite and >= 0");
  need(k_target >= 0, "k_target must be >= 0 (0: one round per rank)");
  need(starts >= 1, "starts must be >= 1, got " + std::to_string(starts));
  need(sweeps >= 1, "sweeps must be >= 1, got " + std::to_string(sweeps));
  need(max_candidates >= 1, "max_candidates must be >= 1, got " + std::to_string(max_candidates));
  need(granularity == Granularity::kAuto || granularity == Granularity::kFixed, "unknown granularity");
  need(leaving_price == LeavingPrice::kMax || leaving_price == LeavingPrice::kSum, "unknown leaving_price");
}


// ----- shape selection ------------------------------------------------------------------------

namespace {

// scores[s] += w * column[s]: the hot loop of shape selection, compiled for AVX2 too.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void add_scaled(double* scores, const int16_t* column, double w, int64_t n) {
  for (int64_t s = 0; s < n; ++s) scores[s] += w * double(column[s]);
}

constexpr double kExactDouble = 9007199254740992.0;  // 2^53: doubles are exact integers below

}  // namespace

ShapeTable::ShapeTable(std::vector<int16_t> shapes, int64_t n, int32_t c, std::vector<int32_t> profile)
    : count(n), cells(c), dense(std::move(shapes)), profile_cells(std::move(profile)) {
  columns.resize(size_t(count) * cells);
  column_max.assign(cells, 0);
  for (int64_t s = 0; s < count; ++s)
    for (int32_t k = 0; k < cells; ++k) {
      const int16_t x = dense[size_t(s) * cells + k];
      columns[size_t(k) * count + s] = x;
      column_max[k] = std::max(column_max[k], x);
    }
}

// Scores are sums of non-negative integer products; while the largest possible one stays below
// 2^53 they are computed exactly in doubles, cell by cell over all shapes (vectorised); beyond
// that, or for negative weights, in int64 shape by shape. Either way the exact argmax.
int64_t ShapeTable::best(const int64_t* w, const int64_t* limits, std::vector<double>& scores) const {
  double bound = 0.0;
  bool exact = true;
  for (int32_t k = 0; k < cells; ++k) {
    exact = exact && w[k] >= 0;
    bound += double(w[k]) * column_max[k];
  }
  exact = exact && bound < kExactDouble / 2;
  auto fits = [&](int64_t s) {
    if (!limits) return true;
    for (const int32_t k : profile_cells)
      if (dense[size_t(s) * cells + k] > limits[k]) return false;
    return true;
  };
  int64_t best_shape = -1;
  if (exact) {  // in chunks of shapes whose scores stay in the L1 cache across the cells
    constexpr int64_t kChunk = 1024;
    scores.resize(kChunk);
    double best_score = 0.0;
    for (int64_t base = 0; base < count; base += kChunk) {
      const int64_t n = std::min(kChunk, count - base);
      std::fill_n(scores.begin(), n, 0.0);
      for (int32_t k = 0; k < cells; ++k)
        if (w[k] && column_max[k]) add_scaled(scores.data(), &columns[size_t(k) * count + base], double(w[k]), n);
      for (int64_t s = 0; s < n; ++s)
        if ((best_shape < 0 || scores[s] > best_score) && fits(base + s)) {
          best_score = scores[s];
          best_shape = base + s;
        }
    }
    return best_shape;
  }
  int64_t best_score = 0;
  for (int64_t s = 0; s < count; ++s) {
    if (!fits(s)) continue;
    int64_t score = 0;
    for (int32_t k = 0; k < cells; ++k) score += w[k] * dense[size_t(s) * cells + k];
    if (best_shape < 0 || score > best_score) {
      best_score = score;
      best_shape = s;
    }
  }
  return best_shape;
}

// ----- the planner ----------------------------------------------------------------------------

// Every buffer one plan() call needs, sized on first use and reused by every activation.
struct PlannerCore::Workspace {
  const PlanParams* params = nullptr;
  int32_t N = 0, G = 0, g = 0;
  double tau = 1.0;
  int64_t k = 0;
  SplitMix64 rng{0};
  // the residual and its aggregates (kept up to date by consume)
  std::vector<int64_t> rem, dhat;
  int64_t nonzero = 0;
  std::vector<int64_t> price_out, price_in;
  std::vector<char> stale_out, stale_in;
  // factored shape selection
  std::vector<int64_t> node_w, limits, choice, limit_out, limit_in, outs, ins, left_out, left_in;
  struct Key {
    int64_t neg;
    int32_t a, d;
    bool operator>(const Key& o) const { return std::tie(neg, a, d) > std::tie(o.neg, o.a, o.d); }
  };
  std::vector<Key> heap;
  std::vector<int32_t> open_in;
  std::vector<std::tuple<int32_t, int32_t, int64_t>> pairs;
  std::vector<std::vector<std::pair<double, int32_t>>> out_halves, in_halves;
  std::vector<size_t> next_out, next_in;
  std::vector<double> scores;  // one per shape
  std::vector<int64_t> last_w, last_choice;  // factored: each node's weights and pattern last time
  // candidates: spans into the catalog's flat lanes or into built
  std::vector<std::vector<Lane>> built;
  std::vector<std::pair<const Lane*, size_t>> cands;
  // endpoint binding
  std::vector<int32_t> out_ptr, out_ids, in_ptr, in_ids;
  std::vector<int32_t> src, dst, cand_src, cand_dst, best_src, best_dst, perm, cols;
  std::vector<int64_t> w, vol, best_vol;
  Assignment assignment;
  Lane single{};
  // the activation: the route options of each live lane in flat buffers
  std::vector<int64_t> opt_ptr;
  std::vector<int32_t> opt_links;
  std::vector<uint8_t> opt_via;
  std::vector<size_t> lane_first, live, pick, next;
  std::vector<int32_t> stamp;  // per link id: the activation generation that uses it
  int32_t generation = 0;
};

PlannerCore::PlannerCore(const CatalogFile& catalog, Deployment deployment) : dep_(std::move(deployment)) {
  try {
    dep_.check();
  } catch (const std::invalid_argument& err) {
    throw CatalogError(err.what());
  }
  const auto header = catalog.at("header").as<int64_t>();
  if (header.size() < 3) corrupt("header has " + std::to_string(header.size()) + " entries, expected 3");
  factored_ = header[0] == 1;
  if (factored_ && header[2] != dep_.layout.links_per_node)
    throw CatalogError("the catalog's node has " + std::to_string(header[2]) + " links but the deployment's has " +
                       std::to_string(dep_.layout.links_per_node));
  inst_src_ = catalog.at("inst_src").as<int32_t>();
  inst_dst_ = catalog.at("inst_dst").as<int32_t>();
  inst_rate_ = catalog.at("inst_rate").as<double>();
  route_inst_ptr_ = catalog.at("route_inst_ptr").as<int64_t>();
  route_link_ptr_ = catalog.at("route_link_ptr").as<int64_t>();
  route_links_ = catalog.at("route_links").as<int32_t>();
  route_via_ = catalog.at("route_via").as<uint8_t>();
  const auto& shape_arr = catalog.at("shapes");
  if (shape_arr.shape.size() != 3 || shape_arr.shape[1] != shape_arr.shape[2]) corrupt("shapes is not S x n x n");
  num_shapes_ = static_cast<int64_t>(shape_arr.shape[0]);
  cat_groups_ = static_cast<int32_t>(shape_arr.shape[1]);
  auto shapes = shape_arr.as<int16_t>();
  if (shapes.size() != size_t(num_shapes_) * cat_groups_ * cat_groups_) corrupt("shapes has the wrong size");
  std::vector<int32_t> profile;  // factored: the leaving column and the arriving row, which limits bound
  if (factored_)
    for (int32_t a = 0; a + 1 < cat_groups_; ++a) {
      profile.push_back(a * cat_groups_ + cat_groups_ - 1);
      profile.push_back((cat_groups_ - 1) * cat_groups_ + a);
    }
  table_ = ShapeTable(std::move(shapes), num_shapes_, cat_groups_ * cat_groups_, std::move(profile));
  fam_ptr_ = catalog.at("fam_ptr").as<int64_t>();
  fam_inst_ = catalog.at("fam_inst").as<int32_t>();
  fam_count_ = catalog.at("fam_count").as<int32_t>();
  fam_shape_ = catalog.at("fam_shape").as<int32_t>();
  check_catalog();
  const int32_t per_node = factored_ ? cat_groups_ - 1 : cat_groups_;
  if (per_node * (factored_ ? dep_.layout.nodes : 1) != dep_.n_groups)
    throw CatalogError("catalog groups do not match the deployment's rank groups");
  node_of_group_.resize(dep_.n_groups);
  for (int32_t a = 0; a < dep_.n_groups; ++a) node_of_group_[a] = factored_ ? a / per_node : 0;
  // the families of each shape, in catalog order (counting sort)
  fam_of_shape_ptr_.assign(num_shapes_ + 1, 0);
  for (const int32_t s : fam_shape_) ++fam_of_shape_ptr_[s + 1];
  std::partial_sum(fam_of_shape_ptr_.begin(), fam_of_shape_ptr_.end(), fam_of_shape_ptr_.begin());
  fam_of_shape_.resize(fam_shape_.size());
  std::vector<int64_t> at(fam_of_shape_ptr_.begin(), fam_of_shape_ptr_.end() - 1);
  for (size_t f = 0; f < fam_shape_.size(); ++f) fam_of_shape_[at[fam_shape_[f]]++] = static_cast<int32_t>(f);
  if (!factored_) {  // flat catalogs: every family's lanes, once
    flat_lane_ptr_.push_back(0);
    for (size_t f = 0; f + 1 < fam_ptr_.size(); ++f) {
      for (int64_t p = fam_ptr_[f]; p < fam_ptr_[f + 1]; ++p) {
        const int32_t inst = fam_inst_[p];
        for (int32_t c = 0; c < fam_count_[p]; ++c)
          flat_lanes_.push_back({inst_src_[inst], inst_dst_[inst], inst_rate_[inst], LaneKind::kFlat, 0, inst, 0, 0});
      }
      flat_lane_ptr_.push_back(static_cast<int64_t>(flat_lanes_.size()));
    }
  }
}

// Every index the planner follows stays inside its array, and every family realizes its shape.
void PlannerCore::check_catalog() const {
  const size_t n_inst = inst_src_.size(), n_routes = route_via_.size();
  if (inst_dst_.size() != n_inst || inst_rate_.size() != n_inst) corrupt("instance arrays differ in length");
  check_range(inst_src_, 0, cat_groups_, "inst_src");
  check_range(inst_dst_, 0, cat_groups_, "inst_dst");
  for (const double r : inst_rate_)
    if (!(r > 0) || !std::isfinite(r)) corrupt("an instance rate is not a positive number");
  check_csr(route_inst_ptr_, n_inst, n_routes, "route_inst_ptr");
  check_csr(route_link_ptr_, n_routes, route_links_.size(), "route_link_ptr");
  for (size_t i = 0; i < n_inst; ++i)
    if (route_inst_ptr_[i] == route_inst_ptr_[i + 1]) corrupt("instance " + std::to_string(i) + " has no route");
  const int64_t links = factored_ ? dep_.layout.links_per_node + dep_.layout.net_links_per_node : dep_.layout.total();
  check_range(route_links_, 0, links, "route_links");
  const size_t cells = size_t(cat_groups_) * cat_groups_;
  check_range(table_.dense, 0, std::numeric_limits<int16_t>::max(), "shapes");
  const size_t n_fam = fam_shape_.size();
  check_csr(fam_ptr_, n_fam, fam_inst_.size(), "fam_ptr");
  if (fam_count_.size() != fam_inst_.size()) corrupt("fam_count and fam_inst differ in length");
  check_range(fam_inst_, 0, int64_t(n_inst), "fam_inst");
  check_range(fam_count_, 1, std::numeric_limits<int32_t>::max(), "fam_count");
  check_range(fam_shape_, 0, num_shapes_, "fam_shape");
  std::vector<char> has_family(num_shapes_, 0);
  std::vector<int64_t> cell_count(cells);
  for (size_t f = 0; f < n_fam; ++f) {
    std::fill(cell_count.begin(), cell_count.end(), 0);
    for (int64_t p = fam_ptr_[f]; p < fam_ptr_[f + 1]; ++p)
      cell_count[size_t(inst_src_[fam_inst_[p]]) * cat_groups_ + inst_dst_[fam_inst_[p]]] += fam_count_[p];
    const int16_t* shape = &table_.dense[size_t(fam_shape_[f]) * cells];
    for (size_t c = 0; c < cells; ++c)
      if (cell_count[c] != shape[c]) corrupt("family " + std::to_string(f) + " does not realize its shape");
    has_family[fam_shape_[f]] = 1;
  }
  for (int64_t s = 0; s < num_shapes_; ++s)
    if (!has_family[s]) corrupt("shape " + std::to_string(s) + " has no family");
}

PlanResult PlannerCore::plan(const int64_t* demand, const PlanParams& params) const {
  params.check();
  Workspace ws;
  ws.params = &params;
  ws.N = dep_.ranks;
  ws.G = dep_.n_groups;
  ws.g = dep_.group_size;
  ws.rng = SplitMix64(params.seed);
  const size_t NN = size_t(ws.N) * ws.N;
  ws.rem.assign(demand, demand + NN);
  for (size_t c = 0; c < NN; ++c)
    if (ws.rem[c] < 0)
      throw std::invalid_argument("demand[" + std::to_string(c / ws.N) + "][" + std::to_string(c % ws.N) +
                                  "] is negative: " + std::to_string(ws.rem[c]));
  ws.stamp.assign(dep_.layout.total(), 0);
  PlanResult res;
  quantum(ws);
  res.tau_s = ws.tau;
  res.k = ws.k;
  aggregate(ws);
  while (ws.nonzero) {
    candidates(ws);
    double best_u = -1.0;
    const Lane* best = nullptr;
    for (const auto& [lanes, count] : ws.cands) {
      ++res.candidates;
      multistart_aa(lanes, count, ws);
      const double u = evaluate(lanes, count, ws.cand_src.data(), ws.cand_dst.data(), ws, ws.vol);
      if (best == nullptr || u > best_u) {
        best_u = u;
        best = lanes;
        ws.best_src = ws.cand_src;
        ws.best_dst = ws.cand_dst;
        ws.best_vol = ws.vol;
      }
    }
    if (best == nullptr || best_u <= 0) {
      // The binding found no lane with demand (a local optimum of the Alternating Algorithm):
      // serve the largest residual entry alone on its nearest path.
      ++res.fallbacks;
      single_lane(ws);
      best = &ws.single;
    }
    activation(best, ws, res);
  }
  return res;
}

// τ from the target round count (paper §5 "Global execution granularity").
void PlannerCore::quantum(Workspace& ws) const {
  const int32_t N = ws.N;
  double t_est = 0.0;
  for (int32_t i = 0; i < N; ++i) {
    int64_t row = 0, col = 0;
    for (int32_t j = 0; j < N; ++j) {
      row += ws.rem[size_t(i) * N + j];
      col += ws.rem[size_t(j) * N + i];
    }
    t_est = std::max({t_est, double(row) / (dep_.endpoint_up_gbs[i] * 1e9), double(col) / (dep_.endpoint_down_gbs[i] * 1e9)});
  }
  const PlanParams& p = *ws.params;
  int64_t k = p.k_target ? p.k_target : N;
  if (p.granularity == Granularity::kAuto && p.lambda_s > 0)
    k = std::min<int64_t>(k, std::max<int64_t>(1, static_cast<int64_t>(t_est / (10 * p.lambda_s))));
  ws.k = k;
  ws.tau = t_est > 0 ? t_est / double(k) : 1.0;
}

// D̂_ad = Σ_{i∈V_a, j∈V_d} D_rem[i, j] (Eq. 5), once; consume() keeps it (and the leaving
// prices) equal to the reference's recomputation after every lane.
void PlannerCore::aggregate(Workspace& ws) const {
  const int32_t N = ws.N, G = ws.G;
  ws.dhat.assign(size_t(G) * G, 0);
  ws.nonzero = 0;
  for (int32_t i = 0; i < N; ++i)
    for (int32_t j = 0; j < N; ++j) {
      const int64_t v = ws.rem[size_t(i) * N + j];
      ws.dhat[size_t(dep_.group_of[i]) * G + dep_.group_of[j]] += v;
      ws.nonzero += v != 0;
    }
  if (!factored_) return;
  ws.price_out.assign(G, 0);
  ws.price_in.assign(G, 0);
  ws.stale_out.assign(G, 1);
  ws.stale_in.assign(G, 1);
}

void PlannerCore::consume(Workspace& ws, int32_t i, int32_t j, int64_t x) const {
  int64_t& r = ws.rem[size_t(i) * ws.N + j];
  r -= x;
  ws.nonzero -= r == 0;
  const int32_t a = dep_.group_of[i], d = dep_.group_of[j];
  int64_t& v = ws.dhat[size_t(a) * ws.G + d];
  if (factored_ && node_of_group_[a] != node_of_group_[d]) {
    if (ws.params->leaving_price == LeavingPrice::kSum) {
      ws.price_out[a] -= x;
      ws.price_in[d] -= x;
    } else {  // a maximum can only fall if the entry that held it falls
      ws.stale_out[a] |= v == ws.price_out[a];
      ws.stale_in[d] |= v == ws.price_in[d];
    }
  }
  v -= x;
}

void PlannerCore::candidates(Workspace& ws) const {
  if (factored_)
    factored_candidates(ws);
  else
    flat_candidates(ws);
}

// The shape of highest pressure (Eq. 6) and its families, each one candidate.
void PlannerCore::flat_candidates(Workspace& ws) const {
  const int64_t shape = table_.best(ws.dhat.data(), nullptr, ws.scores);
  ws.cands.clear();
  for (int64_t p = fam_of_shape_ptr_[shape]; p < fam_of_shape_ptr_[shape + 1]; ++p) {
    const int32_t f = fam_of_shape_[p];
    ws.cands.emplace_back(flat_lanes_.data() + flat_lane_ptr_[f], size_t(flat_lane_ptr_[f + 1] - flat_lane_ptr_[f]));
  }
}

// Node-level shape selection and the aligned combinations of the chosen patterns' families.
void PlannerCore::factored_candidates(Workspace& ws) const {
  prices(ws);
  select_patterns(ws);
  size_t count = 0;
  for (const int64_t s : ws.choice) count = std::max<size_t>(count, fam_of_shape_ptr_[s + 1] - fam_of_shape_ptr_[s]);
  count = std::min<size_t>(count, ws.params->max_candidates);
  if (ws.built.size() < count) ws.built.resize(count);
  for (size_t c = 0; c < count; ++c) combine(ws, c, ws.built[c]);
  ws.cands.clear();
  for (size_t c = 0; c < count; ++c) ws.cands.emplace_back(ws.built[c].data(), ws.built[c].size());
}

// The price of a leaving (arriving) lane of group a: the largest, or the total, off-node
// pressure out of (into) a. Only rows and columns whose maximum may have fallen are rescanned.
void PlannerCore::prices(Workspace& ws) const {
  const int32_t G = ws.G;
  const bool sum = ws.params->leaving_price == LeavingPrice::kSum;
  // group a's off-node row (leaving: step 1) or column (arriving: step G) of D̂
  auto price = [&](int32_t a, const int64_t* first, size_t step) {
    int64_t p = 0;
    for (int32_t d = 0; d < G; ++d)
      if (node_of_group_[a] != node_of_group_[d]) p = sum ? p + first[d * step] : std::max(p, first[d * step]);
    return p;
  };
  for (int32_t a = 0; a < G; ++a) {
    if (ws.stale_out[a]) ws.price_out[a] = price(a, &ws.dhat[size_t(a) * G], 1);
    if (ws.stale_in[a]) ws.price_in[a] = price(a, &ws.dhat[a], size_t(G));
    ws.stale_out[a] = ws.stale_in[a] = 0;
  }
}

// Each node's best pattern under the prices; nodes whose leaving or arriving lanes find no
// partner across nodes re-select among patterns with no more of them, until all are matched.
void PlannerCore::select_patterns(Workspace& ws) const {
  const int32_t gl = cat_groups_ - 1, nodes = dep_.layout.nodes, G = ws.G;
  const int32_t pw = gl + 1;
  const size_t cells = size_t(pw) * pw;
  ws.node_w.assign(size_t(nodes) * cells, 0);
  ws.choice.resize(nodes);
  ws.last_w.resize(size_t(nodes) * cells, -1);
  ws.last_choice.resize(nodes, -1);
  for (int32_t k = 0; k < nodes; ++k) {
    int64_t* w = &ws.node_w[size_t(k) * cells];
    for (int32_t a = 0; a < gl; ++a) {
      for (int32_t d = 0; d < gl; ++d) w[size_t(a) * pw + d] = 2 * ws.dhat[size_t(k * gl + a) * G + (k * gl + d)];
      w[size_t(a) * pw + gl] = ws.price_out[k * gl + a];
      w[size_t(gl) * pw + a] = ws.price_in[k * gl + a];
    }
    int64_t* last = &ws.last_w[size_t(k) * cells];
    if (!std::equal(w, w + cells, last)) {  // a node whose pressures did not move keeps its pattern
      std::copy(w, w + cells, last);
      ws.last_choice[k] = table_.best(w, nullptr, ws.scores);
    }
    ws.choice[k] = ws.last_choice[k];
  }
  auto pat = [&](int64_t s, int32_t r, int32_t c) { return int64_t(table_.dense[size_t(s) * cells + size_t(r) * pw + c]); };
  ws.limit_out.assign(size_t(nodes) * gl, ws.g);
  ws.limit_in.assign(size_t(nodes) * gl, ws.g);
  ws.outs.resize(G);
  ws.ins.resize(G);
  ws.limits.assign(cells, kNoLimit);
  for (int64_t iter = 0; iter < int64_t(nodes) * gl * ws.g + 1; ++iter) {
    for (int32_t k = 0; k < nodes; ++k)
      for (int32_t a = 0; a < gl; ++a) {
        ws.outs[k * gl + a] = pat(ws.choice[k], a, gl);
        ws.ins[k * gl + a] = pat(ws.choice[k], gl, a);
      }
    match(ws);
    bool leftover = false;
    for (int32_t a = 0; a < G && !leftover; ++a) leftover = ws.left_out[a] || ws.left_in[a];
    if (!leftover) break;
    for (int32_t k = 0; k < nodes; ++k) {
      bool mine = false;
      for (int32_t a = 0; a < gl; ++a) mine = mine || ws.left_out[k * gl + a] || ws.left_in[k * gl + a];
      if (!mine) continue;
      for (int32_t a = 0; a < gl; ++a) {
        const size_t x = size_t(k) * gl + a;
        ws.limit_out[x] = std::min(ws.limit_out[x], ws.outs[x] - ws.left_out[x]);
        ws.limit_in[x] = std::min(ws.limit_in[x], ws.ins[x] - ws.left_in[x]);
        ws.limits[size_t(a) * pw + gl] = ws.limit_out[x];
        ws.limits[size_t(gl) * pw + a] = ws.limit_in[x];
      }
      const int64_t s = table_.best(&ws.node_w[size_t(k) * cells], ws.limits.data(), ws.scores);
      ws.choice[k] = s < 0 ? 0 : s;  // as the reference's argmax when nothing fits
    }
  }
}

// Greedy cross-node matching of leaving to arriving lanes by pressure: pairs (a, d, lanes) in
// order of decreasing D̂_ad (then a, then d), and the lanes left without a partner. The same
// order as the reference's sorted list, from a heap of rows, each under its best partner still
// open: a row's key only worsens as partners close, so a stale key is re-read when it surfaces.
void PlannerCore::match(Workspace& ws) const {
  const int32_t G = ws.G;
  ws.left_out = ws.outs;
  ws.left_in = ws.ins;
  ws.pairs.clear();
  ws.heap.clear();
  ws.open_in.clear();  // the groups with arriving lanes, ascending; closed ones are skipped
  for (int32_t d = 0; d < G; ++d)
    if (ws.left_in[d]) ws.open_in.push_back(d);
  auto partner = [&](int32_t a) {  // a's best open partner: the highest pressure, then the lowest d
    const int64_t* row = &ws.dhat[size_t(a) * G];
    const int32_t node = node_of_group_[a];
    Workspace::Key key{1, a, -1};
    for (const int32_t d : ws.open_in)
      if (node_of_group_[d] != node && (key.d < 0 || -row[d] < key.neg)) key = {-row[d], a, d};
    if (key.d >= 0) {
      ws.heap.push_back(key);
      std::push_heap(ws.heap.begin(), ws.heap.end(), std::greater<>());
    }
  };
  for (int32_t a = 0; a < G; ++a)
    if (ws.left_out[a]) partner(a);
  while (!ws.heap.empty()) {
    std::pop_heap(ws.heap.begin(), ws.heap.end(), std::greater<>());
    const auto [neg, a, d] = ws.heap.back();
    ws.heap.pop_back();
    if (!ws.left_in[d]) {  // the partner closed since: look again
      partner(a);
      continue;
    }
    const int64_t m = std::min(ws.left_out[a], ws.left_in[d]);
    ws.pairs.emplace_back(a, d, m);
    ws.left_out[a] -= m;
    ws.left_in[d] -= m;
    if (!ws.left_in[d]) ws.open_in.erase(std::find(ws.open_in.begin(), ws.open_in.end(), d));
    if (ws.left_out[a]) partner(a);
  }
}

// Candidate c: family c (cyclically) of every node's pattern; node-local lanes as they are,
// leaving and arriving halves joined along the matched pairs, fastest halves first.
void PlannerCore::combine(Workspace& ws, size_t c, std::vector<Lane>& lanes) const {
  const int32_t gl = cat_groups_ - 1, nodes = dep_.layout.nodes, G = ws.G;
  lanes.clear();
  ws.out_halves.resize(G);
  ws.in_halves.resize(G);
  for (auto& v : ws.out_halves) v.clear();
  for (auto& v : ws.in_halves) v.clear();
  for (int32_t k = 0; k < nodes; ++k) {
    const int64_t first = fam_of_shape_ptr_[ws.choice[k]];
    const int64_t n_fams = fam_of_shape_ptr_[ws.choice[k] + 1] - first;
    const int32_t f = fam_of_shape_[first + int64_t(c % n_fams)];
    for (int64_t p = fam_ptr_[f]; p < fam_ptr_[f + 1]; ++p) {
      const int32_t inst = fam_inst_[p];
      for (int32_t n = 0; n < fam_count_[p]; ++n) {
        if (inst_dst_[inst] == gl)
          ws.out_halves[k * gl + inst_src_[inst]].emplace_back(-inst_rate_[inst], inst);
        else if (inst_src_[inst] == gl)
          ws.in_halves[k * gl + inst_dst_[inst]].emplace_back(-inst_rate_[inst], inst);
        else
          lanes.push_back(
              {k * gl + inst_src_[inst], k * gl + inst_dst_[inst], inst_rate_[inst], LaneKind::kIntra, k, inst, 0, 0});
      }
    }
  }
  for (auto& v : ws.out_halves) std::sort(v.begin(), v.end());
  for (auto& v : ws.in_halves) std::sort(v.begin(), v.end());
  ws.next_out.assign(G, 0);
  ws.next_in.assign(G, 0);
  for (const auto& [a, d, m] : ws.pairs) {
    for (int64_t n = 0; n < m; ++n) {
      const auto& [ro, oi] = ws.out_halves[a][ws.next_out[a]++];
      const auto& [ri, ii] = ws.in_halves[d][ws.next_in[d]++];
      lanes.push_back({a, d, std::min(-ro, -ri), LaneKind::kNet, a / gl, oi, d / gl, ii});
    }
  }
}

// Endpoint binding by the multi-start Alternating Algorithm on the useful-rate credits
// h_ijr = min(D_ij/τ, bw(r)) (Eq. 7-8): the best start's binding in ws.cand_src / cand_dst.
int64_t PlannerCore::multistart_aa(const Lane* lanes, size_t L, Workspace& ws) const {
  const int32_t G = ws.G, g = ws.g, N = ws.N;
  const PlanParams& params = *ws.params;
  // the lanes leaving and entering each group, in lane order (CSR)
  ws.out_ptr.assign(G + 1, 0);
  ws.in_ptr.assign(G + 1, 0);
  for (size_t l = 0; l < L; ++l) {
    ++ws.out_ptr[lanes[l].src_group + 1];
    ++ws.in_ptr[lanes[l].dst_group + 1];
  }
  std::partial_sum(ws.out_ptr.begin(), ws.out_ptr.end(), ws.out_ptr.begin());
  std::partial_sum(ws.in_ptr.begin(), ws.in_ptr.end(), ws.in_ptr.begin());
  ws.out_ids.resize(L);
  ws.in_ids.resize(L);
  {
    ws.perm.assign(ws.out_ptr.begin(), ws.out_ptr.end() - 1);
    ws.cols.assign(ws.in_ptr.begin(), ws.in_ptr.end() - 1);
    for (size_t l = 0; l < L; ++l) {
      ws.out_ids[ws.perm[lanes[l].src_group]++] = static_cast<int32_t>(l);
      ws.in_ids[ws.cols[lanes[l].dst_group]++] = static_cast<int32_t>(l);
    }
  }
  auto group_rank = [&](int32_t grp, int32_t idx) { return dep_.group_ranks[size_t(grp) * g + idx]; };
  auto credit = [&](const Lane& lane, int32_t i, int32_t j) -> int64_t {
    if (i == j) return kForbidden;
    return credit_units(std::min(double(ws.rem[size_t(i) * N + j]) / (ws.tau * 1e9), lane.rate));
  };
  bool have = false;
  int64_t best_f = 0;
  for (int32_t start = 0; start < params.starts; ++start) {
    ws.src.assign(L, 0);
    ws.dst.assign(L, 0);
    for (int32_t d = 0; d < G; ++d) {
      const int32_t* ks = ws.in_ids.data() + ws.in_ptr[d];
      const int32_t rows = ws.in_ptr[d + 1] - ws.in_ptr[d];
      if (!rows) continue;
      if (start == 0) {  // optimistic start: each lane's best credit over any of its sources
        ws.w.resize(size_t(rows) * g);
        for (int32_t r = 0; r < rows; ++r)
          for (int32_t c = 0; c < g; ++c) {
            int64_t best = std::numeric_limits<int64_t>::min();
            for (int32_t m = 0; m < g; ++m)
              best = std::max(best, credit(lanes[ks[r]], group_rank(lanes[ks[r]].src_group, m), group_rank(d, c)));
            ws.w[size_t(r) * g + c] = best;
          }
        ws.perm.resize(rows);
        ws.assignment.solve(ws.w.data(), rows, g, ws.perm.data());
      } else {
        ws.rng.permutation(rows, ws.perm);
      }
      for (int32_t n = 0; n < rows; ++n) ws.dst[ks[n]] = group_rank(d, ws.perm[n]);
    }
    bool scored = false;
    int64_t score = 0;
    for (int32_t sweep = 0; sweep < params.sweeps; ++sweep) {
      for (int32_t a = 0; a < G; ++a) {
        const int32_t* ks = ws.out_ids.data() + ws.out_ptr[a];
        const int32_t rows = ws.out_ptr[a + 1] - ws.out_ptr[a];
        if (!rows) continue;
        ws.w.resize(size_t(rows) * g);
        for (int32_t r = 0; r < rows; ++r)
          for (int32_t c = 0; c < g; ++c) ws.w[size_t(r) * g + c] = credit(lanes[ks[r]], group_rank(a, c), ws.dst[ks[r]]);
        ws.cols.resize(rows);
        ws.assignment.solve(ws.w.data(), rows, g, ws.cols.data());
        for (int32_t r = 0; r < rows; ++r) ws.src[ks[r]] = group_rank(a, ws.cols[r]);
      }
      for (int32_t d = 0; d < G; ++d) {
        const int32_t* ks = ws.in_ids.data() + ws.in_ptr[d];
        const int32_t rows = ws.in_ptr[d + 1] - ws.in_ptr[d];
        if (!rows) continue;
        ws.w.resize(size_t(rows) * g);
        for (int32_t r = 0; r < rows; ++r)
          for (int32_t c = 0; c < g; ++c) ws.w[size_t(r) * g + c] = credit(lanes[ks[r]], ws.src[ks[r]], group_rank(d, c));
        ws.cols.resize(rows);
        ws.assignment.solve(ws.w.data(), rows, g, ws.cols.data());
        for (int32_t r = 0; r < rows; ++r) ws.dst[ks[r]] = group_rank(d, ws.cols[r]);
      }
      int64_t f = 0;
      for (size_t l = 0; l < L; ++l) f += credit(lanes[l], ws.src[l], ws.dst[l]);
      if (scored && f <= score) break;
      score = f;
      scored = true;
    }
    if (!have || score > best_f) {
      have = true;
      best_f = score;
      ws.cand_src = ws.src;
      ws.cand_dst = ws.dst;
    }
  }
  return best_f;
}

// x = min(τ·bw, D_rem) per lane (at least one byte of capacity); U = Σx / (λ + max x/bw) (Eq. 9-10).
double PlannerCore::evaluate(const Lane* lanes, size_t L, const int32_t* s, const int32_t* d, Workspace& ws,
                             std::vector<int64_t>& x) const {
  x.assign(L, 0);
  double slowest = 0.0;
  int64_t total = 0;
  for (size_t l = 0; l < L; ++l) {
    const int64_t cap = std::max<int64_t>(1, floor_nonneg(ws.tau * lanes[l].rate * 1e9));
    x[l] = std::min(cap, ws.rem[size_t(s[l]) * ws.N + d[l]]);
    if (x[l]) slowest = std::max(slowest, double(x[l]) / (lanes[l].rate * 1e9));
    total += x[l];
  }
  return total ? double(total) / (ws.params->lambda_s + slowest) : 0.0;
}

// A one-lane channel for the largest residual entry (first in row-major order).
void PlannerCore::single_lane(Workspace& ws) const {
  const int32_t N = ws.N, G = ws.G;
  const auto top = std::max_element(ws.rem.begin(), ws.rem.end()) - ws.rem.begin();
  const int32_t i = static_cast<int32_t>(top / N), j = static_cast<int32_t>(top % N);
  const int32_t a = dep_.group_of[i], d = dep_.group_of[j];
  ws.single = {a, d, dep_.near_rate[size_t(a) * G + d], LaneKind::kRoute, 0, 0, 0, 0};
  ws.best_src.assign(1, i);
  ws.best_dst.assign(1, j);
  evaluate(&ws.single, 1, ws.best_src.data(), ws.best_dst.data(), ws, ws.best_vol);
}

// The activation: concrete routes with disjoint links for every lane that moves bytes, appended
// to the result; the residual and its aggregates lose the lanes' bytes.
void PlannerCore::activation(const Lane* lanes, Workspace& ws, PlanResult& res) const {
  ws.live.clear();
  for (size_t l = 0; l < ws.best_vol.size(); ++l)
    if (ws.best_vol[l]) ws.live.push_back(l);
  ws.opt_ptr.assign(1, 0);
  ws.opt_links.clear();
  ws.opt_via.clear();
  ws.lane_first.clear();
  for (const size_t l : ws.live) {
    ws.lane_first.push_back(ws.opt_via.size());
    route_options(lanes[l], ws);
  }
  ws.lane_first.push_back(ws.opt_via.size());
  disjoint(ws);
  for (size_t n = 0; n < ws.live.size(); ++n) {
    const size_t l = ws.live[n];
    const int32_t i = ws.best_src[l], j = ws.best_dst[l];
    const Lane& lane = lanes[l];
    res.src.push_back(i);
    res.dst.push_back(j);
    res.bytes.push_back(ws.best_vol[l]);
    res.rate.push_back(lane.rate);
    res.lane_kind.push_back(static_cast<int32_t>(lane.kind));
    res.lane_inst.push_back(lane.kind == LaneKind::kFlat || lane.kind == LaneKind::kIntra ? lane.inst : -1);
    const size_t o = ws.pick[n];
    if (ws.opt_via[o]) res.links.push_back(dep_.endpoint_up[i]);
    res.links.insert(res.links.end(), ws.opt_links.begin() + ws.opt_ptr[o], ws.opt_links.begin() + ws.opt_ptr[o + 1]);
    if (ws.opt_via[o]) res.links.push_back(dep_.endpoint_down[j]);
    res.link_ptr.push_back(static_cast<int64_t>(res.links.size()));
    consume(ws, i, j, ws.best_vol[l]);
  }
  res.step_ptr.push_back(static_cast<int64_t>(res.src.size()));
}

// The concrete routes a lane may take (option o's links: opt_links[opt_ptr[o], opt_ptr[o+1])).
void PlannerCore::route_options(const Lane& lane, Workspace& ws) const {
  auto append = [&](int64_t r, int32_t node, bool translate) {
    for (int64_t p = route_link_ptr_[r]; p < route_link_ptr_[r + 1]; ++p)
      ws.opt_links.push_back(translate ? static_cast<int32_t>(dep_.layout.global(route_links_[p], node)) : route_links_[p]);
  };
  auto close = [&](uint8_t via) {
    ws.opt_ptr.push_back(static_cast<int64_t>(ws.opt_links.size()));
    ws.opt_via.push_back(via);
  };
  switch (lane.kind) {
    case LaneKind::kRoute: {
      const size_t cell = size_t(lane.src_group) * dep_.n_groups + lane.dst_group;
      ws.opt_links.insert(ws.opt_links.end(), dep_.near_links.begin() + dep_.near_ptr[cell],
                          dep_.near_links.begin() + dep_.near_ptr[cell + 1]);
      close(dep_.near_via[cell]);
      return;
    }
    case LaneKind::kFlat:
    case LaneKind::kIntra:
      for (int64_t r = route_inst_ptr_[lane.inst]; r < route_inst_ptr_[lane.inst + 1]; ++r) {
        append(r, lane.node, lane.kind == LaneKind::kIntra);
        close(route_via_[r]);
      }
      return;
    case LaneKind::kNet:
      for (int64_t ro = route_inst_ptr_[lane.inst]; ro < route_inst_ptr_[lane.inst + 1]; ++ro)
        for (int64_t ri = route_inst_ptr_[lane.inst2]; ri < route_inst_ptr_[lane.inst2 + 1]; ++ri) {
          append(ro, lane.node, true);
          append(ri, lane.node2, true);
          close(1);
        }
      return;
  }
}

// One option per live lane with pairwise-disjoint link sets, the first in order (backtracking).
void PlannerCore::disjoint(Workspace& ws) const {
  const int32_t gen = ++ws.generation;
  auto mark = [&](size_t o, int32_t value) {
    for (int64_t p = ws.opt_ptr[o]; p < ws.opt_ptr[o + 1]; ++p) ws.stamp[ws.opt_links[p]] = value;
  };
  auto free_of_conflicts = [&](size_t o) {
    for (int64_t p = ws.opt_ptr[o]; p < ws.opt_ptr[o + 1]; ++p)
      if (ws.stamp[ws.opt_links[p]] == gen) return false;
    return true;
  };
  const size_t lanes = ws.live.size();
  ws.pick.assign(lanes, 0);
  ws.next.assign(lanes + 1, 0);
  size_t depth = 0;
  while (depth < lanes) {
    bool placed = false;
    for (size_t o = ws.lane_first[depth] + ws.next[depth]; o < ws.lane_first[depth + 1]; ++o) {
      if (!free_of_conflicts(o)) continue;
      ws.pick[depth] = o;
      ws.next[depth] = o - ws.lane_first[depth] + 1;
      mark(o, gen);
      placed = true;
      break;
    }
    if (placed) {
      ++depth;
      if (depth < lanes) ws.next[depth] = 0;
      continue;
    }
    if (depth == 0) throw CatalogError("no disjoint concrete routes for a catalog family: the catalog is inconsistent");
    --depth;
    mark(ws.pick[depth], 0);
  }
}

}  // namespace variopath
