"""Per-head retention boxes with the budget line, like the paper's Figure 5."""

from __future__ import annotations

import matplotlib
import numpy as np

matplotlib.use("Agg")

MARKERS = {"needle": "^", "sharegpt": "o", "mtbench": "s"}


def pick_layers(num_layers: int, count: int = 6) -> list[int]:
    """``count`` layers evenly spread from first to last."""
    return sorted(set(np.linspace(0, num_layers - 1, min(count, num_layers)).round().astype(int).tolist()))


def retention_figure(path: str, cal: np.ndarray, cal_src: list[str], held: np.ndarray | None,
                     held_src: list[str], budgets: np.ndarray, title: str = "", layers: list[int] | None = None):
    """Save a PNG. cal, held: retention [S, L, H]; budgets: [L, H].

    One panel per layer; heads on x sorted by budget; a box per head over the
    calibration samples; per-source means of the held-out samples as markers;
    the budget of each head as a dashed line.
    """
    import matplotlib.pyplot as plt

    layers = layers or pick_layers(budgets.shape[0])
    fig, axes = plt.subplots(1, len(layers), figsize=(2.2 * len(layers) + 1, 3.2), sharey=True, squeeze=False)
    for ax, layer in zip(axes[0], layers):
        order = np.argsort(budgets[layer], kind="stable")
        xs = np.arange(1, len(order) + 1)
        ax.boxplot([cal[:, layer, h] * 100 for h in order], positions=xs, widths=0.5, showfliers=False)
        for x, h in zip(xs, order):
            ax.hlines(budgets[layer, h] * 100, x - 0.35, x + 0.35, colors="tab:red", linestyles="dashed")
        if held is not None and len(held):
            src = np.asarray(held_src)
            for s in dict.fromkeys(held_src):
                ax.scatter(xs, held[src == s][:, layer, order].mean(axis=0) * 100, s=14,
                           marker=MARKERS.get(s, "x"), label=f"held-out {s}", zorder=3)
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xticks(xs, [f"h{h}" for h in order], fontsize=8)
        ax.set_xlabel("heads by budget", fontsize=8)
    axes[0][0].set_ylabel("retention (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="tab:red", linestyle="dashed"))
    labels.append("budget mu + alpha sigma")
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(title + " (boxes: calibration samples)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
