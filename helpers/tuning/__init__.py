"""Tune a Relax module with MetaSchedule, then build it from the tuning database (Day 8; Days 7, 10 and 12-14 use it).

Import it as ``from helpers import tuning``: every name below is ``tuning.<name>``. One job per module:

* ``search``: ``tune`` (MetaSchedule's evolutionary search over every kernel, under a budget) and
  ``seed_with`` (another database's best schedules, replayed and measured here first);
* ``builder``: ``InProcessBuilder``. ``LocalBuilder`` builds every batch of candidates in a fresh pool of
  worker processes, each of which imports ``tvm.s_tir.tensor_intrin`` (about 30 s on a small machine),
  so builds hit its 30 s timeout; this one builds each candidate in a fork of this process, with a limit;
* ``intrinsics``: importing TVM's tensor intrinsics in seconds rather than most of a minute (TVMScript's
  parser asks ``inspect`` for every stack frame), and the course's own int8 ones (Day 12);
* ``progress``: the bar over the trials, and MetaSchedule's tables kept out of the notebook;
* ``tasks``: preparing a module (legalize, fuse, prepack) and extracting its kernels (``prepare``,
  ``extract_tasks``, ``task_table``; ``tunable_tasks``, the kernels ``tune`` tunes); ``BUILD_CODE``, the files
  whose code shapes a tuned build;
* ``settings``: the database's ``course_tuning.json``: how its kernels were prepared, and its budget;
* ``records``: reading a database (checked, ``load_database``), pruning, copying and summarising records.
  ``MetaScheduleApplyDatabase`` looks records up by workload only: it would apply a database tuned for
  another CPU without a word, so the records tuned for the target you build for are kept, and none
  is an error unless asked to *transfer* them (``transfer=True``: a record is a trace of schedule
  primitives, so it replays on any x86-64 CPU; the build is then checked for parity and labelled);
* ``apply``: ``apply_database``, ``build_tuned`` and ``compile_tuned`` (fuse, give each kernel its best
  schedule, compile, load; weights prepacked once through ``main_transform_params``; kept in the
  compile cache).

A tuning directory (``work_dir``) holds MetaSchedule's two JSON files, ``database_workload.json`` (the
kernels) and ``database_tuning_record.json`` (the measured schedules, each with the target it was tuned
for), ``logs/`` with MetaSchedule's own per-task logs, and ``course_tuning.json`` (``settings``).

Weight prepacking (``prepack=True``, TVM's ``cpu_weight_prepack``) lets each tuned schedule choose the
memory layout of its weights (e.g. blocked for the vector lanes, as on Day 7). The build then has a
second function, ``main_transform_params``, that rewrites the weights into those layouts once;
``compile_tuned`` runs it when it loads the model.

Introduced on Day 8.
"""

from ..errors import TuningDatabaseError
from .apply import apply_database, build_tuned, compile_tuned
from .builder import BUILD_TIMEOUT_S, InProcessBuilder
from .intrinsics import import_tensor_intrinsics, import_tvm_tensor_intrinsics
from .progress import progress_bar, quiet_metaschedule
from .records import (FAILED_RUN_SECS, LOG_DIR, RECORD_FILE, WORKLOAD_FILE, add_kernels_from, database_summary,
                      database_targets, load_database, measured_records, prune_database, succeeded)
from .search import seed_with, tune
from .settings import SETTINGS_FILE, budget, tuned_in_quick_mode, tuned_layout, tuned_with_prepacking
from .tasks import (BUILD_CODE, extract_tasks, is_static, kernels_by_shape, per_call_kernels, prepare, task_table,
                    tunable_tasks)

__all__ = [
    "BUILD_CODE", "BUILD_TIMEOUT_S", "FAILED_RUN_SECS", "InProcessBuilder", "LOG_DIR", "RECORD_FILE", "SETTINGS_FILE",
    "TuningDatabaseError", "WORKLOAD_FILE", "add_kernels_from", "apply_database", "budget", "build_tuned", "compile_tuned",
    "database_summary", "database_targets", "extract_tasks", "import_tensor_intrinsics", "import_tvm_tensor_intrinsics",
    "is_static", "kernels_by_shape", "load_database", "measured_records", "per_call_kernels", "prepare", "progress_bar",
    "prune_database", "quiet_metaschedule", "seed_with", "succeeded", "task_table", "tune", "tuned_in_quick_mode",
    "tunable_tasks", "tuned_layout", "tuned_with_prepacking",
]
