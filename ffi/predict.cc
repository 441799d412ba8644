// The analytic predictor (docs/planner.md "The analytic predictor"): the simulator's step and
// post semantics with bandwidth sharing in closed form per transfer; exact where a family keeps
// its links uncontended, a bound elsewhere.
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

// ----- the analytic predictor ----------------------------------------------------

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

// One flow moving on a link, as on_link entries: (end, cap B/s, staged, B/s, the
// root complex it pushes writes toward on the link or -1).
struct Moving {
  double end, cap;
  bool staged;
  double speed;
  int32_t target;
};

// _share: the rate a transfer gets on link l beside the flows moving there from t,
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
  // the flows moving on each link, kept only when a transfer waits for signals
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

  auto shared_time = [&](size_t f, double start) {  // _shared_time
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

}  // namespace variopath
