// Deciding off the call path (issue 51 item 3; docs/planner.md "Deciding ahead"): per call site,
// the decision its next call applies, made on a worker thread from this call's demand while the
// call's bytes move. A call takes the decision made from its site's previous demand (waiting for
// it if the worker is still at it: the decision of a call never depends on timing), or the safe
// decision on a site's first call. Every process that saw the same demands holds the same
// decisions; the transports compare their ids (Contribution::decision) and use the safe decision
// for a call whose ranks do not agree.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "choice.h"

namespace variopath {

class Decider {
 public:
  // a call site and the group of ranks calling it (collective.h run_collective's site and group)
  using Site = std::pair<int64_t, int64_t>;
  // decide(demand): the decision made from a demand (ChoiceCore::choose ahead)
  using Decide = std::function<Decision(const std::vector<int64_t>& demand)>;
  explicit Decider(Decide decide);
  ~Decider();  // finishes the job in hand, drops the queued ones
  Decider(const Decider&) = delete;
  Decider& operator=(const Decider&) = delete;

  // The decision for `site`'s next call: made from the demand last submitted for it (waited for
  // up to timeout_s; "" or the error in `error`), the safe decision if none was.
  Decision take(const Site& site, double timeout_s, std::string& error);
  // Decide from `demand` for `site`'s next call, on the worker thread.
  void submit(const Site& site, std::vector<int64_t> demand);

 private:
  struct Slot {
    uint64_t submitted = 0, done = 0;  // jobs submitted for the site, and decided
    Decision decision;                  // the latest decided
    std::string error;                  // the latest decision's failure, if it failed
  };
  void work();

  Decide decide_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Site, Slot> slots_;
  std::deque<std::pair<Site, std::vector<int64_t>>> queue_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace variopath
