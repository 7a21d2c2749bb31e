"""helpers.hugging_face: transformers' GPT-2 and Llama from small configs, through TVM."""

import pytest
import torch

from helpers import build, hugging_face, ir, transformer


class Cumsums(torch.nn.Module):
    """cumsum of a boolean, of an int32 and of a float with a dtype asked for: PyTorch gives int64, int64, float64."""

    def forward(self, x):
        return torch.cumsum(x > 0, dim=1), torch.cumsum(x.to(torch.int32), dim=1), torch.cumsum(x, dim=1, dtype=torch.float64)


def test_cumsum_is_imported_in_the_dtype_pytorch_computes():
    x = torch.randn(2, 5)
    fixed = hugging_face.import_model(Cumsums(), x)  # any module: the converter does not care what it runs in
    assert [call.ty.dtype for call in ir.calls(fixed.mod, "cumsum")] == ["int64", "int64", "float64"]
    as_is = hugging_face.import_model(Cumsums(), x, fixed=False)
    assert len(hugging_face.boolean_cumsums(as_is.mod)) == 1, "TVM 0.27's own converter keeps bool: if this fails, it was fixed"


def test_without_the_converter_a_hugging_face_gpt2_does_not_build():
    model = hugging_face.small_model("gpt2", width=32, heads=2)
    as_is = hugging_face.import_model(model, transformer.tokens(12, seed=2), fixed=False)
    assert hugging_face.boolean_cumsums(as_is.mod), "transformers' mask looks for packed sequences with a bool cumsum"
    with pytest.raises(Exception, match="kDLFloat"):
        build.compile_model(as_is)


@pytest.mark.parametrize("family", hugging_face.FAMILIES)
def test_hugging_face_models_with_the_converter_build_and_match_pytorch(family):
    model = hugging_face.small_model(family, vocab=96, width=32, heads=2, seed=4)
    ids = transformer.tokens(24, vocab=96, seed=9)
    imported = hugging_face.import_model(model, ids)
    assert not hugging_face.boolean_cumsums(imported.mod)
    assert build.check_parity(build.compile_model(imported), model, ids) < 1e-5


def test_an_unknown_family_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="gpt2"):
        hugging_face.small_model("bert")
