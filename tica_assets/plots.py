"""Plots for evidence a person would rather look at than read: per-step forward diffs per arm,
per-round throughput per concurrency. Drawn from the sealed receipts, not from judge output."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from tica.evidence import EvidenceItem
from tica_assets.core import leg_meta, read_json, read_jsonl

DIFF_MAX = "training/rollout_probs_diff_max"
DIFF_MEAN = "training/rollout_probs_diff_mean"
ARM_COLOR = {"bi1": "tab:blue", "bi0": "tab:orange"}


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def forward_plot(legs: list[Path], subdir: str = "") -> bytes | None:
    series = []
    for leg in legs:
        rows = read_jsonl(leg / subdir / "metrics.jsonl")
        rows = [r for r in rows if DIFF_MAX in r and "step" in r]
        if rows:
            series.append((leg_meta(leg).get("arm", leg.name), rows))
    if not series:
        return None
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6, 3), dpi=80)
    for arm, rows in series:
        steps = [r["step"] for r in rows]
        color = ARM_COLOR.get(arm)
        ax.plot(steps, [r[DIFF_MAX] for r in rows], "o-", color=color, label=f"{arm} max")
        ax.plot(steps, [r.get(DIFF_MEAN, float("nan")) for r in rows], "s--", color=color, label=f"{arm} mean")
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set_ylim(bottom=0)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("step")
    ax.set_ylabel("|p_trainer - p_rollout|")
    ax.set_title("rollout_probs_diff per step (BI=1 passes only at 0)")
    ax.legend(fontsize=7)
    return _png(plt, fig)


def throughput_plot(legs: list[Path], budget: dict[int, float] | None = None) -> bytes | None:
    """Left: raw output throughput of every leg per concurrency. Right: each round's paired loss
    1 - T_BI1/T_BI0 per concurrency, with the frozen budget where there is one."""
    points: dict[tuple[int, object, str], float] = {}
    for leg in legs:
        bench = read_json(leg / "bench.json") if leg.is_dir() else read_json(leg)
        meta = leg_meta(leg) if leg.is_dir() else {}
        if not bench:
            continue
        arm = meta.get("arm") or bench.get("arm")
        conc = meta.get("concurrency") or bench.get("max_concurrency")
        rnd = meta.get("round") or bench.get("round")
        value = bench.get("output_throughput")
        if arm and conc and value is not None:
            points[(int(conc), rnd, arm)] = float(value)
    if not points:
        return None
    plt = _figure()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3), dpi=80)
    concs = sorted({c for c, _, _ in points})
    for offset, arm in ((-0.12, "bi1"), (0.12, "bi0")):
        xs = [concs.index(c) + offset for (c, _, a) in points if a == arm]
        ys = [v for (_, _, a), v in points.items() if a == arm]
        left.scatter(xs, ys, color=ARM_COLOR[arm], label=arm, s=14)
    left.set_xticks(range(len(concs)), [f"c={c}" for c in concs])
    left.set_ylabel("output tok/s")
    left.set_title("throughput of each leg")
    left.legend(fontsize=7)
    for (c, r, arm), t1 in points.items():
        t0 = points.get((c, r, "bi0"))
        if arm == "bi1" and t0:
            right.scatter(concs.index(c), 1 - t1 / t0, color="tab:red", s=14)
    for c, b in (budget or {}).items():
        if c in concs:
            i = concs.index(c)
            right.hlines(b, i - 0.3, i + 0.3, colors="black", linestyles="dashed")
    right.axhline(0, color="grey", linewidth=0.5)
    right.set_xticks(range(len(concs)), [f"c={c}" for c in concs])
    right.set_ylabel("1 - T_BI1/T_BI0")
    right.set_title("paired loss per round (dashes: budget)")
    return _png(plt, fig)


def _png(plt, fig) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


PLOTTERS = {
    EvidenceItem.FORWARD: forward_plot,
    EvidenceItem.UPDATE: lambda legs: forward_plot(legs, subdir="post_forward"),
    EvidenceItem.THROUGHPUT: throughput_plot,
}


def plot_for(item: EvidenceItem, legs: list[Path], budget: dict[int, float] | None = None) -> bytes | None:
    if item is EvidenceItem.THROUGHPUT:
        return throughput_plot(legs, budget)
    plotter = PLOTTERS.get(item)
    return plotter(legs) if plotter else None


def markdown_image(png: bytes, alt: str) -> str:
    return f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})"


def throughput_statistics(numbers: dict, budget: dict[int, float] | None, alpha: float | None,
                          power: float = 0.8) -> dict[str, bytes]:
    """From a judged throughput cell: each valid round's paired loss per c with the sign test's
    band and the budget; and, where a c has two valid rounds or more, the plan's curve (crossed
    rounds against the smallest budget they decide at this run's spread). `alpha` is the frozen
    basis's; without a basis the band is drawn at 0.05 and the pictures say so in their title."""
    import statistics

    from tica.stats import plots as stats_plots

    losses: dict[int, list[float]] = {}
    for r in numbers.get("rounds") or []:
        if r.get("valid") and r.get("loss") is not None:
            losses.setdefault(int(r["c"]), []).append(float(r["loss"]))
    if not losses:
        return {}
    a = alpha if alpha is not None else 0.05
    out = {"per-round loss": stats_plots.per_round_loss_png(losses, budget or {}, a)}
    spread = {c: statistics.stdev(v) for c, v in losses.items() if len(v) >= 2}
    if spread:
        out["plan curve"] = stats_plots.plan_curve_png(spread, {c: statistics.median(losses[c]) for c in spread},
                                                       a, power, budget=budget)
    return out
