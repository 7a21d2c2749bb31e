"""The class on JupyterHub, end to end: `make hub` on localhost with two learners and an instructor
(Unix accounts, PAM), nbgrader's exchange driven from the Assignment List in headless Chromium, the
instructor's collect/autograde/feedback, each learner's score and feedback, and what a learner must
not be able to do, tried as that learner's Unix account. Screenshots land in artifacts/hub/.

Needs root (Unix accounts), Debian's chromium, the pinned jupyterhub and configurable-http-proxy
(`make test` installs them); in CI a missing one fails the test, elsewhere it skips.
"""

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent
DAY = "day00_environment"  # the cheapest day to execute: the test is about the class, not the day
SHOTS = REPO / "artifacts" / "hub"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PROXY = REPO / "hub" / "node_modules" / ".installed"


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the hub needs root (Unix accounts for learners): run the test as root, as CI does"
    if not Path(CHROMIUM).exists():
        return "Debian's chromium is not installed (run `make browser` as root)"
    if not PROXY.exists():
        return "configurable-http-proxy is not installed (`make proxy`, needs npm)"
    if not shutil.which("useradd"):
        return "useradd is missing"
    try:
        import jupyterhub  # noqa: F401
        import playwright  # noqa: F401
    except ImportError as err:
        return f"{err.name} is not installed (`make env`)"
    return None


