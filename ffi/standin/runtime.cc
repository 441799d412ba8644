// The CPU stand-in for the CUDA runtime (standin.h, include/cuda_runtime.h; issue 52 item 6).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda.h"
#include "cuda_runtime.h"
#include "cuda/kernels.h"
#include "cuda/copy_split.h"
#include "standin/standin.h"

namespace variopath::standin {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

// ----- memory ------------------------------------------------------------------------------------

enum class Where : int { kDevice, kPinned, kRegistered, kIpc };

struct Pool {
  int device = -1;
  std::map<int, cudaMemAccessFlags> access;  // granted to other devices
};

struct Alloc {
  size_t size = 0;
  Where where = Where::kDevice;
  Kind kind = Kind::kPlain;
  int device = -1;                // the owner (kDevice, kIpc: the exporter's device)
  int opened_on = -1;             // kIpc: the device that opened it
  Pool* pool = nullptr;           // kPool
  std::vector<int> vmm_granted;   // kVmm: devices mapped read-write besides the owner
  std::string shm;                // kDevice: its segment's name (for IPC); kIpc: the peer's
  bool readonly = false;          // kRegistered with cudaHostRegisterReadOnly
};

struct Event;

// One stream: a thread running its operations in order.
struct Stream {
  int device = -1;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;
  int64_t enqueued = 0, done = 0;
  std::mt19937_64 rng;
};

struct Event {
  int device = -1;
  bool timing = true;
  std::mutex mu;
  std::condition_variable cv;
  int64_t recorded = 0, completed = 0;  // records enqueued, and the latest one that ran
  uint64_t at_ns = 0;                   // when the latest record ran
};

struct Device {
  cudaError_t sticky = cudaSuccess;
  std::vector<bool> enabled;  // peer access enabled from this device to each
  int64_t wedge_after = -1;   // its streams run this many more operations, then stop (-1: never)
  Pool pool;                  // its default stream-ordered pool
};

struct State {
  std::mutex mu;
  int devices = 8;
  std::vector<std::vector<bool>> peer;
  uint64_t seed = 0;
  double max_delay_s = 0;
  bool readonly_register = true;
  std::vector<Device> device;
  std::map<uintptr_t, Alloc> allocs;  // by base address
  std::vector<Stream*> streams;
  std::vector<std::string> faults;
  std::atomic<int64_t> serial{0};
  std::vector<int64_t> operations;
  std::map<std::string, int64_t> counters;  // calls by what they did (counters())
};

State& state() {
  static State* s = [] {  // never destroyed: stream threads may outlive static destruction
    auto* st = new State;
    st->device.resize(st->devices);
    for (auto& d : st->device) d.enabled.assign(st->devices, false);
    st->operations.assign(st->devices, 0);
    return st;
  }();
  return *s;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;

void count_of(const char* what) {
  std::lock_guard<std::mutex> lock(state().mu);
  ++state().counters[what];
}

std::atomic<int64_t> not_ready_polls{0};  // cudaEventQuery answered cudaErrorNotReady

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) t_last = e;
  return e;
}

