"""Real labelled images and the network trained on them (helpers.digits, Day 12): the data, the shipped
weights, and the int8 build of Day 12's steps on it."""

import numpy as np
import pytest
import torch

from helpers import build, digits, machine, quantize
from helpers.errors import CourseError


def test_training_and_test_images_are_disjoint_and_cover_the_data_set():
    train, test = digits._split()
    assert len(test) == digits.TEST_IMAGES and len(train) + len(test) == 1797
    assert not set(train.tolist()) & set(test.tolist())
    images, labels = digits.test_set()
    assert images.shape == (digits.TEST_IMAGES, 1, digits.SIZE, digits.SIZE)
    assert -1.0 <= float(images.min()) and float(images.max()) <= 1.0
    assert set(labels.tolist()) == set(range(10))
    assert torch.equal(digits.test_set(5)[1], labels[:5])


@pytest.fixture(scope="module")
def model():
    return digits.trained_model()


def test_the_shipped_weights_are_trained(model):
    images, labels = digits.test_set()
    right = (digits.predictions(model, images) == labels.numpy()).mean()
    assert right > 0.97, f"the shipped network classifies only {right:.1%} of the test digits (untrained: about 10 %)"


def test_predictions_pad_the_last_batch_and_keep_the_order(model):
    images, _ = digits.test_set(130)
    with torch.no_grad():
        direct = model(images).argmax(-1).numpy()
    assert np.array_equal(digits.predictions(model, images, batch=50), direct)


def test_missing_weights_say_how_to_get_them(monkeypatch, tmp_path):
    monkeypatch.setattr(digits, "WEIGHTS", tmp_path / "none.pt")
    with pytest.raises(CourseError, match="python -m helpers.digits"):
        digits.trained_model()


def test_the_int8_build_of_day_12s_steps_classifies_like_the_float_network(model):
    target = machine.cpu_target()
    images, labels = digits.test_set(digits.BATCH)
    _, int8_model, ranges = quantize.quantized_model(images, target, model=model,
                                                     calibration=digits.calibration_inputs())
    assert len(ranges) == sum(isinstance(m, torch.nn.Conv2d) and quantize.is_pointwise(m) for m in model.modules())
    tvm_int8 = build.compile_model(int8_model, target)
    same = (digits.predictions(tvm_int8, images) == digits.predictions(model, images)).mean()
    assert same >= 0.97, f"TVM's int8 build agrees with float32 on only {same:.0%} of the digits"
