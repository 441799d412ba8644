// What the ranks of one collective call share to wait on each other: a mutex, a condition
// variable and the call's failure, set once and seen by every rank; and the one way to wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "clock.h"

namespace variopath {

struct CallSync {
  std::mutex mu;
  std::condition_variable cv;  // the rendezvous's waits
  bool failed = false;
  std::string error;
  // The executor's waits (LocalBoard), one condition variable per rank, so that a transfer
  // enqueued wakes only the ranks waiting for it (waiting_on) instead of every rank of the call.
  std::unique_ptr<std::condition_variable[]> rank_cv;
  std::vector<int32_t> waiting_on;  // per rank: the transfer it waits for, kNone or kSettling
  static constexpr int32_t kNone = -1, kSettling = -2;

  void set_ranks(int32_t n) {  // before any rank waits
    rank_cv.reset(new std::condition_variable[n]);
    waiting_on.assign(n, kNone);
  }

  void fail(const std::string& why) {  // with mu held
    if (!failed) {
      failed = true;
      error = why;
    }
    cv.notify_all();
    for (size_t r = 0; r < waiting_on.size(); ++r) rank_cv[r].notify_all();
  }
};

// Wait, with mu held, on `on` (default: the rendezvous's) until `done()` holds or the call
// fails; give up after `timeout_s` (from now: every wait has its own deadline) with `stalled()`
// as the call's error. True when `done()` holds.
template <typename Done, typename Stalled>
bool wait_for(CallSync& sync, std::unique_lock<std::mutex>& lock, double timeout_s, Done done, Stalled stalled,
              std::condition_variable* on = nullptr) {
  const auto deadline = Clock::now() + seconds_of(timeout_s);
  std::condition_variable& cv = on ? *on : sync.cv;
  if (cv.wait_until(lock, deadline, [&] { return sync.failed || done(); }) && !sync.failed) return true;
  if (!sync.failed) sync.fail("timed out after " + std::to_string(timeout_s) + " s: " + stalled());
  return false;
}

}  // namespace variopath
