"""What a request's tangram_ratio parameter becomes at arrival (sglang/scheduling.py ratio_of_request)."""

import types

import numpy as np
import pytest

from tangram_sglang.serving.context import ServingContext
from tangram_sglang.sglang.scheduling import ratio_of_request

BUDGETS = {0.25: np.full((2, 2), 0.25), 0.5: np.full((2, 2), 0.5), 0.7: np.full((2, 2), 0.7)}


def _serving(served=0.5):
    ctx = types.SimpleNamespace(ratio_budgets=BUDGETS, entry=types.SimpleNamespace(ratio=served,
                                                                                   group_budget=BUDGETS[served]))
    ctx.budgets_for = lambda r: ServingContext.budgets_for(ctx, r)
    return types.SimpleNamespace(context=ctx)


def _req(custom_params):
    return types.SimpleNamespace(sampling_params=types.SimpleNamespace(custom_params=custom_params))


@pytest.mark.parametrize("params,ratio", [(None, None), ({}, None), ({"other": 1}, None),
                                          ({"tangram_ratio": 0.5}, None), ({"tangram_ratio": "0.5"}, None),
                                          ({"tangram_ratio": 0.25}, 0.25), ({"tangram_ratio": 0.7 + 1e-12}, 0.7)])
def test_the_served_ratio_or_none_is_no_ratio_of_its_own(params, ratio):
    why, got = ratio_of_request(_serving(), _req(params))
    assert why is None and (got == pytest.approx(ratio) if ratio is not None else got is None)


@pytest.mark.parametrize("value", [0.4, "abc", [0.25], 2, float("nan")])
def test_a_ratio_the_profile_lacks_is_refused_naming_its_ratios(value):
    why, got = ratio_of_request(_serving(), _req({"tangram_ratio": value}))
    assert got is None
    assert why == f"Tangram: tangram_ratio {value!r} is not one of the served profile's ratios (0.25, 0.5, 0.7)"
