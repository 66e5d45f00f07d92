"""The activation mode is checked where it is configured: a mode the registry does not list, or int8
where the CPU block kernels do not run (CUDA, bf16, block kernels off), is one ValueError naming it."""
import pytest

from specserve.config import ACTIVATIONS, ModelConfig


def test_the_modes():
    assert ACTIVATIONS == ("fp32", "int8")
    assert ModelConfig().activations == "fp32"
    assert ModelConfig(activations="int8").activations == "int8"


@pytest.mark.parametrize("kw", [dict(activations="int4"), dict(activations="int8", device="cuda"),
                                dict(activations="int8", dtype="bfloat16"), dict(activations="int8", block_kernels=False)])
def test_refused_where_it_cannot_run(kw):
    with pytest.raises(ValueError, match="activations"):
        ModelConfig(**kw)
