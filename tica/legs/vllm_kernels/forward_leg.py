"""The forward legs: a step's arrays and metrics row (prefill-scored, or response tokens against
vLLM's sampled-token logprobs), the BI=1 forward legs with their probes and planted faults
(``bi1_forward_legs``, run by ``producers bi1``), and the BI=0 arm's commands (``bi0``: vLLM BI=0
and the HF transformers trainer; ``bi0-megatron``: megatron-core over the same rollouts).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# the core fingerprint of a model folder, as the manifest's checkpoint.path hashes (no cache file)
from tica.models.hashing import weights_hash

from .legio import log
from .rollout import ENGINES, FORWARD_CFG, N_STEPS, SCHEDULE_SEED, FakeRollout, VllmRollout, schedule

FAULT_LINEAR = "model.layers.0.self_attn.o_proj"
FAULTS = (
    ("forward_bi1_planted_fault", "logprob:torch.log_softmax",
     "torch.log_softmax on fp32 logits (a trainer's usual logprob) instead of the V2 runner's logprob kernel"),
    ("forward_bi1_fault_hf_final_norm", "model.norm:hf_rmsnorm",
     "HF transformers' LlamaRMSNorm for the final norm instead of vLLM's fused_add_rms_norm"),
    ("forward_bi1_fault_cublas_linear", FAULT_LINEAR,
     "torch.nn.functional.linear (torch's default cuBLAS matmul) for one linear instead of vLLM's Triton "
     "persistent matmul"),
)


def arrays_for(ro: dict, trainer_lp) -> dict:
    import numpy as np

    tok, lens, roll, dec, mask = [], [], [], [], []
    for f, g, pf, dl in zip(ro["fulls"], ro["gens"], ro["prefill"], ro["decode"]):
        n = len(f) - 1
        tok.extend(f[1:])
        lens.append(n)
        roll.extend(pf)
        m = [False] * (n - len(g)) + [True] * len(g)
        mask.extend(m)
        dec.extend([float("nan")] * (n - len(g)) + list(dl))
    a = {"token_ids": np.asarray(tok, np.int32), "seq_lens": np.asarray(lens, np.int32),
         "trainer_logprobs": np.asarray(trainer_lp, np.float32), "rollout_logprobs": np.asarray(roll, np.float32),
         "decode_logprobs": np.asarray(dec, np.float32), "decode_mask": np.asarray(mask, np.bool_)}
    assert a["trainer_logprobs"].size == a["token_ids"].size == a["rollout_logprobs"].size
    return a


def step_extra(a: dict, st: dict, ro: dict) -> dict:
    import numpy as np

    m = a["decode_mask"]
    t, d, r = a["trainer_logprobs"][m], a["decode_logprobs"][m], a["rollout_logprobs"][m]
    return {
        "tica/n_sequences": int(a["seq_lens"].size),
        "tica/seq_len_min": int(a["seq_lens"].min()) + 1, "tica/seq_len_max": int(a["seq_lens"].max()) + 1,
        "tica/decode_n_tokens": int(m.sum()),
        "tica/trainer_vs_decode_n_bitwise_diff": int(np.count_nonzero(t.view(np.uint32) != d.view(np.uint32))),
        "tica/trainer_vs_decode_abs_diff_max": float(np.abs(t.astype(np.float64) - d).max()) if m.any() else 0.0,
        "tica/decode_vs_prefill_n_bitwise_diff": int(np.count_nonzero(r.view(np.uint32) != d.view(np.uint32))),
        "tica/batch": {"prompts": st["idx"], "gen_tokens": st["gen"], "scoring_neighbours": st["fillers"],
                       "scoring_order": ro.get("scoring_batch")},
    }


def write_forward_step(legio, d: Path, st: dict, ro: dict, trainer_lp, checkpoint: str) -> dict:
    """One step of a prefill-scored forward leg under ``d``: its arrays, and its metrics row."""
    arr = arrays_for(ro, trainer_lp)
    legio.write_step_arrays(d, st["step"], **arr)
    return legio.step_row(st["step"], checkpoint, arr["trainer_logprobs"], arr["rollout_logprobs"], step_extra(arr, st, ro))


def trainer_decode_logprobs(model, ro: dict, device):
    """The trainer's logprobs of the generated tokens, each row computed as the rollout engine
    computed it: prompt rows as a prefill step, generated-token rows as decode steps (only
    fused_add_rms_norm's launch shape differs, see model.KernelLlama._fused_add)."""
    import numpy as np
    import torch

    from .model import pack

    ids, cu, mx = pack(ro["fulls"], device)
    mask = torch.zeros(ids.numel(), dtype=torch.bool, device=device)
    for s, f, g in zip(cu[:-1].tolist(), ro["fulls"], ro["gens"]):
        mask[s + len(f) - len(g): s + len(f)] = True
    if model.engine_step_rows:
        model.decode_rows = mask
    try:
        with torch.no_grad():
            lp = model.logprobs(ids, cu, mx).float().cpu().numpy()
    finally:
        model.decode_rows = None
    out, o = [], 0
    for f, g in zip(ro["fulls"], ro["gens"]):
        n = len(f) - 1
        out.append(lp[o + n - len(g):o + n])
        o += n
    return np.concatenate(out)


def write_decode_rows(legio, d: Path, kept: list, model, dev, checkpoint: str) -> list[dict]:
    """Response tokens only, rollout = vLLM's sampled-token logprobs (verl's rollout_log_probs):
    each step's arrays and metrics.jsonl under ``d`` (a leg, or an update's post_forward/)."""
    import numpy as np

    rows = []
    for st, ro in kept:
        tr = trainer_decode_logprobs(model, ro, dev)
        dec = np.asarray([x for dl in ro["decode"] for x in dl], np.float32)
        pre = np.asarray([x for pf, g in zip(ro["prefill"], ro["gens"]) for x in pf[len(pf) - len(g):]], np.float32)
        a = {"token_ids": np.asarray([t for g in ro["gens"] for t in g], np.int32),
             "seq_lens": np.asarray([len(g) for g in ro["gens"]], np.int32),
             "trainer_logprobs": tr, "rollout_logprobs": dec}
        legio.write_step_arrays(d, st["step"], **a)
        extra = {"tica/rollout_logprobs": "vLLM's sampled-token (decode) logprobs: verl's rollout_log_probs",
                 "tica/trainer_rows": trainer_rows(model),
                 "tica/trainer_vs_prefill_scoring_n_bitwise_diff": int(np.count_nonzero(tr.view(np.uint32) != pre.view(np.uint32))),
                 "tica/decode_vs_prefill_scoring_n_bitwise_diff": int(np.count_nonzero(dec.view(np.uint32) != pre.view(np.uint32))),
                 "tica/batch": {"prompts": st["idx"], "gen_tokens": st["gen"]}}
        rows.append(legio.step_row(st["step"], checkpoint, tr, dec, extra))
        log(f"{d.name} step {st['step']}: n={rows[-1]['tica/n_tokens']} bitwise_diff={rows[-1]['tica/n_bitwise_diff']} "
            f"max={rows[-1]['training/rollout_probs_diff_max']:.3g} (decode vs prefill {extra['tica/decode_vs_prefill_scoring_n_bitwise_diff']})")
    legio.write_jsonl(d / "metrics.jsonl", rows)
    return rows


PRODUCT_ROWS = "every row in one packed forward, as for prefill: no knowledge of the engine's steps"


def trainer_rows(model) -> str:
    """How the trainer computed the generated-token rows it compares with the rollout's."""
    return "prompt rows as a prefill step, generated-token rows as decode steps" if model.engine_step_rows else PRODUCT_ROWS


def decode_kernels(kern: dict) -> dict:
    if kern.get("trainer_rows") == PRODUCT_ROWS:
        return dict(kern)
    return dict(kern, trainer_fused_add_rms_norm_rows="prompt rows in one call (>= 256 rows), "
                "generated-token rows in calls of <= 255 rows")


def write_decode_leg(legio, d: Path, kept: list, model, dev, checkpoint: str, kern: dict, base_cfg: dict, *,
                     started_at: str | None) -> list[dict]:
    """started_at: when the rollouts these rows score began (their engine's start or first step)."""
    rows = write_decode_rows(legio, d, kept, model, dev, checkpoint)
    meta = legio.new_meta("forward", legio.kernels_arm(), trainer="vllm_kernels", started_at=started_at)
    meta["ended_at"] = legio.now()
    meta["kernels"] = decode_kernels(kern)
    meta["resolved_config"] = dict(base_cfg, tokens="response (generated) tokens only",
                                   rollout_logprobs="vLLM sampled-token logprobs (SamplingParams.logprobs=0)")
    if kept:  # the first step this run scored (a re-check after an update continues the numbering)
        meta["resolved_config"]["first_step"] = min(int(st["step"]) for st, _ in kept)
    legio.write_meta(d, meta)
    return rows


def trainer_logprobs(model, fulls, device) -> "list[float]":
    import torch

    from .model import pack

    ids, cu, mx = pack(fulls, device)
    with torch.no_grad():
        return model.logprobs(ids, cu, mx).float().cpu().numpy()



# ---------------------------------------------------------------- bi1
def decode_probe(rollout, model, prompts, dev) -> dict:
    """One request alone (the kit's check): its decode logprobs vs a prefill of prompt+generated,
    and the trainer on the same tokens; then the same request generated inside a batch."""
    import numpy as np
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = rollout.llm
    p0 = max(prompts, key=len)
    sp = SamplingParams(temperature=1.0, seed=1234, logprobs=0, max_tokens=64, ignore_eos=True, detokenize=False)
    o = llm.generate([TokensPrompt(prompt_token_ids=p0)], sp, use_tqdm=False)[0]
    gen = list(o.outputs[0].token_ids)
    dec = np.asarray([d[t].logprob for d, t in zip(o.outputs[0].logprobs, gen)], np.float32)
    full = p0 + gen
    spp = SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False, seed=7)
    pf = llm.generate([TokensPrompt(prompt_token_ids=full)], spp, use_tqdm=False)[0]
    pre = np.asarray([pl[t].logprob for pl, t in zip(pf.prompt_logprobs[1:], full[1:])], np.float32)
    tr = np.asarray(trainer_logprobs(model, [full], dev), np.float32)
    n = len(gen)

    def nd(a, b):
        return int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))

    others = [TokensPrompt(prompt_token_ids=x) for x in prompts[:12] if x is not p0]
    sps = [SamplingParams(temperature=1.0, seed=50 + i, logprobs=0, max_tokens=8 + 7 * i, ignore_eos=True,
                          detokenize=False) for i in range(len(others))]
    ob = llm.generate(others[:6] + [TokensPrompt(prompt_token_ids=p0)] + others[6:], sps[:6] + [sp] + sps[6:],
                      use_tqdm=False)[6]
    genb = list(ob.outputs[0].token_ids)
    decb = np.asarray([d[t].logprob for d, t in zip(ob.outputs[0].logprobs, genb)], np.float32)
    same = 0
    for x, y in zip(gen, genb):
        if x != y:
            break
        same += 1
    return {"prompt_len": len(p0), "gen": n,
            "alone_decode_vs_prefill_n_diff": nd(dec, pre[-n:]),
            "alone_decode_vs_trainer_n_diff": nd(dec, tr[-n:]),
            "alone_prefill_vs_trainer_n_diff": nd(pre, tr),
            "alone_decode_vs_prefill_abs_max": float(np.abs(dec.astype(np.float64) - pre[-n:]).max()),
            "batch_same_tokens_prefix": same,
            "batch_decode_vs_alone_decode_n_diff": nd(decb[:same], dec[:same]),
            "decode_vs_prefill_pattern": "".join("x" if v else "." for v in (dec.view(np.uint32) != pre[-n:].view(np.uint32)))}



