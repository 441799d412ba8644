#!/usr/bin/env bash
# First contact with one GPU (issue 52; `make gpu-check`): in under 6 minutes, everything one GPU
# can tell about the CUDA transports, each step's output under "$OUT" (a fresh directory when
# unset) and one STEP line per step, the last line the verdict `GPU FIRST: PASS|FAIL`.
#
#   facts     GPU, driver, MIG mode, compute capability, CUDA/nvcc, Python, jax/jaxlib versions
#   build     the package for this GPU's architecture only, with this machine's python3 (the GPU
#             image has scikit-build-core, nanobind, jax and nvcc; nothing is fetched)
#   kernels   the batched copy on aligned segments and on rows of 2, 6, 12 and 14 bytes (odd
#             rows: heads, tails and shifted loads), under `compute-sanitizer --tool memcheck`
#             where it exists
#   ordering  8 thread-ranks on one GPU, each with its own stream, random delays on the host and
#             the streams, every execution mode (stream/event ordering: a missing wait is a
#             wrong byte)
#   checks    benchmarks/gpu_check.py --quick: every other check in a process of its own with its
#             own timeout, among them cuda-ipc and cuda-host between two processes on this GPU
#
# `--platform cpu` is the dry run on a machine without a GPU (the test suite runs it): the same
# steps where they can run, on what the CPU has: the facts it can read, the installed .venv
# module instead of a build, the kernels' per-thread code on the host (batched_copy_on_host) over
# the same rows, the 8 thread-ranks on the stream emulator, and the checks gpu_check runs on CPU
# devices. What one GPU cannot exercise, and
# how to run that on a machine with several: scripts/README.md.
set -uo pipefail
cd "$(dirname "$0")/.."
PLATFORM=gpu
while [ $# -gt 0 ]; do
  case "$1" in
    --platform) PLATFORM=${2:-}; shift 2 ;;
    --platform=*) PLATFORM=${1#*=}; shift ;;
    *) echo "usage: $0 [--platform gpu|cpu]" >&2; exit 2 ;;
  esac
done
[ "$PLATFORM" = gpu ] || [ "$PLATFORM" = cpu ] || { echo "--platform is gpu or cpu" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
if [ "$PLATFORM" = cpu ]; then
  export JAX_PLATFORMS=cpu
  PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
else
  PY=${PYTHON:-python3}
fi
BUDGET=${GPU_FIRST_BUDGET_S:-330}  # every step's timeout comes out of it: the script ends in time
START=$(date +%s)
FAILED=()

# step NAME LIMIT_S COMMAND...: run it with at most LIMIT_S (and what is left of the budget),
# its output in $OUT/NAME.log; exit 0 PASS, 3 SKIP, else FAIL (with the log's tail).
step() {
  local name=$1 limit=$2 left t0 code
  shift 2
  left=$(( BUDGET - ($(date +%s) - START) ))
  (( limit > left )) && limit=$left
  if (( limit < 5 )); then
    echo "STEP $name: FAIL no time left of the ${BUDGET} s budget"; FAILED+=("$name"); return
  fi
  t0=$(date +%s)
  # the steps are functions: `timeout` runs them in a bash of their own (export -f below)
  timeout --kill-after=5 "$limit" bash -c '"$@"' step "$@" >"$OUT/$name.log" 2>&1
  code=$?
  local took=$(( $(date +%s) - t0 ))
  case $code in
    0) echo "STEP $name: PASS (${took} s)" ;;
    3) echo "STEP $name: SKIP $(tail -1 "$OUT/$name.log") (${took} s)" ;;
    124|137) echo "STEP $name: FAIL timed out after ${limit} s"; FAILED+=("$name"); tail -15 "$OUT/$name.log" ;;
    *) echo "STEP $name: FAIL exit $code (${took} s)"; FAILED+=("$name"); tail -15 "$OUT/$name.log" ;;
  esac
}

facts() {
  echo "platform: $PLATFORM"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,compute_cap,mig.mode.current,memory.total,pci.bus_id \
      --format=csv
  else
    echo "nvidia-smi: none (no NVIDIA driver here)"
  fi
  command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc: none"
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | head -2 || echo "compute-sanitizer: none"
  "$PY" -c 'import sys; print("python", sys.version.split()[0])'
  "$PY" -c 'import jax, jaxlib; print("jax", jax.__version__, "jaxlib", jaxlib.__version__)' 2>&1 | tail -1
  "$PY" -m pip list 2>/dev/null | grep -iE "^(jax|nvidia-nccl|cupy|nanobind|scikit-build)" || true
  if [ "$PLATFORM" = gpu ]; then
    nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader | grep -qi enabled &&
      echo "WARNING: MIG is on: the checks see one MIG instance, and CUDA IPC between MIG instances is refused"
    nvidia-smi >/dev/null  # a driver that does not answer fails this step
  fi
  return 0
}

