"""The rules every CUDA call of the transports keeps (issue 52 item 1), checked on CPU by a lint
over ffi/cuda, ffi/nccl and ffi/ffi_cuda.cc (no GPU has run this code yet):

- every CUDA runtime call goes through ``VP_CUDA(...)`` (ffi/cuda/check.h), which names the call
  and the device in its message and clears the thread's last error on any failure, so a status
  ignored in a cleanup path cannot leave an error behind;
- so a poll (``cudaEventQuery``/``cudaStreamQuery``) clears the ``cudaErrorNotReady`` it leaves in
  the thread's last error, and a later launch does not report it as its own failure;
- every kernel launch goes through ``VP_LAUNCH``, which clears the last error before the launch
  and reads it after (a launch helper that returned ``cudaGetLastError()`` after a poll failed).

check.h, the wrapper itself, is the one file that calls the runtime directly.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ROOT / "ffi" / "cuda" / "check.h"
CALL = re.compile(r"\bcuda[A-Z]\w*\s*\(")
WRAPPED = re.compile(r"VP_CUDA\(\s*$")


def _code(text: str) -> str:
    """The source with comments and string/char literals blanked (line numbers kept)."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def violations(text: str, name: str = "<source>") -> list[str]:
    """What breaks the rules in one source file: ``name:line: what``."""
    code, found = _code(text), []  # (position, what)

    def at(pos: int, what: str) -> None:
        found.append((pos, f"{name}:{code.count(chr(10), 0, pos) + 1}: {what}"))

    for m in CALL.finditer(code):
        if not WRAPPED.search(code[max(0, m.start() - 40) : m.start()]):
            call = m.group(0).rstrip("( ")
            why = (
                "a poll that leaves cudaErrorNotReady behind"
                if call in ("cudaEventQuery", "cudaStreamQuery")
                else "a launch check that reads an error it never cleared"
                if call in ("cudaGetLastError", "cudaPeekAtLastError")
                else "an unchecked CUDA call"
            )
            at(m.start(), f"{call} outside VP_CUDA: {why}")
    for m in re.finditer(r"<<<", code):
        at(m.start(), "a kernel launch outside VP_LAUNCH (the last error is not cleared before it)")
    return [what for _, what in sorted(found)]


def sources() -> list[Path]:
    ffi = ROOT / "ffi"
    files = [
        *sorted((ffi / "cuda").glob("*")),
        *sorted((ffi / "nccl").glob("*")),
        ffi / "ffi_cuda.cc",
    ]
    return [p for p in files if p.suffix in (".cc", ".cu", ".h") and p != WRAPPER]


def test_every_cuda_call_of_the_transports_keeps_the_rules() -> None:
    found = [
        v for p in sources() for v in violations(p.read_text(), p.relative_to(ROOT).as_posix())
    ]
    assert not found, "\n".join(found)
    assert len(sources()) >= 20  # the lint reads the transports, not an empty glob


def test_the_wrapper_clears_every_failure_and_the_launch_clears_first() -> None:
    code = _code(WRAPPER.read_text())
    body = code[code.index("Status status_of(") :]
    body = body[: body.index("\n}\n")]
    # on every failure, cudaErrorNotReady included, before the message is built
    assert body.index("cudaGetLastError()") < body.index("cudaErrorNotReady")
    launch = code[code.index("#define VP_LAUNCH") :]
    assert launch.index("clear_last_error()") < launch.index("<<<") < launch.index("launched(")


def test_the_lint_catches_what_the_first_reading_found() -> None:
    """The three patterns of the code before issue 52, each caught, and their fixes passing."""
    poll = """
    for (;;) {
      const cudaError_t status = cudaEventQuery(e);  // never cleared
      if (status != cudaErrorNotReady) return status;
    }"""
    launch = """
    cudaError_t stamp_clock(uint64_t* slot, cudaStream_t stream) {
      stamp_kernel<<<1, 1, 0, stream>>>(slot);
      return cudaGetLastError();
    }"""
    raw = '  if (slots_) cudaFree(slots_);  // "cudaFree(x)" in a string is no call\n'
    assert [v.split(": ", 1)[1] for v in violations(poll)] == [
        "cudaEventQuery outside VP_CUDA: a poll that leaves cudaErrorNotReady behind"
    ]
    assert len(violations(launch)) == 2 and "VP_LAUNCH" in violations(launch)[0]
    assert violations(raw) == ["<source>:1: cudaFree outside VP_CUDA: an unchecked CUDA call"]
    fixed = """
    const Status s = VP_CUDA(cudaEventQuery(e));
    if (slots_) VP_CUDA(cudaFree(slots_));  // cudaFree(p) in a comment
    return VP_LAUNCH(stamp_kernel, 1, 1, stream, slot);"""
    assert violations(fixed) == []