if (why := _missing()) is not None:
    if os.environ.get("CI"):
        pytest.fail(f"the hub test cannot run in CI: {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)

from playwright.sync_api import sync_playwright  # noqa: E402

from helpers.instructor import grading  # noqa: E402
from helpers.instructor.feedback_hidden import hidden_test_lines, shown  # noqa: E402
from helpers.rpc_tuning import free_port  # noqa: E402
from local_servers import wait_until_serving  # noqa: E402


def _hub_cli(env, *args):
    proc = subprocess.run([sys.executable, "-m", "helpers.instructor.hub", *args], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"helpers.instructor.hub {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _as(hub, user: str, *cmd: str, cwd=None) -> subprocess.CompletedProcess:
    """Run ``cmd`` as ``user``'s Unix account, with their home and the course's environment."""
    pw = pwd.getpwnam(user)
    env = {"HOME": pw.pw_dir, "USER": user, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "JUPYTER_CONFIG_PATH": str(hub["root"] / "learner-config")}
    return subprocess.run(cmd, cwd=cwd or pw.pw_dir, env=env, user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def hub():
    tag = secrets.token_hex(3)
    instructor, learners, group = f"ti{tag}", [f"tl{tag}a", f"tl{tag}b"], f"tg{tag}"
    root = Path(tempfile.mkdtemp(prefix="tvm-hub-", dir="/tmp"))
    ports = [free_port() for _ in range(3)]
    env = {**os.environ, "TVM_HUB_ROOT": str(root), "TVM_HUB_INSTRUCTOR": instructor, "TVM_HUB_GROUP": group,
           "TVM_HUB_IP": "127.0.0.1", "TVM_HUB_PORT": str(ports[0]), "TVM_HUB_API_PORT": str(ports[1]),
           "TVM_HUB_PROXY_API_PORT": str(ports[2]), "TVM_HUB_MEM": "8G", "TVM_HUB_CPUS": "1"}
    passwords = {name: secrets.token_urlsafe(12) for name in learners}
    global T0
    T0 = time.monotonic()
    proc = None
    try:
        _hub_cli(env, "setup", "--open-path")
        for name in learners:
            _hub_cli(env, "add-learner", name, f"--password={passwords[name]}")  # (a password may start with -)
        assert "released" in _hub_cli(env, "release", DAY)
        _mark("released")
        # started the way an instructor starts it: `make hub` (the day is released already)
        proc = subprocess.Popen(["make", "-s", "hub", "HUB_ARGS=--no-release"], cwd=REPO, env=env,
                                stdout=open(root / "state" / "hub.log", "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        base = f"http://127.0.0.1:{ports[0]}"
        hub_log = root / "state" / "hub.log"
        wait_until_serving(proc, f"{base}/hub/health", "`make hub`", hub_log.read_text)
        _mark("hub up")
        yield dict(base=base, env=env, root=root, instructor=instructor, learners=learners, passwords=passwords)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # make, the hub, its proxy; the hub stops the learners' servers
            proc.wait(timeout=60)
        import psutil

        uids = set()
        for name in [instructor, *learners]:
            try:
                uids.add(pwd.getpwnam(name).pw_uid)
            except KeyError:
                pass
        for p in psutil.process_iter(["uids"]):
            if p.info["uids"] and p.info["uids"].real in uids:
                p.kill()  # a server this test's hub started and left behind
        for name in [instructor, *learners]:
            subprocess.run(["userdel", "--remove", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)
        if (root / "state" / "hub.log").exists():  # kept with the screenshots (CI's artefacts)
            SHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / "state" / "hub.log", SHOTS / "hub.log")
        shutil.rmtree(root, ignore_errors=True)


def _answer(path: Path, right: bool) -> None:
    """Write an answer to Day 0's float32 lanes into the fetched notebook: the solution, or lanes of 64 bits."""
    source = json.loads((REPO / "solutions" / DAY / f"{DAY}.ipynb").read_text())
    solution = next(c for c in source["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "float32_lanes")
    code = "".join(solution["source"]).replace("    ### BEGIN SOLUTION\n", "").replace("    ### END SOLUTION\n", "")
    if not right:
        code = code.replace("// 32", "// 64")
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "float32_lanes")
    cell["source"] = code
    stat = path.stat()
    path.write_text(json.dumps(nb, indent=1))
    os.chown(path, stat.st_uid, stat.st_gid)


T0 = time.monotonic()


def _mark(what: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {what}", flush=True)


def _hidden_test_lines() -> set[str]:
    """Lines of Day 0's hidden tests that the student notebook does not have."""
    lines = hidden_test_lines(nbformat.read(REPO / "solutions" / DAY / f"{DAY}.ipynb", as_version=4))
    assert lines, "Day 0 has no hidden tests to look for"
    return lines


def _assignment_list(page):
    page.keyboard.press("Control+Shift+C")
    page.keyboard.type("Assignment List")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Released assignments", timeout=60_000)


def _row_button(page, section: str, label: str):
    """The button ``label`` in the Assignment List's row for DAY under ``section``."""
    return page.locator(f"#{section} .list_item", has_text=DAY).get_by_role("button", name=label)


def test_a_class_fetches_submits_is_graded_and_gets_feedback(hub):
    learners, pages = hub["learners"], {}
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            for name, right in zip(learners, (True, False)):
                page = pages[name] = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
                page.goto(f"{hub['base']}/hub/login")
                page.fill("#username_input", name)
                page.fill("#password_input", hub["passwords"][name])
                page.click("#login_submit")
                page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)  # their own JupyterLab
                _mark("lab up")
                # the course kernel in their launcher; none of the instructor's tools
                page.get_by_text("TVM course (Python 3.11)").first.wait_for(timeout=60_000)
                assert page.get_by_text("Create Assignment").count() == 0, "a learner sees the instructor's tools"
                _assignment_list(page)
                _row_button(page, "released_assignments_list", "Fetch").click()
                _row_button(page, "fetched_assignments_list", "Submit").wait_for(timeout=60_000)
                home = Path(pwd.getpwnam(name).pw_dir)
                fetched = home / DAY / f"{DAY}.ipynb"
                assert fetched.is_file(), f"fetching {DAY} in the Assignment List did not put it in {name}'s home"
                _answer(fetched, right)
                _row_button(page, "fetched_assignments_list", "Submit").click()
                page.wait_for_selector(f"#submitted_assignments_list .list_item:has-text('{DAY}')", timeout=60_000)
                page.screenshot(path=str(SHOTS / f"submitted-{'right' if right else 'wrong'}.png"))

            _mark("submitted")
            a, b = learners
            inbound = hub["root"] / "exchange" / "tvm-course" / "inbound"
            course = hub["root"] / "course"
            # --- what a learner must not do, tried as their Unix account
            secret = [course / "gradebook.db", course / "solutions" / DAY / f"{DAY}.ipynb",
                      REPO / "solutions" / DAY / f"{DAY}.ipynb", REPO / "tests" / "test_hidden_tests.py",
                      Path(pwd.getpwnam(b).pw_dir) / DAY / f"{DAY}.ipynb", REPO / ".git" / "HEAD"]
            secret += [p for p in (REPO / "gradebook.db", *(REPO / "build" / "regenerated").glob(f"*/solutions/{DAY}/{DAY}.ipynb"))
                       if p.exists()]
            for path in secret:
                assert path.exists(), path
                assert _as(hub, a, "cat", str(path)).returncode != 0, f"learner {a} can read {path}"
            assert _as(hub, a, "ls", str(inbound)).returncode != 0, f"learner {a} can list the submissions"
            forged = _as(hub, a, "nbgrader", "submit", DAY, f"--student={b}", cwd=pwd.getpwnam(a).pw_dir)
            assert forged.returncode == 0, forged.stderr  # nbgrader lets it into the exchange ...

            # --- the instructor's side
            _hub_cli(hub["env"], "collect", DAY)
            _mark("collected")
            # ... but collect takes only what the learner it names submitted: b's is b's own wrong answer
            collected = json.loads((course / "submitted" / b / DAY / f"{DAY}.ipynb").read_text())
            cell = next(c for c in collected["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "float32_lanes")
            assert "// 64" in "".join(cell["source"]), f"{a} submitted as {b}: collect took the forged submission"
            print(_hub_cli(hub["env"], "autograde", DAY))
            _mark("autograded")
            scores = grading.scores(DAY, course=course)
            assert scores[a].score == 2 and scores[b].score == 0, scores
            _hub_cli(hub["env"], "feedback", DAY)
            released = hub["root"] / "exchange" / "tvm-course" / "feedback"
            assert _as(hub, a, "ls", str(released)).returncode != 0, f"learner {a} can list everyone's feedback"
            _mark("feedback")

            # --- each learner fetches feedback in the browser and gets only their own
            for name, expected in ((a, "2.0 / 4.0"), (b, "0.0 / 4.0")):
                page = pages[name]
                page.reload()
                page.wait_for_selector("#jp-main-dock-panel", timeout=60_000)
                _assignment_list(page)
                # (a's list also shows the submission a forged as b: fetching feedback for either fetches a's own)
                _row_button(page, "submitted_assignments_list", "Fetch Feedback").first.click()
                home = Path(pwd.getpwnam(name).pw_dir)
                for _ in range(60):  # the file appears before nbgrader has written it: wait for all of it (the
                    files = list((home / DAY / "feedback").glob(f"*/{DAY}.html"))  # score comes after the styles)
                    if files and all(f.read_text().rstrip().endswith("</html>") for f in files):
                        break
                    time.sleep(0.5)
                assert len(files) == 1, f"{name} got feedback files {files}"
                text = files[0].read_text()
                (SHOTS / f"feedback-{name[-1]}.html").write_text(text)
                assert expected in text, f"{name}'s feedback does not show their score {expected}"
                leaked = shown(text, _hidden_test_lines())
                assert not leaked, f"{name}'s feedback shows the hidden tests: {leaked[:2]}"
                page.screenshot(path=str(SHOTS / f"feedback-{name[-1]}.png"))
                _mark(f"{name} has their feedback")
            # (in this test, not one of its own: pytest-xdist could run that on another worker, without the hub)
            _check_limits(hub)
        finally:
            browser.close()


def _check_limits(hub):
    """The limits are the kernel's: RLIMIT_AS and the CPU affinity of the learners' servers."""
    import psutil

    uids = {pwd.getpwnam(n).pw_uid for n in hub["learners"]}
    servers = [p for p in psutil.process_iter(["uids", "cmdline"])
               if p.info["uids"] and p.info["uids"].real in uids and "jupyterhub-singleuser" in " ".join(p.info["cmdline"] or [])]
    assert len(servers) == len(uids), "each learner's server runs as their own account"
    for p in servers:
        limits = Path(f"/proc/{p.pid}/limits").read_text()
        line = next(l for l in limits.splitlines() if l.startswith("Max address space"))
        assert line.split()[3:5] == [str(8 << 30)] * 2, line  # soft and hard: the learner cannot raise it
        assert len(p.cpu_affinity()) == 1
        assert p.environ().get("OMP_NUM_THREADS") == "1" and p.environ().get("TVM_COURSE_NO_CACHE") == "1"
