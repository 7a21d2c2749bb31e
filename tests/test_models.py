import pytest
import torch

from helpers import models
from helpers.errors import ExportError, InputShapeError, UnknownModelError


def test_unknown_model_name_says_what_to_do():
    with pytest.raises(UnknownModelError, match="mobilenet_v2.*available_models"):
        models.load_model("mobilenet_v9")


def test_offline_load_falls_back_to_seeded_random_weights_visibly(capsys):
    a = models.load_model("resnet18", pretrained=True, seed=3)
    out = capsys.readouterr()
    if "pretrained ImageNet weights loaded" not in out.out:  # no network, no cache: the fallback
        assert "random weights with seed 3" in out.out
        b = models.load_model("resnet18", pretrained=True, seed=3)
        c = models.load_model("resnet18", pretrained=True, seed=4)
        assert torch.equal(a.conv1.weight, b.conv1.weight)
        assert not torch.equal(a.conv1.weight, c.conv1.weight)
    assert out.err == "", "a failed download must not write to stderr (nbgrader scores stderr as a failure)"
    assert not a.training


def test_example_input_is_seeded_and_checked():
    assert models.example_input(4).shape == (4, 3, 224, 224)
    assert torch.equal(models.example_input(2, seed=5), models.example_input(2, seed=5))
    with pytest.raises(InputShapeError):
        models.example_input(0)


def test_import_splits_out_the_weights(tiny_imported, tiny_model):
    # trainable parameters become inputs of main; buffers (BatchNorm's running stats) stay constants
    assert tiny_imported.num_params == len(list(tiny_model.parameters()))
    assert tiny_imported.input_shape == (2, 3, 32, 32)
    assert tiny_imported.input_dtype == "float32"
    # main takes the input, then the weights
    assert len(tiny_imported.mod["main"].params) == 1 + tiny_imported.num_params


def test_wrong_input_shape_is_reported_in_words(tiny_model):
    with pytest.raises(InputShapeError, match=r"\(2, 5, 32, 32\)"):
        models.import_to_relax(tiny_model, torch.randn(2, 5, 32, 32))


def test_any_export_failure_arrives_as_the_course_error_naming_the_input_and_what_the_model_takes(capsys):
    # PyTorch's own message here names neither a shape nor a size: "a and b must have same reduction dim"
    linear = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    with pytest.raises(InputShapeError) as err:
        models.import_to_relax(linear, torch.randn(2, 5))
    message = str(err.value)
    assert "(2, 5)" in message and "(..., 4)" in message and "Linear" in message, message
    assert isinstance(err.value.__cause__, RuntimeError), "PyTorch's error is chained to the course's"
    assert capsys.readouterr().err == "", "the failed export's log must not reach stderr (it costs a graded cell)"

    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).eval()
    with pytest.raises(InputShapeError, match=r"float64.*\(batch, 3, height, width\), float32"):
        models.import_to_relax(conv, torch.randn(1, 3, 8, 8, dtype=torch.float64))


def test_an_export_failure_that_is_not_the_input_is_an_export_error():
    class DataDependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x) if x.sum() > 0 else -self.fc(x)   # control flow on values: torch.export refuses

    with pytest.raises(ExportError, match=r"\(2, 4\)") as err:
        models.export(DataDependent().eval(), torch.randn(2, 4))
    assert not isinstance(err.value, InputShapeError) and err.value.__cause__ is not None
