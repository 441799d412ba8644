#include "cuda/profile_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/cuda_streams.h"
#include "cuda/kernels.h"

namespace variopath::cuda {

namespace {

constexpr int64_t kChunk = 1 << 20;  // bytes per paced chunk

struct Buffers {
  uint8_t* src = nullptr;
  uint8_t* host = nullptr;  // pinned: the staging, or the destination of a route to host memory
  uint8_t* dst = nullptr;
  uint64_t* clock = nullptr;  // the GPU clock when the transfer's first chunk began
  cudaStream_t stream = nullptr;
  cudaEvent_t end = nullptr;
};

}  // namespace

ProfileRun profile_run(const std::vector<ProfileRoute>& routes, const std::vector<ExperimentTransfer>& ts,
                       double timeout_s) {
  ProfileRun out;
  out.error = check_experiment(ts, routes.size());
  if (!out.error.empty() || ts.empty()) return out;
  const int device = routes[ts[0].route].src;
  for (const auto& t : ts)
    if (routes[t.route].src != device) out.error = "every transfer of one experiment must leave one device";
  if (!out.error.empty()) return out;
  const auto ok = [&](const Status& s) {
    if (!s.ok() && out.error.empty()) out.error = s.message;
    return s.ok();
  };
  const auto deadline =
      Clock::now() + seconds_of(timeout_s);
  const auto wait = [&](cudaEvent_t e) {
    if (!poll_event(e, deadline, out.error) && out.error.empty())
      out.error = "a transfer did not complete within " + std::to_string(timeout_s) + " s";
    return out.error.empty();
  };
  std::vector<Buffers> b(ts.size());
  cudaStream_t launch = nullptr;
  cudaEvent_t start = nullptr, gate = nullptr;
  ok(VP_CUDA(cudaSetDevice(device)));
  for (const auto& r : routes)
    if (r.dst >= 0 && r.dst != device && !r.staged) {
      // without peer access cudaMemcpyPeerAsync still works, through host memory (the failure is cleared)
      VP_CUDA(cudaDeviceEnablePeerAccess(r.dst, 0));
    }
  ok(VP_CUDA(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking))) &&
      ok(VP_CUDA(cudaEventCreate(&start))) && ok(VP_CUDA(cudaEventCreate(&gate)));
  for (size_t i = 0; i < ts.size() && out.error.empty(); ++i) {
    const ProfileRoute& r = routes[ts[i].route];
    const size_t n = static_cast<size_t>(std::max<int64_t>(ts[i].nbytes, 1));
    ok(VP_CUDA(cudaMalloc(&b[i].src, n))) && ok(VP_CUDA(cudaMalloc(&b[i].clock, sizeof(uint64_t)))) &&
        ok(VP_CUDA(cudaStreamCreateWithFlags(&b[i].stream, cudaStreamNonBlocking))) &&
        ok(VP_CUDA(cudaEventCreate(&b[i].end)));
    if (r.staged || r.dst < 0) ok(VP_CUDA(cudaMallocHost(&b[i].host, n)));
    if (r.dst >= 0) {
      ok(VP_CUDA(cudaSetDevice(r.dst))) && ok(VP_CUDA(cudaMalloc(&b[i].dst, n)));
      ok(VP_CUDA(cudaSetDevice(device)));
    }
  }
  ok(VP_CUDA(cudaEventRecord(start, launch)));
  cudaEvent_t step_start = start;
  for (size_t first = 0; first < ts.size() && out.error.empty();) {
    size_t last = first;
    while (last < ts.size() && ts[last].step == ts[first].step) ++last;
    if (first > 0) {  // the barrier: the host saw the previous step complete
      for (size_t i = 0; i < first; ++i)
        if (!wait(b[i].end)) break;
      ok(VP_CUDA(cudaEventRecord(gate, launch)));
      step_start = gate;
    }
    for (size_t i = first; i < last && out.error.empty(); ++i) {
      const ProfileRoute& r = routes[ts[i].route];
      cudaStream_t s = b[i].stream;
      ok(VP_CUDA(cudaStreamWaitEvent(s, step_start, 0)));
      if (ts[i].after >= 0) ok(VP_CUDA(cudaStreamWaitEvent(s, b[ts[i].after].end, 0)));
      const int64_t chunk = ts[i].cap > 0 ? kChunk : std::max<int64_t>(ts[i].nbytes, 1);
      if (ts[i].cap > 0) ok(stamp_clock(b[i].clock, s));
      for (int64_t at = 0, j = 0; at < ts[i].nbytes && out.error.empty(); at += chunk, ++j) {
        const size_t n = static_cast<size_t>(std::min(chunk, ts[i].nbytes - at));
        if (ts[i].cap > 0 && j > 0)
          ok(hold_until(b[i].clock, static_cast<uint64_t>(at / ts[i].cap * 1e9), s));
        if (r.dst < 0) {
          ok(VP_CUDA(cudaMemcpyAsync(b[i].host + at, b[i].src + at, n, cudaMemcpyDeviceToHost, s)));
        } else if (r.staged) {
          ok(VP_CUDA(cudaMemcpyAsync(b[i].host + at, b[i].src + at, n, cudaMemcpyDeviceToHost, s))) &&
              ok(VP_CUDA(cudaMemcpyAsync(b[i].dst + at, b[i].host + at, n, cudaMemcpyDefault, s)));
        } else {
          ok(VP_CUDA(cudaMemcpyPeerAsync(b[i].dst + at, r.dst, b[i].src + at, device, n, s)));
        }
      }
      ok(VP_CUDA(cudaEventRecord(b[i].end, s)));
    }
    first = last;
  }
  for (auto& x : b)
    if (x.end && !wait(x.end)) break;
  if (out.error.empty()) {
    for (auto& x : b) {
      float ms = 0;
      ok(VP_CUDA(cudaEventElapsedTime(&ms, start, x.end)));
      out.ends.push_back(ms * 1e-3);
    }
  }
  // a transfer still running at a timeout keeps its buffers: freeing them under it is unsafe
  const bool drained = std::all_of(b.begin(), b.end(), [](const Buffers& x) {
    return !x.end || !VP_CUDA(cudaEventQuery(x.end)).not_ready();
  });
  if (!drained) return out;
  for (auto& x : b) {
    VP_CUDA(cudaFree(x.src));
    VP_CUDA(cudaFree(x.dst));
    VP_CUDA(cudaFree(x.clock));
    VP_CUDA(cudaFreeHost(x.host));
    if (x.stream) VP_CUDA(cudaStreamDestroy(x.stream));
    if (x.end) VP_CUDA(cudaEventDestroy(x.end));
  }
  if (launch) VP_CUDA(cudaStreamDestroy(launch));
  if (start) VP_CUDA(cudaEventDestroy(start));
  if (gate) VP_CUDA(cudaEventDestroy(gate));
  return out;
}

