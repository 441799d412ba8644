// XLA FFI handler symbols for CUDA devices (ffi_cuda.cc), registered by the nanobind module
// when the CUDA parts are built.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace variopath {

XLA_FFI_DECLARE_HANDLER_SYMBOL(AllToAllVCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(AllToAllVIntoCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(RaggedAllToAllCuda);

}  // namespace variopath