def bi1_forward_legs(legs: Path, rollout, model, kernels, cfg: dict, kern: dict, base_cfg: dict, ck0: str,
                     dev: str, *, t_engine: str, dry_run: bool) -> list[tuple]:
    """The BI=1 process's forward legs over steps 1..N_STEPS, all scoring the same rollouts:
    forward_bi1 (prefill scoring; on the GPU also the kernel and decode probes), forward_bi1_decode
    and the planted faults. Returns each step's (schedule, rollout, arrays) for the backward."""
    import numpy as np

    from . import legio

    prompts, steps = schedule(cfg["vocab_size"], 1, N_STEPS)
    fwd = legs / "forward_bi1"
    rows, kept = [], []
    for st in steps:
        ro = rollout.step(prompts, st)
        lp = trainer_logprobs(model, ro["fulls"], dev)
        arr = arrays_for(ro, lp)
        extra = step_extra(arr, st, ro)
        if st["step"] == 1:  # packed vs one sequence at a time, bitwise
            single = np.concatenate([trainer_logprobs(model, [f], dev) for f in ro["fulls"]])
            extra["tica/trainer_packed_vs_single_n_bitwise_diff"] = int(
                np.count_nonzero(single.view(np.uint32) != arr["trainer_logprobs"].view(np.uint32)))
        legio.write_step_arrays(fwd, st["step"], **arr)
        rows.append(legio.step_row(st["step"], ck0, arr["trainer_logprobs"], arr["rollout_logprobs"], extra))
        kept.append((st, ro, arr))
        log(f"bi1 step {st['step']}: n={rows[-1]['tica/n_tokens']} bitwise_diff={rows[-1]['tica/n_bitwise_diff']} "
            f"max={rows[-1]['training/rollout_probs_diff_max']:.3g} decode_diff={extra['tica/trainer_vs_decode_n_bitwise_diff']}")
    legio.write_jsonl(fwd / "metrics.jsonl", rows)
    if not dry_run:
        from .probe import probe_model

        kp = probe_model(kernels, cfg)
        (fwd / "kernel_probe.json").write_text(json.dumps(kp, indent=1))
        log(f"kernel probe: {json.dumps(kp)[:1500]}")
        try:
            dp = decode_probe(rollout, model, prompts, dev)
        except Exception as err:  # noqa: BLE001
            dp = {"error": repr(err)[:1000]}
        (fwd / "decode_probe.json").write_text(json.dumps(dp, indent=1))
        log(f"decode probe: {json.dumps({k: v for k, v in dp.items() if not isinstance(v, list)})[:1500]}")
    meta = legio.new_meta("forward", legio.kernels_arm(), trainer="vllm_kernels", started_at=t_engine)
    meta["ended_at"] = legio.now()
    meta["kernels"] = kern
    meta["resolved_config"] = dict(base_cfg)
    legio.write_meta(fwd, meta)
    write_decode_leg(legio, legs / "forward_bi1_decode", [(st, ro) for st, ro, _ in kept], model, dev, ck0, kern, base_cfg,
                     started_at=t_engine)

    # planted faults (canaries): one op switched away from vLLM's kernel; same rollouts, same weights
    for leg_name, fault, what in FAULTS:
        flt = legs / leg_name
        model.fault = fault
        rows = []
        for st, ro, arr in kept:
            lp = trainer_logprobs(model, ro["fulls"], dev)
            arr2 = dict(arr, trainer_logprobs=np.asarray(lp, np.float32))
            legio.write_step_arrays(flt, st["step"], **arr2)
            rows.append(legio.step_row(st["step"], ck0, arr2["trainer_logprobs"], arr2["rollout_logprobs"],
                                       {"tica/planted_fault": fault}))
            log(f"{leg_name} step {st['step']}: bitwise_diff={rows[-1]['tica/n_bitwise_diff']} "
                f"max={rows[-1]['training/rollout_probs_diff_max']:.3g}")
        model.fault = None
        legio.write_jsonl(flt / "metrics.jsonl", rows)
        meta = legio.new_meta("forward", legio.kernels_arm(), trainer="vllm_kernels", started_at=t_engine)  # the same rollouts
        meta["ended_at"] = legio.now()
        meta["kernels"] = dict(kern, planted_fault={fault: what})
        meta["resolved_config"] = dict(base_cfg, planted_fault={"target": fault, "replacement": what,
                                                                "expect": "nonzero diff: the criterion must fail"},
                                       canary=True)
        legio.write_meta(flt, meta)
    return kept