// With state().mu: the allocation holding [p, p + n), or null.
Alloc* find(const void* p, size_t n, uintptr_t* base = nullptr) {
  State& s = state();
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = s.allocs.upper_bound(at);
  if (it == s.allocs.begin()) return nullptr;
  --it;
  if (at + n > it->first + it->second.size || at < it->first) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

// With state().mu: whether a kernel on `device` may read (write: store into) [p, p + n); else
// why not.
std::string kernel_access(int device, const void* p, size_t n, bool write) {
  if (n == 0) return "";
  State& s = state();
  const Alloc* a = find(p, n);
  char where[96];
  std::snprintf(where, sizeof where, "%s %zu bytes at %p", write ? "a store of" : "a load of", n, p);
  if (!a) return std::string(where) + " outside every allocation (pageable host memory or out of bounds)";
  switch (a->where) {
    case Where::kPinned:
      return "";
    case Where::kRegistered:
      return write && a->readonly ? std::string(where) + " into read-only registered host memory" : "";
    case Where::kIpc:
      if (a->opened_on == device) return "";
      return std::string(where) + ": an IPC mapping opened on device " + std::to_string(a->opened_on) +
             ", not device " + std::to_string(device);
    case Where::kDevice:
      break;
  }
  if (a->device == device) return "";
  const std::string whose = std::string(where) + " in device " + std::to_string(a->device) + "'s ";
  switch (a->kind) {
    case Kind::kPlain:
      if (s.device[device].enabled[a->device]) return "";
      return whose + "cudaMalloc memory without peer access enabled from device " + std::to_string(device);
    case Kind::kPool: {
      const auto g = a->pool->access.find(device);
      const int flags = g == a->pool->access.end() ? 0 : g->second;
      if (flags == cudaMemAccessFlagsProtReadWrite || (!write && flags == cudaMemAccessFlagsProtRead)) return "";
      return whose + "pool memory its pool does not grant device " + std::to_string(device);
    }
    case Kind::kVmm:
      if (std::count(a->vmm_granted.begin(), a->vmm_granted.end(), device)) return "";
      return whose + "VMM memory not mapped for device " + std::to_string(device);
  }
  return whose + "memory";
}

// A segment of shared memory of `bytes` (at least one page), its name in `name`.
void* shared_segment(size_t bytes, std::string& name) {
  State& s = state();
  char buf[64];
  std::snprintf(buf, sizeof buf, "/vp-standin-%d-%lld", static_cast<int>(getpid()),
                static_cast<long long>(s.serial++));
  const int fd = shm_open(buf, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(std::max<size_t>(bytes, 1))) != 0) {
    close(fd);
    shm_unlink(buf);
    return nullptr;
  }
  void* p = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(buf);
    return nullptr;
  }
  name = buf;
  return p;
}

// Remove every segment this process still has at exit (a test process's device memory).
void unlink_all() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& [base, a] : s.allocs)
    if (a.where == Where::kDevice && !a.shm.empty()) shm_unlink(a.shm.c_str());
}

// ----- streams -----------------------------------------------------------------------------------

void run_stream(Stream* st) {
  State& s = state();
  std::uniform_real_distribution<double> delay(0.0, 1.0);
  for (;;) {
    std::function<void()> op;
    {
      std::unique_lock<std::mutex> lock(st->mu);
      st->cv.wait(lock, [&] { return !st->ops.empty(); });
      op = std::move(st->ops.front());
      st->ops.pop_front();
    }
    double max_delay = 0;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      Device& d = s.device[st->device];
      if (d.wedge_after == 0) {  // wedged: this and every later operation never run
        lock.unlock();
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }
      if (d.wedge_after > 0) --d.wedge_after;
      max_delay = s.max_delay_s;
    }
    if (max_delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(max_delay * delay(st->rng)));
    op();
    {
      std::lock_guard<std::mutex> lock(s.mu);
      ++s.operations[st->device];
    }
    {
      std::lock_guard<std::mutex> lock(st->mu);
      ++st->done;
    }
    st->cv.notify_all();
  }
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> op) {
  auto* st = reinterpret_cast<Stream*>(stream);
  if (!st) return fail(cudaErrorInvalidResourceHandle);  // the legacy default stream is not modeled
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (const cudaError_t e = state().device[st->device].sticky; e != cudaSuccess) return fail(e);
  }
  {
    std::lock_guard<std::mutex> lock(st->mu);
    st->ops.push_back(std::move(op));
    ++st->enqueued;
  }
  st->cv.notify_all();
  return cudaSuccess;
}

int device_of(cudaStream_t stream) { return reinterpret_cast<Stream*>(stream)->device; }

// A kernel of `device`: its accesses checked first; an illegal one makes the device's error
// sticky (later calls on it fail) and is kept for the test, and the kernel does nothing.
bool kernel_may(int device, const std::vector<std::string>& why) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const std::string& w : why)
    if (!w.empty()) {
      s.device[device].sticky = cudaErrorIllegalAddress;
      s.faults.push_back("device " + std::to_string(device) + ": illegal address: " + w);
      return false;
    }
  return true;
}

// A copy by the copy engines (cudaMemcpy*): any device or registered memory, and pageable host
// memory; the ranges must lie inside their allocations where they are in one.
cudaError_t check_copy_range(const void* p, size_t n) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = s.allocs.upper_bound(at);
  if (it == s.allocs.begin()) return cudaSuccess;
  --it;
  if (at >= it->first + it->second.size) return cudaSuccess;  // pageable host memory
  return at + n <= it->first + it->second.size ? cudaSuccess : cudaErrorInvalidValue;
}

