// Deciding ahead of a call (issue 51; docs/planner.md "Deciding ahead"): a Decision (the family
// and, for the paced families, their split per group pair and route) made from a previous demand
// off the call path, and ChoiceCore::apply, which makes the current demand's plan from it on the
// call path.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "choice.h"

namespace variopath {

Decision safe_decision() {
  Decision d;
  d.id = decision_id(d);
  return d;
}

uint64_t decision_id(const Decision& decision) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the plan's name and the fractions' bits
  const auto mix = [&h](const void* data, size_t size) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t k = 0; k < size; ++k) h = (h ^ bytes[k]) * 1099511628211ull;
  };
  mix(decision.plan.data(), decision.plan.size());
  mix(decision.route_frac.data(), decision.route_frac.size() * sizeof(double));
  return h;
}

void set_caps(ChoiceSchedule& s) {
  s.cap_bps.assign(s.transfers(), 0.0);
  if (s.plan == "paced" || s.plan == "rot-paced" || s.plan == "chained")
    for (size_t t = 0; t < s.transfers(); ++t) s.cap_bps[t] = s.rate[t] * 1e9;
}

std::vector<double> ChoiceCore::route_table(const Aggregate& agg, const std::vector<double>& frac) const {
  std::vector<double> table(size_t(dep_.n_groups) * dep_.n_groups * kPacedRoutes, -1.0);
  for (size_t c = 0; c < frac.size(); ++c) {
    const auto p = size_t(agg.col_pair[c]);
    const int64_t pair = int64_t(agg.pair_a[p]) * dep_.n_groups + agg.pair_d[p];
    table[size_t(pair) * kPacedRoutes + size_t(agg.col_route[c] - dep_.route_ptr[pair])] = frac[c];
  }
  return table;
}

std::vector<double> ChoiceCore::table_fractions(const Aggregate& agg, const std::vector<double>& table) const {
  std::vector<double> frac = initial_fractions(agg), total(agg.volume.size(), 0.0);
  const bool decided = !table.empty();
  for (size_t c = 0; c < frac.size(); ++c) {
    const auto p = size_t(agg.col_pair[c]);
    const int64_t pair = int64_t(agg.pair_a[p]) * dep_.n_groups + agg.pair_d[p];
    const size_t at = size_t(pair) * kPacedRoutes + size_t(agg.col_route[c] - dep_.route_ptr[pair]);
    if (decided && table[at] >= 0)
      frac[c] = table[at];
    else if (reference_frac_[at] >= 0)
      frac[c] = reference_frac_[at];
  }
  for (size_t c = 0; c < frac.size(); ++c) total[size_t(agg.col_pair[c])] += frac[c];
  const std::vector<double> cold = initial_fractions(agg);
  for (size_t c = 0; c < frac.size(); ++c) {
    const double sum = total[size_t(agg.col_pair[c])];
    frac[c] = sum > 0 ? frac[c] / sum : cold[c];  // a pair decided all-zero (never: a split sums to 1) runs cold
  }
  return frac;
}

ChoiceSchedule ChoiceCore::apply(const Decision& decision, const int64_t* demand, const Algorithm2& algorithm2,
                                 const std::vector<NetParams>& models, int32_t rank) const {
  const std::string& plan = decision.plan;
  const size_t table = size_t(dep_.n_groups) * dep_.n_groups * kPacedRoutes;
  if ((plan == "paced" || plan == "rot-paced") && decision.route_frac.size() != table)
    throw std::invalid_argument("decision " + plan + " has " + std::to_string(decision.route_frac.size()) +
                                " fractions, the deployment's split has " + std::to_string(table));
  ChoiceSchedule s;
  bool made = false;
  for (const auto& f : {std::make_tuple("concurrent", 1, false, false),
                        std::make_tuple("multipath", kMultipathRoutes, false, false),
                        std::make_tuple("staged", 1, true, false),
                        std::make_tuple("staged-balanced", kMultipathRoutes, true, true)})
    if (plan == std::get<0>(f)) {
      s = concurrent(demand, std::get<1>(f), std::get<2>(f), std::get<3>(f), rank);
      made = true;
    }
  if (plan == "paced" || plan == "rot-paced") {
    const DemandCells demand_cells = cells(demand);
    const Aggregate agg = aggregate(demand_cells);
    if (plan == "rot-paced") {
      Phased ph;
      made = phase_aggregate(demand_cells, agg, ph) &&
             expand_rotated(demand, ph, table_fractions(ph.agg, decision.route_frac), s);
    } else {
      const PacedPieces pieces =
          paced_pieces(demand, demand_cells, agg, table_fractions(agg, decision.route_frac), shared_tally(demand_cells));
      s = expand(demand, agg, pieces, rank);
      made = true;
    }
  } else if ((plan == "barrier" || plan == "signal") && algorithm2) {
    s = barrier(algorithm2());
    if (plan == "signal") s = signal_driven(s);
    made = true;
  } else if (plan == "chained" && !models.empty()) {
    size_t gap_model = 0;  // the gaps the choice built it with (choose: hybrid.py gap_network)
    const auto gap_of = [](const NetParams& m) {
      return m.issue_s + std::max(m.latency_pcie_s, m.latency_net_s) + m.signal_s;
    };
    for (size_t m = 1; m < models.size(); ++m)
      if (gap_of(models[m]) > gap_of(models[gap_model])) gap_model = m;
    made = chained(demand, models[gap_model], s);
  } else if (!made && plan != "barrier" && plan != "signal" && plan != "chained") {
    throw std::invalid_argument("decision names no family the op runs: '" + plan + "'");
  }
  if (!made) s = concurrent(demand, 1, true, false, rank);  // the demand did not fit the family: staged
  s.plan = made ? plan : "staged";
  set_caps(s);
  return s;
}

}  // namespace variopath
