#include "streams.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

namespace variopath {

void run_batch(const std::vector<Send>& batch, Clock::time_point start, const std::function<void(size_t)>& began,
               const std::function<void(size_t, const Send::Piece&)>& copy, const std::function<void(size_t)>& done) {
  struct Cursor {
    size_t i, piece = 0;
    int64_t within = 0, sent = 0, total = 0, chunk = 0;
  };
  std::vector<Cursor> paced;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].pace_gbs > 0) {
      Cursor c{i};
      for (const auto& p : batch[i].pieces) c.total += p.nbytes;
      c.chunk = std::max<int64_t>(kMinPaceChunk, static_cast<int64_t>(batch[i].pace_gbs * 1e9 * kPaceChunk));
      paced.push_back(c);
      continue;
    }
    began(i);
    for (const auto& p : batch[i].pieces) copy(i, p);
    done(i);
  }
  // when the cursor's next chunk may start (or, all copied, its transfer may end)
  const auto due = [&](const Cursor& c) {
    return start + seconds_of(c.sent / (batch[c.i].pace_gbs * 1e9));
  };
  while (!paced.empty()) {
    auto next = std::min_element(paced.begin(), paced.end(),
                                 [&](const Cursor& a, const Cursor& b) { return due(a) < due(b); });
    std::this_thread::sleep_until(due(*next));
    Cursor& c = *next;
    const auto& pieces = batch[c.i].pieces;
    if (c.sent == c.total) {  // its last chunk went out, and its bytes at its cap have passed
      done(c.i);
      paced.erase(next);
      continue;
    }
    if (c.sent == 0) began(c.i);
    for (int64_t left = std::min(c.chunk, c.total - c.sent); left > 0;) {
      const Send::Piece& p = pieces[c.piece];
      const int64_t take = std::min(left, p.nbytes - c.within);
      copy(c.i, {p.dst + c.within, p.src + c.within, take});
      c.within += take;
      c.sent += take;
      left -= take;
      if (c.within == p.nbytes) {
        ++c.piece;
        c.within = 0;
      }
    }
  }
}

namespace {

// The CPU backends: a rank's own memory is written at once by its own thread.
class HostStreams : public Streams {
 public:
  void local(int32_t, uint8_t* dst, const uint8_t* src, int64_t nbytes) override { std::memmove(dst, src, nbytes); }
  void zero(int32_t, uint8_t* dst, int64_t nbytes) override { std::memset(dst, 0, nbytes); }
};

// Every op at once, on the calling thread: a record completes its event when enqueued.
class MemcpyStreams final : public HostStreams {
 public:
  MemcpyStreams(int32_t events, Copier copier)
      : copier_(std::move(copier)), began_(events, -1), ended_(events, -1) {}

  void wait(int32_t, int32_t) override {}  // its record is enqueued, hence complete

  void send(int32_t, const std::vector<Send>& batch) override {
    run_batch(
        batch, Clock::now(), [&](size_t i) { began_[batch[i].event] = clock_++; },
        [&](size_t i, const Send::Piece& p) { move(batch[i].event, p); },
        [&](size_t i) { ended_[batch[i].event] = clock_++; });
  }

  bool synchronize(int32_t, Clock::time_point) override { return true; }
  std::string error() const override {
    std::lock_guard<std::mutex> lock(error_mu_);
    return error_;
  }

  void order(std::vector<int64_t>& began, std::vector<int64_t>& ended) const override {
    began.assign(began_.begin(), began_.end());
    ended.assign(ended_.begin(), ended_.end());
  }

 private:
  void move(int32_t event, const Send::Piece& p) {
    if (!copier_) {
      std::memcpy(p.dst, p.src, p.nbytes);
      return;
    }
    std::string err = copier_(event, p.dst, p.src, p.nbytes);
    if (!err.empty()) {
      std::lock_guard<std::mutex> lock(error_mu_);
      if (error_.empty()) error_ = std::move(err);
    }
  }

  Copier copier_;
  mutable std::mutex error_mu_;
  std::string error_;  // under error_mu_
  std::atomic<int64_t> clock_{0};
  std::vector<int64_t> began_, ended_;  // each event's entries are written by its one sender
};

std::atomic<int32_t> g_stalled_stream{-1};

// A thread per stream running its ops in order, each after a random delay; events as flags. Once
// destroyed (every rank has returned) the ops left are dropped: on the normal path none are
// (every enqueued transfer completed before its ranks returned), after a stall (stall_emulated_stream)
// the stalled stream's are, and those waiting on them.
class EmulatedStreams final : public HostStreams {
 public:
  EmulatedStreams(int32_t streams, int32_t events, uint64_t seed, double max_delay_s)
      : queues_(streams), running_(streams, -1), recorded_(events, 0), complete_(events, 0), began_(events, -1),
        ended_(events, -1),
        stalled_(g_stalled_stream.load()) {
    for (int32_t s = 0; s < streams; ++s)
      workers_.emplace_back([this, s, seed, max_delay_s] { run(s, seed * 1000003u + s, max_delay_s); });
  }

