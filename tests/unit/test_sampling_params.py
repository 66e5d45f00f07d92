import pytest

from specserve import SamplingParams


@pytest.mark.parametrize("kw", [dict(max_tokens=0), dict(max_tokens=-3), dict(top_p=1.5), dict(top_p=0),
                                dict(temperature=-1), dict(n=0), dict(top_k=-2)])
def test_nonsense_is_rejected(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_stop_string_normalised():
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]