bool pageable(const void* p) {
  std::lock_guard<std::mutex> lock(state().mu);
  return find(p, 1) == nullptr;
}

// ----- the driver's entry points -------------------------------------------------------------------

CUresult standin_cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const Alloc* a = find(reinterpret_cast<const void*>(ptr), 1);
  if (!a || (a->where != Where::kDevice && a->where != Where::kIpc)) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<CUmemoryPool*>(data) = a->kind == Kind::kPool ? reinterpret_cast<CUmemoryPool>(a->pool) : nullptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *static_cast<int*>(data) = a->kind == Kind::kPlain ? 1 : 0;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult standin_cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const Alloc* a = find(reinterpret_cast<const void*>(ptr), 1);
  if (!a || a->where != Where::kDevice || a->kind != Kind::kVmm) return CUDA_ERROR_INVALID_VALUE;
  const bool rw = location->id == a->device ||
                  std::count(a->vmm_granted.begin(), a->vmm_granted.end(), location->id);
  *flags = rw ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return CUDA_SUCCESS;
}

struct Registered {
  Registered() { std::atexit(unlink_all); }
};
Registered g_registered;

}  // namespace

// ----- control (standin.h) ------------------------------------------------------------------------

void configure(int devices, const std::vector<std::vector<bool>>& peer, uint64_t seed, double max_delay_s,
               bool readonly_register) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (devices < static_cast<int>(s.device.size())) devices = static_cast<int>(s.device.size());  // never shrinks
  s.devices = devices;
  s.peer = peer;
  s.seed = seed;
  s.max_delay_s = max_delay_s;
  s.readonly_register = readonly_register;
  s.device.resize(devices);
  s.operations.resize(devices, 0);
  for (int d = 0; d < devices; ++d) {
    s.device[d].enabled.assign(devices, false);
    s.device[d].pool.device = d;
  }
}

void wedge(int device, int64_t after) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (int d = 0; d < s.devices; ++d) s.device[d].wedge_after = d == device ? after : -1;
}

std::vector<std::string> faults() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().faults;
}

std::map<std::string, int64_t> counters() {
  std::lock_guard<std::mutex> lock(state().mu);
  auto out = state().counters;
  out["event_not_ready"] = not_ready_polls.load();
  return out;
}

std::vector<int64_t> operations() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().operations;
}

void* allocate(int device, size_t bytes, Kind kind, const std::vector<int>& granted) {
  State& s = state();
  std::string name;
  void* p = shared_segment(bytes, name);
  if (!p) return nullptr;
  std::lock_guard<std::mutex> lock(s.mu);
  Alloc a;
  a.size = std::max<size_t>(bytes, 1);
  a.device = device;
  a.kind = kind;
  a.shm = name;
  if (kind == Kind::kPool) {
    // a pool of its own per grant set: the pool's access is what the decision reads
    auto* pool = new Pool;  // kept for the process (a pool outlives its allocations)
    pool->device = device;
    for (int g : granted) pool->access[g] = cudaMemAccessFlagsProtReadWrite;
    a.pool = pool;
  } else if (kind == Kind::kVmm) {
    a.vmm_granted = granted;
  }
  s.allocs[reinterpret_cast<uintptr_t>(p)] = a;
  return p;
}

void release(void* ptr) { cudaFree(ptr); }

void unlink_segments() { unlink_all(); }

}  // namespace variopath::standin

// ----- the runtime API ------------------------------------------------------------------------------

using namespace variopath::standin;  // NOLINT: the definitions below are the C API

namespace {

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported",
     "peer access is not supported between these two devices"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText& text_of(cudaError_t e) {
  for (const ErrorText& t : kErrors)
    if (t.code == e) return t;
  return kErrors[sizeof kErrors / sizeof kErrors[0] - 1];
}

cudaError_t sticky_of(int device) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().device[device].sticky;
}

bool valid_device(int d) {
  std::lock_guard<std::mutex> lock(state().mu);
  return d >= 0 && d < state().devices;
}

// Wait until every operation enqueued on `st` so far has run.
void drain(Stream* st) {
  std::unique_lock<std::mutex> lock(st->mu);
  const int64_t target = st->enqueued;
  st->cv.wait(lock, [&] { return st->done >= target; });
}

}  // namespace