  ~EmulatedStreams() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  void wait(int32_t stream, int32_t event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!recorded_[event] && error_.empty())
      error_ = "executor bug: a stream waited for event " + std::to_string(event) +
               " before its record was enqueued (a no-op on CUDA)";
    push(stream, {Op::kWait, event});
  }

  void send(int32_t stream, const std::vector<Send>& batch) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Send& t : batch) recorded_[t.event] = 1;
    Op op{Op::kSend, -1};
    op.batch = std::make_shared<const std::vector<Send>>(batch);
    push(stream, op);
  }

  bool synchronize(int32_t event, Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return complete_[event] != 0; });
  }

  bool stream_ordered() const override { return true; }

  int32_t finish(int32_t stream, Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_until(lock, deadline, [&] { return queues_[stream].empty() && running_[stream] < 0; })) return -1;
    if (running_[stream] >= 0) return running_[stream];
    const Op& next = queues_[stream].front();
    return next.kind == Op::kWait || next.batch->empty() ? next.event : next.batch->front().event;
  }

  std::string error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  void order(std::vector<int64_t>& began, std::vector<int64_t>& ended) const override {
    std::lock_guard<std::mutex> lock(mu_);
    began = began_;
    ended = ended_;
  }

 private:
  struct Op {
    enum Kind { kWait, kSend } kind;
    int32_t event;
    std::shared_ptr<const std::vector<Send>> batch;
  };

  void push(int32_t stream, const Op& op) {  // with mu_ held
    queues_[stream].push_back(op);
    cv_.notify_all();
  }

  void run(int32_t stream, uint64_t seed, double max_delay_s) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> delay(0.0, max_delay_s);
    std::unique_lock<std::mutex> lock(mu_);
    if (stream == stalled_) {
      cv_.wait(lock, [&] { return stop_; });
      return;
    }
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queues_[stream].empty(); });
      if (stop_) return;  // destroyed: what is left is dropped
      const Op op = queues_[stream].front();
      queues_[stream].pop_front();
      running_[stream] = op.kind == Op::kWait || op.batch->empty() ? op.event : op.batch->front().event;
      const double d = delay(rng);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double>(d));
      lock.lock();
      switch (op.kind) {
        case Op::kWait:  // the event's record is enqueued somewhere, so it completes (unless stalled)
          cv_.wait(lock, [&] { return stop_ || complete_[op.event] != 0; });
          if (stop_) return;
          break;
        case Op::kSend: {  // its transfers in flight together, from now (run_batch)
          const std::vector<Send>& batch = *op.batch;
          lock.unlock();
          run_batch(
              batch, Clock::now(),
              [&](size_t i) {
                std::lock_guard<std::mutex> hold(mu_);
                began_[batch[i].event] = clock_++;
              },
              [](size_t, const Send::Piece& p) { std::memcpy(p.dst, p.src, p.nbytes); },
              [&](size_t i) {
                std::lock_guard<std::mutex> hold(mu_);
                complete_[batch[i].event] = 1;
                ended_[batch[i].event] = clock_++;
                cv_.notify_all();
              });
          lock.lock();
          break;
        }
      }
      running_[stream] = -1;
      cv_.notify_all();  // a host waiting in finish
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string error_;
  std::vector<std::deque<Op>> queues_;
  std::vector<int32_t> running_;  // per stream: the event of the op it runs (-1: none)
  std::vector<uint8_t> recorded_, complete_;
  std::vector<int64_t> began_, ended_;
  int64_t clock_ = 0;
  int32_t stalled_;  // the stream that never runs an op (tests), or -1
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<Streams> memcpy_streams(int32_t events, Copier copier) {
  return std::make_unique<MemcpyStreams>(events, std::move(copier));
}

std::unique_ptr<Streams> emulated_streams(int32_t streams, int32_t events, uint64_t seed, double max_delay_s) {
  return std::make_unique<EmulatedStreams>(streams, events, seed, max_delay_s);
}

void stall_emulated_stream(int32_t stream) { g_stalled_stream.store(stream); }

}  // namespace variopath
