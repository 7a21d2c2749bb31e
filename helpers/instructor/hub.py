"""The course on JupyterHub, on one machine: Unix accounts, nbgrader's exchange, per-learner limits.

    make hub                                           # as root: set up, release every day, serve
    python -m helpers.instructor.hub add-learner NAME [--password P]   # as root: a learner's Unix account
    python -m helpers.instructor.hub release DAY                  # the instructor's exchange cycle ...
    python -m helpers.instructor.hub collect DAY
    python -m helpers.instructor.hub autograde DAY                # ... grade, print the scores
    python -m helpers.instructor.hub feedback DAY                 # generate and release feedback

Where things live (``TVM_HUB_ROOT``, /srv/tvm-course unless set):
  exchange/   nbgrader's exchange (mode 1777; nbgrader makes inbound/ write-only for learners)
  course/     the instructor's nbgrader course directory: sources, gradebook, submissions (mode 0700)
  learner-config/  Jupyter config every learner's server reads (course id, exchange, extensions)
  state/      the hub's database and cookie secret (root only)

The instructor commands run as the instructor's Unix account (``TVM_HUB_INSTRUCTOR``, ``instructor``
unless set); run by root, they switch to it. ``make submit`` and ``helpers.instructor.grading`` still grade
without a hub, on the repository's own course directory.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from . import grading
from ..errors import GradingError

REPO = grading.REPO
BIN = Path(sys.executable).parent
COURSE_ID = "tvm-course"
# Paths of the repository a learner must not read: the sources with their solutions and hidden
# tests, the history that holds them, and the repo's own gradebook and submissions.
# build/regenerated holds the tests' executed copies of the sources.
PRIVATE = ("solutions", ".git", "tests", "gradebook.db", "submitted", "autograded", "feedback", "grades.csv",
           "build/regenerated")


class HubError(GradingError):
    """A hub command that cannot run here; the message says what to do."""


@dataclass(frozen=True)
class Hub:
    root: Path
    instructor: str
    group: str

    @classmethod
    def from_env(cls) -> "Hub":
        return cls(Path(os.environ.get("TVM_HUB_ROOT", "/srv/tvm-course")),
                   os.environ.get("TVM_HUB_INSTRUCTOR", "instructor"),
                   os.environ.get("TVM_HUB_GROUP", "tvm-learners"))

    exchange = property(lambda self: self.root / "exchange")
    course = property(lambda self: self.root / "course")
    learner_config = property(lambda self: self.root / "learner-config")
    state = property(lambda self: self.root / "state")


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise HubError(f"{what} needs root: the hub starts each learner's server as that learner's Unix "
                       "account and checks passwords with PAM. Run it with sudo (e.g. `sudo make hub`).")


def _run(*cmd: str) -> None:
    """useradd and friends; retried while another one holds /etc/passwd's lock."""
    import time

    for attempt in range(10):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0 or "lock" not in proc.stderr or attempt == 9:
            break
        time.sleep(0.5)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def ensure_user(name: str, password: str | None = None, group: str | None = None) -> pwd.struct_passwd:
    """A Unix account with a private home (0700); ``password`` set when given (PAM checks it)."""
    if not _user_exists(name):
        _run("useradd", "--create-home", "--shell", "/bin/bash", *(["--groups", group] if group else []), name)
    elif group:
        _run("usermod", "--append", "--groups", group, name)
    user = pwd.getpwnam(name)
    os.chmod(user.pw_dir, 0o700)
    if password:
        subprocess.run(["chpasswd"], input=f"{name}:{password}\n", check=True, capture_output=True, text=True)
    return user


def add_learner(name: str, password: str | None = None, hub: Hub | None = None) -> None:
    hub = hub or Hub.from_env()
    require_root("Adding a learner")
    _ensure_group(hub.group)
    ensure_user(name, password, hub.group)


def _ensure_group(name: str) -> None:
    try:
        grp.getgrnam(name)
    except KeyError:
        _run("groupadd", name)


def _interpreter_paths() -> list[Path]:
    """What a learner's server must reach: the environment, and the Python it links to (pyenv, say)."""
    return [BIN, Path(sys.executable).resolve().parent, Path(sys.base_prefix) / "lib"]


def _closed(path: Path) -> list[Path]:
    return [p for p in [path, *path.parents] if not p.stat().st_mode & 0o001]


