"""Reading one forward receipt (a forward leg's, or an update's post_forward/) for one arm: every
step present, BI=1 bitwise equal (from the arrays where they exist, else the logged numbers with a
content digest), BI=0 of the reference's magnitude. The forward's room (tica/items/forward/) and
the update's room (tica/items/update/) both read it."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tica.grad_reading import zero_advantage
from tica.judging import Findings
from tica.messages import digest
from tica.metrics import forward_metrics, n_bitwise_diff, step_content_digest
from tica.receipts import ARRAYS_DIR, METRICS_FILE, ForwardStep, load_step_arrays, load_step_metrics, step_arrays_path
from tica.routing import compare_routing

_STEP_FILE = re.compile(r"step_(\d+)\.npz")
STEP_HEADERS = ["step", "basis", "checkpoint", "max", "mean", "std", "pearson", "k3 KL",
                "tokens", "bitwise diffs", "decode≠prefill", "grad norm", "source", "verdict"]


@dataclass
class ForwardReading:
    """One forward receipt (a leg's, or an update's post_forward/) judged for one arm."""

    findings: Findings = field(default_factory=Findings)
    rows: list[list[Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)


def _same(logged: Any, recomputed: Any) -> bool:
    if isinstance(logged, float) or isinstance(recomputed, float):
        a, b = float(logged), float(recomputed)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        # No absolute slack: a logged 0 against a recomputed 1e-13 is exactly the lie to catch.
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)
    return logged == recomputed


def _recompute(forward_dir: Path, step: ForwardStep, findings: Findings, label: str) -> dict[str, Any] | None:
    path = step_arrays_path(forward_dir, step.step)
    if not path.is_file():
        return None
    arrays = load_step_arrays(path)
    t, r = arrays.trainer_logprobs, arrays.rollout_logprobs
    if t.size > 1 and bool((t == t.flat[0]).all()) and bool((r == t.flat[0]).all()):
        findings.inconclusive(f"{label}step {step.step}: every scored logprob is {float(t.flat[0])!r} on both sides: "
                              "a placeholder, not a measurement")
    m = forward_metrics(arrays.trainer_logprobs, arrays.rollout_logprobs)
    out: dict[str, Any] = {
        "max": m["training/rollout_probs_diff_max"],
        "mean": m["training/rollout_probs_diff_mean"],
        "std": m["training/rollout_probs_diff_std"],
        "pearson": m["training/rollout_actor_probs_pearson_corr"],
        "k3": m["rollout_corr/k3_kl"],
        "n_tokens": m["tica/n_tokens"],
        "n_bitwise_diff": m["tica/n_bitwise_diff"],
        "abs_max": m["tica/logprob_abs_diff_max"],
        "decode_diff": None,
        # the step's content identity (labels left out; two trainers scoring one history are two measurements)
        "content": step_content_digest(arrays.token_ids, arrays.seq_lens, arrays.trainer_logprobs,
                                       arrays.rollout_logprobs),
    }
    if arrays.decode_logprobs is not None and arrays.decode_mask is not None:
        out["decode_diff"] = n_bitwise_diff(arrays.rollout_logprobs, arrays.decode_logprobs, where=arrays.decode_mask)
    if arrays.rollout_experts is not None and arrays.trainer_experts is not None:
        out["routing"] = compare_routing(arrays.seq_lens, arrays.rollout_experts, arrays.trainer_experts,
                                         arrays.rollout_logprobs, arrays.trainer_logprobs,
                                         arrays.rollout_gate_weights, arrays.trainer_gate_weights)
    logged = {"max": step.probs_diff_max, "mean": step.probs_diff_mean, "std": step.probs_diff_std,
              "pearson": step.pearson, "k3": step.k3_kl, "n_tokens": step.n_tokens,
              "n_bitwise_diff": step.n_bitwise_diff, "abs_max": step.logprob_abs_diff_max,
              "content": step.content_sha256}
    for key, value in logged.items():
        if value is None:
            continue
        r = out[key]
        if key == "content" and value != r:
            findings.inconclusive(f"{label}step {step.step}: metrics.jsonl's content digest {digest(value)} is not its "
                                  f"arrays' {digest(r)}; the receipt contradicts itself (judged on the arrays)")
        elif not _same(value, r):
            findings.inconclusive(
                f"{label}step {step.step}: metrics.jsonl says {key}={value!r}, its arrays give {r!r}; "
                "the receipt contradicts itself (judged on the arrays)"
            )
    return out


_LABELS = {"step", "step_basis", "checkpoint_version"}


def _logged_content(step: ForwardStep) -> str:
    """A logged-only step's content identity: its recorded digest of tokens and logprobs, else
    everything it measured (its labels left out: a copy under a new step and checkpoint is one
    measurement). Without a digest, BI=1 steps that pass measure all zeros and cannot be told
    apart this way: `read_forward` does not count them."""
    if step.content_sha256 is not None:
        return step.content_sha256
    body = json.dumps(step.model_dump(mode="json", by_alias=True, exclude=_LABELS), sort_keys=True)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def same_content(label: str, steps: Sequence[dict[str, Any]]) -> list[str]:
    """Steps that measured one thing under several step numbers: one measurement, counted once."""
    by_content: dict[str, list[int]] = {}
    for s in steps:
        by_content.setdefault(s["content"], []).append(s["step"])
    return [f"{label}steps {nums} hold one measurement (content {digest(content)}): a copy under another step "
            "number is not another step" for content, nums in by_content.items() if len(nums) > 1]


def _bi0_grad_norm(s: ForwardStep, required: bool, f: Findings, label: str) -> None:
    """The smoke check's grad norm: finite; exactly 0 only where every group's rewards are equal."""
    g = s.grad_norm
    if g is None:
        if required:
            f.inconclusive(f"{label}step {s.step}: grad norm not recorded (actor/grad_norm): the BI=0 smoke check is incomplete")
    elif not math.isfinite(g):
        f.fail(f"{label}step {s.step}: BI=0 grad norm is {g}")
    elif g == 0:
        if s.within_group_rewards is None:
            f.inconclusive(f"{label}step {s.step}: BI=0 grad norm exactly 0 and no within-group rewards recorded")
        elif zero_advantage(s.within_group_rewards):
            f.note(f"{label}step {s.step}: BI=0 grad norm 0 explained: every group has equal rewards, advantage 0")
        else:
            f.fail(f"{label}step {s.step}: BI=0 grad norm exactly 0 while rewards vary within a group: a numerical fault")


def _judge_bi0_step(s: ForwardStep, mx: float, mean: float, bi0_range: tuple[float, float] | None,
                    grad_norm_required: bool, noise_floor: float, f: Findings, label: str) -> None:
    if bi0_range is not None and not (bi0_range[0] <= mean <= bi0_range[1]):
        f.fail(
            f"{label}step {s.step}: BI=0 mean {mean:.3g} is not the magnitude of the reference "
            f"(allowed [{bi0_range[0]:.3g}, {bi0_range[1]:.3g}])"
        )
    if not math.isfinite(mx):
        f.fail(f"{label}step {s.step}: BI=0 max is {mx}")
    if not math.isfinite(mean):
        f.fail(f"{label}step {s.step}: BI=0 mean is {mean}")
    if noise_floor > 0 and mean <= noise_floor:
        f.note(f"{label}step {s.step}: BI=0 mean {mean:.3g} is inside the noise floor {noise_floor:g}: "
               "not distinguishable from noise")
    _bi0_grad_norm(s, grad_norm_required, f, label)


def read_forward(
    forward_dir: Path, arm: str, min_steps: int, bi0_range: tuple[float, float] | None, label: str = "",
    grad_norm_required: bool = False, noise_floor: float = 0.0,
) -> ForwardReading:
    """Judge one forward receipt directory (metrics.jsonl [+ arrays/]) as arm `arm`.

    `bi0_range` is the allowed BI=0 mean |diff|; None reports BI=0 without judging its magnitude.
    `grad_norm_required`: a BI=0 step without a recorded grad norm is not a pass (smoke check).
    Where some steps have arrays, every step must: one receipt is judged from one source, never its
    arrays where they exist and its logged numbers where they were left out. (Whether the steps
    begin where the run began is judged over all of an arm's legs: `_arm_covers`.)
    """
    reading = ForwardReading()
    f = reading.findings
    steps: list[ForwardStep] = load_step_metrics(forward_dir / METRICS_FILE, ForwardStep)
    if not steps:
        f.inconclusive(f"{label}no steps in {forward_dir / METRICS_FILE}")
        return reading
    unknown = [k for k in ("step_basis", "checkpoint_version") if any(getattr(s, k) is None for s in steps)]
    if unknown:
        # Without them the steps cannot be tied to a checkpoint: the bitwise claim is not about a
        # known model state. BI=0 only reports a magnitude, which does not hinge on it.
        msg = (f"{label}unknown: {', '.join(unknown)} ({forward_dir.name}/{METRICS_FILE}): the steps are not tied "
               "to a checkpoint")
        f.inconclusive(msg) if arm == "bi1" else f.note(msg)
    present = [s.step for s in steps]
    gaps = sorted(set(range(present[0], present[-1] + 1)) - set(present))
    if gaps:
        f.inconclusive(f"{label}steps {gaps} missing between {present[0]} and {present[-1]}: a missing step is not a pass")
    if len(steps) < min_steps:
        f.inconclusive(f"{label}{len(steps)} steps present, the question requires {min_steps}")
    arrays_dir = forward_dir / ARRAYS_DIR
    with_arrays: set[int] = set()
    if arrays_dir.is_dir():
        orphan = []
        for p in sorted(arrays_dir.iterdir()):
            m = _STEP_FILE.fullmatch(p.name)
            if m is None or p.name != step_arrays_path(forward_dir, int(m.group(1))).name:
                f.inconclusive(f"{label}{ARRAYS_DIR}/{p.name}: not a step's arrays file (step_NNNN.npz); what it "
                               "holds is not judged, so the receipt is not judged whole")
            elif int(m.group(1)) not in present:
                orphan.append(int(m.group(1)))
            else:
                with_arrays.add(int(m.group(1)))
        if orphan:
            f.inconclusive(f"{label}arrays exist for steps {sorted(orphan)} that metrics.jsonl does not report")
    if with_arrays and (without := sorted(set(present) - with_arrays)):
        f.inconclusive(f"{label}steps {without} have no arrays while steps {sorted(with_arrays)} do: the receipt "
                       "would be judged partly on its arrays and partly on its logged numbers")
    for s in steps:
        recomputed = _recompute(forward_dir, s, f, label)
        src = "arrays" if recomputed else "logged"
        v = recomputed or {
            "max": s.probs_diff_max, "mean": s.probs_diff_mean, "std": s.probs_diff_std, "pearson": s.pearson,
            "k3": s.k3_kl, "n_tokens": s.n_tokens, "n_bitwise_diff": s.n_bitwise_diff,
            "abs_max": s.logprob_abs_diff_max, "decode_diff": None, "content": _logged_content(s),
        }
        mx, mean = v["max"], v["mean"]
        step_f = Findings()
        if mx is None or mean is None:
            step_f.inconclusive(f"{label}step {s.step}: max or mean not recorded, so the step is missing")
        elif v["n_tokens"] == 0:
            step_f.inconclusive(f"{label}step {s.step}: 0 tokens compared: an empty step is not a measurement")
        elif arm == "bi1":
            if src == "logged" and s.content_sha256 is None:
                step_f.inconclusive(f"{label}step {s.step}: logged only, with neither arrays nor a content digest "
                                    "(tica/content_sha256): it cannot be told from a copy of another step")
            if not (mx == 0 and mean == 0):
                step_f.fail(f"{label}step {s.step}: BI=1 probs diff max={mx!r} mean={mean!r}, must both be 0")
            if v["n_bitwise_diff"]:
                step_f.fail(f"{label}step {s.step}: {v['n_bitwise_diff']} logprobs not bitwise equal")
            # where the step also records them: bitwise equal logprobs give each of these exactly 0
            for key, name in (("abs_max", "logprob |diff| max"), ("std", "probs diff std"), ("k3", "k3 KL")):
                if v[key] is not None and v[key] != 0:
                    step_f.fail(f"{label}step {s.step}: BI=1 {name} is {v[key]!r}: the logprobs are not bitwise equal")
            if v["decode_diff"]:
                step_f.fail(f"{label}step {s.step}: {v['decode_diff']} decode logprobs differ from the prefill scoring")
            routing = v.get("routing")
            if routing is not None and not routing.identical:  # a route is part of what BI=1 makes bitwise
                step_f.fail(f"{label}step {s.step}: {routing.sentence()}")
        else:
            _judge_bi0_step(s, mx, mean, bi0_range, grad_norm_required, noise_floor, step_f, label)
        f.extend(step_f)
        reading.rows.append([s.step, s.step_basis, s.checkpoint_version, mx, mean, v["std"], v["pearson"], v["k3"],
                             v["n_tokens"], v["n_bitwise_diff"], v["decode_diff"], s.grad_norm, src,
                             step_f.verdict.value])
        routing = v.get("routing")
        shown = {k: v[k] for k in v if k != "routing"} | ({"routing": routing.sentence()} if routing is not None else {})
        reading.steps.append({"step": s.step, "step_basis": s.step_basis, "checkpoint_version": s.checkpoint_version,
                              "source": src, **shown, "grad_norm": s.grad_norm,
                              "verdict": step_f.verdict.value})
    for why in same_content(label, reading.steps):
        f.inconclusive(why)
    return reading
