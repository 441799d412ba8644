// XLA FFI handler symbols for CPU devices (ffi_cpu.cc), registered by the nanobind module.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace variopath {

XLA_FFI_DECLARE_HANDLER_SYMBOL(AllToAllVCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(RaggedAllToAllCpu);

}  // namespace variopath