extern "C" {

const char* cudaGetErrorName(cudaError_t error) { return text_of(error).name; }
const char* cudaGetErrorString(cudaError_t error) { return text_of(error).text; }

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last; }

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  std::lock_guard<std::mutex> lock(state().mu);
  *count = state().devices;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "VarioPath CPU stand-in GPU %d", device);
  for (int i = 0; i < 16; ++i) prop->uuid.bytes[i] = static_cast<char>(i == 15 ? device : 0x5a);
  prop->totalGlobalMem = size_t(16) << 30;
  prop->major = 9;
  prop->multiProcessorCount = 132;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* bus, int len, int device) {
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  std::snprintf(bus, static_cast<size_t>(len), "00000000:%02X:00.0", 0x18 + device);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  const int d = t_device;
  std::vector<Stream*> mine;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    for (Stream* st : state().streams)
      if (st->device == d) mine.push_back(st);
  }
  for (Stream* st : mine) drain(st);
  return fail(sticky_of(d));
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  if (!valid_device(device) || !valid_device(peer)) return fail(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> lock(state().mu);
  const auto& p = state().peer;
  *can = device != peer && (p.empty() || p[device][peer]) ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int) {
  const int d = t_device;
  if (!valid_device(peer) || peer == d) return fail(cudaErrorInvalidDevice);
  std::lock_guard<std::mutex> lock(state().mu);
  State& s = state();
  if (!(s.peer.empty() || s.peer[d][peer])) return fail(cudaErrorPeerAccessUnsupported);
  if (s.device[d].enabled[peer]) return fail(cudaErrorPeerAccessAlreadyEnabled);
  s.device[d].enabled[peer] = true;
  ++s.counters["peer_access_enabled"];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (const cudaError_t e = sticky_of(t_device); e != cudaSuccess) return fail(e);
  *ptr = allocate(t_device, size, Kind::kPlain, {});
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaMallocAsync(void** ptr, size_t size, cudaStream_t stream) {
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  *ptr = allocate(device_of(stream), size, Kind::kPool, {});
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) { return cudaFree(ptr); }

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.allocs.end() || it->second.where != Where::kDevice) return fail(cudaErrorInvalidValue);
  munmap(ptr, it->second.size);
  shm_unlink(it->second.shm.c_str());
  s.allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, 256, std::max<size_t>(size, 1)) != 0) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(state().mu);
  Alloc a;
  a.size = std::max<size_t>(size, 1);
  a.where = Where::kPinned;
  state().allocs[reinterpret_cast<uintptr_t>(p)] = a;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == state().allocs.end() || it->second.where != Where::kPinned) return fail(cudaErrorInvalidValue);
  state().allocs.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int flags) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if ((flags & cudaHostRegisterReadOnly) && !s.readonly_register) {
    ++s.counters["host_register_refused"];
    return fail(cudaErrorNotSupported);
  }
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& [base, a] : s.allocs)
    if (base < at + size && at < base + a.size) return fail(cudaErrorHostMemoryAlreadyRegistered);
  Alloc a;
  a.size = size;
  a.where = Where::kRegistered;
  a.readonly = (flags & cudaHostRegisterReadOnly) != 0;
  s.allocs[at] = a;
  ++s.counters["host_register"];
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == state().allocs.end() || it->second.where != Where::kRegistered)
    return fail(cudaErrorHostMemoryNotRegistered);
  state().allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  std::lock_guard<std::mutex> lock(state().mu);
  std::memset(attributes, 0, sizeof *attributes);
  attributes->device = -2;
  const Alloc* a = find(ptr, 1);
  if (!a) {
    attributes->type = cudaMemoryTypeUnregistered;
    return cudaSuccess;
  }
  if (a->where == Where::kDevice || a->where == Where::kIpc) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = a->device;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = t_device;
    attributes->hostPointer = const_cast<void*>(ptr);
    attributes->devicePointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAccess(enum cudaMemAccessFlags* flags, cudaMemPool_t pool, struct cudaMemLocation* location) {
  auto* p = reinterpret_cast<Pool*>(pool);
  if (!p || !location || location->type != cudaMemLocationTypeDevice) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(state().mu);
  if (location->id == p->device) {
    *flags = cudaMemAccessFlagsProtReadWrite;
  } else {
    const auto it = p->access.find(location->id);
    *flags = it == p->access.end() ? cudaMemAccessFlagsProtNone : it->second;
  }
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const struct cudaMemAccessDesc* descs, size_t count) {
  auto* p = reinterpret_cast<Pool*>(pool);
  if (!p) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(state().mu);
  for (size_t i = 0; i < count; ++i) p->access[descs[i].location.id] = descs[i].flags;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind) {
  if (check_copy_range(dst, count) != cudaSuccess || check_copy_range(src, count) != cudaSuccess)
    return fail(cudaErrorInvalidValue);
  if (const cudaError_t e = sticky_of(t_device); e != cudaSuccess) return fail(e);
  if (count) std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind, cudaStream_t stream) {
  if (check_copy_range(dst, count) != cudaSuccess || check_copy_range(src, count) != cudaSuccess)
    return fail(cudaErrorInvalidValue);
  if (count == 0) return cudaSuccess;
  if (pageable(src)) {  // the driver stages a pageable source before the call returns: it may be freed after
    auto staged = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                         static_cast<const uint8_t*>(src) + count);
    return enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  }
  if (pageable(dst)) {  // into pageable memory: the call returns once the copy is done
    if (const cudaError_t e = enqueue(stream, [dst, src, count] { std::memmove(dst, src, count); }); e != cudaSuccess)
      return e;
    drain(reinterpret_cast<Stream*>(stream));
    return cudaSuccess;
  }
  return enqueue(stream, [dst, src, count] { std::memmove(dst, src, count); });
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t count,
                                cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(state().mu);
    const Alloc* d = find(dst, count);
    const Alloc* s = find(src, count);
    const auto on = [](const Alloc* a, int device) {
      return a && (a->where == Where::kDevice || a->where == Where::kIpc) && a->device == device;
    };
    if (count && (!on(d, dst_device) || !on(s, src_device))) return fail(cudaErrorInvalidValue);
  }
  if (count == 0) return cudaSuccess;
  count_of("peer_copy");
  return enqueue(stream, [dst, src, count] { std::memmove(dst, src, count); });
}

