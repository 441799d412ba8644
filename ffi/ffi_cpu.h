// XLA FFI handler symbols for CPU devices (ffi_cpu.cc), registered by the nanobind module.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace variopath {

XLA_FFI_DECLARE_HANDLER_SYMBOL(AllToAllVCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllToAllVIntoCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(RaggedAllToAllCpu);

// At interpreter exit (jax_ops/__init__.py registers it): fail the in-process calls in flight and
// wait, at most `timeout_s`, until no collective runs on the handlers' threads, so that none of
// them touches XLA's runtime or this module's state while they are torn down. Whether they all
// ended; the threads left idle wait on the pool alone, which is never destroyed.
bool quiesce_handlers(double timeout_s);

}  // namespace variopath
