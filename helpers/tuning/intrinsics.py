"""The tensor intrinsics tuning and tuned builds need registered, imported in seconds instead of most of a minute.

Importing ``tvm.s_tir.tensor_intrin`` at all (MetaSchedule's ``TuneContext`` does it) is slow because
TVMScript's parser calls ``inspect.stack()`` for every kernel it parses, and ``inspect`` rescans
``sys.modules`` for every stack frame that is not a module file. With torch imported that takes 40 s or
more; the import here memoises that lookup and takes a few seconds. The course's own int8 and bf16
intrinsics (Day 12, ``helpers.int8`` and ``helpers.bf16``) are registered beside TVM's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

from ..bf16 import BF16_INTRIN, register_bf16_intrinsic
from ..int8 import AVX2_INTRIN, VNNI_INTRIN, register_avx2_intrinsic, register_vnni_intrinsic


@contextlib.contextmanager
def _memoised_frame_modules() -> Iterator[None]:
    """Let ``inspect.getmodule`` remember frames whose file is not a module.

    For such frames (``<frozen importlib._bootstrap>``, a notebook cell) the
    standard library rescans all of ``sys.modules`` on every call; the answer
    for a given file name cannot change while one import runs.
    """
    original = inspect.getmodule
    seen: dict[str, object] = {}

    def getmodule(obj, _filename=None):
        if _filename is None or not inspect.isframe(obj):
            return original(obj, _filename)
        if _filename not in seen:
            seen[_filename] = original(obj, _filename)
        return seen[_filename]

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = original


@functools.cache
def import_tvm_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` once, in seconds rather than most of a minute.

    MetaSchedule needs the tensor intrinsics registered (its x86 rules name the
    AVX-512 VNNI ones) and imports them itself when it first creates a task.
    """
    with _memoised_frame_modules():
        import tvm.s_tir.tensor_intrin  # noqa: F401  (registers the intrinsics)


_TENSORIZE = re.compile(r'\["Tensorize",\[[^\]]*\],\["([^"]+)"')


def import_tensor_intrinsics(records: Path | None = None) -> None:
    """The tensor intrinsics that tuning, or replaying ``records``, needs registered.

    The course's own intrinsics (Day 12: ``helpers.int8``'s VNNI and AVX2, ``helpers.bf16``'s) always; TVM's own set
    for tuning, and for a records file only when it names one of them: importing
    TVM's set costs 5 to 10 s per process (the float32 databases name none).
    """
    named = None if records is None else set(_TENSORIZE.findall(Path(records).read_text()))
    if named is None or named - {VNNI_INTRIN, AVX2_INTRIN, BF16_INTRIN}:
        import_tvm_tensor_intrinsics()
    register_vnni_intrinsic()
    register_avx2_intrinsic()
    register_bf16_intrinsic()
