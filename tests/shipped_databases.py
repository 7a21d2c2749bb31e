"""The check that a model's shipped databases hold a record for every kernel it builds (Day 12's int8 and bf16
models), shared by their tests: a change to a rewrite must come with new databases."""

import tvm

from helpers import build, databases, tuning


def assert_every_kernel_covered(mod: tvm.IRModule, target: tvm.target.Target, name: str, remake: str) -> None:
    """Every shipped ``name`` database (``tuning/<name>-b1-*cores``) has a record for each kernel of ``mod`` fused
    for ``target``; ``remake`` is the command that tunes it again."""
    tasks = tuning.extract_tasks(build.fuse(mod, target), target)
    shipped = sorted(databases.SHIPPED_ROOT.glob(f"{name}-b1-*cores"))
    assert shipped, f"no {name} database ships in tuning/: {remake}"
    for path in shipped:
        db = tuning.load_database(path)
        missing = [t.task_name for t in tasks if not db.has_workload(t.dispatched[0])]
        assert not missing, f"{path.name} has no record for {missing[:4]} ({len(missing)} of {len(tasks)})"
