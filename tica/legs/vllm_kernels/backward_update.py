"""The BI=1 backward and update legs (``producers bi1``, after its forward legs): a GRPO-style
policy-gradient backward through the vllm_kernels trainer on the last forward step's batch
(backward_bi1, with the GPU backward check), one AdamW step, the updated weights written as
safetensors and reloaded by vLLM, the deployed bytes compared before and after, and forward steps
6..10 on the new weights (update_bi1, forward_bi1_post_update_prefill,
forward_bi1_decode_post_update).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

# the core fingerprint of a model folder, as the manifest's checkpoint.path hashes (no cache file)
from tica.models.hashing import weights_hash

from .forward_leg import decode_kernels, trainer_logprobs, trainer_rows, write_decode_leg, write_decode_rows, write_forward_step
from .legio import log
from .rollout import N_STEPS, SCHEDULE_SEED, schedule

LR = 5e-3


def group_advantages(n: int, seed: int) -> tuple[list[float], list[float]]:
    """Seeded 0/1 rewards for one group of n responses (never all equal) and their GRPO
    advantages (reward - mean) / (std + 1e-6)."""
    rr = random.Random(seed)
    rewards = [float(rr.random() < 0.5) for _ in range(n)]
    if len(set(rewards)) == 1:
        rewards[0] = 1.0 - rewards[0]
    mu = sum(rewards) / n
    sd = (sum((x - mu) ** 2 for x in rewards) / n) ** 0.5
    return rewards, [(x - mu) / (sd + 1e-6) for x in rewards]


def adamw(params, lr: float = LR):
    """The update's optimizer, as every H200 update leg configures it."""
    import torch

    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def grad_norm(params) -> float:
    """The global L2 norm of the gradients, summed in float64."""
    import torch

    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None)))


def write_weights(state: dict, m0: Path, out: Path) -> None:
    """bf16 weights as safetensors beside m0's config: what vLLM reloads and weights_hash names."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.cpu() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    for f in ("config.json", "generation_config.json"):
        if (m0 / f).exists():
            shutil.copy(m0 / f, out / f)


def rerun_update(m0: Path, kernels, ro: dict, weights, n_resp: int, dev: str, gnorm: float, after: dict,
                 out: Path) -> dict:
    """The same backward and AdamW step again, from the weights on disk and the same batch, in a
    fresh trainer; its updated weights written to `out` and named by content hash, as the update's are."""
    import torch

    from .model import from_dir, pack

    again = from_dir(m0, kernels, device=dev)
    again.engine_step_rows = False
    ids, cu, mx = pack(ro["fulls"], dev)
    lp = again.logprobs(ids, cu, mx)
    (-(lp.float() * weights.to(lp.device)).sum() / n_resp).backward()
    g2 = grad_norm(again.master)
    adamw(again.parameters()).step()
    after2 = again.deployed_state_dict()
    differ = sorted(k for k in after if not torch.equal(after[k].view(torch.int16), after2[k].view(torch.int16)))
    write_weights(after2, m0, out)
    del again
    return {"grad_norm": g2, "updated_weights_hash": weights_hash(out), "grad_norm_equal": g2 == gnorm,
            "weights_equal": not differ, "tensors_differ": differ[:8], "n_tensors_differ": len(differ),
            "how": "a fresh trainer from the same weights, the same batch, loss and optimizer, in the same process"}