cudaError_t cudaMemset(void* ptr, int value, size_t count) {
  if (check_copy_range(ptr, count) != cudaSuccess) return fail(cudaErrorInvalidValue);
  std::memset(ptr, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  {
    std::lock_guard<std::mutex> lock(state().mu);
    const std::string why = kernel_access(device_of(stream), ptr, count, true);
    if (!why.empty()) return fail(cudaErrorInvalidValue);
  }
  return enqueue(stream, [ptr, value, count] { std::memset(ptr, value, count); });
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  auto* st = new Stream;  // never freed: its thread runs for the process
  st->device = t_device;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    st->rng.seed(state().seed * 1000003 + state().streams.size());
    state().streams.push_back(st);
  }
  std::thread(run_stream, st).detach();
  *stream = reinterpret_cast<cudaStream_t>(st);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return stream ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);  // its work still runs; the thread stays
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!stream) return fail(cudaErrorInvalidResourceHandle);
  drain(reinterpret_cast<Stream*>(stream));
  return fail(sticky_of(device_of(stream)));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  auto* e = reinterpret_cast<Event*>(event);
  if (!stream || !e) return fail(cudaErrorInvalidResourceHandle);
  int64_t target;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    target = e->recorded;  // the record enqueued before this call (none: the wait is a no-op)
  }
  if (target == 0) return cudaSuccess;
  return enqueue(stream, [e, target] {
    std::unique_lock<std::mutex> lock(e->mu);
    e->cv.wait(lock, [&] { return e->completed >= target; });
  });
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  auto* e = new Event;  // never freed: a wait enqueued on it may still run after its destruction
  e->device = t_device;
  e->timing = !(flags & cudaEventDisableTiming);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) { return event ? cudaSuccess : fail(cudaErrorInvalidResourceHandle); }

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto* e = reinterpret_cast<Event*>(event);
  if (!e || !stream) return fail(cudaErrorInvalidResourceHandle);
  if (e->device != device_of(stream)) return fail(cudaErrorInvalidResourceHandle);  // as CUDA: one device
  int64_t gen;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    gen = ++e->recorded;
  }
  const cudaError_t r = enqueue(stream, [e, gen] {
    {
      std::lock_guard<std::mutex> lock(e->mu);
      e->completed = std::max(e->completed, gen);
      e->at_ns = now_ns();
    }
    e->cv.notify_all();
  });
  if (r != cudaSuccess) {
    std::lock_guard<std::mutex> lock(e->mu);
    --e->recorded;
  }
  return r;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  auto* e = reinterpret_cast<Event*>(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (const cudaError_t s = sticky_of(e->device); s != cudaSuccess) return fail(s);
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->completed >= e->recorded) return cudaSuccess;
  ++not_ready_polls;
  return fail(cudaErrorNotReady);  // NotReady stays as the thread's last error, as CUDA leaves it
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  auto* e = reinterpret_cast<Event*>(event);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> lock(e->mu);
  e->cv.wait(lock, [&] { return e->completed >= e->recorded; });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  auto* a = reinterpret_cast<Event*>(start);
  auto* b = reinterpret_cast<Event*>(end);
  if (!a || !b || !a->timing || !b->timing) return fail(cudaErrorInvalidResourceHandle);
  std::scoped_lock lock(a->mu, b->mu);
  if (a->completed < a->recorded || b->completed < b->recorded) return fail(cudaErrorNotReady);
  *ms = static_cast<float>((static_cast<double>(b->at_ns) - static_cast<double>(a->at_ns)) / 1e6);
  return cudaSuccess;
}

