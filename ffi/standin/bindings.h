// The CPU stand-in's entry points in the test module `_native_cuda_standin` (bindings.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace variopath::standin {

void bind(nanobind::module_& m);

}  // namespace variopath::standin
