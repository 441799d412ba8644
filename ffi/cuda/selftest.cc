#include "cuda/selftest.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "collective.h"
#include "cuda/check.h"
#include "cuda/cuda_streams.h"
#include "cuda/host_staging.h"
#include "cuda/ipc.h"
#include "cuda/kernels.h"

namespace variopath::cuda {

namespace {

// How long a check's host wait gives up after (a blocking synchronise waits forever on a stalled GPU).
constexpr double kCheckTimeout_s = 120.0;

// Wait until `event` (recorded) completed, polling against kCheckTimeout_s. "" or the error.
std::string await(cudaEvent_t event, const char* what) {
  std::string why;
  const auto deadline =
      Clock::now() + seconds_of(kCheckTimeout_s);
  if (!poll_event(event, deadline, why))
    return "timed out after " + std::to_string(kCheckTimeout_s) + " s waiting for " + what + " (the GPU is stalled)";
  return why;
}

// Wait until everything enqueued on `stream` so far completed (await). "" or the error.
std::string synchronize(cudaStream_t stream) {
  cudaEvent_t done = nullptr;
  Status s = VP_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  if (s.ok()) s = VP_CUDA(cudaEventRecord(done, stream));
  const std::string err = s.ok() ? await(done, "a stream") : s.message;
  if (done) VP_CUDA(cudaEventDestroy(done));  // released once complete, if it is not yet
  return err;
}

// The byte rank `r` holds at input position `i` (so every received byte names its origin).
uint8_t pattern(size_t r, int64_t i) { return static_cast<uint8_t>((r * 131 + i * 7 + (i >> 8)) & 0xff); }

// Random host delays before each transfer a rank sends (a TransferHook is a plain function).
std::mutex g_delay_mu;
std::mt19937_64 g_delay_rng;
double g_max_delay_s = 0;

void random_delay(int32_t, int64_t) {
  double d;
  {
    std::lock_guard<std::mutex> lock(g_delay_mu);
    d = std::uniform_real_distribution<double>(0.0, g_max_delay_s)(g_delay_rng);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(d));
}

struct RankBuffers {
  cudaStream_t stream = nullptr;
  uint8_t *input = nullptr, *output = nullptr;
  int32_t* recv_counts = nullptr;
  uint64_t* clock = nullptr;
  int64_t input_rows = 0, output_rows = 0;