def check_reachable(open_path: bool = False) -> None:
    """Learners' servers run this environment: every folder above it must let them through.

    With ``open_path`` the closed folders get o+x (others may pass through, not list them): what a
    Python under /root (pyenv) needs.
    """
    closed = sorted({p for path in _interpreter_paths() for p in _closed(path)})
    if closed and open_path:
        for path in closed:
            os.chmod(path, path.stat().st_mode | 0o001)
    elif closed:
        raise HubError(f"{', '.join(map(str, closed))} closed to other users, so learners cannot run the course's "
                       f"Python ({Path(sys.executable).resolve()}): let them through with `make hub HUB_ARGS=--open-path` "
                       "(o+x, no listing), or build the course's environment under /opt or /srv.")


def protect_repo(repo: Path = REPO) -> None:
    """Close the solutions, hidden tests, history and the repo's own grading to other users."""
    for name in PRIVATE:
        path = repo / name
        try:
            os.chmod(path, path.stat().st_mode & ~0o007)
        except FileNotFoundError:  # (not made yet, or being rewritten by a test run)
            pass


LEARNER_NBGRADER = '''# Written by helpers.instructor.hub: what every learner's nbgrader (Assignment List) reads.
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "{course_id}"
c.Exchange.root = "{exchange}"
'''

INSTRUCTOR_NBGRADER = '''
# --- added by helpers.instructor.hub: this course directory serves the hub's exchange
c.CourseDirectory.root = "{course}"
c.Exchange.root = "{exchange}"
# collect only what a learner submitted under their own name (nbgrader itself only warns)
c.ExchangeFactory.collect = "helpers.instructor.hub_exchange.OwnerCheckedCollect"
# (feedback without the hidden tests: the course's config above sets c.GenerateFeedback.preprocessors)
'''


def setup(hub: Hub | None = None, open_path: bool = False) -> Hub:
    """The exchange, the instructor's course directory, the learners' config; idempotent."""
    hub = hub or Hub.from_env()
    require_root("Setting up the hub")
    check_reachable(open_path)
    protect_repo()
    _ensure_group(hub.group)
    teacher = ensure_user(hub.instructor)
    hub.root.mkdir(parents=True, exist_ok=True)
    os.chmod(hub.root, 0o755)
    hub.exchange.mkdir(exist_ok=True)
    os.chmod(hub.exchange, 0o1777)  # nbgrader's documented exchange mode (sticky: nobody removes another's files)
    hub.state.mkdir(exist_ok=True)
    os.chmod(hub.state, 0o700)
    hub.learner_config.mkdir(exist_ok=True)
    (hub.learner_config / "nbgrader_config.py").write_text(
        LEARNER_NBGRADER.format(course_id=COURSE_ID, exchange=hub.exchange))
    # Learners get the Assignment List; the instructor's tools are useless and confusing to them.
    (hub.learner_config / "jupyter_server_config.json").write_text(
        '{"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": false, '
        '"nbgrader.server_extensions.create_assignment": false, "nbgrader.server_extensions.course_list": false}}}\n')
    # ... and their JupyterLab parts
    (hub.learner_config / "labconfig").mkdir(exist_ok=True)
    (hub.learner_config / "labconfig" / "page_config.json").write_text(
        '{"disabledExtensions": {"@jupyter/nbgrader:create-assignment": true, "@jupyter/nbgrader:course-list": true, '
        '"@jupyter/nbgrader:formgrader": true}}\n')
    for path in hub.learner_config.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    os.chmod(hub.learner_config, 0o755)
    if not (hub.course / "nbgrader_config.py").exists():
        grading.scratch_course(hub.course)
        with open(hub.course / "nbgrader_config.py", "a") as f:
            f.write(INSTRUCTOR_NBGRADER.format(course=hub.course, exchange=hub.exchange))
    for path in [hub.course, *hub.course.rglob("*")]:
        os.chown(path, teacher.pw_uid, teacher.pw_gid)
    os.chmod(hub.course, 0o700)
    return hub


# --- the instructor's side of the exchange (run as the instructor's account, in the course directory)

def release(day: str, hub: Hub) -> None:
    """generate_assignment (records the day in the gradebook), then release_assignment to the exchange."""
    if (hub.exchange / COURSE_ID / "outbound" / day).exists():
        print(f"{day} is released already")
        return
    grading.generate(day, course=hub.course)
    grading.nbgrader("release_assignment", day, course=hub.course)
    print(f"released {day}")


def collect(day: str, hub: Hub) -> None:
    grading.nbgrader("collect", day, "--update", course=hub.course)
    got = sorted(p.parent.name for p in (hub.course / "submitted").glob(f"*/{day}"))
    print(f"collected {day} from: {', '.join(got) or 'nobody yet'}")


