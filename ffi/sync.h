// What the ranks of one collective call share to wait on each other: a mutex, a condition
// variable and the call's failure, set once and seen by every rank; and the one way to wait.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

namespace variopath {

struct CallSync {
  std::mutex mu;
  std::condition_variable cv;
  bool failed = false;
  std::string error;

  void fail(const std::string& why) {  // with mu held
    if (!failed) {
      failed = true;
      error = why;
    }
    cv.notify_all();
  }
};

// Wait, with mu held, until `done()` holds or the call fails; give up after `timeout_s` (from
// now: every wait has its own deadline) with `stalled()` as the call's error. True when
// `done()` holds.
template <typename Done, typename Stalled>
bool wait_for(CallSync& sync, std::unique_lock<std::mutex>& lock, double timeout_s, Done done, Stalled stalled) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (sync.cv.wait_until(lock, deadline, [&] { return sync.failed || done(); }) && !sync.failed) return true;
  if (!sync.failed) sync.fail("timed out after " + std::to_string(timeout_s) + " s: " + stalled());
  return false;
}

}  // namespace variopath