  RankBuffers() = default;
  RankBuffers(const RankBuffers&) = delete;
  RankBuffers& operator=(const RankBuffers&) = delete;
  ~RankBuffers() {
    if (stream && !synchronize(stream).empty()) return;  // the stream may still use them: they stay
    VP_CUDA(cudaFree(input));
    VP_CUDA(cudaFree(output));
    VP_CUDA(cudaFree(recv_counts));
    VP_CUDA(cudaFree(clock));
    if (stream) VP_CUDA(cudaStreamDestroy(stream));
  }
};

// Rank `r`'s all_to_all_v contribution over its buffers: counts[r][j] rows to each rank j.
Contribution contribution_of(const RankBuffers& b, int64_t config, size_t r,
                             const std::vector<std::vector<int32_t>>& counts, int64_t row_bytes, int device) {
  Contribution c;
  c.rank = static_cast<int32_t>(r);
  c.config = config;
  c.axis_size = static_cast<int64_t>(counts.size());
  c.row_bytes = row_bytes;
  c.input = b.input;
  c.input_rows = b.input_rows;
  c.output = b.output;
  c.output_rows = b.output_rows;
  c.recv_counts = b.recv_counts;
  c.device = device;
  c.stream = b.stream;
  int64_t row = 0;
  for (size_t j = 0; j < counts.size(); ++j) {
    c.slices.push_back({static_cast<int32_t>(j), row, counts[r][j], -1});
    row += counts[r][j];
  }
  return c;
}

// Rank `r`'s buffers on the current device: its input (a pattern of its own), its output with one
// row past what arrives (the transport zeroes it), its counts and a clock word. "" or the error.
std::string allocate(RankBuffers& b, size_t r, const std::vector<std::vector<int32_t>>& counts, int64_t row_bytes) {
  const size_t n = counts.size();
  for (size_t j = 0; j < n; ++j) {
    b.input_rows += counts[r][j];
    b.output_rows += counts[j][r];
  }
  b.output_rows += 1;
  std::vector<uint8_t> host(b.input_rows * row_bytes);
  for (size_t i = 0; i < host.size(); ++i) host[i] = pattern(r, static_cast<int64_t>(i));
  std::string error;
  const auto ok = [&](const Status& s) {
    if (!s.ok()) error = s.message;
    return s.ok();
  };
  ok(VP_CUDA(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking))) &&
      ok(VP_CUDA(cudaMalloc(&b.input, std::max<int64_t>(host.size(), 1)))) &&
      ok(VP_CUDA(cudaMalloc(&b.output, b.output_rows * row_bytes))) &&
      ok(VP_CUDA(cudaMalloc(&b.recv_counts, n * sizeof(int32_t)))) &&
      ok(VP_CUDA(cudaMalloc(&b.clock, sizeof(uint64_t)))) &&
      ok(VP_CUDA(cudaMemcpy(b.input, host.data(), host.size(), cudaMemcpyHostToDevice)));
  return error;
}

// Bytes of rank `r`'s result (after its stream) that differ from what it should hold: the rows
// from each source in source order, then zeros, and the received counts. Sets `error` when a copy
// back fails.
int64_t wrong_bytes_of(const RankBuffers& b, size_t r, const std::vector<std::vector<int32_t>>& counts,
                       int64_t row_bytes, std::string& error) {
  const size_t n = counts.size();
  std::vector<uint8_t> got(b.output_rows * row_bytes);
  std::vector<int32_t> got_counts(n);
  const auto ok = [&](const Status& s) {
    if (!s.ok() && error.empty()) error = s.message;
  };
  if (const std::string err = synchronize(b.stream); !err.empty() && error.empty()) error = err;
  ok(VP_CUDA(cudaMemcpy(got.data(), b.output, got.size(), cudaMemcpyDeviceToHost)));
  ok(VP_CUDA(cudaMemcpy(got_counts.data(), b.recv_counts, n * sizeof(int32_t), cudaMemcpyDeviceToHost)));
  int64_t at = 0, wrong = 0;
  for (size_t src = 0; src < n; ++src) {
    int64_t first = 0;
    for (size_t j = 0; j < r; ++j) first += counts[src][j];
    for (int64_t i = 0; i < counts[src][r] * row_bytes; ++i) wrong += got[at++] != pattern(src, first * row_bytes + i);
    wrong += got_counts[src] != counts[src][r] ? int64_t(sizeof(int32_t)) : 0;
  }
  for (; at < static_cast<int64_t>(got.size()); ++at) wrong += got[at] != 0;
  return wrong;
}

}  // namespace

