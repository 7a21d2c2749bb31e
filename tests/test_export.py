import json
import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from helpers import export, ir
from helpers.errors import CourseError


@pytest.fixture(scope="module")
def artefact(tiny_compiled, tiny_imported, tiny_input, tmp_path_factory):
    """The tiny model exported as the course's artefact folder."""
    folder = tmp_path_factory.mktemp("artefact")
    with export.capture_stderr():
        tiny_compiled.executable.export_library(str(folder / export.LIBRARY))
    export.save_params(tiny_imported, folder / export.PARAMS)
    export.write_input_spec(tiny_imported, folder / export.SPEC)
    export.write_loader(folder)
    np.save(folder / export.INPUT, tiny_input.numpy())
    return folder


def test_capture_stderr_catches_native_and_python_writes_and_restores_fd2():
    before = os.fstat(2).st_ino
    with export.capture_stderr() as err:
        os.write(2, b"from C: file descriptor 2\n")
        print("from Python", file=sys.stderr)
    assert err.lines == ["from C: file descriptor 2", "from Python"]
    assert os.fstat(2).st_ino == before, "fd 2 must point where it pointed before"


def test_export_library_logs_nothing_outside_the_capture(tiny_compiled, tmp_path, capfd):
    capfd.readouterr()
    with export.capture_stderr() as err:
        tiny_compiled.executable.export_library(str(tmp_path / "m.so"))
    assert (tmp_path / "m.so").stat().st_size > 0
    assert capfd.readouterr().err == "", "TVM's log lines should be held by capture_stderr, not leak"
    assert isinstance(err.text, str)


def test_fresh_process_output_is_bit_identical(artefact, tiny_compiled, tiny_input):
    run = export.run_loader(artefact)
    assert run.info["runtime_only"] is True and run.info["tvm_libraries"] == ["tvm_runtime"]
    assert run.command[0] == sys.executable
    fresh = np.load(artefact / export.OUTPUT)
    assert np.array_equal(fresh, tiny_compiled(tiny_input))


def test_the_loader_records_which_process_wrote_the_output(artefact):
    import hashlib

    run = export.run_loader(artefact)
    record = json.loads((artefact / export.RUN_RECORD).read_text())
    assert record == run.info
    assert record["pid"] != os.getpid(), "the loader ran in a process of its own"
    assert record["output_sha256"] == hashlib.sha256((artefact / export.OUTPUT).read_bytes()).hexdigest()


def test_loader_refuses_an_input_of_the_wrong_shape(artefact, tmp_path):
    for name in (export.LIBRARY, export.PARAMS, export.SPEC):
        (tmp_path / name).write_bytes((artefact / name).read_bytes())
    np.save(tmp_path / export.INPUT, np.zeros((1, 3, 32, 32), "float32"))
    with pytest.raises(export.ReloadError, match=r"compiled for \[2, 3, 32, 32\] float32"):
        export.run_loader(tmp_path)


def test_params_are_keyed_by_main_parameter_names(artefact, tiny_imported):
    loaded = tvm.runtime.load_param_dict_from_file(str(artefact / export.PARAMS))
    names = export.param_names(tiny_imported)
    assert list(names) == [str(p.name) for p in tiny_imported.mod["main"].params[1:]]
    assert set(loaded.keys()) == set(names)
    for name, p in zip(names, tiny_imported.params):
        assert np.array_equal(loaded[name].numpy(), p.numpy())
    spec = json.loads((artefact / export.SPEC).read_text())
    assert spec["input"] == {"name": export.input_name(tiny_imported), "shape": [2, 3, 32, 32], "dtype": "float32"}
    assert spec["params"] == names


def test_library_contents_lists_the_kernels_and_the_embedded_executable(artefact, tiny_imported, tmp_path):
    contents = export.library_contents(artefact / export.LIBRARY)
    assert set(contents.kernels) == set(ir.kernel_names(relax.transform.LegalizeOps()(tiny_imported.mod)))
    assert any(k.startswith("conv2d") for k in contents.kernels)
    assert 0 < contents.code_bytes < contents.file_bytes and contents.executable_bytes > 0
    # binding the weights moves them into the executable blob
    mod = tiny_imported.mod
    bound = relax.transform.BindParams("main", dict(zip(mod["main"].params[1:], tiny_imported.params)))(mod)
    with export.capture_stderr():
        tvm.compile(bound, target=tvm.target.Target({"kind": "llvm"})).export_library(str(tmp_path / "b.so"))
    weights = sum(p.numpy().nbytes for p in tiny_imported.params)
    grown = export.library_contents(tmp_path / "b.so").executable_bytes - contents.executable_bytes
    assert 0.9 * weights <= grown <= 1.5 * weights, f"the blob grew by {grown} bytes for {weights} bytes of weights"


def test_library_contents_explains_a_missing_library(tmp_path):
    with pytest.raises(CourseError, match="export it first"):
        export.library_contents(tmp_path / "nothing.so")


def test_file_sizes_and_runtime_files(artefact):
    sizes = export.file_sizes(artefact)
    assert list(sizes.values()) == sorted(sizes.values(), reverse=True)
    assert sizes[export.LIBRARY] == (artefact / export.LIBRARY).stat().st_size
    libs = export.runtime_files()
    assert {"libtvm_runtime.so", "libtvm_ffi.so"} <= set(libs)
    assert libs["libtvm_runtime.so"] < libs.get("libtvm_compiler.so", float("inf"))


def test_vector_registers_read_the_instruction_set_a_library_needs(tiny_imported, tmp_path):
    counts = {}
    for mcpu in ("x86-64-v2", "x86-64-v3"):
        target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
        path = tmp_path / f"{mcpu}.so"
        with export.capture_stderr():
            tvm.compile(tiny_imported.mod, target=target, relax_pipeline="default").export_library(str(path))
        counts[mcpu] = export.vector_registers(path)
    assert counts["x86-64-v2"]["xmm"] > 0 and counts["x86-64-v2"]["ymm"] == counts["x86-64-v2"]["zmm"] == 0  # SSE only
    assert counts["x86-64-v3"]["ymm"] > 0 and counts["x86-64-v3"]["zmm"] == 0  # AVX2, no AVX-512
    with pytest.raises(CourseError, match="export it first"):
        export.vector_registers(tmp_path / "missing.so")
