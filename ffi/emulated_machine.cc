#include "emulated_machine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace variopath::emulated {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kRel = 1e-9;  // relative slack of "caps fit" and "link saturated"

double eta(const LinkClass& c, int32_t k) { return std::max(c.floor, 1.0 / (1.0 + c.beta * (k - 1))); }

void fail(const std::string& what) { throw std::invalid_argument("emulated machine: " + what); }

// Per route, (uplink, target root complex) for every uplink its pushed writes cross: the root
// complex of the next root-port link it goes down through, else the uplink's own. Pulls: none.
using Writes = std::vector<std::vector<std::pair<int32_t, int32_t>>>;

Writes writes_of(const Machine& m) {
  Writes out(m.routes.size());
  if (m.root_complex.empty() || m.trigger_factor >= 1) return out;
  for (size_t r = 0; r < m.routes.size(); ++r) {
    if (!m.route_pull.empty() && m.route_pull[r]) continue;
    const auto& links = m.routes[r];
    for (size_t i = 0; i < links.size(); ++i) {
      if (!m.uplink[links[i]]) continue;
      int32_t target = m.root_complex[links[i]];
      for (size_t j = i + 1; j < links.size(); ++j)
        if (m.root_complex[links[j]] >= 0 && !m.uplink[links[j]]) {
          target = m.root_complex[links[j]];
          break;
        }
      out[r].emplace_back(links[i], target);
    }
  }
  return out;
}

// The rates of the `active` transfers: progressive filling over links of capacity `cap` (already
// jittered), each reduced to C · η(k) where the loss rule applies and to C · trigger_factor where
// the trigger fires.
void allocate(const Machine& m, const std::vector<double>& cap, const std::vector<Transfer>& ts, const Writes& writes,
              const std::vector<int32_t>& active, std::vector<double>& rate) {
  const size_t links = cap.size();
  std::vector<int32_t> open(links, 0);
  std::vector<double> capsum(links, 0), left(links, 0);
  for (int32_t a : active)
    for (int32_t l : m.routes[ts[a].route]) {
      ++open[l];
      capsum[l] += ts[a].cap > 0 ? ts[a].cap : kInf;
    }
  for (size_t l = 0; l < links; ++l) {
    if (open[l] == 0) continue;
    const LinkClass& c = m.classes[m.link_class[l]];
    const bool lossy = capsum[l] > cap[l] * (1 + kRel) || (!c.paced_lossless && open[l] >= 2);
    left[l] = lossy ? cap[l] * eta(c, open[l]) : cap[l];
  }
  // the trigger: per uplink, the distinct root complexes its moving pushed transfers write toward
  std::vector<std::vector<int32_t>> targets(links);
  for (int32_t a : active)
    for (const auto& [l, rc] : writes[ts[a].route])
      if (std::find(targets[l].begin(), targets[l].end(), rc) == targets[l].end()) targets[l].push_back(rc);
  for (size_t l = 0; l < links; ++l)
    if (targets[l].size() >= 2) left[l] = std::min(left[l], cap[l] * m.trigger_factor);
  std::vector<char> frozen(active.size(), 0);
  for (int32_t a : active) rate[a] = 0;
  size_t unfrozen = active.size();
  while (unfrozen > 0) {
    double inc = kInf;
    for (size_t l = 0; l < links; ++l)
      if (open[l] > 0) inc = std::min(inc, left[l] / open[l]);
    for (size_t i = 0; i < active.size(); ++i)
      if (!frozen[i] && ts[active[i]].cap > 0) inc = std::min(inc, ts[active[i]].cap - rate[active[i]]);
    inc = std::max(inc, 0.0);
    for (size_t i = 0; i < active.size(); ++i) {
      if (frozen[i]) continue;
      rate[active[i]] += inc;
      for (int32_t l : m.routes[ts[active[i]].route]) left[l] -= inc;
    }
    for (size_t i = 0; i < active.size(); ++i) {
      if (frozen[i]) continue;
      const Transfer& t = ts[active[i]];
      bool stop = t.cap > 0 && rate[active[i]] >= t.cap * (1 - kRel);
      for (int32_t l : m.routes[t.route]) stop = stop || left[l] <= kRel * cap[l];
      if (!stop) continue;
      frozen[i] = 1;
      --unfrozen;
      for (int32_t l : m.routes[t.route]) --open[l];
    }
  }
}

