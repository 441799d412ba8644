#include "cuda/profile_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

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
  const auto ok = [&](cudaError_t status, const char* what) {
    if (status != cudaSuccess && out.error.empty()) out.error = describe(status, what);
    return status == cudaSuccess;
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
  ok(cudaSetDevice(device), "cudaSetDevice");
  for (const auto& r : routes)
    if (r.dst >= 0 && r.dst != device && !r.staged) {
      const cudaError_t status = cudaDeviceEnablePeerAccess(r.dst, 0);
      // without peer access cudaMemcpyPeerAsync still works, through host memory
      if (status != cudaSuccess) cudaGetLastError();
    }
  ok(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking), "cudaStreamCreate") &&
      ok(cudaEventCreate(&start), "cudaEventCreate") && ok(cudaEventCreate(&gate), "cudaEventCreate");
  for (size_t i = 0; i < ts.size() && out.error.empty(); ++i) {
    const ProfileRoute& r = routes[ts[i].route];
    const size_t n = static_cast<size_t>(std::max<int64_t>(ts[i].nbytes, 1));
    ok(cudaMalloc(&b[i].src, n), "cudaMalloc") && ok(cudaMalloc(&b[i].clock, sizeof(uint64_t)), "cudaMalloc") &&
        ok(cudaStreamCreateWithFlags(&b[i].stream, cudaStreamNonBlocking), "cudaStreamCreate") &&
        ok(cudaEventCreate(&b[i].end), "cudaEventCreate");
    if (r.staged || r.dst < 0) ok(cudaMallocHost(&b[i].host, n), "cudaMallocHost");
    if (r.dst >= 0) {
      ok(cudaSetDevice(r.dst), "cudaSetDevice") && ok(cudaMalloc(&b[i].dst, n), "cudaMalloc");
      ok(cudaSetDevice(device), "cudaSetDevice");
    }
  }
  ok(cudaEventRecord(start, launch), "cudaEventRecord");
  cudaEvent_t step_start = start;
  for (size_t first = 0; first < ts.size() && out.error.empty();) {
    size_t last = first;
    while (last < ts.size() && ts[last].step == ts[first].step) ++last;
    if (first > 0) {  // the barrier: the host saw the previous step complete
      for (size_t i = 0; i < first; ++i)
        if (!wait(b[i].end)) break;
      ok(cudaEventRecord(gate, launch), "cudaEventRecord");
      step_start = gate;
    }
    for (size_t i = first; i < last && out.error.empty(); ++i) {
      const ProfileRoute& r = routes[ts[i].route];
      cudaStream_t s = b[i].stream;
      ok(cudaStreamWaitEvent(s, step_start, 0), "cudaStreamWaitEvent");
      if (ts[i].after >= 0) ok(cudaStreamWaitEvent(s, b[ts[i].after].end, 0), "cudaStreamWaitEvent");
      const int64_t chunk = ts[i].cap > 0 ? kChunk : std::max<int64_t>(ts[i].nbytes, 1);
      if (ts[i].cap > 0) ok(stamp_clock(b[i].clock, s), "stamp_clock");
      for (int64_t at = 0, j = 0; at < ts[i].nbytes && out.error.empty(); at += chunk, ++j) {
        const size_t n = static_cast<size_t>(std::min(chunk, ts[i].nbytes - at));
        if (ts[i].cap > 0 && j > 0)
          ok(hold_until(b[i].clock, static_cast<uint64_t>(at / ts[i].cap * 1e9), s), "hold_until");
        if (r.dst < 0) {
          ok(cudaMemcpyAsync(b[i].host + at, b[i].src + at, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
        } else if (r.staged) {
          ok(cudaMemcpyAsync(b[i].host + at, b[i].src + at, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync") &&
              ok(cudaMemcpyAsync(b[i].dst + at, b[i].host + at, n, cudaMemcpyDefault, s), "cudaMemcpyAsync");
        } else {
          ok(cudaMemcpyPeerAsync(b[i].dst + at, r.dst, b[i].src + at, device, n, s), "cudaMemcpyPeerAsync");
        }
      }
      ok(cudaEventRecord(b[i].end, s), "cudaEventRecord");
    }
    first = last;
  }
  for (auto& x : b)
    if (x.end && !wait(x.end)) break;
  if (out.error.empty()) {
    for (auto& x : b) {
      float ms = 0;
      ok(cudaEventElapsedTime(&ms, start, x.end), "cudaEventElapsedTime");
      out.ends.push_back(ms * 1e-3);
    }
  }
  // a transfer still running at a timeout keeps its buffers: freeing them under it is unsafe
  const bool drained = std::all_of(b.begin(), b.end(), [](const Buffers& x) {
    return !x.end || cudaEventQuery(x.end) != cudaErrorNotReady;
  });
  if (!drained) return out;
  for (auto& x : b) {
    cudaFree(x.src);
    cudaFree(x.dst);
    cudaFree(x.clock);
    cudaFreeHost(x.host);
    if (x.stream) cudaStreamDestroy(x.stream);
    if (x.end) cudaEventDestroy(x.end);
  }
  if (launch) cudaStreamDestroy(launch);
  if (start) cudaEventDestroy(start);
  if (gate) cudaEventDestroy(gate);
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
  const auto ok = [&](cudaError_t status, const char* what) {
    if (status != cudaSuccess && out.error.empty()) out.error = describe(status, what);
    return status == cudaSuccess;
  };
  const auto deadline = Clock::now() + seconds_of(timeout_s);
  std::vector<Flow> f(flows.size());
  // peer access for the issuing device of every flow, to the other one
  for (size_t i = 0; i < flows.size() && out.error.empty(); ++i) {
    const TriggerFlow& t = flows[i];
    f[i].device = t.pull ? t.dst : t.src;
    const int peer = t.pull ? t.src : t.dst;
    int can = 0;
    if (!ok(cudaDeviceCanAccessPeer(&can, f[i].device, peer), "cudaDeviceCanAccessPeer")) break;
    if (!can) {
      out.error = "device " + std::to_string(f[i].device) + " cannot access device " + std::to_string(peer) +
                  " peer to peer: the trigger probe needs P2P between the GPUs it measures";
      break;
    }
    ok(cudaSetDevice(f[i].device), "cudaSetDevice");
    const cudaError_t status = cudaDeviceEnablePeerAccess(peer, 0);
    if (status == cudaErrorPeerAccessAlreadyEnabled)
      cudaGetLastError();
    else
      ok(status, "cudaDeviceEnablePeerAccess");
  }
  for (size_t i = 0; i < flows.size() && out.error.empty(); ++i) {
    const TriggerFlow& t = flows[i];
    const size_t n = static_cast<size_t>(std::max<int64_t>(t.nbytes, 1));
    ok(cudaSetDevice(t.src), "cudaSetDevice") && ok(cudaMalloc(&f[i].src, n), "cudaMalloc");
    ok(cudaSetDevice(t.dst), "cudaSetDevice") && ok(cudaMalloc(&f[i].dst, n), "cudaMalloc");
    ok(cudaSetDevice(f[i].device), "cudaSetDevice") &&
        ok(cudaStreamCreateWithFlags(&f[i].stream, cudaStreamNonBlocking), "cudaStreamCreate") &&
        ok(cudaEventCreate(&f[i].start), "cudaEventCreate") && ok(cudaEventCreate(&f[i].end), "cudaEventCreate");
  }
  // the gate: a hold of kGateNs on the first flow's issuing device; every flow waits for it
  const int gate_device = f[0].device;
  cudaStream_t launch = nullptr;
  cudaEvent_t gate = nullptr;
  uint64_t* clock = nullptr;
  ok(cudaSetDevice(gate_device), "cudaSetDevice") &&
      ok(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking), "cudaStreamCreate") &&
      ok(cudaEventCreateWithFlags(&gate, cudaEventDisableTiming), "cudaEventCreate") &&
      ok(cudaMalloc(&clock, sizeof(uint64_t)), "cudaMalloc") && ok(stamp_clock(clock, launch), "stamp_clock") &&
      ok(hold_until(clock, kGateNs, launch), "hold_until") && ok(cudaEventRecord(gate, launch), "cudaEventRecord");
  for (size_t i = 0; i < flows.size() && out.error.empty(); ++i) {
    const Segment segment{f[i].src, f[i].dst, flows[i].nbytes};
    ok(cudaSetDevice(f[i].device), "cudaSetDevice") &&
        ok(cudaStreamWaitEvent(f[i].stream, gate, 0), "cudaStreamWaitEvent") &&
        ok(cudaEventRecord(f[i].start, f[i].stream), "cudaEventRecord") &&
        ok(batched_copy(&segment, flows[i].nbytes > 0 ? 1 : 0, f[i].stream), "batched_copy") &&
        ok(cudaEventRecord(f[i].end, f[i].stream), "cudaEventRecord");
  }
  // every flow must have been enqueued before the gate opened, or they did not start together
  if (out.error.empty() && gate && cudaEventQuery(gate) != cudaErrorNotReady)
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
      ok(cudaEventElapsedTime(&ms, x.start, x.end), "cudaEventElapsedTime");
      out.ends.push_back(ms * 1e-3);
    }
  // a flow still running at a timeout keeps its buffers: freeing them under it is unsafe
  const bool drained = std::all_of(f.begin(), f.end(), [](const Flow& x) {
    return !x.end || cudaEventQuery(x.end) != cudaErrorNotReady;
  });
  if (!drained) return out;
  for (auto& x : f) {
    cudaFree(x.src);
    cudaFree(x.dst);
    if (x.stream) cudaStreamDestroy(x.stream);
    if (x.start) cudaEventDestroy(x.start);
    if (x.end) cudaEventDestroy(x.end);
  }
  if (launch) cudaStreamDestroy(launch);
  if (gate) cudaEventDestroy(gate);
  cudaFree(clock);
  return out;
}

}  // namespace variopath::cuda
