"""The dense oracle: what serving a conversation under a profile should give, computed on the
whole model with plain HF attention (serving_reference.py); the equality tests and the fidelity
benchmark compare served answers with it."""
