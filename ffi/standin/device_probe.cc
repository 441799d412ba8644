// The CUDA device probe (cuda/device_probe.cu: runtime calls only, no kernel) compiled by the
// host compiler against the stand-in's runtime, for the test module.
#include "cuda/device_probe.cu"