// An IPC handle: the exporting process, its device, the segment's name and size.
struct IpcHandle {
  char magic[8];
  int32_t pid;
  int32_t device;
  uint64_t size;
  char name[40];
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t), "an IPC handle fits CUDA's");

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* ptr) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().allocs.find(reinterpret_cast<uintptr_t>(ptr));
  // legacy IPC exports the base of cudaMalloc memory only (not pool or VMM memory)
  if (it == state().allocs.end() || it->second.where != Where::kDevice || it->second.kind != Kind::kPlain)
    return fail(cudaErrorInvalidValue);
  IpcHandle h{};
  std::memcpy(h.magic, "VPSTNDN", 8);
  h.pid = static_cast<int32_t>(getpid());
  h.device = it->second.device;
  h.size = it->second.size;
  std::snprintf(h.name, sizeof h.name, "%s", it->second.shm.c_str());
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &h, sizeof h);
  ++state().counters["ipc_export"];
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** ptr, cudaIpcMemHandle_t handle, unsigned int) {
  IpcHandle h;
  std::memcpy(&h, handle.reserved, sizeof h);
  if (std::memcmp(h.magic, "VPSTNDN", 8) != 0) return fail(cudaErrorInvalidValue);
  if (h.pid == static_cast<int32_t>(getpid())) return fail(cudaErrorInvalidValue);  // not within one process
  const int d = t_device;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    const auto& p = state().peer;
    if (h.device != d && !(p.empty() || p[d][h.device])) return fail(cudaErrorPeerAccessUnsupported);
  }
  const int fd = shm_open(h.name, O_RDWR, 0600);
  if (fd < 0) return fail(cudaErrorInvalidValue);  // freed by its owner
  void* p = mmap(nullptr, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(state().mu);
  Alloc a;
  a.size = h.size;
  a.where = Where::kIpc;
  a.device = h.device;
  a.opened_on = d;
  a.shm = h.name;
  state().allocs[reinterpret_cast<uintptr_t>(p)] = a;
  ++state().counters["ipc_open"];
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* ptr) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().allocs.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == state().allocs.end() || it->second.where != Where::kIpc) return fail(cudaErrorInvalidValue);
  munmap(ptr, it->second.size);
  state().allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int, unsigned long long,
                                             enum cudaDriverEntryPointQueryResult* status) {
  *fn = nullptr;
  if (std::strcmp(symbol, "cuPointerGetAttribute") == 0)
    *fn = reinterpret_cast<void*>(&standin_cuPointerGetAttribute);
  else if (std::strcmp(symbol, "cuMemGetAccess") == 0)
    *fn = reinterpret_cast<void*>(&standin_cuMemGetAccess);
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* status) {
  return cudaGetDriverEntryPointByVersion(symbol, fn, 12000, flags, status);
}

}  // extern "C"

