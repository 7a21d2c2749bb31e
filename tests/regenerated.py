"""Every day generated from the sources once per state of the sources, shared by the suite's workers.

`nbgrader generate_assignment` for every day takes about half a minute. Its result depends only on
the sources, the course's nbgrader config and grading code, and nbgrader's version, so it is kept in
``build/regenerated/<digest of those>/`` and made once (under a lock, the suite's workers share it).
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import tempfile
from pathlib import Path

from helpers.instructor import grading


def sources_digest(course: Path = grading.REPO) -> str:
    """Everything `nbgrader generate_assignment` reads: the sources, the config, the course's grading code."""
    import nbgrader

    digest = hashlib.sha256(nbgrader.__version__.encode())
    files = [course / "nbgrader_config.py", course / "helpers" / "instructor" / "grading.py",
             *sorted((course / grading.SOURCE).rglob("*"))]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(course)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def shared(course: Path = grading.REPO) -> Path:
    """The generated course for the sources of ``course`` as they are now (made if missing). Read-only: copy it."""
    root = course / "build" / "regenerated"
    root.mkdir(parents=True, exist_ok=True)
    generated = root / sources_digest(course)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (generated / grading.RELEASE).is_dir():
            with tempfile.TemporaryDirectory() as tmp:
                scratch = grading.scratch_course(Path(tmp) / "generating", origin=course)
                grading.generate(course=scratch)
                shutil.copytree(scratch, generated.with_suffix(".partial"), dirs_exist_ok=True)
                generated.with_suffix(".partial").rename(generated)
    return generated
