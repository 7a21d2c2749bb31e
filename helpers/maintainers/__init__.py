"""The course's own measuring and shipping machinery: what makes ``results/`` and ``tuning/``.

No notebook and no learner module imports this package (``tests/test_architecture.py`` checks it); it
imports the learner modules, as a notebook would, and runs them at full size. Its commands:

| command | module | writes |
| --- | --- | --- |
| ``make benchmark``: ``python -m helpers.maintainers.benchmark table``, ``int8``, ``transformer`` | ``benchmark`` (the command line), ``table``, ``int8_table``, ``transformer_table`` | ``results/benchmark-*``, ``int8-*``, ``transformer-*`` |
| ``python -m helpers.maintainers.benchmark tune MODEL --stages 8 16 --keep 1`` | ``stages`` | a database and its curve (``build/tuning/``, or ``--into tuning/NAME``) |
| ``python -m helpers.maintainers.benchmark compare MODEL DIR...`` | ``table`` | prints which database builds the faster model |
| ``python -m helpers.maintainers.benchmark layers MODEL`` | ``layers`` | ``results/layers-*`` |
| ``python -m helpers.maintainers.transfer_study MODEL`` | ``transfer_study`` | ``results/transfer-*`` |
| ``python -m helpers.maintainers.shipping int8 TRIALS`` / ``prefill`` / ``decode`` | ``shipping`` | Day 12's and Day 14's databases in ``tuning/`` |
| ``make capstone``: ``python -m helpers.maintainers.capstone`` | ``capstone`` | ``results/capstone-*`` |
| ``python -m helpers.maintainers.gpu_record`` (on an NVIDIA GPU) | ``gpu_record`` | ``results/gpu/*`` |

``report`` is what the comparisons share: timings as records, the load average, printing a result and
keeping it in ``results/`` (``helpers.results`` names the files). docs/maintainers.md says when to run each.
"""
