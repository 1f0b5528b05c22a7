"""Pictures of the statistics, as PNG bytes (matplotlib, Agg backend) for Dagster metadata.

Each function takes plain numbers, draws with a figure of its own, closes it, and returns the
PNG; nothing is shown or written to disk. The quality 2x2 is a markdown table.
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from tica.stats import throughput as tstats  # noqa: E402


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def per_round_loss_png(losses: Mapping[int, Sequence[float]], budget: Mapping[int, float], alpha: float) -> bytes:
    """Per concurrency: each round's paired loss 1 - T_BI1/T_BI0 (dots), their median (line), the
    noise band, and the budget (dashed). The band is the sign test's one-sided (1 - alpha) bounds
    of the median; with too few rounds for a bound, the median +- one SD, labelled as such."""
    cs = sorted(losses)
    fig, axes = plt.subplots(1, max(len(cs), 1), figsize=(3.0 * max(len(cs), 1), 3.0), squeeze=False,
                             constrained_layout=True)
    for i, (ax, c) in enumerate(zip(axes[0], cs)):
        ds = list(losses[c])
        ax.plot(range(1, len(ds) + 1), ds, "o", color="tab:blue", label="round loss")
        if ds:
            med = statistics.median(ds)
            ax.axhline(med, color="tab:blue", lw=1, label="median")
            lo, hi = (float(v) for v in tstats.median_bounds(ds, alpha))
            if lo == lo and hi == hi:  # not NaN: enough rounds for a bound
                ax.axhspan(lo, hi, color="tab:blue", alpha=0.15, label=f"{1 - alpha:g} bounds of the median")
            elif len(ds) >= 2:
                sd = statistics.stdev(ds)
                ax.axhspan(med - sd, med + sd, color="tab:gray", alpha=0.15, label="median +- SD (too few rounds "
                                                                                   "for a bound)")
        if c in budget:
            ax.axhline(budget[c], color="tab:red", ls="--", label="budget")
        ax.set_title(f"c={c}")
        ax.set_xlabel("round")
        if i == 0:
            ax.set_ylabel("1 - T_BI1/T_BI0")
    if cs:
        seen: dict[str, object] = {}
        for ax in axes[0]:
            for h, label in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(label, h)
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=5, fontsize=7)
    return _png(fig)


def plan_curve_png(sd: Mapping[int, float], median: Mapping[int, float], alpha: float, power: float,
                   max_rounds: int = 60, budget: Mapping[int, float] | None = None) -> bytes:
    """Per concurrency: the smallest budget that n crossed rounds decide (pass with probability
    >= power at the measured median and SD), against n; the budget as a dashed line."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ns = list(range(2, max_rounds + 1))
    for c in sorted(sd):
        xs, ys = [], []
        for n in ns:
            m = tstats.smallest_decidable_margin(n, sd[c], alpha, power)
            if m is not None:
                xs.append(n)
                ys.append(median[c] + m)
        line, = ax.plot(xs, ys, label=f"c={c}")
        if budget and c in budget:
            ax.axhline(budget[c], color=line.get_color(), ls="--", lw=0.8)
    ax.set_xlabel("crossed rounds")
    ax.set_ylabel("smallest decidable budget (loss)")
    ax.set_title(f"sign test, alpha {alpha:g}, power {power:g}")
    ax.legend(fontsize=7)
    return _png(fig)


def quality_table_md(both_correct: int, only_bi1: int, only_bi0: int, both_wrong: int) -> str:
    """The quality pairing's 2x2, with margins, as a markdown table."""
    n = both_correct + only_bi1 + only_bi0 + both_wrong
    rows = [("BI=1 correct", both_correct, only_bi1), ("BI=1 wrong", only_bi0, both_wrong)]
    lines = ["| | BI=0 correct | BI=0 wrong | total |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {a} | {b} | {a + b} |" for name, a, b in rows]
    lines.append(f"| total | {both_correct + only_bi0} | {only_bi1 + both_wrong} | {n} |")
    return "\n".join(lines)
