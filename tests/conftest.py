"""Shared test set-up: one torch thread per process (the two cores are shared)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
