"""The ahead-of-time split map (Algorithm 1, round version) by hand."""

import numpy as np
import pytest

from tangram_sglang.attention.split_row import device_parallel_capacity
from tangram_sglang.method.split_map import DEFAULT_PARALLEL_CAPACITY, compute_split_map


def test_docstring_example():
    b = np.array([[0.9, 0.1, 0.5, 0.2]])
    s = compute_split_map(b, [[[1, 3], [2, 0]]], 17)  # Omega 1.7, tau 0.1, Phi [0.3, 1.4]
    assert s.tolist() == [[3, 14]]
    assert s.dtype == np.int64


def test_each_layer_has_its_own_tau_and_floor_of_one():
    b = np.array([[0.5, 0.5], [0.01, 0.99]])
    s = compute_split_map(b, [[[0], [1]], [[0], [1]]], 8)
    # layer 0: tau = 1/8 -> [4, 4]; layer 1: tau = 1/8 -> round(0.08) = 0 -> 1, round(7.92) = 8
    assert s.tolist() == [[4, 4], [1, 8]]


def test_round_half_to_even_like_python_round():
    b = np.array([[0.25, 0.75]])  # tau = 1/4 at N_CTA 4 -> shares 1, 3; at 2 -> 0.5 -> 1 (floor), 1.5 -> 2
    assert compute_split_map(b, [[[0], [1]]], 4).tolist() == [[1, 3]]
    assert compute_split_map(b, [[[0], [1]]], 2).tolist() == [[1, 2]]
    b2 = np.array([[0.625, 0.375]])  # N_CTA 4 -> 2.5 -> 2, 1.5 -> 2
    assert compute_split_map(b2, [[[0], [1]]], 4).tolist() == [[round(2.5), round(1.5)]]


def test_zero_budget_layer_gets_one_split_and_bad_capacity_raises():
    assert compute_split_map(np.zeros((1, 2)), [[[0], [1]]], 16).tolist() == [[1, 1]]
    with pytest.raises(ValueError, match="parallel capacity"):
        compute_split_map(np.ones((1, 2)), [[[0], [1]]], 0)


def test_capacity_without_gpu_is_the_configured_default():
    import torch

    if not torch.cuda.is_available():
        assert device_parallel_capacity() == DEFAULT_PARALLEL_CAPACITY
    else:
        props = torch.cuda.get_device_properties(0)
        assert device_parallel_capacity(2) == 2 * props.multi_processor_count


def test_profile_split_map_weights_stored_work():
    # Groups [[1, 3], [2, 0]] store beta = [0.2, 0.9] for both of their heads:
    # stored budgets [0.9, 0.2, 0.9, 0.2], Phi = [0.4, 1.8], Omega = 2.2.
    from tangram_sglang.method.split_map import profile_split_map, stored_budgets

    b = np.array([[0.9, 0.1, 0.5, 0.2]])
    groups = [[[1, 3], [2, 0]]]
    assert stored_budgets(b, groups).tolist() == [[0.9, 0.2, 0.9, 0.2]]
    assert profile_split_map(b, groups, 22).tolist() == [[4, 18]]  # tau = 0.1
    # The paper's raw sums would give [3, 14] of 17 CTAs for the same shares of 1.7.
    assert compute_split_map(b, groups, 17).tolist() == [[3, 14]]
