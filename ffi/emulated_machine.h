// An emulated machine for the profiler (issue 27, `variopath profile --backend emulated`): links
// with injected capacities and per-class losses, routes over them, and the per-message costs
// o, L, σ, λ, run on a deterministic virtual clock (no threads, no sleeping). The link
// behaviour is implemented here, not borrowed from the Python simulator, so that the profiler's
// measurement and fit are tested against an independent implementation of the same rules:
//
// - Sharing: the transfers moving data at once share every link they cross by max-min fairness
//   (progressive filling), each capped by its pacing rate when it has one.
// - Loss: a link of capacity C with k transfers on it delivers C · max(floor, 1 / (1 + β (k - 1)))
//   (β, floor of its class) when their caps add up to more than C (an uncapped transfer counts
//   as an infinite cap), or when its class does not share paced flows losslessly and k >= 2.
// - Posting: transfers of one step that wait for nothing are posted by their route's source
//   endpoint together, at the step's start, for one o; a transfer that waits for another
//   (`after`) becomes ready σ after it ended and is a post of its own, serialised with the other
//   posts of its endpoint (o each). Data moves from the end of its post; a transfer ends its
//   route's latency L after its last byte moved. Step s > 0 starts λ after every transfer of step
//   s - 1 ended.
// - The posted-write trigger (optional): a link may join a CPU root port (its root complex) and
//   go up into it (an uplink) or down from it. A transfer of a pushed route (not `route_pull`)
//   writes, on every uplink it crosses, toward the root complex of the next root-port link it
//   goes down through (none: the uplink's own). An uplink whose moving pushed transfers write
//   toward two or more distinct root complexes delivers at most trigger_factor · C, paced or
//   not; pulls (reads issued by the receiver) never count (research/contention-evidence.md
//   "The posted-write collapse"; the simulator's rule, sim/network.py RootPorts).
// - Jitter (optional, seeded): per experiment, each link's capacity is scaled by 1 + U(-j, j).
// Each link has one fixed class: the emulated wiring gives staged traffic links of its own
// (root_dma), where the simulator switches a root link's class by what it carries.
#pragma once

#include <cstdint>
#include <vector>

#include "experiment.h"

namespace variopath::emulated {

struct LinkClass {
  double beta = 0;
  double floor = 0;
  bool paced_lossless = true;
};

struct Machine {
  std::vector<double> capacity;              // per link, bytes per second
  std::vector<int32_t> link_class;           // per link, an index into `classes`
  std::vector<LinkClass> classes;
  std::vector<std::vector<int32_t>> routes;  // per route, the links it crosses
  std::vector<int32_t> route_source;         // per route, the endpoint that posts its transfers
  std::vector<double> route_latency;         // per route, L in seconds
  double issue_s = 0;                        // o
  double signal_s = 0;                       // σ
  double barrier_s = 0;                      // λ
  double jitter = 0;                         // in [0, 1)
  uint64_t seed = 0;
  // The trigger: per link, the root complex of the root port it joins (-1: none) and whether it
  // goes up into that port (empty vectors: no link joins a root port); per route, whether it is
  // a pull (empty: every route pushes); the fraction of C a triggered uplink keeps (1: none).
  std::vector<int32_t> root_complex;
  std::vector<bool> uplink;
  std::vector<bool> route_pull;
  double trigger_factor = 1;                 // in (0, 1]
};

using Transfer = ExperimentTransfer;

// Throws std::invalid_argument naming the bad field.
void validate(const Machine& machine);

// When each transfer ends, in seconds after the experiment began. `experiment` selects the
// jitter draw, so the same (machine, transfers, experiment) always gives the same times.
// Throws std::invalid_argument naming the bad transfer.
std::vector<double> run(const Machine& machine, const std::vector<Transfer>& transfers, uint64_t experiment);

}  // namespace variopath::emulated