enum State : uint8_t { kUnposted, kPosted, kMoving, kEnded };

// Transfers [first, last) of one step, starting at `start`; fills `end`.
void run_step(const Machine& m, const std::vector<double>& cap, const std::vector<Transfer>& ts, const Writes& writes,
              size_t first, size_t last, double start, std::vector<double>& end) {
  const int32_t endpoints = *std::max_element(m.route_source.begin(), m.route_source.end()) + 1;
  std::vector<double> free_at(endpoints, start), data_at(ts.size(), kInf), ready_at(ts.size(), kInf);
  std::vector<double> left(ts.size(), 0), rate(ts.size(), 0);
  std::vector<State> state(ts.size(), kUnposted);
  for (size_t i = first; i < last; ++i) {  // one grouped post per endpoint at the step's start
    left[i] = static_cast<double>(ts[i].nbytes);
    if (ts[i].after >= 0) continue;
    const int32_t src = m.route_source[ts[i].route];
    free_at[src] = start + m.issue_s;
    data_at[i] = start + m.issue_s;
    state[i] = kPosted;
  }
  size_t ended = 0;
  double now = start;
  const auto finish = [&](size_t i, double t) {
    state[i] = kEnded;
    ++ended;
    end[i] = t + m.route_latency[ts[i].route];
    for (size_t d = i + 1; d < last; ++d)
      if (ts[d].after == static_cast<int32_t>(i)) ready_at[d] = end[i] + m.signal_s;
  };
  while (ended < last - first) {
    std::vector<int32_t> active;
    for (size_t i = first; i < last; ++i)
      if (state[i] == kMoving) active.push_back(static_cast<int32_t>(i));
    allocate(m, cap, ts, writes, active, rate);
    double next = kInf;
    for (int32_t a : active)
      if (rate[a] > 0) next = std::min(next, now + left[a] / rate[a]);
    for (size_t i = first; i < last; ++i) {
      if (state[i] == kPosted) next = std::min(next, data_at[i]);
      if (state[i] == kUnposted) next = std::min(next, ready_at[i]);
    }
    if (!(next < kInf)) fail("a transfer can never move (a link of capacity 0?)");
    for (int32_t a : active) {
      const bool done = rate[a] > 0 && now + left[a] / rate[a] <= next * (1 + 1e-12);
      left[a] = done ? 0 : left[a] - rate[a] * (next - now);
      if (done) finish(a, next);
    }
    now = next;
    // readies due now post in (time, index) order, each serialised at its endpoint
    for (;;) {
      size_t pick = last;
      for (size_t i = first; i < last; ++i)
        if (state[i] == kUnposted && ready_at[i] <= now && (pick == last || ready_at[i] < ready_at[pick])) pick = i;
      if (pick == last) break;
      const int32_t src = m.route_source[ts[pick].route];
      const double post = std::max(ready_at[pick], free_at[src]);
      free_at[src] = post + m.issue_s;
      data_at[pick] = post + m.issue_s;
      state[pick] = kPosted;
    }
    for (size_t i = first; i < last; ++i) {
      if (state[i] != kPosted || data_at[i] > now) continue;
      state[i] = kMoving;
      if (ts[i].nbytes == 0) finish(i, now);
    }
  }
}

}  // namespace