ThreadsResult exchange_on_one_gpu(int64_t config, int64_t site, const std::vector<std::vector<int32_t>>& counts,
                                  int64_t row_bytes, int device, uint64_t seed, double max_delay_s, int rounds) {
  const size_t n = counts.size();
  ThreadsResult out;
  out.errors.assign(n, "");
  std::vector<RankBuffers> ranks(n);
  std::string setup;
  if (const Status s = VP_CUDA(cudaSetDevice(device)); !s.ok()) setup = s.message;
  for (size_t r = 0; r < n && setup.empty(); ++r) setup = allocate(ranks[r], r, counts, row_bytes);
  {
    std::lock_guard<std::mutex> lock(g_delay_mu);
    g_delay_rng.seed(seed);
    g_max_delay_s = max_delay_s;
  }
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::uniform_real_distribution<double> busy(0.0, max_delay_s);
  static std::atomic<int64_t> runs{int64_t(1) << 40};  // run ids of their own, apart from XLA's
  set_transfer_hook(max_delay_s > 0 ? random_delay : nullptr);
  for (int round = 0; round < rounds && setup.empty(); ++round, ++out.rounds) {
    const int64_t run = runs++;
    std::vector<double> busy_ns(n);
    for (auto& b : busy_ns) b = busy(rng) * 1e9;
    std::vector<std::thread> threads;
    for (size_t r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        RankBuffers& b = ranks[r];
        // a producer still busy with this rank's output memory, then writing it
        for (const Status& s : {VP_CUDA(cudaSetDevice(device)), stamp_clock(b.clock, b.stream),
                                hold_until(b.clock, static_cast<uint64_t>(busy_ns[r]), b.stream),
                                VP_CUDA(cudaMemsetAsync(b.output, 0xAB, b.output_rows * row_bytes, b.stream)),
                                VP_CUDA(cudaMemsetAsync(b.recv_counts, 0xFF, n * sizeof(int32_t), b.stream))})
          if (!s.ok() && out.errors[r].empty()) out.errors[r] = s.message;
        std::string why;
        void* entry = take_event(device, why);
        if (!entry || !out.errors[r].empty()) {
          if (out.errors[r].empty()) out.errors[r] = why;
          if (entry) give_event(device, entry);
          return;
        }
        if (const Status s = VP_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(entry), b.stream)); !s.ok()) {
          out.errors[r] = s.message;
          give_event(device, entry);
          return;
        }
        Contribution c = contribution_of(b, config, r, counts, row_bytes, device);
        c.entry = entry;
        const std::string err = run_collective(run, site, 0, std::move(c));
        give_event(device, entry);
        if (!err.empty()) out.errors[r] = err;
      });
    for (auto& t : threads) t.join();
    for (size_t r = 0; r < n && setup.empty(); ++r) out.wrong_bytes += wrong_bytes_of(ranks[r], r, counts, row_bytes, setup);
  }
  set_transfer_hook(nullptr);
  if (!setup.empty()) out.errors.assign(n, setup);
  return out;
}

ProcessResult process_exchange(int64_t config, int64_t site, int32_t rank,
                               const std::vector<std::vector<int32_t>>& counts, int64_t row_bytes, int device,
                               uint64_t seed, double max_delay_s, int rounds) {
  const size_t n = counts.size(), me = static_cast<size_t>(rank);
  ProcessResult out;
  const auto cfg = find_config(config);
  const bool host = cfg && cfg->transport == Transport::kCudaHost;
  RankBuffers b;
  if (me >= n) {
    out.error = "rank " + std::to_string(rank) + " is outside the " + std::to_string(n) + " ranks of counts";
    return out;
  }
  if (const Status s = VP_CUDA(cudaSetDevice(device)); !s.ok())
    out.error = s.message;
  else
    out.error = allocate(b, me, counts, row_bytes);
  std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * (me + 1)));
  std::uniform_real_distribution<double> busy(0.0, max_delay_s);
  for (int round = 0; round < rounds && out.error.empty(); ++round, ++out.rounds) {
    // a producer still busy with this rank's output memory, then writing it
    for (const Status& s : {stamp_clock(b.clock, b.stream),
                            hold_until(b.clock, static_cast<uint64_t>(busy(rng) * 1e9), b.stream),
                            VP_CUDA(cudaMemsetAsync(b.output, 0xAB, b.output_rows * row_bytes, b.stream)),
                            VP_CUDA(cudaMemsetAsync(b.recv_counts, 0xFF, n * sizeof(int32_t), b.stream))})
      if (!s.ok() && out.error.empty()) out.error = s.message;
    if (!out.error.empty()) break;
    Contribution c = contribution_of(b, config, me, counts, row_bytes, device);
    const std::string err =
        host ? run_host_collective(round, site, 0, std::move(c)) : run_ipc_collective(round, site, 0, std::move(c));
    if (!err.empty()) {
      out.error = "round " + std::to_string(round) + ": " + err;
      break;
    }
    out.wrong_bytes += wrong_bytes_of(b, me, counts, row_bytes, out.error);
  }
  return out;
}