# ---------------------------------------------------------------- bi0
def cmd_bi0(a) -> int:
    if not a.dry_run and os.environ.get("VLLM_BATCH_INVARIANT") != "0":
        raise SystemExit("bi0 needs VLLM_BATCH_INVARIANT=0 in its environment")
    import numpy as np
    import torch

    from . import legio

    legs = Path(a.legs)
    m0 = Path(a.model)
    t0 = time.time()
    cfg = json.loads((m0 / "config.json").read_text())
    ck0 = weights_hash(m0)
    dev = "cpu" if a.dry_run else "cuda"
    started = legio.now()  # the leg's work starts with the engine
    engine_cfg = ENGINES[getattr(a, "engine", "eager")]
    if a.dry_run:
        from .kernels import TorchReference
        from .model import from_dir

        rollout = FakeRollout(from_dir(m0, TorchReference, device="cpu"))
    else:
        rollout = VllmRollout(m0, tensor_parallel_size=a.tp, **engine_cfg)
        log(f"vLLM BI=0 TP={a.tp} engine up after {time.time() - t0:.1f}s")
    prompts, steps = schedule(cfg["vocab_size"], 1, N_STEPS)
    ros = [(st, rollout.step(prompts, st)) for st in steps]
    if a.rollouts:  # the same BI=0 rollouts for the megatron-core trainer (its own process: bi0-megatron)
        Path(a.rollouts).write_text(json.dumps([[st, ro] for st, ro in ros]))
        # and the engine that made them, which that leg records as its rollout engine
        Path(a.rollouts + ".engine.json").write_text(json.dumps(
            {"selected": rollout.selected(), "config": {**FORWARD_CFG, **engine_cfg, "tensor_parallel_size": a.tp}}))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(m0), dtype=torch.bfloat16, attn_implementation="sdpa").to(dev).eval()
    fwd = legs / ("forward_bi0_hf" if a.tp == 1 else f"forward_bi0_tp{a.tp}_hf")
    rows = []
    for st, ro in ros:
        lps = []
        with torch.no_grad():
            for f in ro["fulls"]:
                x = torch.tensor([f], device=dev)
                logits = hf(x).logits[0, :-1].float()
                lps.append(torch.log_softmax(logits, -1).gather(-1, x[0, 1:, None])[:, 0].cpu().numpy())
        rows.append(write_forward_step(legio, fwd, st, ro, np.concatenate(lps), ck0))
        log(f"bi0 step {st['step']}: bitwise_diff={rows[-1]['tica/n_bitwise_diff']}/{rows[-1]['tica/n_tokens']} "
            f"max={rows[-1]['training/rollout_probs_diff_max']:.3g} mean={rows[-1]['training/rollout_probs_diff_mean']:.3g}")
    legio.write_jsonl(fwd / "metrics.jsonl", rows)
    meta = legio.new_meta("forward", "bi0", trainer="transformers", started_at=started)
    meta["ended_at"] = legio.now()
    meta["kernels"] = {"trainer": {"model": "transformers LlamaForCausalLM", "attention": "sdpa", "dtype": "bfloat16",
                                   "logprob": "torch.log_softmax on fp32 logits"},
                       "rollout": {"attention": "FLASH_ATTN", **rollout.selected(),
                                   "matmul": "vLLM default (cuBLAS via dispatch_unquantized_gemm)"}}
    meta["resolved_config"] = {"model": str(m0), "weights_hash": ck0, "architecture": cfg["architectures"][0],
                               **FORWARD_CFG, **engine_cfg, "tensor_parallel_size": a.tp, "schedule_seed": SCHEDULE_SEED,
                               "weights": getattr(a, "weights_note", None),
                               "megatron": "megatron-core runs in its own process over these rollouts "
                                           "(bi0-megatron: forward_bi0_megatron); this leg is HF's second baseline"}
    legio.write_meta(fwd, meta)
    legio.add_processes(legio.legs_written(), rollout.shutdown_records())
    log(f"bi0 done in {time.time() - t0:.1f}s")
    return 0


