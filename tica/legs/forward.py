"""Forward leg: fixed token histories scored by the rollout engine (vLLM `prompt_logprobs`, plus
the decode logprobs of its own generations) and by the trainer forward, per step, with the batch
composition changing from step to step. Writes metrics.jsonl (verl's names) and arrays/step_NNNN.npz.

    python -m tica.legs.forward --out LEG_DIR --arm bi0 --model MODEL_DIR [--trainer transformers]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from tica.legs import common

common.observe_worker_exits(__name__)  # in the EngineCore vLLM spawns from this producer

BATCH_SIZES = (4, 7, 2, 5, 3, 6)  # changes the batch composition step to step


def add_engine_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="leg directory to write (sealed last)")
    ap.add_argument("--arm", required=True, choices=common.ARM_ENV)
    ap.add_argument("--model", required=True, help="checkpoint directory (safetensors + config)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shutdown-timeout", type=int, default=common.SHUTDOWN_TIMEOUT_S,
                    help="the recipe's engine shutdown grace, seconds (vLLM's shutdown_timeout); 0 = force-kill")
    ap.add_argument("--engine-args", type=json.loads, default={},
                    help="JSON object of vLLM engine arguments over the defaults (e.g. CUDA graphs, prefix caching)")
    ap.add_argument("--bi1-attempt-engine", action="store_true",
                    help="on a platform without batch invariance, start the engine anyway and record how it fails")


def add_trainer_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--trainer", default="transformers",
                    choices=("transformers", "megatron", "external", "vllm_kernels", "vllm_engine"))
    ap.add_argument("--trainer-command", default=None, help="for --trainer external: 'CMD ... {input} {output}'")
    ap.add_argument("--trainer-dtype", default="bfloat16")


def step_prompts(seed: int, steps: int, vocab: int, *, min_len: int = 8, max_len: int = 40) -> list[list[list[int]]]:
    """Per step, a batch of prompts; the anchor prompt recurs every step at a moving position."""
    rng = random.Random(seed)
    lo = 3  # skip <unk>, <s>, </s>
    anchor = [rng.randrange(lo, vocab) for _ in range(24)]
    batches = []
    for s in range(steps):
        size = BATCH_SIZES[s % len(BATCH_SIZES)]
        batch = [[rng.randrange(lo, vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(size - 1)]
        batch.insert(s % size, anchor)
        batches.append(batch)
    return batches


def model_vocab(model_dir: str | Path) -> int:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return int(cfg["vocab_size"])


def run_steps(llm, trainer, batches, out_dir: Path, *, checkpoint_version: str, gen_tokens: int, seed: int, log) -> list[dict]:
    """Generate, score, compare, write metrics.jsonl + arrays; return the per-step metrics."""
    import numpy as np

    from tica.legs import engine
    from tica.metrics import forward_metrics, step_content_digest

    arrays = out_dir / "arrays"
    arrays.mkdir(parents=True, exist_ok=True)
    rows, anchor_first = [], None
    anchor = batches[0][0 % len(batches[0])]
    for s, prompts in enumerate(batches, start=1):
        gens = engine.generate(llm, prompts, max_tokens=gen_tokens, temperature=1.0, seed=seed + s)
        seqs, decode_lp, decode_mask = [], [], []
        for p, samples in zip(prompts, gens):
            toks, lps = samples[0]
            seqs.append(p + toks)
            # logprob entries cover tokens 1..n-1; generated tokens are the last len(toks)
            decode_lp.append(np.concatenate([np.full(len(p) - 1, np.nan, np.float32), lps]))
            decode_mask.append(np.concatenate([np.zeros(len(p) - 1, bool), np.ones(len(toks), bool)]))
        rollout = engine.score(llm, seqs)
        trainer_lp = trainer.logprobs(seqs)
        r, t = np.concatenate(rollout), np.concatenate(trainer_lp)
        d, mask = np.concatenate(decode_lp), np.concatenate(decode_mask)
        m = forward_metrics(t, r)
        dp = forward_metrics(d[mask], r[mask])  # decode vs prefill of the same tokens, same engine
        td = forward_metrics(t[mask], d[mask])  # verl's own pairing: trainer vs rollout decode logprobs
        idx = next(i for i, p in enumerate(prompts) if p == anchor)
        anchor_lp = rollout[idx][: len(anchor) - 1]
        if anchor_first is None:
            anchor_first = anchor_lp
        # scored tokens only (each sequence's tokens 1..L-1, which the logprobs belong to): docs/receipts.md
        tok = np.concatenate([np.asarray(x[1:], np.int32) for x in seqs])
        lens = np.asarray([len(x) - 1 for x in seqs], np.int32)
        row = {
            "step": s,
            "step_basis": "rollout",
            "checkpoint_version": checkpoint_version,
            **m,
            "tica/content_sha256": step_content_digest(tok, lens, t, r),
            "tica/batch_size": len(seqs),
            "tica/decode_vs_prefill_n_tokens": dp["tica/n_tokens"],
            "tica/decode_vs_prefill_n_bitwise_diff": dp["tica/n_bitwise_diff"],
            "tica/decode_vs_prefill_abs_diff_max": dp["tica/logprob_abs_diff_max"],
            "tica/trainer_vs_decode_probs_diff_max": td["training/rollout_probs_diff_max"],
            "tica/trainer_vs_decode_probs_diff_mean": td["training/rollout_probs_diff_mean"],
            "tica/anchor_prompt_bitwise_equal_to_step1": bool(np.array_equal(anchor_lp.view(np.uint32), anchor_first.view(np.uint32))),
        }
        rows.append(row)
        np.savez(arrays / f"step_{s:04d}.npz", token_ids=tok, seq_lens=lens, trainer_logprobs=t.astype(np.float32),
                 rollout_logprobs=r.astype(np.float32), decode_logprobs=d.astype(np.float32), decode_mask=mask)
        log.info(f"forward step {s}: batch {len(seqs)}, {m['tica/n_tokens']} tokens, probs_diff max "
                 f"{m['training/rollout_probs_diff_max']:.3g} mean {m['training/rollout_probs_diff_mean']:.3g}, "
                 f"bitwise diff {m['tica/n_bitwise_diff']}; decode vs prefill bitwise diff {dp['tica/n_bitwise_diff']}")
    common.write_jsonl(out_dir / "metrics.jsonl", rows)
    return rows


def bi1_not_run(leg: common.Leg, args, log) -> bool:
    """Record BI=1 as not run where vLLM cannot do it; return True when the leg is finished."""
    from tica.legs import engine

    if args.arm != "bi1" or getattr(args, "bi1_attempt_engine", False):
        return False
    checked_at = common.now()
    reason = engine.bi1_unsupported_reason()
    if reason is None:
        return False
    log.info(f"not run: {reason}")
    leg.begin(checked_at)  # the leg's only work: asking vLLM whether it can run BI=1 here
    leg.end()
    leg.finish(not_run_reason=reason)
    return True


def start_engine_or_not_run(leg: common.Leg, args, model):
    """vLLM's engine for a leg, as (llm, engine args). Under BI=1 an engine that fails to start
    finishes the leg as not run, with vLLM's own reason, and gives None; under BI=0 it raises."""
    from tica.legs import engine

    leg.begin()  # the leg's work starts with the engine
    try:
        # the leg's own options win over the engine settings it was given (both may name shutdown_timeout)
        return engine.start_llm(model, **{**getattr(args, "engine_args", {}), "max_model_len": args.max_model_len,
                                          "gpu_memory_utilization": args.gpu_memory_utilization, "seed": args.seed,
                                          "shutdown_timeout": args.shutdown_timeout})
    except Exception as err:
        if args.arm == "bi1":
            leg.finish(not_run_reason="vLLM engine failed to start with VLLM_BATCH_INVARIANT=1: "
                                      + engine_failure_reason(leg.log_text(), err))
            return None
        raise