// ----- the kernels' host twins (cuda/kernels.h) ------------------------------------------------------

namespace variopath::cuda {

namespace {

// The threads of a launch over `largest` bytes, as kernels.cu sizes its grid (256 per block).
int64_t threads_for(int64_t largest) {
  const int64_t words = (largest + 15) / 16;
  const int64_t blocks = words / 256 + 1 < 1024 ? words / 256 + 1 : 1024;
  return blocks * 256;
}

Status launch(cudaStream_t stream, const char* kernel, std::vector<std::string> why, std::function<void()> body) {
  clear_last_error();  // check.h's, as VP_LAUNCH does before a launch
  // the rule of check.h broken: the error of an earlier call (a poll's cudaErrorNotReady) would
  // be read back as this launch's own
  if (t_last != cudaSuccess) count_of("launch_saw_stale_error");
  count_of(kernel);
  if (!stream) {
    t_last = cudaErrorInvalidResourceHandle;
    return launched(kernel);
  }
  const int device = device_of(stream);
  const cudaError_t e = enqueue(stream, [device, why = std::move(why), body = std::move(body)] {
    if (kernel_may(device, why)) body();
  });
  if (e != cudaSuccess) t_last = e;
  return launched(kernel);
}

std::string access_of(cudaStream_t stream, const void* p, int64_t n, bool write) {
  if (!stream) return "";
  std::lock_guard<std::mutex> lock(state().mu);
  return kernel_access(device_of(stream), p, static_cast<size_t>(n), write);
}

}  // namespace

Status batched_copy(const Segment* segments, int count, cudaStream_t stream) {
  if (count <= 0) return {};
  if (count > kMaxSegments) return status_of(cudaErrorInvalidValue, "more segments than one launch carries");
  std::vector<Segment> batch(segments, segments + count);
  std::vector<std::string> why;
  int64_t largest = 0;
  for (const Segment& s : batch) {
    why.push_back(access_of(stream, s.src, s.nbytes, false));
    why.push_back(access_of(stream, s.dst, s.nbytes, true));
    largest = std::max(largest, s.nbytes);
  }
  const int64_t threads = threads_for(largest);
  return launch(stream, "batched_copy_kernel", std::move(why), [batch, threads] {
    for (const Segment& s : batch)
      for (int64_t t = 0; t < threads; ++t) copy_part(s.src, s.dst, s.nbytes, t, threads);
  });
}

Status paced_copy(const PacedSegment* segments, int count, cudaStream_t stream) {
  if (count <= 0) return {};
  if (count > kMaxSegments) return status_of(cudaErrorInvalidValue, "more segments than one launch carries");
  std::vector<PacedSegment> batch(segments, segments + count);
  std::vector<std::string> why;
  for (const PacedSegment& s : batch) {
    why.push_back(access_of(stream, s.src, s.nbytes, false));
    why.push_back(access_of(stream, s.dst, s.nbytes, true));
    if (s.start) why.push_back(access_of(stream, s.start, sizeof(uint64_t), false));
  }
  return launch(stream, "paced_copy_kernel", std::move(why), [batch] {
    for (const PacedSegment& s : batch)
      for (int64_t offset = 0; offset < s.nbytes; offset += kPacedChunk) {
        if (s.start) {
          const uint64_t due = *s.start + static_cast<uint64_t>(static_cast<double>(s.before + offset) * s.ns_per_byte);
          while (now_ns() < due) std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        const int64_t nbytes = std::min<int64_t>(kPacedChunk, s.nbytes - offset);
        for (int64_t t = 0; t < 256; ++t) copy_part(s.src + offset, s.dst + offset, nbytes, t, 256);
      }
  });
}

Status stamp_clock(uint64_t* slot, cudaStream_t stream) {
  return launch(stream, "stamp_kernel", {access_of(stream, slot, sizeof(uint64_t), true)},
                [slot] { *slot = now_ns(); });
}

Status hold_until(const uint64_t* slot, uint64_t hold_ns, cudaStream_t stream) {
  return launch(stream, "hold_kernel", {access_of(stream, slot, sizeof(uint64_t), false)}, [slot, hold_ns] {
    const uint64_t until = *slot + hold_ns;
    while (now_ns() < until) std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
}

}  // namespace variopath::cuda
