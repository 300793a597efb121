"""The memory benchmark's byte model agrees with the allocator and orders the methods as it should."""

import numpy as np
import pytest

from benchmarks.modeled.memory_reclaim import multi_turn, request_bytes


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_analytic_ragged_equals_allocator_and_methods_are_ordered(page_size):
    rng = np.random.default_rng(page_size)
    budgets = rng.uniform(0.02, 1.0, (3, 4))
    chunks, decode = [37, 37, 11], 9
    measured = request_bytes(budgets, 8, page_size, 2, chunks, decode, measure=True)
    analytic = request_bytes(budgets, 8, page_size, 2, chunks, decode, measure=False)
    assert measured == analytic
    m = measured
    assert m["ideal"] <= m["budget_aware"] <= m["monolithic"] <= m["full"]
    assert m["ideal"] <= m["adjacent"] <= m["monolithic"]
    budgets[0, 0] = 1.0  # one saturated head: monolithic pads every head of every layer to it
    assert request_bytes(budgets, 8, page_size, 2, chunks, decode, measure=False)["monolithic"] == m["full"]


def test_multi_turn_padding_is_zero_for_page_size_one_and_in_place_is_cheapest():
    budgets = np.random.default_rng(0).uniform(0.05, 1.0, (2, 4))
    assert multi_turn(budgets, 2, 1, 3, 50, 20, 5) == {"dense_in_place": 0.0, "dense_copy": 0.0,
                                                       "fresh_page_per_segment": 0.0}
    o = multi_turn(budgets, 2, 16, 3, 50, 20, 5)
    assert 0 <= o["dense_in_place"] <= o["dense_copy"] and o["dense_in_place"] <= o["fresh_page_per_segment"]
