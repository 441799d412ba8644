// The XLA FFI error code of a collective's failure, from its message: a wait that gave up past its
// deadline (every such message says "timed out after N s") is DEADLINE_EXCEEDED, so JAX raises it
// as a timeout and not as a bad argument; anything else keeps the code its caller chose.
#pragma once

#include <string>

#include "xla/ffi/api/ffi.h"

namespace variopath {

inline xla::ffi::ErrorCode error_code_of(const std::string& message, xla::ffi::ErrorCode otherwise) {
  return message.find("timed out after ") != std::string::npos ? xla::ffi::ErrorCode::kDeadlineExceeded
                                                              : otherwise;
}

}  // namespace variopath