void validate(const Machine& m) {
  const size_t links = m.capacity.size();
  if (m.link_class.size() != links) fail("link_class needs one entry per link");
  for (size_t l = 0; l < links; ++l) {
    if (!(m.capacity[l] > 0 && std::isfinite(m.capacity[l])))
      fail("link " + std::to_string(l) + ": capacity must be a positive number of bytes per second");
    if (m.link_class[l] < 0 || m.link_class[l] >= static_cast<int32_t>(m.classes.size()))
      fail("link " + std::to_string(l) + ": class " + std::to_string(m.link_class[l]) + " does not exist");
  }
  for (size_t c = 0; c < m.classes.size(); ++c) {
    const LinkClass& k = m.classes[c];
    if (!(k.beta >= 0 && std::isfinite(k.beta)) || !(k.floor >= 0 && k.floor <= 1))
      fail("class " + std::to_string(c) + ": need beta >= 0 and floor in [0, 1]");
  }
  if (m.routes.empty()) fail("no routes");
  if (m.route_source.size() != m.routes.size() || m.route_latency.size() != m.routes.size())
    fail("route_source and route_latency need one entry per route");
  for (size_t r = 0; r < m.routes.size(); ++r) {
    if (m.routes[r].empty()) fail("route " + std::to_string(r) + " crosses no link");
    for (int32_t l : m.routes[r])
      if (l < 0 || static_cast<size_t>(l) >= links)
        fail("route " + std::to_string(r) + ": link " + std::to_string(l) + " does not exist");
    if (m.route_source[r] < 0) fail("route " + std::to_string(r) + ": negative source endpoint");
    if (!(m.route_latency[r] >= 0 && std::isfinite(m.route_latency[r])))
      fail("route " + std::to_string(r) + ": latency must be >= 0");
  }
  for (double v : {m.issue_s, m.signal_s, m.barrier_s})
    if (!(v >= 0 && std::isfinite(v))) fail("issue_s, signal_s and barrier_s must be >= 0");
  if (!(m.jitter >= 0 && m.jitter < 1)) fail("jitter must be in [0, 1)");
  if (!m.root_complex.empty() && m.root_complex.size() != links)
    fail("root_complex needs one entry per link (or none)");
  if (m.uplink.size() != m.root_complex.size()) fail("uplink needs one entry per root_complex entry");
  for (size_t l = 0; l < m.root_complex.size(); ++l)
    if (m.root_complex[l] < -1 || (m.uplink[l] && m.root_complex[l] < 0))
      fail("link " + std::to_string(l) + ": an uplink needs a root complex >= 0 (others -1 or >= 0)");
  if (!m.route_pull.empty() && m.route_pull.size() != m.routes.size())
    fail("route_pull needs one entry per route (or none)");
  if (!(m.trigger_factor > 0 && m.trigger_factor <= 1)) fail("trigger_factor must be in (0, 1]");
}

std::vector<double> run(const Machine& m, const std::vector<Transfer>& ts, uint64_t experiment) {
  validate(m);
  const std::string bad = check_experiment(ts, m.routes.size());
  if (!bad.empty()) fail(bad);
  std::vector<double> cap(m.capacity);
  if (m.jitter > 0) {
    // each capacity times a uniform draw from [1 - jitter, 1 + jitter), made from the generator's
    // 53 top bits: std::uniform_real_distribution's algorithm differs between standard libraries
    std::mt19937_64 rng(m.seed ^ (0x9E3779B97F4A7C15ull * (experiment + 1)));
    for (double& c : cap) c *= 1 - m.jitter + 2 * m.jitter * (double(rng() >> 11) * 0x1.0p-53);
  }
  const Writes writes = writes_of(m);
  std::vector<double> end(ts.size(), 0);
  double start = 0;
  for (size_t first = 0; first < ts.size();) {
    size_t last = first;
    while (last < ts.size() && ts[last].step == ts[first].step) ++last;
    run_step(m, cap, ts, writes, first, last, start, end);
    start = *std::max_element(end.begin() + first, end.begin() + last) + m.barrier_s;
    first = last;
  }
  return end;
}

}  // namespace variopath::emulated