def cmd_bi0_megatron(a) -> int:
    """The regular trainer path of the BI=0 arm: megatron-core's GPTModel over the rollouts bi0
    saved (its own process: megatron initialises torch.distributed, vLLM's engine already did)."""
    import numpy as np

    from tica.legs.megatron_trainer import megatron_token_logprobs

    from . import legio

    t0 = time.time()
    legs, m0 = Path(a.legs), Path(a.model)
    ros = json.loads(Path(a.rollouts).read_text())
    ck0 = weights_hash(m0)
    fwd = legs / "forward_bi0_megatron"
    rows, info = [], {}
    started = legio.now()  # the leg's own work: megatron-core's forward over bi0's rollouts
    for st, ro in ros:
        lp, info = megatron_token_logprobs(m0, ro["fulls"], device="cpu" if a.dry_run else "cuda")
        rows.append(write_forward_step(legio, fwd, st, ro, np.asarray(lp, np.float32), ck0))
        log(f"megatron step {st['step']}: bitwise_diff={rows[-1]['tica/n_bitwise_diff']}/{rows[-1]['tica/n_tokens']} "
            f"max={rows[-1]['training/rollout_probs_diff_max']:.3g} mean={rows[-1]['training/rollout_probs_diff_mean']:.3g}")
    legio.write_jsonl(fwd / "metrics.jsonl", rows)
    meta = legio.new_meta("forward", "bi0", trainer="megatron", started_at=started)
    meta["ended_at"] = legio.now()
    # the rollouts' engine as bi0 recorded it; absent (an older bi0), the engine is not known here
    engine_file = Path(a.rollouts + ".engine.json")
    engine = json.loads(engine_file.read_text()) if engine_file.exists() else {}
    meta["kernels"] = {"trainer": info, "rollout": {**engine.get("selected", {}),
                                                    "made_by": "vLLM BI=0 in forward_bi0_hf (the same rollouts)"}}
    cfg = json.loads((m0 / "config.json").read_text())
    meta["resolved_config"] = {"model": str(m0), "weights_hash": ck0, "architecture": cfg["architectures"][0],
                               **engine.get("config", {}), "schedule_seed": SCHEDULE_SEED, "rollouts": "forward_bi0_hf's"}
    legio.write_meta(fwd, meta)
    log(f"bi0-megatron done in {time.time() - t0:.1f}s")
    return 0
