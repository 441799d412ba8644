#include "nccl/loader.h"

#include <dlfcn.h>

#include <mutex>

namespace variopath::nccl {

namespace {

std::mutex g_mu;
Api* g_api = nullptr;  // leaked: the library stays open for the process

template <typename Fn>
bool resolve(void* handle, const char* name, Fn& out, std::string& missing) {
  out = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!out && missing.empty()) missing = name;
  return out != nullptr;
}

std::string result_name(Result r) {
  switch (r) {
    case kSuccess: return "ncclSuccess";
    case kUnhandledCudaError: return "ncclUnhandledCudaError";
    case kSystemError: return "ncclSystemError";
    case kInternalError: return "ncclInternalError";
    case kInvalidArgument: return "ncclInvalidArgument";
    case kInvalidUsage: return "ncclInvalidUsage";
    case kRemoteError: return "ncclRemoteError";
    case kInProgress: return "ncclInProgress";
  }
  return "ncclResult " + std::to_string(static_cast<int>(r));
}

}  // namespace

std::string version_string(int code) {
  // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

const Api* load(const std::string& path, std::string& error) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_api) return g_api;
  const std::string name = path.empty() ? "libnccl.so.2" : path;
  dlerror();
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    error = "cannot load NCCL from " + name + ": " + (why ? why : "dlopen failed") +
            (path.empty() ? " (install nvidia-nccl-cu12 or nvidia-nccl-cu13, or set VARIOPATH_NCCL_LIBRARY)"
                          : "");
    return nullptr;
  }
  Api api;
  std::string missing;
  resolve(handle, "ncclGetVersion", api.GetVersion, missing);
  resolve(handle, "ncclGetUniqueId", api.GetUniqueId, missing);
  resolve(handle, "ncclCommInitRankConfig", api.CommInitRankConfig, missing);
  resolve(handle, "ncclCommDestroy", api.CommDestroy, missing);
  resolve(handle, "ncclCommAbort", api.CommAbort, missing);
  resolve(handle, "ncclCommGetAsyncError", api.CommGetAsyncError, missing);
  resolve(handle, "ncclGetErrorString", api.GetErrorString, missing);
  resolve(handle, "ncclGetLastError", api.GetLastError, missing);
  resolve(handle, "ncclGroupStart", api.GroupStart, missing);
  resolve(handle, "ncclGroupEnd", api.GroupEnd, missing);
  resolve(handle, "ncclSend", api.Send, missing);
  resolve(handle, "ncclRecv", api.Recv, missing);
  resolve(handle, "ncclAllGather", api.AllGather, missing);
  if (api.GetVersion && api.GetVersion(&api.version) != kSuccess) api.version = 0;
  const std::string found = api.version ? " (version " + version_string(api.version) + ")" : "";
  if (!missing.empty() || api.version < kMinVersion) {
    error = "NCCL at " + name + found + " is unusable: " +
            (missing.empty() ? std::string("the NCCL transport needs version ") + version_string(kMinVersion) +
                                   " or newer (non-blocking communicators)"
                             : "it has no symbol " + missing + "; the NCCL transport needs version " +
                                   version_string(kMinVersion) + " or newer");
    dlclose(handle);
    return nullptr;
  }
  api.path = name;
  g_api = new Api(api);
  return g_api;
}

const Api* loaded() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_api;
}

std::string describe(const Api& api, Result result, const char* what, Comm comm) {
  const char* text = api.GetErrorString(result);
  std::string out = std::string(what) + ": " + result_name(result) + " (" + (text ? text : "no description") + ")";
  const char* last = api.GetLastError(comm);  // NCCL's last error message (its comm is unused)
  if (last && *last) out += ": " + std::string(last);
  return out;
}

}  // namespace variopath::nccl
