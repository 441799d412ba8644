#include "decider.h"

#include <chrono>
#include <exception>

namespace variopath {

Decider::Decider(Decide decide) : decide_(std::move(decide)), worker_([this] { work(); }) {}

Decider::~Decider() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  worker_.join();
}

void Decider::submit(const Site& site, std::vector<int64_t> demand) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++slots_[site].submitted;
    queue_.emplace_back(site, std::move(demand));
  }
  cv_.notify_all();
}

Decision Decider::take(const Site& site, double timeout_s, std::string& error) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = slots_.find(site);
  if (it == slots_.end()) return safe_decision();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const Slot& slot = it->second;  // std::map: stays put while others are added
  if (!cv_.wait_until(lock, deadline, [&] { return slot.done == slot.submitted; })) {
    error = "timed out after " + std::to_string(timeout_s) + " s waiting for the decision made ahead of this call";
    return safe_decision();
  }
  if (!slot.error.empty()) {
    error = "deciding ahead of this call failed: " + slot.error;
    return safe_decision();
  }
  return slot.decision;
}

void Decider::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto [site, demand] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    Decision made;
    std::string why;
    try {
      made = decide_(demand);
    } catch (const std::exception& e) {
      why = e.what();
    }
    lock.lock();
    Slot& slot = slots_[site];
    slot.decision = std::move(made);
    slot.error = std::move(why);
    ++slot.done;
    cv_.notify_all();
  }
}

}  // namespace variopath