CopyBandwidth copy_bandwidth(int device, int64_t nbytes, int segments, int iterations, int64_t row_bytes) {
  CopyBandwidth out;
  if (segments < 1 || segments > kMaxSegments || nbytes < segments || iterations < 1 || row_bytes < 0 ||
      (row_bytes > 0 && nbytes / row_bytes < 4 + segments)) {
    out.error = "need 1 <= segments <= " + std::to_string(kMaxSegments) +
                ", nbytes >= segments (and, with rows, at least segments + 4 rows), iterations >= 1";
    return out;
  }
  uint8_t *src = nullptr, *dst = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  const auto ok = [&](const Status& s) {
    if (!s.ok() && out.error.empty()) out.error = s.message;
    return s.ok();
  };
  const auto synchronized = [&](cudaStream_t s) {
    const std::string err = synchronize(s);
    if (!err.empty() && out.error.empty()) out.error = err;
    return err.empty();
  };
  if (ok(VP_CUDA(cudaSetDevice(device))) && ok(VP_CUDA(cudaMalloc(&src, nbytes))) &&
      ok(VP_CUDA(cudaMalloc(&dst, nbytes))) && ok(VP_CUDA(cudaStreamCreate(&stream))) &&
      ok(VP_CUDA(cudaEventCreate(&start))) && ok(VP_CUDA(cudaEventCreate(&stop)))) {
    std::vector<Segment> parts;
    if (row_bytes == 0) {
      const int64_t each = nbytes / segments / 16 * 16;  // aligned segments, the last takes the rest
      for (int s = 0; s < segments; ++s)
        parts.push_back({src + s * each, dst + s * each, s + 1 < segments ? each : nbytes - s * each});
    } else {
      const int64_t rows = nbytes / row_bytes - 3, each = rows / segments;  // the last takes the rest
      for (int s = 0; s < segments; ++s)
        parts.push_back({src + (1 + s * each) * row_bytes, dst + (3 + s * each) * row_bytes,
                         (s + 1 < segments ? each : rows - s * each) * row_bytes});
    }
    for (const Segment& s : parts) out.nbytes += s.nbytes;
    const auto time = [&](auto&& launch) {
      launch();  // warm-up
      ok(VP_CUDA(cudaEventRecord(start, stream)));
      for (int i = 0; i < iterations; ++i) launch();
      ok(VP_CUDA(cudaEventRecord(stop, stream)));
      float ms = 0;
      const std::string err = await(stop, "the timed copies");
      if (!err.empty() && out.error.empty()) out.error = err;
      err.empty() && ok(VP_CUDA(cudaEventElapsedTime(&ms, start, stop)));
      return ms > 0 ? double(out.nbytes) * iterations / (ms * 1e-3) / 1e9 : 0.0;
    };
    // first, that it copies: a pattern through one launch, every byte of the destination compared
    std::vector<uint8_t> pat(nbytes), want(nbytes, 0), got(nbytes);
    for (int64_t i = 0; i < nbytes; ++i) pat[i] = pattern(static_cast<size_t>(segments), i);
    for (const Segment& s : parts)
      std::memcpy(want.data() + (s.dst - dst), pat.data() + (s.src - src), static_cast<size_t>(s.nbytes));
    ok(VP_CUDA(cudaMemcpy(src, pat.data(), nbytes, cudaMemcpyHostToDevice))) &&
        ok(VP_CUDA(cudaMemset(dst, 0, nbytes))) &&
        ok(batched_copy(parts.data(), segments, stream)) && synchronized(stream) &&
        ok(VP_CUDA(cudaMemcpy(got.data(), dst, nbytes, cudaMemcpyDeviceToHost)));
    if (out.error.empty() && got != want) out.error = "batched_copy wrote wrong bytes";
    out.batched_gbs = time([&] { ok(batched_copy(parts.data(), segments, stream)); });
    out.memcpy_gbs = time(
        [&] { ok(VP_CUDA(cudaMemcpyAsync(dst, src, out.nbytes, cudaMemcpyDeviceToDevice, stream))); });
  }
  if (stream && !synchronized(stream)) return out;  // the stream may still use them: they stay
  VP_CUDA(cudaFree(src));
  VP_CUDA(cudaFree(dst));
  if (start) VP_CUDA(cudaEventDestroy(start));
  if (stop) VP_CUDA(cudaEventDestroy(stop));
  if (stream) VP_CUDA(cudaStreamDestroy(stream));
  return out;
}

}  // namespace variopath::cuda
