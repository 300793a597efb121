"""The Figure-9-style plot of the fidelity benchmark: accuracy against kept share, one panel per model."""

from __future__ import annotations

from benchmarks.fidelity.settings import base_setting

# overlapping lines (the server and its oracle agree exactly) stay visible through markers and dashes
STYLES = {"tangram": ("o", "-"), "static": ("x", ":"), "dynamic": ("^", "-"), "uniform": ("s", "--"),
          "kvpress-snapkv": ("v", "-"), "kvpress-adakv-snapkv": ("D", ":"), "kvpress-kvzip": ("P", "-")}


def plot(summary: list[dict], path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = sorted({s["model"] for s in summary})
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = [s for s in summary if s["model"] == model and s["accuracy"] is not None]
        for setting in dict.fromkeys(s["setting"] for s in rows):
            pts = sorted((s["kept_share"], s["accuracy"], s) for s in rows
                         if s["setting"] == setting and s["kept_share"] is not None)
            if setting == "full" and pts:
                ax.axhline(100 * pts[0][1], color="black", ls="--", lw=1, label="full KV (stock SGLang)")
                ax.plot([100], [100 * pts[0][1]], marker="*", color="black", ms=10)
                continue
            xs, ys = [100 * p[0] for p in pts], [100 * p[1] for p in pts]
            marker, ls = STYLES.get(base_setting(setting), ("o", "-"))
            ax.plot(xs, ys, marker=marker, ls=ls, label=setting, alpha=0.85)
            for x, y, (_, _, s) in zip(xs, ys, pts):
                if s["degenerate"]:
                    ax.annotate(f"{s['degenerate']} deg.", (x, y), fontsize=7, xytext=(3, -9),
                                textcoords="offset points")
                if s["saved_vs_full_kv"] is not None:
                    ax.annotate(f"saves {100 * s['saved_vs_full_kv']:.0f}%", (x, y), fontsize=7,
                                xytext=(3, 4), textcoords="offset points")
        ax.set_xlabel("KV kept (% of full)")
        ax.set_ylabel("multi-turn accuracy (%)")
        ax.set_title(f"{model}: accuracy vs kept share")
        ax.set_ylim(-2, 102)
        ax.set_xlim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
