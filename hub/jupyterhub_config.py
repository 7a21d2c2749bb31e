"""JupyterHub for the course on one machine (`make hub`; see the README, "A class on JupyterHub").

Learners log in with their Unix account (PAM; `python -m helpers.instructor.hub add-learner NAME`), and each
gets JupyterLab as that account with the course kernel and nbgrader's Assignment List, under the
limits of helpers.instructor.hub_spawner.CourseSpawner. Set with environment variables (defaults in brackets):
  TVM_HUB_ROOT [/srv/tvm-course]  exchange, instructor's course directory, hub state
  TVM_HUB_INSTRUCTOR [instructor] the instructor's Unix account (a hub admin)
  TVM_HUB_GROUP [tvm-learners]    the learners' Unix group: only its members (and the instructor) log in
  TVM_HUB_IP [0.0.0.0], TVM_HUB_PORT [8000]    where the class connects
  TVM_HUB_API_PORT [8081], TVM_HUB_PROXY_API_PORT [8001]   the hub's and proxy's own ports (localhost)
  TVM_HUB_MEM [8G]  memory per learner process;  TVM_HUB_CPUS [1]  cores per learner
Put TLS in front (or set c.JupyterHub.ssl_key/ssl_cert) before a class logs in over a network:
passwords cross it.
"""

import os
from pathlib import Path

from helpers.instructor import hub as course
from helpers.instructor.hub_spawner import CourseSpawner

c = get_config()  # noqa: F821
env = os.environ.get
h = course.Hub.from_env()
REPO = Path(__file__).resolve().parent.parent

c.JupyterHub.bind_url = f"http://{env('TVM_HUB_IP', '0.0.0.0')}:{env('TVM_HUB_PORT', '8000')}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{env('TVM_HUB_API_PORT', '8081')}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('TVM_HUB_PROXY_API_PORT', '8001')}"
# configurable-http-proxy, pinned in hub/package.json, installed by `make hub` into hub/node_modules
c.ConfigurableHTTPProxy.command = [str(REPO / "hub" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.JupyterHub.db_url = f"sqlite:///{h.state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(h.state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(h.state / "jupyterhub.pid")

# Local Unix accounts, passwords checked by PAM; the instructor administers the hub.
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {h.group}
c.Authenticator.allowed_users = {h.instructor}
c.Authenticator.admin_users = {h.instructor}

c.JupyterHub.spawner_class = CourseSpawner
c.Spawner.cmd = [str(course.BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.http_timeout = 60
c.Spawner.mem_limit = env("TVM_HUB_MEM", "8G")
c.Spawner.cpu_limit = float(env("TVM_HUB_CPUS", "1"))
c.Spawner.environment = {
    "PATH": f"{course.BIN}:/usr/local/bin:/usr/bin:/bin",
    # the course id and exchange for nbgrader, and the learners' extensions (helpers.instructor.hub.setup)
    "JUPYTER_CONFIG_PATH": str(h.learner_config),
    # the compile cache is the repo's build/compiled, which learners cannot write: build afresh
    "TVM_COURSE_NO_CACHE": "1",
}
