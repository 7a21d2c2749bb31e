"""A cache of compiled models, for builds that are slow and fully determined by their inputs.

Building MobileNetV2 from a tuning database takes 20 to 30 s on two cores (the
database's schedules are replayed kernel by kernel), and a notebook that shows
three models pays it three times, every time it runs. The result depends only on
the module, the target, the database and the TVM version, so it is exported
once (``export_library``, Day 6) under a key made of exactly those, and loaded
in milliseconds the next time. Anything that changes the build changes the key.

The cache lives in ``build/compiled/`` (not in git); delete the folder, or set
``TVM_COURSE_NO_CACHE=1``, to build from scratch.

In quick (CI) mode, the suite's notebooks and tests import and build the same models again and
again; there the imports of models made of torch's and torchvision's layers (``models.import_to_relax``),
their ONNX exports (``peers``) and their untuned builds (``build.compile_model`` with a named pipeline)
are cached too (``for_tests()``). Not for a learner: the notebooks time those steps to teach what they
cost. (A library loaded back cannot be exported again, which Day 6 does: a cached untuned build
compiles its executable again where one is asked for.)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch
import tvm

from .capture import capture_stderr
from .config import REPO, quick

CACHE_ROOT = REPO / "build" / "compiled"
NO_CACHE_ENV = "TVM_COURSE_NO_CACHE"


def enabled() -> bool:
    """False when ``TVM_COURSE_NO_CACHE`` is set to a true value."""
    return os.environ.get(NO_CACHE_ENV, "").strip().lower() not in {"1", "true", "yes", "on"}


def for_tests() -> bool:
    """Whether the caches kept for the suite alone (imports, ONNX exports) are on: in quick mode, unless disabled."""
    return quick() and enabled()


def file_digest(paths: Iterable[str | Path]) -> str:
    """A digest of the files' contents (e.g. a tuning database), in the order given."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def key(*parts: object) -> str:
    """A cache key for everything a build depends on: pass each ingredient as a part."""
    digest = hashlib.sha256(tvm.__version__.encode())
    for part in parts:
        digest.update(b"\0" + str(part).encode())
    return digest.hexdigest()[:32]


def path_for(name: str, cache_key: str, root: Path | None = None) -> Path:
    """Where the library for ``cache_key`` is (or would be) kept."""
    return Path(root or CACHE_ROOT) / f"{name}-{cache_key}.so"


def load_or_build(
    name: str, cache_key: str, build: Callable[[], tvm.runtime.Executable], root: Path | None = None
) -> tuple[tvm.runtime.Module | tvm.runtime.Executable, bool]:
    """The cached library for ``cache_key``, or ``build()`` exported into the cache.

    Returns ``(module, from_cache)``: the library loaded from the cache, or the
    freshly built executable when caching is off. Either goes into
    ``relax.VirtualMachine``. A fresh build is exported and loaded back from the
    cache: handed to the VM as it is, LLVM would generate its machine code a
    second time, in memory (40 s for EfficientNet-B0 on a 2-core Zen 3).
    """
    root = Path(root or CACHE_ROOT)
    path = path_for(name, cache_key, root)
    if not enabled():
        return build(), False
    if path.is_file():
        return tvm.runtime.load_module(str(path)), True
    root.mkdir(parents=True, exist_ok=True)
    with _one_builder(root / f".{name}-{cache_key}.lock"):
        if path.is_file():  # another process built it while this one waited
            return tvm.runtime.load_module(str(path)), True
        executable = build()
        # Export next to the final name, then rename: a run stopped half-way leaves no broken entry.
        fd, partial = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=root)
        os.close(fd)
        try:
            with capture_stderr():  # TVM logs to fd 2 while exporting
                executable.export_library(partial)
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
        return tvm.runtime.load_module(str(path)), False


def load_or_compute_json(name: str, cache_key: str, compute: Callable[[], dict], root: Path | None = None) -> dict:
    """A small result (counts, not a library) that is slow to compute and fully determined by
    ``cache_key``: computed once, kept as JSON, read back the next time."""
    path = Path(root or CACHE_ROOT) / f"{name}-{cache_key}.json"
    if enabled() and path.is_file():
        return json.loads(path.read_text())
    result = compute()
    if enabled():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=f".{name}-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            json.dump(result, handle)
        os.replace(partial, path)
    return result


def load_or_compute_files(name: str, cache_key: str, compute: Callable[[Path], None],
                          root: Path | None = None) -> Path:
    """A folder of files fully determined by ``cache_key``: ``compute(folder)`` writes them once (into a
    scratch folder renamed into place, so a run stopped half-way leaves nothing), later calls return it."""
    root = Path(root or CACHE_ROOT)
    path = root / f"{name}-{cache_key}"
    if path.is_dir():
        return path
    root.mkdir(parents=True, exist_ok=True)
    with _one_builder(root / f".{name}-{cache_key}.lock"):
        if not path.is_dir():
            scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
            try:
                compute(scratch)
                os.replace(scratch, path)
            finally:
                if scratch.exists():
                    shutil.rmtree(scratch)
    return path


@contextlib.contextmanager
def _one_builder(lock: Path) -> Iterator[None]:
    """Let one process at a time build a cache entry: the others wait for it, then load its library.

    Two notebooks (or test workers) that need the same cold build would otherwise both
    build it, each at half speed on a 2-core machine. Where the lock cannot be made
    (a read-only cache), everyone builds, as before. The lock file goes with the build.
    """
    try:
        handle = open(lock, "a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)


# ------------------------------------------------ kept for the test suite alone


def kept_for_tests(name: str, model: torch.nn.Module, parts: tuple, code: Path,
                   write: Callable[[Path], None]) -> Path | None:
    """The folder where ``write`` left what it made of ``model`` (and of ``parts``, the input's shape and
    type), kept in the suite's cache (``for_tests``) once per ``fingerprint``, parts and contents of
    ``code`` (the file that makes it). None outside the suite, or for a model whose fingerprint is unknown:
    then the caller does the work (and nothing is hashed)."""
    found = fingerprint(model) if for_tests() else None
    if found is None:
        return None
    return load_or_compute_files(name, key(name, found, *parts, file_digest([code]), torch.__version__), write)


def fingerprint(model: torch.nn.Module) -> str | None:
    """A digest of everything torch.export reads from ``model``, or None where that cannot be known.

    Known: a model whose every layer is a class of torch or torchvision (their code is fixed by the
    installed versions) and whose instances keep their class's ``forward``; the digest covers the layer
    tree with its settings (``repr``), train/eval mode and every weight and buffer. A layer of any other
    class (a learner's own, whose code may change between runs) makes it unknown.
    """
    digest = hashlib.sha256(repr(model).encode())
    for module in model.modules():
        if not type(module).__module__.startswith(("torch.nn.", "torchvision.")) or "forward" in vars(module):
            return None
        digest.update(b"T" if module.training else b"E")
    for name, tensor in model.state_dict().items():
        if not isinstance(tensor, torch.Tensor) or tensor.is_quantized:
            return None
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{value.dtype}:{tuple(value.shape)}".encode())
        digest.update(value.numpy().tobytes() if value.dtype != torch.bfloat16 else value.float().numpy().tobytes())
    return digest.hexdigest()