def autograde(day: str, hub: Hub) -> None:
    grading.autograde(day, course=hub.course)
    for s in grading.scores(day, course=hub.course).values():
        print(f"{s.student}: {s.score:g} / {s.max_score:g}")


def feedback(day: str, hub: Hub) -> None:
    grading.feedback(day, course=hub.course)
    grading.nbgrader("release_feedback", day, course=hub.course)
    print(f"released feedback on {day}")


INSTRUCTOR_COMMANDS = {"release": release, "collect": collect, "autograde": autograde, "feedback": feedback}


def _instructor(hub: Hub) -> pwd.struct_passwd:
    """The instructor's account, once ``setup`` has made it and the course directory; before, one line saying
    what to run (the account's lookup raised a bare KeyError)."""
    try:
        teacher = pwd.getpwnam(hub.instructor)
    except KeyError:
        teacher = None
    # (only root and the instructor may look into the course directory: mode 0700)
    if teacher is None or (os.geteuid() in (0, teacher.pw_uid) and not (hub.course / "nbgrader_config.py").exists()):
        raise HubError(f"The hub is not set up yet (no {'course directory ' + str(hub.course) if teacher else 'account ' + hub.instructor}): "
                       "run `sudo make hub` first, or `sudo .venv/bin/python -m helpers.instructor.hub setup` to set it up "
                       "without serving, then release.")
    return teacher


def as_instructor(command: str, day: str, hub: Hub | None = None) -> subprocess.CompletedProcess | None:
    """Run an instructor command as the instructor's account (root switches to it)."""
    hub = hub or Hub.from_env()
    teacher = _instructor(hub)
    if os.geteuid() == teacher.pw_uid:
        INSTRUCTOR_COMMANDS[command](day, hub)
        return None
    require_root(f"`{command}` as {hub.instructor}")
    keep = {k: v for k, v in os.environ.items() if k.startswith(("TVM_", "OMP_", "LANG", "LC_"))}
    env = {**keep, "HOME": teacher.pw_dir, "USER": hub.instructor, "PATH": f"{BIN}:/usr/bin:/bin",
           "TVM_HUB_ROOT": str(hub.root), "TVM_HUB_INSTRUCTOR": hub.instructor, "TVM_HUB_GROUP": hub.group,
           # the repo's compile cache belongs to whoever made it; the instructor grades without it
           "TVM_COURSE_NO_CACHE": "1"}
    return subprocess.run([sys.executable, "-m", "helpers.instructor.hub", command, day], cwd=hub.course, env=env,
                          user=teacher.pw_uid, group=teacher.pw_gid, extra_groups=[], check=True,
                          capture_output=True, text=True)


def serve(hub: Hub | None = None, release_days: bool = True, open_path: bool = False) -> None:
    """`make hub`: set up, release every day that is not released yet, run JupyterHub (foreground)."""
    hub = setup(hub, open_path)
    proxy = REPO / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
    if not proxy.exists():
        raise HubError(f"configurable-http-proxy is missing ({proxy}): `make hub` installs it with npm (npm ci --prefix hub).")
    if release_days:
        for day in grading.assignments(hub.course):
            out = as_instructor("release", day, hub)
            print(out.stdout.strip() if out else f"{day} released")
    os.execv(str(BIN / "jupyterhub"), [str(BIN / "jupyterhub"), "-f", str(REPO / "hub" / "jupyterhub_config.py")])


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m helpers.instructor.hub", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    setup_cmd = sub.add_parser("setup")
    serve_cmd = sub.add_parser("serve")
    serve_cmd.add_argument("--no-release", action="store_true", help="release nothing (the instructor will)")
    for cmd in (setup_cmd, serve_cmd):
        cmd.add_argument("--open-path", action="store_true", help="let other users through the folders above the Python (o+x)")
    learner = sub.add_parser("add-learner")
    learner.add_argument("name")
    learner.add_argument("--password")
    for name in INSTRUCTOR_COMMANDS:
        sub.add_parser(name).add_argument("day")
    args = parser.parse_args(argv)
    try:
        if args.command == "setup":
            setup(open_path=args.open_path)
        elif args.command == "serve":
            serve(release_days=not args.no_release, open_path=args.open_path)
        elif args.command == "add-learner":
            add_learner(args.name, args.password)
        else:
            out = as_instructor(args.command, args.day)
            if out is not None:
                print(out.stdout, end="")
    except subprocess.CalledProcessError as err:
        print(f"error: {' '.join(map(str, err.cmd))} failed:\n{err.stdout or ''}{err.stderr or ''}", file=sys.stderr)
        return 1
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
