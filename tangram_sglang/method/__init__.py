"""The method, on integers and numpy only: budgets from calibration statistics (budgets.py),
head groups (grouping.py), per-head token selection (selection.py), protected tokens
(protection.py), the ahead-of-time split map (split_map.py) and the chunk schedule
(chunks.py). Nothing here imports torch, transformers or sglang."""
