"""JupyterLab settings for the course: open without the news pop-up.

On its first start JupyterLab 4 asks, in a toast, "Would you like to get notified about official
Jupyter news?", and keeps asking until someone answers. The course answers once, for every
learner: no news feed, no update check (both would call a website from the classroom machine).
The answer is a settings *override*: it changes the setting's default in this environment's
JupyterLab, so a learner who wants the news can still switch it on in Settings.

    python -m helpers.instructor.labsettings     # install into this environment (`make env` does it)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PLUGIN = "@jupyterlab/apputils-extension:notification"
# fetchNews is a string setting: "true" (always), "false" (never), "none" (ask: the pop-up).
OVERRIDES = {PLUGIN: {"fetchNews": "false", "checkForUpdates": False}}
# overrides.d/ holds one file per package, merged by JupyterLab; overrides.json stays the user's.
FILE_NAME = "tvm-course.json"


def app_dir() -> Path:
    """The JupyterLab application folder of this environment (``<sys.prefix>/share/jupyter/lab``)."""
    try:
        from jupyterlab.commands import get_app_dir
    except ImportError:
        return Path(sys.prefix) / "share" / "jupyter" / "lab"
    return Path(get_app_dir())


def overrides_file(lab_dir: Path | None = None) -> Path:
    """Where the course's overrides go: ``<app dir>/settings/overrides.d/tvm-course.json``."""
    return Path(lab_dir or app_dir()) / "settings" / "overrides.d" / FILE_NAME


def install(lab_dir: Path | None = None) -> Path:
    """Write the course's setting overrides into JupyterLab's application settings; returns the file."""
    path = overrides_file(lab_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(OVERRIDES, indent=2) + "\n")
    return path


def main() -> int:
    path = install()
    print(f"JupyterLab settings for the course (no news pop-up, no update check): {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
