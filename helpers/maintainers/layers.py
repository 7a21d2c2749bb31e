"""Tuned TVM's convolutions against the fastest PyTorch's and ONNX Runtime's, layer by layer
(``python -m helpers.maintainers.benchmark layers``)."""

from __future__ import annotations

from .. import databases, layer_compare, machine, models, peers
from ..build import check_parity
from ..peers import FROZEN, ORT
from ..results import results_path_here, save_record


def compare_layers(model_name: str, batch: int = 1, repeats: int = 10, mcpu: str | None = None,
                   save: bool = True) -> dict:
    """Tuned TVM's convolutions (the database ``databases.choose`` picks) against the fastest PyTorch's
    (freezing: oneDNN, BatchNorm folded) and, unless the CPU class is imitated, ONNX Runtime's, layer
    by layer (``helpers.layer_compare``): the profile that says where a model's gap to each peer is.
    Prints where tuned TVM loses most and (``save``) keeps every table in results/layers-<model>-<cpu>-<cores>cores.json."""
    target = machine.target_for(mcpu)
    model, x, imported = models.load_imported(model_name, batch)
    database = databases.choose(model_name, imported, target, batch, tune_if_missing=False)
    compiled = database.compile(imported, target)
    check_parity(compiled, model, x)
    found = peers.peers(model, x, with_onnx_runtime=not machine.is_imitated(target), which=[FROZEN, ORT])
    tables = layer_compare.against_peers(compiled, model, x, found.runners, repeats)
    print(f"{model_name}, batch {batch}, TVM built for {target.attrs['mcpu']} with {database.label()}, "
          f"on {machine.cpu_name()}:")
    for engine, frame in tables.items():
        columns = [c for c in frame.columns if c.endswith(" ms")]
        print(f"\nagainst {engine}: {frame[columns[0]].sum():.2f} ms against {frame[columns[1]].sum():.2f}; "
              "where tuned TVM loses most:")
        print(layer_compare.where_time_is_lost(frame, 8).round(3).to_string(index=False))
    if save:
        path = results_path_here(target, "json", f"layers-{model_name}")
        save_record(path, machine=machine.describe().as_dict(), target=str(target), imitated=machine.is_imitated(target),
                    model=model_name, batch=batch, database=database.label(),
                    **{f"layers against {engine}": frame.round(3).to_dict(orient="records") for engine, frame in tables.items()})
        print(f"saved {path}")
    return tables
