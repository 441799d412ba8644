// The stand-in's test entry points in `_native_cuda_standin` (standin.h; issue 52 item 6), and
// the part of XLA the CUDA handlers meet: an XLA_FFI_Api that answers their context (stream,
// device ordinal, run id) and their errors, and a caller that builds each device's call frame
// (its buffers in the stand-in's device memory, its attributes sorted by name, as XLA passes them)
// and calls the real handler (ffi_cuda.cc) on a host thread per device, as XLA's GPU client does.
#include "standin/bindings.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/check.h"
#include "cuda/cuda_streams.h"
#include "cuda/kernels.h"
#include "ffi_cuda.h"
#include "standin/standin.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;

struct XLA_FFI_Error {
  std::string message;
  XLA_FFI_Error_Code code;
};

struct XLA_FFI_ExecutionContext {
  cudaStream_t stream;
  int32_t device;
  int64_t run;
};

namespace variopath::standin {

namespace {

XLA_FFI_Error* error_create(XLA_FFI_Error_Create_Args* args) {
  return new XLA_FFI_Error{args->message ? args->message : "", args->errc};
}
void error_message(XLA_FFI_Error_GetMessage_Args* args) { args->message = args->error->message.c_str(); }
void error_destroy(XLA_FFI_Error_Destroy_Args* args) { delete args->error; }
XLA_FFI_Error* stream_get(XLA_FFI_Stream_Get_Args* args) {
  args->stream = args->ctx->stream;
  return nullptr;
}
XLA_FFI_Error* run_id_get(XLA_FFI_RunId_Get_Args* args) {
  args->run_id = args->ctx->run;
  return nullptr;
}
XLA_FFI_Error* device_ordinal_get(XLA_FFI_DeviceOrdinal_Get_Args* args) {
  args->device_ordinal = args->ctx->device;
  return nullptr;
}

const XLA_FFI_Api* api() {
  static const XLA_FFI_Api* a = [] {
    auto* x = new XLA_FFI_Api{};
    x->struct_size = XLA_FFI_Api_STRUCT_SIZE;
    x->api_version = {XLA_FFI_Api_Version_STRUCT_SIZE, nullptr, XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
    x->XLA_FFI_Error_Create = error_create;
    x->XLA_FFI_Error_GetMessage = error_message;
    x->XLA_FFI_Error_Destroy = error_destroy;
    x->XLA_FFI_Stream_Get = stream_get;
    x->XLA_FFI_RunId_Get = run_id_get;
    x->XLA_FFI_DeviceOrdinal_Get = device_ordinal_get;
    return x;
  }();
  return a;
}

// The stream XLA would give each device's program: one per device, kept for the process.
cudaStream_t stream_of(int device) {
  static std::mutex mu;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto& s = streams[device];
  if (!s) {
    cudaSetDevice(device);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  }
  return s;
}

struct Array {
  XLA_FFI_DataType dtype;
  std::vector<int64_t> dims;
  std::string bytes;  // args: the contents; rets: empty (allocated)
  int alias = -1;     // rets: the argument it aliases
};

size_t element_bytes(XLA_FFI_DataType t) {
  switch (t) {
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8:
      return 1;
    case XLA_FFI_DataType_S16:
    case XLA_FFI_DataType_U16:
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16:
      return 2;
    case XLA_FFI_DataType_S32:
    case XLA_FFI_DataType_U32:
    case XLA_FFI_DataType_F32:
      return 4;
    default:
      return 8;
  }
}

size_t nbytes_of(const Array& a) {
  size_t n = element_bytes(a.dtype);
  for (int64_t d : a.dims) n *= static_cast<size_t>(d);
  return n;
}

// One device's call: its buffers (in its device's memory), its frame, its outcome.
struct DeviceCall {
  int rank = 0, device = 0;
  std::vector<Array> args, rets;
  std::vector<void*> arg_data, ret_data, owned, snapshots;
  std::vector<XLA_FFI_Buffer> arg_buf, ret_buf;
  std::string error;
  bool drained = false;
};

Array array_of(const nb::handle& h) {
  nb::tuple t = nb::cast<nb::tuple>(h);  // (dtype code, dims, bytes or None, alias)
  Array a;
  a.dtype = static_cast<XLA_FFI_DataType>(nb::cast<int>(t[0]));
  a.dims = nb::cast<std::vector<int64_t>>(t[1]);
  if (!t[2].is_none()) {
    nb::bytes b = nb::cast<nb::bytes>(t[2]);
    a.bytes.assign(b.c_str(), b.size());
  }
  a.alias = t.size() > 3 ? nb::cast<int>(t[3]) : -1;
  return a;
}

XLA_FFI_Handler* handler_of(const std::string& target) {
  if (target == "variopath_all_to_all_v") return AllToAllVCuda;
  if (target == "variopath_all_to_all_v_into") return AllToAllVIntoCuda;
  if (target == "variopath_ragged_all_to_all") return RaggedAllToAllCuda;
  throw nb::value_error(("no CUDA handler " + target).c_str());
}

// Run `target`'s CUDA handler for every call at once, one host thread each, as XLA's GPU client
// runs each local device's program; then wait for each device's stream (at most timeout_s) and
// read the results back. Before each call its stream is kept busy a random time (up to busy_s)
// and then overwrites the results that are not aliased to an argument (a producer still using
// that memory), so a peer that writes before the receiver's stream reached the call, or a call
// that ends before its data arrived, shows as a wrong result.
nb::list call(const std::string& target, int64_t config, int64_t site, int64_t run, int64_t axis_size, nb::list calls, int kind,
              std::vector<int> granted, double timeout_s, double busy_s, uint64_t seed, bool free) {
  XLA_FFI_Handler* handler = handler_of(target);
  std::vector<DeviceCall> dc(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    nb::dict d = nb::cast<nb::dict>(calls[i]);
    dc[i].rank = nb::cast<int>(d["rank"]);
    dc[i].device = nb::cast<int>(d["device"]);
    for (nb::handle a : nb::cast<nb::list>(d["args"])) dc[i].args.push_back(array_of(a));
    for (nb::handle r : nb::cast<nb::list>(d["rets"])) dc[i].rets.push_back(array_of(r));
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> busy(0.0, busy_s);
  {
    nb::gil_scoped_release release;
    for (DeviceCall& c : dc) {
      cudaSetDevice(c.device);
      cudaStream_t stream = stream_of(c.device);
      for (const Array& a : c.args) {
        void* p = allocate(c.device, std::max<size_t>(nbytes_of(a), 1), static_cast<Kind>(kind), granted);
        cudaMemcpy(p, a.bytes.data(), std::min(a.bytes.size(), nbytes_of(a)), cudaMemcpyHostToDevice);
        c.arg_data.push_back(p);
        c.owned.push_back(p);
      }
      void* clock = nullptr;
      cudaMalloc(&clock, sizeof(uint64_t));
      c.owned.push_back(clock);
      cuda::stamp_clock(static_cast<uint64_t*>(clock), stream);
      cuda::hold_until(static_cast<uint64_t*>(clock), static_cast<uint64_t>(busy(rng) * 1e9), stream);
      for (const Array& r : c.rets) {
        void* p = r.alias >= 0 ? c.arg_data.at(r.alias) : nullptr;
        if (!p) {
          p = allocate(c.device, std::max<size_t>(nbytes_of(r), 1), static_cast<Kind>(kind), granted);
          c.owned.push_back(p);
          cudaMemsetAsync(p, 0xAB, nbytes_of(r), stream);
        }
        c.ret_data.push_back(p);
      }
      for (size_t k = 0; k < c.args.size(); ++k)
        c.arg_buf.push_back({XLA_FFI_Buffer_STRUCT_SIZE, nullptr, c.args[k].dtype, c.arg_data[k],
                             static_cast<int64_t>(c.args[k].dims.size()), c.args[k].dims.data()});
      for (size_t k = 0; k < c.rets.size(); ++k)
        c.ret_buf.push_back({XLA_FFI_Buffer_STRUCT_SIZE, nullptr, c.rets[k].dtype, c.ret_data[k],
                             static_cast<int64_t>(c.rets[k].dims.size()), c.rets[k].dims.data()});
    }
    std::vector<std::thread> threads;
    for (DeviceCall& c : dc)
      threads.emplace_back([&c, handler, run, config, site, axis_size] {
        XLA_FFI_ExecutionContext ctx{stream_of(c.device), c.device, run};
        std::vector<XLA_FFI_ArgType> arg_types(c.arg_buf.size(), XLA_FFI_ArgType_BUFFER);
        std::vector<void*> args;
        for (auto& b : c.arg_buf) args.push_back(&b);
        std::vector<XLA_FFI_RetType> ret_types(c.ret_buf.size(), XLA_FFI_RetType_BUFFER);
        std::vector<void*> rets;
        for (auto& b : c.ret_buf) rets.push_back(&b);
        // attributes sorted by name, as XLA passes them
        int64_t values[3] = {axis_size, config, site};
        XLA_FFI_Scalar scalars[3];
        XLA_FFI_ByteSpan names[3] = {{"axis_size", 9}, {"config", 6}, {"site", 4}};
        XLA_FFI_ByteSpan* name_ptrs[3];
        void* attrs[3];
        XLA_FFI_AttrType attr_types[3];
        for (int k = 0; k < 3; ++k) {
          scalars[k] = {XLA_FFI_DataType_S64, &values[k]};
          name_ptrs[k] = &names[k];
          attrs[k] = &scalars[k];
          attr_types[k] = XLA_FFI_AttrType_SCALAR;
        }
        XLA_FFI_CallFrame frame{};
        frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
        frame.api = api();
        frame.ctx = &ctx;
        frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
        frame.args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, static_cast<int64_t>(args.size()), arg_types.data(),
                      args.data()};
        frame.rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, static_cast<int64_t>(rets.size()), ret_types.data(),
                      rets.data()};
        frame.attrs = {XLA_FFI_Attrs_STRUCT_SIZE, nullptr, 3, attr_types, name_ptrs, attrs};
        if (XLA_FFI_Error* err = handler(&frame)) {
          c.error = err->message;
          delete err;
          return;
        }
        // XLA's next operation on the stream, at once: it reads the results (into snapshots,
        // which the test checks). A call that returns before the stream waits for the data
        // coming into its buffers shows as wrong bytes here.
        cudaSetDevice(c.device);
        for (size_t k = 0; k < c.rets.size(); ++k) {
          void* snap = nullptr;
          cudaMalloc(&snap, std::max<size_t>(nbytes_of(c.rets[k]), 1));
          c.owned.push_back(snap);
          c.snapshots.push_back(snap);
          cudaMemcpyAsync(snap, c.ret_data[k], nbytes_of(c.rets[k]), cudaMemcpyDeviceToDevice, ctx.stream);
        }
      });
    for (auto& t : threads) t.join();
    // XLA's next operation follows each stream: wait for it, with a deadline (a wedged device)
    const auto deadline = Clock::now() + seconds_of(timeout_s);
    for (DeviceCall& c : dc) {
      cudaSetDevice(c.device);
      std::string why;
      void* done = cuda::take_event(c.device, why);
      if (done && cudaEventRecord(static_cast<cudaEvent_t>(done), stream_of(c.device)) == cudaSuccess &&
          cuda::poll_event(done, deadline, why) && why.empty()) {
        c.drained = true;
        cuda::give_event(c.device, done);
      } else if (c.error.empty()) {
        c.error = "the stand-in: device " + std::to_string(c.device) + "'s stream did not finish the call within " +
                  std::to_string(timeout_s) + " s" + (why.empty() ? "" : ": " + why);
      }
    }
  }
  nb::list out;
  for (DeviceCall& c : dc) {
    nb::dict r;
    r["rank"] = c.rank;
    r["error"] = c.error;
    r["drained"] = c.drained;
    nb::list rets;
    for (size_t k = 0; k < c.rets.size(); ++k) {
      std::string host(nbytes_of(c.rets[k]), '\0');
      if (c.drained && k < c.snapshots.size())
        cudaMemcpy(host.data(), c.snapshots[k], host.size(), cudaMemcpyDeviceToHost);
      rets.append(nb::bytes(host.data(), host.size()));
    }
    r["rets"] = rets;
    out.append(r);
    if (c.drained && free)  // a stream that never finished may still write them: they stay allocated
      for (void* p : c.owned) release(p);
  }
  return out;
}

}  // namespace

void bind(nb::module_& m) {
  m.def("standin_configure", &configure, nb::arg("devices") = 8, nb::arg("peer") = std::vector<std::vector<bool>>{},
        nb::arg("seed") = 0, nb::arg("max_delay_s") = 0.0, nb::arg("readonly_register") = true,
        "The CPU stand-in for CUDA (tests): the machine it pretends to be (standin.h).");
  m.def("standin_wedge", &wedge, nb::arg("device"), nb::arg("after"),
        "The CPU stand-in: `device`'s streams run `after` more operations, then none (-1: no device).");
  m.def("standin_faults", &faults, "The CPU stand-in: illegal accesses its kernels attempted.");
  m.def("standin_unlink_segments", &unlink_segments,
        "The CPU stand-in: unlink this process's device-memory segments (before os._exit).");
  m.def("standin_counters", &counters, "The CPU stand-in: what its calls did so far, by name (standin.h).");
  m.def("standin_operations", &operations, "The CPU stand-in: stream operations run, per device.");
  m.def("standin_call", &call, nb::arg("target"), nb::arg("config"), nb::arg("site"), nb::arg("run"),
        nb::arg("axis_size"), nb::arg("calls"), nb::arg("kind") = 0, nb::arg("granted") = std::vector<int>{},
        nb::arg("timeout_s") = 30.0, nb::arg("busy_s") = 0.0, nb::arg("seed") = 0,
        nb::arg("free") = true,
        "The CPU stand-in: call a CUDA handler (ffi_cuda.cc) for each of `calls` ({rank, device, args, rets}: "
        "(XLA dtype, dims, bytes or None, alias)) on a thread each, as XLA would; per call {rank, error, drained, "
        "rets}; `free`: release the buffers after (else kept, so that no later buffer reuses an address).");
}

}  // namespace variopath::standin