def bi1_backward_and_update(legs: Path, work: str, m0: Path, rollout, model, cfg: dict, kern: dict, base_cfg: dict,
                            ck0: str, dev: str, kept: list[tuple], *, gc: dict, gc_tol: float, t_gradcheck: str,
                            dry_run: bool) -> None:
    """kept: the forward legs' (schedule, rollout, arrays) per step; gc: the GPU backward check
    (recorded in backward_bi1), started at t_gradcheck."""
    import torch

    from . import legio
    from .autograd import backward_impls
    from .model import pack

    # deployed bytes: vLLM's fused parameters vs this trainer's casts of its masters
    def bytes_equal() -> tuple[bool | None, dict]:
        vp = rollout.param_bytes()
        if not vp:
            return None, {"reason": "no rollout engine (dry run)"}
        mine = model.deployed_state_dict()
        L = cfg["num_hidden_layers"]
        want = {}
        for i in range(L):
            p = f"model.layers.{i}."
            want[p + "self_attn.qkv_proj.weight"] = torch.cat([mine[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
            want[p + "mlp.gate_up_proj.weight"] = torch.cat([mine[p + "mlp.gate_proj.weight"], mine[p + "mlp.up_proj.weight"]])
            for n in ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight"):
                want[p + n] = mine[p + n]
        for n in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            if n in mine and not (n == "lm_head.weight" and cfg.get("tie_word_embeddings") and n not in vp):
                want[n] = mine[n]  # a tied lm_head is the embedding: vLLM holds no parameter of its own
        res = {}
        for n, w in want.items():
            v = vp.get(n)
            if v is None:
                res[n] = "missing in vLLM"
                continue
            w = w.cpu()
            if v.shape != w.shape:
                v = v[: w.shape[0]] if v.shape[1:] == w.shape[1:] else v
            res[n] = bool(v.shape == w.shape and v.dtype == w.dtype and torch.equal(v.view(torch.int16), w.view(torch.int16)))
        extra_v = sorted(set(vp) - set(want))
        return all(x is True for x in res.values()) and not extra_v, {"tensors": len(res),
                                                                     "not_equal": [n for n, x in res.items() if x is not True],
                                                                     "vllm_params_not_compared": extra_v}

    t_update = legio.now()  # the update's work: deployed bytes, backward, optimizer step, reload, steps 6..10
    eq0, eq0_detail = bytes_equal()
    log(f"deployed bytes equal before update: {eq0}")

    # backward + AdamW on the last pre-update step's batch (a GRPO-style policy-gradient loss)
    st, ro, arr = kept[-1]
    rewards, adv = group_advantages(len(ro["fulls"]), SCHEDULE_SEED + 5)
    ids, cu, mx = pack(ro["fulls"], dev)
    model.zero_grad(set_to_none=True)
    lp = model.logprobs(ids, cu, mx)
    lp_nograd = torch.as_tensor(arr["trainer_logprobs"])
    same_fwd = int(torch.count_nonzero(lp.detach().float().cpu().view(torch.int32) != lp_nograd.view(torch.int32)))
    weights = torch.zeros_like(lp, dtype=torch.float32)
    o = 0
    for f, g, av in zip(ro["fulls"], ro["gens"], adv):
        n = len(f) - 1
        weights[o + n - len(g):o + n] = av
        o += n
    n_resp = int(sum(len(g) for g in ro["gens"]))
    loss = -(lp.float() * weights).sum() / n_resp
    tb = time.time()
    loss.backward()
    t_bwd = time.time() - tb
    grads = [p.grad for p in model.master]
    with_grad = sum(g is not None for g in grads)
    finite = all(bool(torch.isfinite(g).all()) for g in grads if g is not None)
    nonzero = sum(bool((g != 0).any()) for g in grads if g is not None)
    gnorm = grad_norm(model.master)
    log(f"backward: loss={float(loss):.5g} grad_norm={gnorm:.5g} finite={finite} with_grad={with_grad}/{len(grads)} "
        f"nonzero={nonzero} fwd_equal_diff={same_fwd} ({t_bwd:.1f}s)")
    bwd_row = {"step": 1, "step_basis": "optimizer", "checkpoint_version": ck0, "actor/grad_norm": gnorm,
               "grad_finite": finite, "params_total": len(grads), "params_with_grad": with_grad,
               "params_nonzero_grad": nonzero, "within_group_rewards": [rewards], "deployed_bytes_equal": eq0,
               "loss": float(loss), "tica/loss": "GRPO-style: -sum(adv_i * logprob over response tokens) / n_response_tokens",
               "tica/rollout_step": st["step"], "tica/n_response_tokens": n_resp,
               "tica/grad_forward_vs_nograd_n_bitwise_diff": same_fwd, "tica/backward_seconds": t_bwd,
               "tica/gradcheck_pass": gc["pass"], "tica/gradcheck_controls_caught": gc["controls_caught"],
               "tica/backward_impls": backward_impls()}
    t_backward_end = legio.now()
    bwd = legs / "backward_bi1"
    legio.write_jsonl(bwd / "metrics.jsonl", [bwd_row])
    (bwd / "gradcheck.json").write_text(json.dumps(gc, indent=1, default=str))
    (bwd / "deployed_bytes.json").write_text(json.dumps({"equal": eq0, **eq0_detail}, indent=1))
    # the backward leg's work: the GPU backward check, then this backward (the forward legs ran between)
    meta = legio.new_meta("backward", legio.kernels_arm(), trainer="vllm_kernels", started_at=t_gradcheck)
    meta["ended_at"] = t_backward_end
    meta["kernels"] = kern
    meta["resolved_config"] = dict(base_cfg, gradcheck_tol=gc_tol, master_dtype="float32", deployed_dtype="bfloat16")
    legio.write_meta(bwd, meta)

    before = {k: v.clone() for k, v in model.deployed_state_dict().items()}
    adamw(model.parameters()).step()
    after = model.deployed_state_dict()
    rerun = rerun_update(m0, model.kernels, ro, weights, n_resp, dev, gnorm, after, Path(work) / "m1_rerun")
    log(f"update rerun from the same weights and batch: {rerun}")
    changed = sum(not torch.equal(before[k].view(torch.int16), after[k].view(torch.int16)) for k in after)
    m1 = Path(work) / "m1"
    write_weights(after, m0, m1)
    ck1 = weights_hash(m1)
    n_loaded = rollout.reload(m1 / "model.safetensors")
    eq1, eq1_detail = bytes_equal()
    log(f"update: changed {changed}/{len(after)} tensors, {ck1[:20]}, vLLM reloaded {n_loaded} params, bytes equal {eq1}")

    # forward steps 6..10 on the updated weights. The update's own re-check (post_forward/) is
    # the decode-faithful one: the trainer against vLLM's sampled-token logprobs, which is what
    # an RL step consumes. The prefill-scoring re-check is kept as its own leg.
    upd = legs / "update_bi1"
    t_post = legio.now()
    prompts2, steps2 = schedule(cfg["vocab_size"], N_STEPS + 1, N_STEPS)
    pre_leg = legs / "forward_bi1_post_update_prefill"
    rows = []
    kept2 = []
    for st in steps2:
        ro = rollout.step(prompts2, st)
        kept2.append((st, ro))
        rows.append(write_forward_step(legio, pre_leg, st, ro, trainer_logprobs(model, ro["fulls"], dev), ck1))
        log(f"post step {st['step']} (prefill scoring): bitwise_diff={rows[-1]['tica/n_bitwise_diff']} "
            f"max={rows[-1]['training/rollout_probs_diff_max']:.3g}")
    legio.write_jsonl(pre_leg / "metrics.jsonl", rows)
    meta = legio.new_meta("forward", legio.kernels_arm(), trainer="vllm_kernels", started_at=t_post)
    meta["ended_at"] = legio.now()
    meta["kernels"] = kern
    meta["resolved_config"] = dict(base_cfg, updated_weights_hash=ck1)
    legio.write_meta(pre_leg, meta)
    write_decode_rows(legio, upd / "post_forward", kept2, model, dev, ck1)
    t_update_end = legio.now()
    write_decode_leg(legio, legs / "forward_bi1_decode_post_update", kept2, model, dev, ck1, kern,
                     dict(base_cfg, updated_weights_hash=ck1), started_at=t_post)
    upd_row = dict(bwd_row, optimizer="adamw", weights_changed_tensors=changed, weights_total_tensors=len(after),
                   updated_weights_hash=ck1, reloaded_by_rollout=bool(n_loaded) if not dry_run else False,
                   deployed_bytes_equal=eq1)
    upd_row.update({"tica/optimizer_config": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                                              "master_dtype": "float32", "grad_clip": None},
                    "tica/reload": "vLLM model.load_weights over the written safetensors (LLM.apply_model, in place)",
                    "tica/reloaded_params": n_loaded, "tica/deployed_bytes_detail": eq1_detail,
                    "tica/update_rerun": rerun})
    legio.write_jsonl(upd / "metrics.jsonl", [upd_row])
    meta = legio.new_meta("update", legio.kernels_arm(), trainer="vllm_kernels", started_at=t_update)
    meta["ended_at"] = t_update_end
    meta["kernels"] = decode_kernels(kern)
    meta["resolved_config"] = dict(base_cfg, updated_weights_hash=ck1, lr=LR,
                                   post_forward=f"steps 6-10, response tokens: the trainer ({trainer_rows(model)}) "
                                                "vs vLLM's sampled-token logprobs")
    legio.write_meta(upd, meta)