# The package for this GPU's architecture only, installed into $OUT/site (on CPU: the .venv's).
build() {
  if [ "$PLATFORM" = cpu ]; then
    "$PY" -P -c 'from variopath_jax import _native; i = _native.build_info(); print("reusing", _native.__file__, i["transports"], "cuda" if i["cuda"] else "no cuda")'
    return
  fi
  local cc arch
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
  arch=${VARIOPATH_CUDA_ARCHITECTURES:-${cc}-real}
  echo "architectures $arch"
  rm -rf "$OUT/wheels" "$OUT/site"
  "$PY" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$OUT/wheels" . \
    -Ccmake.define.VARIOPATH_CUDA_ARCHITECTURES="$arch" -Cbuild-dir="$OUT/build" &&
    "$PY" -m pip install -q --no-deps --no-index --target "$OUT/site" "$OUT"/wheels/*.whl &&
    PYTHONPATH="$OUT/site" "$PY" -P -c 'from variopath_jax import _native; i = _native.build_info(); assert i["cuda"], i; print(i["transports"])'
}

KERNELS='
import sys
from variopath_jax import _native
platform = sys.argv[1]
rows = (0, 2, 6, 12, 14)  # 0: aligned segments
if platform == "cpu":  # the per-thread code of the kernel, on the host, over the same odd rows
    import numpy as np
    rng = np.random.default_rng(0)
    for row in rows:
        size = 4096 + 3 * max(row, 1)
        src = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        for s_off, d_off in ((0, 0), (row, 3 * row), (1, 5), (7, 0)):
            n = size - 64
            r = _native.batched_copy_on_host(src, s_off, size, d_off, n, 256)
            got = r["dst"][d_off : d_off + n]
            assert got == src[s_off : s_off + n] and r["guards_intact"], (row, s_off, d_off)
        print(f"rows of {row} B: exact on the host")
    sys.exit(0)
for row in rows:
    r = _native.cuda_copy_bandwidth(0, 8 << 20, 8, 1, row_bytes=row)
    assert not r["error"], (row, r["error"])
    nbytes = r["nbytes"]
    print(f"rows of {row} B: {nbytes} bytes exact")
'

kernels() {
  if [ "$PLATFORM" = gpu ] && command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --tool memcheck --error-exitcode 99 --leak-check no "$PY" -P -c "$KERNELS" gpu
  else
    [ "$PLATFORM" = gpu ] && echo "compute-sanitizer not found: the kernels run without memcheck"
    "$PY" -P -c "$KERNELS" "$PLATFORM"
  fi
}

# 8 ranks on threads, each with a stream of its own, random delays: a missing wait shows as a
# wrong byte. GPU: gpu_check's threads check (8 streams on this GPU, every execution mode); CPU:
# the same executor on the stream emulator, stream-ordered as the GPU backend is.
ORDERING='
import numpy as np
from variopath_jax import _native
from variopath_jax.jax_ops import configure
n, row, rng, checked = 8, 16, np.random.default_rng(5), 0
for execution in ("signal", "barrier", "concurrent"):
    for seed in range(2):
        cfg = configure(devices=n, execution=execution, transport="emulated", emulator_seed=seed,
                        emulator_delay_s=200e-6, timeout_s=30.0)
        counts = rng.integers(0, 5, (n, n))
        rows = int(max(counts.sum(0).max(), counts.sum(1).max(), 1))
        inputs = [rng.integers(0, 255, rows * row, dtype=np.uint8) for _ in range(n)]
        outputs = [np.zeros(rows * row, np.uint8) for _ in range(n)]
        snaps = [np.zeros_like(o) for o in outputs]
        sent = [a.copy() for a in inputs]  # both are poisoned once their rank returned
        errors = _native.exchange_on_threads(cfg.id, 900 + seed, inputs, outputs, counts.tolist(), row, 0xEE, snaps)
        assert errors == [""] * n, errors
        start = np.concatenate([np.zeros((n, 1), int), np.cumsum(counts, 1)[:, :-1]], 1)
        for j in range(n):
            got = np.concatenate([sent[i][start[i, j] * row : (start[i, j] + counts[i, j]) * row] for i in range(n)])
            assert (snaps[j][: got.size] == got).all() and (snaps[j][got.size :] == 0).all(), (execution, seed, j)
            checked += 1
print(f"{checked} rank results exact: 8 thread-ranks on the stream emulator, 3 execution modes")
'

ordering() {
  if [ "$PLATFORM" = gpu ]; then
    "$PY" -P benchmarks/gpu_check.py --platform gpu --quick --only threads
  else
    "$PY" -P -c "$ORDERING"
  fi
}

checks() {  # the threads check ran as the ordering step
  "$PY" -P benchmarks/gpu_check.py --platform "$PLATFORM" --quick --skip threads
}

export -f facts build kernels ordering checks
export PLATFORM PY OUT KERNELS ORDERING
step facts 30 facts
cat "$OUT/facts.log"
step build 150 build
[ "$PLATFORM" = gpu ] && export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
if [[ " ${FAILED[*]-} " == *" build "* ]]; then
  echo "STEP kernels: SKIP no build"; echo "STEP checks: SKIP no build"
else
  step kernels 60 kernels
  step ordering 120 ordering
  step checks 300 checks
  grep -E "^(CHECK|NOTE|GPU CHECK)" "$OUT/checks.log"
fi
echo "output: $OUT ($(( $(date +%s) - START )) s of ${BUDGET} s)"
if [ ${#FAILED[@]} -eq 0 ]; then
  echo "GPU FIRST: PASS"
else
  echo "GPU FIRST: FAIL ${FAILED[*]}"
  exit 1
fi
