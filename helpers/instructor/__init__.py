"""The instructor's and the hub's tools: grading with nbgrader, re-executing sources, JupyterLab's
settings, the JupyterHub class. No notebook and no learner module imports them
(tests/test_environment.py checks it); run them as ``python -m helpers.instructor.<tool>``."""