def engine_failure_reason(text: str, err: BaseException) -> str:
    worker = common.first_match(r"Worker failed with error[^\n]*", text)
    inner = common.first_match(r"\n[^\n]*(TypeError|NotImplementedError|RuntimeError|ValueError)[^\n]*", text)
    return "; ".join(x for x in (f"{type(err).__name__}: {err}", worker, inner) if x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap)
    add_trainer_args(ap)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--gen-tokens", type=int, default=16)
    args = ap.parse_args(argv)
    common.set_arm_env(args.arm)
    common.grant_worker_shutdown(args.shutdown_timeout)
    with common.pipes_context() as pipes:
        leg = common.Leg(args.out, item="forward", arm=args.arm, producer="tica.legs.forward", trainer=args.trainer)
        with leg.errors_recorded():
            if bi1_not_run(leg, args, pipes.log):
                pipes.report_custom_message({"leg_dir": str(leg.dir), "item": "forward", "not_run": True})
                return 0
            from tica.legs import engine
            from tica.legs.trainer_base import trainer_resolved
            from tica.legs.trainers import load_trainer
            from tica.models.hashing import weights_hash

            version = weights_hash(args.model)
            batches = step_prompts(args.seed, args.steps, model_vocab(args.model))
            pipes.log.info(f"forward leg {args.arm}: starting vLLM on {args.model}")
            if (started := start_engine_or_not_run(leg, args, args.model)) is None:
                return 0
            llm, eargs = started
            trainer = load_trainer(args.trainer, args.model, dtype=args.trainer_dtype, command=args.trainer_command,
                                   engine_args={"max_model_len": args.max_model_len, "seed": args.seed,
                                                "gpu_memory_utilization": args.gpu_memory_utilization,
                                                "shutdown_timeout": args.shutdown_timeout})
            leg.meta["resolved_config"] = {"model": str(Path(args.model).resolve()), "weights_hash": version, **eargs,
                                           "steps": args.steps, "gen_tokens": args.gen_tokens, "batch_sizes": [len(b) for b in batches],
                                           "generation": {"temperature": 1.0, "seed": args.seed, "ignore_eos": True},
                                           "trainer": trainer.describe()}
            try:
                run_steps(llm, trainer, batches, leg.dir, checkpoint_version=version,
                          gen_tokens=args.gen_tokens, seed=args.seed, log=pipes.log)
            except Exception as err:
                if args.arm != "bi1":
                    raise
                leg.meta["kernels"] = {"rollout": engine.engine_kernels(llm, leg.log_text())}
                engine.shutdown_and_record(llm, leg)
                leg.end()
                leg.finish(not_run_reason="vLLM failed under VLLM_BATCH_INVARIANT=1: " + engine_failure_reason(leg.log_text(), err))
                return 0
            leg.meta["kernels"] = {"rollout": engine.engine_kernels(llm, leg.log_text()),
                                   "trainer": {**trainer.describe(), **trainer_resolved(trainer)}}
            engine.shutdown_and_record(llm, leg)
            if hasattr(trainer, "close_and_record"):
                trainer.close_and_record(leg)
            leg.end()
            leg.finish()
        pipes.report_custom_message({"leg_dir": str(leg.dir), "item": "forward", "arm": args.arm,
                                     "metrics": [json.loads(x) for x in (leg.dir / "metrics.jsonl").read_text().splitlines()]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
