"""The hub's spawner (hub/jupyterhub_config.py): each learner's JupyterLab as their own Unix
account, within limits the kernel enforces. Apart from helpers.instructor.hub, which runs without JupyterHub."""

import os
import resource

from jupyterhub.spawner import LocalProcessSpawner


def _cores_for(index: int, per_learner: int) -> set[int]:
    cores = sorted(os.sched_getaffinity(0))
    per_learner = max(1, min(per_learner, len(cores)))
    start = (index * per_learner) % len(cores)
    return {cores[(start + i) % len(cores)] for i in range(per_learner)}


class CourseSpawner(LocalProcessSpawner):
    """A learner's JupyterLab as their Unix account, with limits the kernel enforces.

    Enforced, on every process the learner's server starts (kernels, tuning workers), set as root
    before dropping to the learner so that they cannot be raised again:
      * memory: ``mem_limit`` as RLIMIT_AS, per process (an allocation past it fails with a
        MemoryError in the learner's kernel, not an out-of-memory kill of the machine);
      * CPU: ``cpu_limit`` cores (rounded up) as the CPU affinity of the server and all it starts,
        learners placed round-robin across the machine's cores, and the thread pools of PyTorch and
        TVM sized to them (OMP_NUM_THREADS, TVM_NUM_THREADS);
      * processes: RLIMIT_NPROC per account (a fork bomb stops there).
    Not enforced: the memory of a learner's processes together (each is limited, not their sum;
    that needs cgroups: systemd's or Kubernetes', see the README), and a share of a core that others
    also use (learners placed on the same core share it as the scheduler decides).
    """

    _placed = 0

    def make_preexec_fn(self, name):
        drop = super().make_preexec_fn(name)
        mem = int(self.mem_limit or 0)
        cores = _cores_for(CourseSpawner._placed, int(-(-(self.cpu_limit or 0) // 1)) or 1) if self.cpu_limit else None
        CourseSpawner._placed += 1
        nproc = int(os.environ.get("TVM_HUB_NPROC", "512"))

        def preexec():
            if mem:
                resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            if cores:
                os.sched_setaffinity(0, cores)
            drop()

        return preexec

    def _is_instructor(self) -> bool:
        return self.user.name == os.environ.get("TVM_HUB_INSTRUCTOR", "instructor")

    async def start(self):
        if self._is_instructor():  # the instructor's JupyterLab opens the course directory, with the Formgrader
            self.notebook_dir = os.path.join(os.environ.get("TVM_HUB_ROOT", "/srv/tvm-course"), "course")
        return await super().start()

    def get_env(self):
        env = super().get_env()
        if self._is_instructor():
            env.pop("JUPYTER_CONFIG_PATH", None)  # not the learners' config: all of nbgrader's tools
        if self.cpu_limit:
            threads = str(int(-(-self.cpu_limit // 1)))
            env.update(OMP_NUM_THREADS=threads, TVM_NUM_THREADS=threads)
        return env
