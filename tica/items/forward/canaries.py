"""The forward's canaries: a passing receipt set (a BI=1 and a BI=0 forward leg over the
question's steps, each with its step arrays) and one planted error per rule, each of which the
judge must not pass. `tica.canaries` runs them with every other item's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tica.canary_legs import FAIL, INCONCLUSIVE, NOT_PASS, Canary, drop_arm, edit_jsonl, find_leg, perturb_arrays
from tica.canary_legs import ckpt as _ckpt
from tica.canary_legs import forward_files as _forward_files
from tica.canary_legs import leg_meta as _meta
from tica.canary_legs import proc as _proc
from tica.canary_legs import set_row as _set_row
from tica.canary_legs import write_leg as _write_leg
from tica.evidence import EvidenceItem
from tica.items.forward.criteria import ForwardCriteria
from tica.metrics import forward_metrics, step_content_digest
from tica.question import Question
from tica.seal import seal_leg
from tica.verdict import Verdict

E = EvidenceItem

# The question the built-in canaries and the committed fixtures are judged under.
QUESTION: dict[str, Any] = {
    "name": "forward-bitwise", "compared": "rollout_probs_diff max/mean per step",
    "computation": "verl calculate_debug_metrics over fixed token histories",
    "pass_line": "BI=1 max = mean = 0 at every step",
    "criteria": {"item": "forward", "min_steps": 5, "bi0_reference_mean": 0.01}}


def build_forward(question: Question, dest: Path) -> list[Path]:
    c: ForwardCriteria = question.criteria  # type: ignore[assignment]
    steps = list(range(1, c.min_steps + 1))
    legs = []
    for arm, trainer, seed in (("bi1", "vllm_kernels", 1), ("bi0", "megatron", 2)):
        if arm not in c.arms:
            continue
        meta = _meta("forward", arm, trainer=trainer,
                     processes=[_proc("trainer", 4100 + seed), _proc("engine_core", 4200 + seed)])
        legs.append(_write_leg(dest / f"forward_{arm}", meta, _forward_files(arm, steps, c.bi0_reference_mean or 0.01, seed, _ckpt)))
    return legs


def drop_step(leg: Path, step: int | None) -> None:
    """Remove one step (or, with None, the last step) from metrics and arrays."""
    rows = [json.loads(l) for l in (leg / "metrics.jsonl").read_text().splitlines() if l.strip()]
    gone = step if step is not None else rows[-1]["step"]
    (leg / "arrays" / f"step_{gone:04d}.npz").unlink(missing_ok=True)
    edit_jsonl(leg / "metrics.jsonl", lambda rs: [r for r in rs if r["step"] != gone], leg)


def drop_arrays_keep_digests(forward_dir: Path, reseal: Path) -> None:
    """A forward receipt logged only, as TICA's producers log it: each step's content digest
    (tica/content_sha256) recorded from its arrays, the arrays left out."""
    arrays = forward_dir / "arrays"

    def f(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            path = arrays / f"step_{r['step']:04d}.npz"
            if path.is_file():
                with np.load(path) as z:
                    r["tica/content_sha256"] = step_content_digest(z["token_ids"], z["seq_lens"],
                                                                   z["trainer_logprobs"], z["rollout_logprobs"])
    edit_jsonl(forward_dir / "metrics.jsonl", f, reseal)
    shutil.rmtree(arrays, ignore_errors=True)
    seal_leg(reseal)


def logged_only(leg: Path, step: int, scale_mean: float | None = None, **kv: Any) -> None:
    """A receipt logged only (no arrays, each step's content digest kept), with one step's logged values planted."""
    drop_arrays_keep_digests(leg, leg)

    def f(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            if r["step"] == step:
                r.update(kv)
                if scale_mean is not None:  # a probability difference stays in [0, 1]
                    r["training/rollout_probs_diff_mean"] = min(1.0, r["training/rollout_probs_diff_mean"] * scale_mean)
                mean, mx = r.get("training/rollout_probs_diff_mean"), r.get("training/rollout_probs_diff_max")
                if isinstance(mean, float) and isinstance(mx, float) and mean > mx:
                    r["training/rollout_probs_diff_max"] = mean  # a max is never below its mean
    edit_jsonl(leg / "metrics.jsonl", f, leg)


def perturb_arrays_keep_metrics(leg: Path, step: int) -> None:
    path = leg / "arrays" / f"step_{step:04d}.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    data["rollout_logprobs"] = data["rollout_logprobs"] - np.float32(0.25)
    np.savez(path, **data)
    seal_leg(leg)


def flip_route(leg: Path, step: int) -> None:
    """A routing flip the logprobs do not show: one token sent to another expert at one MoE layer
    on the trainer's side, every logprob (and so every logged metric) unchanged."""
    from tica.routing import flip_one_route

    path = leg / "arrays" / f"step_{step:04d}.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    data["trainer_experts"] = flip_one_route(data["trainer_experts"], token=5, layer=1, n_experts=8)
    np.savez(path, **data)
    seal_leg(leg)


def judged_arm(q: Question) -> str:
    """The forward arm whose leg must have run under `q` (BI=1 when judged, else BI=0)."""
    c: ForwardCriteria = q.criteria  # type: ignore[assignment]
    return "bi1" if "bi1" in c.arms else "bi0"


def set_bi0_grad_norm(**kv: Any) -> Callable[[Question, list[Path]], None]:
    """The BI=0 leg's second step with its grad norm removed, `kv` recorded in its place."""
    def mutate(q: Question, legs: list[Path]) -> None:
        leg = find_leg(legs, arm="bi0")

        def f(rows: list[dict[str, Any]]) -> None:
            rows[1].pop("actor/grad_norm", None)
            rows[1].update(kv)
        edit_jsonl(leg / "metrics.jsonl", f, leg)
    return mutate


def first_step_dropped(q: Question, legs: Sequence[Path]) -> None:
    """The judged arm's first step left out of metrics and arrays (a receipt that begins late)."""
    leg = find_leg(legs, arm=judged_arm(q))
    first = json.loads((leg / "metrics.jsonl").read_text().splitlines()[0])["step"]
    drop_step(leg, first)


def arrays_renamed(q: Question, legs: Sequence[Path]) -> None:
    """Step 1's arrays under a name the judge does not read (step_1.npz), its logged numbers left."""
    arm = judged_arm(q)
    leg = find_leg(legs, arm=arm)
    if arm == "bi1":  # the attack: arrays that show a difference, logged numbers that do not
        perturb_arrays(leg, 1)
        edit_jsonl(leg / "metrics.jsonl", _set_row(0, **{"training/rollout_probs_diff_max": 0.0,
                                                         "training/rollout_probs_diff_mean": 0.0,
                                                         "training/rollout_probs_diff_std": 0.0,
                                                         "rollout_corr/k3_kl": 0.0,
                                                         "tica/logprob_abs_diff_max": 0.0,
                                                         "tica/n_bitwise_diff": 0}), leg)
    (leg / "arrays" / "step_0001.npz").rename(leg / "arrays" / "step_1.npz")
    seal_leg(leg)


def arrays_left_out(q: Question, legs: Sequence[Path]) -> None:
    """One step's arrays deleted while the others keep theirs (judged from two sources)."""
    leg = find_leg(legs, arm=judged_arm(q))
    (leg / "arrays" / "step_0002.npz").unlink()
    seal_leg(leg)


def placeholder_arrays(q: Question, legs: Sequence[Path]) -> None:
    """Every scored logprob 0.0 on both sides (a torch.zeros placeholder), metrics recomputed."""
    leg = find_leg(legs, arm="bi1")
    path = leg / "arrays" / "step_0001.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    for key in ("trainer_logprobs", "rollout_logprobs", "decode_logprobs"):
        if key in data:
            data[key] = np.zeros_like(data[key])
    np.savez(path, **data)
    m = forward_metrics(data["trainer_logprobs"], data["rollout_logprobs"])
    edit_jsonl(leg / "metrics.jsonl", lambda rows: [({**row, **m} if row["step"] == 1 else row) for row in rows], leg)


# A criterion the question switches off cannot pass a wrong receipt either: tica.canaries.SWITCHED_OFF
# names these for the forward's canaries (its canary is not applicable, with the reason, not broken).
def needs_arm(arm: str) -> Callable[[Question | None], str | None]:
    def why(question: Question | None) -> str | None:
        c = getattr(question, "criteria", None)
        if isinstance(c, ForwardCriteria) and arm not in c.arms:
            return f"the question judges {list(c.arms)}, not {arm}"
        return None
    return why


def needs_bi0_smoke(question: Question | None) -> str | None:
    c = getattr(question, "criteria", None)
    if isinstance(c, ForwardCriteria) and not c.bi0_smoke:
        return ("the question judges BI=1: BI=0's grad norm is judged where recorded, required only in a "
                "BI=0 smoke question, arms [bi0]")
    return None


def needs_bi0_reference(question: Question | None) -> str | None:
    c = getattr(question, "criteria", None)
    if isinstance(c, ForwardCriteria) and c.bi0_reference_mean is None:
        return "the question names no BI=0 reference: the magnitude is reported, not judged"
    return None


# The must_record canary every item has is tica.canaries' (it reads the question, not the item).
CANARIES: tuple[Canary, ...] = (
    Canary("forward.bi1_max_zero", E.FORWARD, "BI=1 max = 0 at every step (logged metrics, as verl writes them)",
           FAIL, lambda q, legs: logged_only(find_leg(legs, arm="bi1"), 3, **{"training/rollout_probs_diff_max": 0.0078125})),
    Canary("forward.bi1_mean_zero", E.FORWARD, "BI=1 mean = 0 at every step (logged metrics)", FAIL,
           lambda q, legs: logged_only(find_leg(legs, arm="bi1"), 1, **{"training/rollout_probs_diff_mean": 1e-9})),
    Canary("forward.bi1_bitwise_arrays", E.FORWARD, "BI=1 logprobs bitwise equal (recomputed from arrays)", FAIL,
           lambda q, legs: perturb_arrays(find_leg(legs, arm="bi1"), 2)),
    Canary("forward.route_flip", E.FORWARD, "BI=1 routes the same on both sides (a MoE's experts per token and layer)",
           FAIL, lambda q, legs: flip_route(find_leg(legs, arm="bi1"), 2)),
    Canary("forward.arrays_vs_metrics", E.FORWARD, "recompute from arrays; a receipt contradicting itself is no pass",
           NOT_PASS, lambda q, legs: perturb_arrays_keep_metrics(find_leg(legs, arm=judged_arm(q)), 1)),
    Canary("forward.missing_step", E.FORWARD, "a missing step is not a pass", INCONCLUSIVE,
           lambda q, legs: drop_step(find_leg(legs, arm=judged_arm(q)), 2)),
    Canary("forward.too_few_steps", E.FORWARD, "min_steps present", INCONCLUSIVE,
           lambda q, legs: drop_step(find_leg(legs, arm=judged_arm(q)), None)),
    Canary("forward.first_step", E.FORWARD, "steps start where the run began (a missing first step is missing)",
           INCONCLUSIVE, first_step_dropped),
    Canary("forward.arrays_named", E.FORWARD, "every file in arrays/ is a step's arrays the judge reads",
           INCONCLUSIVE, arrays_renamed),
    Canary("forward.arrays_whole", E.FORWARD, "one receipt, one source: no step judged from logged numbers beside "
           "steps judged from arrays", INCONCLUSIVE, arrays_left_out),
    Canary("forward.placeholder_arrays", E.FORWARD, "arrays that hold one constant are no measurement", INCONCLUSIVE,
           placeholder_arrays),
    Canary("forward.bi0_magnitude", E.FORWARD, "BI=0 mean has the reference's magnitude", FAIL,
           lambda q, legs: logged_only(find_leg(legs, arm="bi0"), 2, scale_mean=200.0)),
    Canary("forward.arm_ran", E.FORWARD, "the judged arm's leg ran (BI=1; BI=0 in a BI=0 smoke question)",
           frozenset({Verdict.NOT_RUN}), lambda q, legs: drop_arm(judged_arm(q))(q, legs)),
    Canary("forward.bi0_grad_norm_finite", E.FORWARD, "BI=0 smoke: grad norm finite", FAIL,
           set_bi0_grad_norm(**{"actor/grad_norm": float("nan")})),
    Canary("forward.bi0_grad_norm_recorded", E.FORWARD, "BI=0 smoke: grad norm recorded at every step",
           INCONCLUSIVE, set_bi0_grad_norm()),
)
