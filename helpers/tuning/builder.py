"""Building MetaSchedule's candidates in a fork of this process, each with a time limit (``InProcessBuilder``).

``LocalBuilder`` builds every batch of candidates in a fresh pool of worker processes, and each worker
imports ``tvm.s_tir.tensor_intrin`` (about 30 s on a small machine), so builds hit the 30 s builder
timeout and most candidates fail. ``InProcessBuilder`` builds each candidate in a fork of this process
instead (the imports come with it: milliseconds each), and stops one that hangs.
"""

from __future__ import annotations

import os
import select
import signal
import warnings

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder, local_builder

from .intrinsics import import_tensor_intrinsics


BUILD_TIMEOUT_S = 60.0


def _build_and_export(build_input: BuilderInput) -> str:
    """``LocalBuilder``'s build and export of one candidate: the path of its shared library."""
    module = local_builder.default_build(build_input.mod, build_input.target, None)
    return local_builder.default_export(module)


def _build_in_fork(build_input: BuilderInput, timeout_s: float) -> BuilderResult:
    """Build one candidate in a fork of this process and give it ``timeout_s`` seconds.

    The fork starts with everything this process imported (no 30 s import), and it can be killed: one
    candidate of a convolution once spent over 12 minutes in LLVM's code generation, in this process,
    and stopped the whole search with it.
    """
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns about forking a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: build, report on the pipe, leave without running the parent's clean-up
        os.close(read_end)
        try:
            message = "ok:" + _build_and_export(build_input)
        except BaseException as err:  # reported to the parent, which marks the candidate failed
            message = f"error:{type(err).__name__}: {err}"
        with os.fdopen(write_end, "w") as pipe:
            pipe.write(message)
        os._exit(0)
    os.close(write_end)
    message = None
    try:
        with os.fdopen(read_end) as pipe:
            if select.select([pipe], [], [], timeout_s)[0]:
                message = pipe.read()
    finally:  # a build past its time, or an interrupted search, leaves no build running
        if message is None:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if message is None:
        return BuilderResult(None, f"InProcessBuilder: the build took over {timeout_s:g} s and was stopped")
    if message.startswith("ok:"):
        return BuilderResult(message[3:], None)
    if not message:
        return BuilderResult(None, f"InProcessBuilder: the build process died (wait status {status})")
    return BuilderResult(None, "InProcessBuilder: " + message[len("error:"):])


@derived_object
class InProcessBuilder(PyBuilder):
    """A MetaSchedule builder that builds candidates in this process, or a fork of it, with a time limit.

    Same build and export as ``LocalBuilder`` (``default_build``, ``default_export``), without the
    worker pool that makes every batch pay a 30 s import and time out: each candidate is built in a
    fork of this process (the imports come with it, a few milliseconds each), which is stopped after
    ``timeout_s`` seconds, as ``LocalBuilder`` stops its workers. Where there is no ``fork``
    (Windows), or with ``timeout_s=None``, it builds here, with no limit. A failed build becomes a
    failed candidate, as with ``LocalBuilder``; the measurement still runs in ``LocalRunner``'s separate
    process, so a crashing kernel cannot take the notebook kernel down.
    """

    def __init__(self, timeout_s: float | None = BUILD_TIMEOUT_S) -> None:
        super().__init__()
        self.timeout_s = timeout_s if hasattr(os, "fork") else None

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        import_tensor_intrinsics()
        if self.timeout_s is not None:
            return [_build_in_fork(build_input, self.timeout_s) for build_input in build_inputs]
        results = []
        for build_input in build_inputs:
            try:
                results.append(BuilderResult(_build_and_export(build_input), None))
            except Exception as err:  # a bad candidate must not stop the search
                results.append(BuilderResult(None, f"InProcessBuilder: {type(err).__name__}: {err}"))
        return results
