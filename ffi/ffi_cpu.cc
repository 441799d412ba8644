// XLA FFI handlers for CPU devices: all_to_all_v and ragged_all_to_all on the in-process
// transport (collective.h). Every failure completes the call with an ffi::Error naming the
// problem.
//
// The handlers are asynchronous: each checks its arguments on XLA's thread, then runs the
// collective on a thread of its own (from a pool that grows so that every waiting collective has
// one) and returns a future that completes with it. A collective
// waits for every rank; blocking XLA's thread instead (possibly one of its small shared intra-op
// pool) starved the devices that had not arrived yet and deadlocked programs with other parallel
// work or collectives (README "Known limitation"). XLA keeps the call's buffers alive until the
// future completes.
#include "ffi_cpu.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "arguments.h"
#include "collective.h"
#include "error_codes.h"

namespace ffi = xla::ffi;

namespace variopath {

namespace {

// Threads that run collectives off XLA's threads, kept for reuse: a submitted collective starts
// a new thread whenever fewer are idle than collectives wait, so no collective ever waits for
// another to finish (they wait for each other); a thread idle for a minute ends. Never destroyed:
// its threads may still wait on it while the process exits.
class CollectiveThreads {
 public:
  void submit(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    if (tasks_.size() > idle_) std::thread([this] { work(); }).detach();
    cv_.notify_one();
  }

  // Wait until no task is queued or running, at most `timeout_s`; whether none is.
  bool quiet(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    return done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                             [&] { return tasks_.empty() && running_ == 0; });
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      const bool got = cv_.wait_for(lock, std::chrono::seconds(60), [&] { return !tasks_.empty(); });
      --idle_;
      if (!got) return;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      lock.unlock();
      task();
      task = nullptr;  // what it captured goes before it counts as done
      lock.lock();
      if (--running_ == 0 && tasks_.empty()) done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> tasks_;
  size_t idle_ = 0, running_ = 0;
};

CollectiveThreads& collective_threads() {
  static auto* threads = new CollectiveThreads;  // never destroyed (see above)
  return *threads;
}

// Run the collective off XLA's thread; the future completes when it has.
ffi::Future start(int64_t run_id, int64_t site, int64_t group, Contribution c) {
  ffi::Promise promise;
  ffi::Future future(promise);
  auto shared = std::make_shared<Contribution>(std::move(c));
  collective_threads().submit([promise, run_id, site, group, shared]() mutable {
    const std::string err = run_collective(run_id, site, group, std::move(*shared));
    if (err.empty())
      promise.SetAvailable();
    else
      promise.SetError(ffi::Error(error_code_of(err, ffi::ErrorCode::kInvalidArgument), "variopath all_to_all: " + err));
  });
  return future;
}

ffi::Future AllToAllVImpl(ffi::RunId run, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> send_counts,
                         ffi::Buffer<ffi::S32> rank, ffi::Buffer<ffi::S32> group, ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::Buffer<ffi::S32>> recv_counts, int64_t config, int64_t site,
                         int64_t axis_size) {
  std::memset(recv_counts->typed_data(), 0, sizeof(int32_t) * recv_counts->element_count());
  Contribution c = all_to_all_v_contribution(x, send_counts.typed_data(), send_counts.element_count(),
                                             rank.typed_data()[0], *y, recv_counts->typed_data(), config, axis_size);
  return start(run.run_id, site, group.typed_data()[0], std::move(c));
}

// The same into `out`, which the lowering aliases to `y` (a donated buffer reused step after step).
ffi::Future AllToAllVIntoImpl(ffi::RunId run, ffi::AnyBuffer x, ffi::Buffer<ffi::S32> send_counts,
                             ffi::Buffer<ffi::S32> rank, ffi::Buffer<ffi::S32> group, ffi::AnyBuffer /*out*/,
                             ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::Buffer<ffi::S32>> recv_counts,
                             int64_t config, int64_t site, int64_t axis_size) {
  return AllToAllVImpl(run, x, send_counts, rank, group, y, recv_counts, config, site, axis_size);
}

ffi::Future RaggedImpl(ffi::RunId run, ffi::AnyBuffer operand, ffi::AnyBuffer output,
                      ffi::Buffer<ffi::S32> input_offsets, ffi::Buffer<ffi::S32> send_sizes,
                      ffi::Buffer<ffi::S32> output_offsets, ffi::Buffer<ffi::S32> recv_sizes,
                      ffi::Buffer<ffi::S32> rank, ffi::Buffer<ffi::S32> group, ffi::Result<ffi::AnyBuffer> result,
                      ffi::Result<ffi::Buffer<ffi::S32>> recv_offsets, ffi::Result<ffi::Buffer<ffi::S32>> source_offsets,
                      int64_t config, int64_t site, int64_t axis_size) {
  if (result->untyped_data() != output.untyped_data())
    std::memcpy(result->untyped_data(), output.untyped_data(), output.size_bytes());
  std::memset(recv_offsets->typed_data(), 0, sizeof(int32_t) * recv_offsets->element_count());
  std::memset(source_offsets->typed_data(), 0, sizeof(int32_t) * source_offsets->element_count());
  const RaggedSlices slices{input_offsets.typed_data(),
                            send_sizes.typed_data(),
                            output_offsets.typed_data(),
                            recv_sizes.typed_data(),
                            {input_offsets.element_count(), send_sizes.element_count(), output_offsets.element_count(),
                             recv_sizes.element_count()}};
  Contribution c = ragged_contribution(operand, output, slices, rank.typed_data()[0], *result,
                                       recv_offsets->typed_data(), source_offsets->typed_data(), config, axis_size);
  return start(run.run_id, site, group.typed_data()[0], std::move(c));
}

}  // namespace

bool quiesce_handlers(double timeout_s) {
  fail_calls("the process is exiting");
  return collective_threads().quiet(timeout_s);
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(AllToAllVCpu, AllToAllVImpl, bind_all_to_all_v(ffi::Ffi::Bind().Ctx<ffi::RunId>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(AllToAllVIntoCpu, AllToAllVIntoImpl,
                              bind_all_to_all_v_into(ffi::Ffi::Bind().Ctx<ffi::RunId>()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(RaggedAllToAllCpu, RaggedImpl, bind_ragged_all_to_all(ffi::Ffi::Bind().Ctx<ffi::RunId>()));

}  // namespace variopath