namespace {

constexpr uint64_t kGateNs = 20'000'000;  // the gate's hold: the host enqueues every flow within it

struct Flow {
  int device = 0;  // the issuing device
  uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
};

}  // namespace

ProfileRun trigger_run(const std::vector<TriggerFlow>& flows, double timeout_s) {
  ProfileRun out;
  if (flows.empty()) return out;
  for (size_t i = 0; i < flows.size() && out.error.empty(); ++i)
    if (flows[i].src == flows[i].dst || flows[i].src < 0 || flows[i].dst < 0 || flows[i].nbytes < 0)
      out.error = "flow " + std::to_string(i) + ": need two different devices and nbytes >= 0";
  if (!out.error.empty()) return out;
  const auto ok = [&](const Status& s) {
    if (!s.ok() && out.error.empty()) out.error = s.message;
    return s.ok();
  };
  const auto deadline = Clock::now() + seconds_of(timeout_s);
  std::vector<Flow> f(flows.size());
  // peer access for the issuing device of every flow, to the other one
  for (size_t i = 0; i < flows.size() && out.error.empty(); ++i) {
    const TriggerFlow& t = flows[i];
    f[i].device = t.pull ? t.dst : t.src;
    const int peer = t.pull ? t.src : t.dst;
    int can = 0;
    if (!ok(VP_CUDA(cudaDeviceCanAccessPeer(&can, f[i].device, peer)))) break;
    if (!can) {
      out.error = "device " + std::to_string(f[i].device) + " cannot access device " + std::to_string(peer) +
                  " peer to peer: the trigger probe needs P2P between the GPUs it measures";
      break;
    }
    ok(VP_CUDA(cudaSetDevice(f[i].device)));
    const Status enabled = VP_CUDA(cudaDeviceEnablePeerAccess(peer, 0));
    if (enabled.code != cudaErrorPeerAccessAlreadyEnabled) ok(enabled);
  }
  for (size_t i = 0; i < flows.size() && out.error.empty(); ++i) {
    const TriggerFlow& t = flows[i];
    const size_t n = static_cast<size_t>(std::max<int64_t>(t.nbytes, 1));
    ok(VP_CUDA(cudaSetDevice(t.src))) && ok(VP_CUDA(cudaMalloc(&f[i].src, n)));
    ok(VP_CUDA(cudaSetDevice(t.dst))) && ok(VP_CUDA(cudaMalloc(&f[i].dst, n)));
    ok(VP_CUDA(cudaSetDevice(f[i].device))) &&
        ok(VP_CUDA(cudaStreamCreateWithFlags(&f[i].stream, cudaStreamNonBlocking))) &&
        ok(VP_CUDA(cudaEventCreate(&f[i].start))) && ok(VP_CUDA(cudaEventCreate(&f[i].end)));
  }
  // the gate: a hold of kGateNs on the first flow's issuing device; every flow waits for it
  const int gate_device = f[0].device;
  cudaStream_t launch = nullptr;
  cudaEvent_t gate = nullptr;
  uint64_t* clock = nullptr;
  ok(VP_CUDA(cudaSetDevice(gate_device))) &&
      ok(VP_CUDA(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking))) &&
      ok(VP_CUDA(cudaEventCreateWithFlags(&gate, cudaEventDisableTiming))) &&
      ok(VP_CUDA(cudaMalloc(&clock, sizeof(uint64_t)))) && ok(stamp_clock(clock, launch)) &&
      ok(hold_until(clock, kGateNs, launch)) && ok(VP_CUDA(cudaEventRecord(gate, launch)));
  for (size_t i = 0; i < flows.size() && out.error.empty(); ++i) {
    const Segment segment{f[i].src, f[i].dst, flows[i].nbytes};
    ok(VP_CUDA(cudaSetDevice(f[i].device))) &&
        ok(VP_CUDA(cudaStreamWaitEvent(f[i].stream, gate, 0))) &&
        ok(VP_CUDA(cudaEventRecord(f[i].start, f[i].stream))) &&
        ok(batched_copy(&segment, flows[i].nbytes > 0 ? 1 : 0, f[i].stream)) &&
        ok(VP_CUDA(cudaEventRecord(f[i].end, f[i].stream)));
  }
  // every flow must have been enqueued before the gate opened, or they did not start together
  if (out.error.empty() && gate && !VP_CUDA(cudaEventQuery(gate)).not_ready())
    out.error = "the gate opened before every flow was enqueued (the host took over " +
                std::to_string(kGateNs / 1'000'000) + " ms): the flows did not start together";
  for (auto& x : f)
    if (x.end && !poll_event(x.end, deadline, out.error)) {
      if (out.error.empty()) out.error = "a flow did not complete within " + std::to_string(timeout_s) + " s";
      break;
    }
  if (out.error.empty())
    for (auto& x : f) {
      float ms = 0;
      ok(VP_CUDA(cudaEventElapsedTime(&ms, x.start, x.end)));
      out.ends.push_back(ms * 1e-3);
    }
  // a flow still running at a timeout keeps its buffers: freeing them under it is unsafe
  const bool drained = std::all_of(f.begin(), f.end(), [](const Flow& x) {
    return !x.end || !VP_CUDA(cudaEventQuery(x.end)).not_ready();
  });
  if (!drained) return out;
  for (auto& x : f) {
    VP_CUDA(cudaFree(x.src));
    VP_CUDA(cudaFree(x.dst));
    if (x.stream) VP_CUDA(cudaStreamDestroy(x.stream));
    if (x.start) VP_CUDA(cudaEventDestroy(x.start));
    if (x.end) VP_CUDA(cudaEventDestroy(x.end));
  }
  if (launch) VP_CUDA(cudaStreamDestroy(launch));
  if (gate) VP_CUDA(cudaEventDestroy(gate));
  VP_CUDA(cudaFree(clock));
  return out;
}

}  // namespace variopath::cuda
