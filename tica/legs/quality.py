"""Quality leg: generation over a shipped problem set under a frozen evaluation contract (the six
items), scored by a real extractor; one record per problem. The first pass (greedy by default)
is the leg's results.jsonl + contract.json; further passes (e.g. sampled) go under passes/<name>/.

    python -m tica.legs.quality --out LEG_DIR --arm bi0 --model MODEL_DIR [--passes greedy,sampled]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from tica.legs import common

common.observe_worker_exits(__name__)  # in the EngineCore vLLM spawns from this producer

INSTRUCTION = "Solve the problem. Put the final answer in \\boxed{{}}.\n\n{question}"
PLAIN_TEMPLATE = "Question: {question}\nAnswer with the final number in \\boxed{{}}.\nAnswer:"
PASSES = {
    "greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "n": 1},
    "sampled": {"temperature": 0.7, "top_p": 0.95, "top_k": -1, "n": 1},
}


def render_prompts(tokenizer, problems: list[dict]) -> tuple[list[str], str]:
    """Prompts and the template's identity (chat template hash or the plain template)."""
    tmpl = getattr(tokenizer, "chat_template", None)
    if tmpl:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": INSTRUCTION.format(question=p["question"])}],
                                                 tokenize=False, add_generation_prompt=True) for p in problems]
        ident = f"chat_template sha256:{hashlib.sha256(tmpl.encode()).hexdigest()} user:{INSTRUCTION!r}"
    else:
        prompts = [PLAIN_TEMPLATE.format(question=p["question"]) for p in problems]
        ident = f"plain:{PLAIN_TEMPLATE!r}"
    return prompts, ident


SUMMARY_FILE = "summary.json"  # per pass: correct, n, score, truncated


def run_pass(llm, problems, prompts, *, sampling: dict, seed: int, length_cap: int, stop: list[str]):
    from vllm import SamplingParams

    from tica.legs import scorer

    sp = SamplingParams(max_tokens=length_cap, seed=seed, stop=stop or None, **sampling)
    outs = llm.generate(prompts, sp, use_tqdm=False)
    rows = []
    for prob, prompt, o in zip(problems, prompts, outs):
        c = o.outputs[0]
        extracted, how = scorer.extract(c.text)
        rows.append({"problem_id": prob["problem_id"], "correct": scorer.is_correct(extracted, prob["answer"]),
                     "prompt_hash": "sha256:" + hashlib.sha256(prompt.encode()).hexdigest(),
                     "response": c.text, "extracted": extracted, "extracted_by": how, "answer": prob["answer"],
                     "truncated": c.finish_reason == "length", "finish_reason": c.finish_reason,
                     "n_output_tokens": len(c.token_ids)})
    return rows


def main(argv: list[str] | None = None) -> int:
    from tica.legs.forward import add_engine_args

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap)
    ap.add_argument("--problems", default="arith30", help="a shipped set name (tica/problems/NAME.jsonl) or a .jsonl path")
    ap.add_argument("--passes", default="greedy,sampled")
    ap.add_argument("--length-cap", type=int, default=128)
    ap.add_argument("--limit", type=int, default=None, help="first N problems only (tests)")
    args = ap.parse_args(argv)
    common.set_arm_env(args.arm)
    common.grant_worker_shutdown(args.shutdown_timeout)
    with common.pipes_context() as pipes:
        leg = common.Leg(args.out, item="quality", arm=args.arm, producer="tica.legs.quality", trainer=None)
        with leg.errors_recorded():
            from tica.legs.forward import bi1_not_run, start_engine_or_not_run

            if bi1_not_run(leg, args, pipes.log):
                return 0
            from tica.legs import engine, scorer
            from tica.models.hashing import weights_hash
            from tica.problems import load_problems

            weights = weights_hash(args.model)
            version, problems = load_problems(args.problems)
            if args.limit:
                problems = problems[: args.limit]
                version += f" first:{args.limit}"
            if (started := start_engine_or_not_run(leg, args, args.model)) is None:
                return 0
            llm, eargs = started
            tok = llm.get_tokenizer()
            prompts, template = render_prompts(tok, problems)
            summary = {}
            for i, name in enumerate(x for x in args.passes.split(",") if x):
                sampling = PASSES[name]
                rows = run_pass(llm, problems, prompts, sampling=sampling, seed=args.seed, length_cap=args.length_cap, stop=[])
                contract = {"dataset_version": version, "prompt_template": template, "thinking_mode": "off",
                            "sampling": {**sampling, "seed": args.seed, "stop": []}, "repeats": 1,
                            "scorer": scorer.scorer_id(), "length_cap": args.length_cap}
                where = leg.dir if i == 0 else leg.dir / "passes" / name
                where.mkdir(parents=True, exist_ok=True)
                common.write_jsonl(where / "results.jsonl", rows)
                (where / "contract.json").write_text(json.dumps(contract, indent=1))
                n_ok = sum(r["correct"] for r in rows)
                summary[name] = {"correct": n_ok, "n": len(rows), "score": n_ok / len(rows),
                                 "truncated": sum(r["truncated"] for r in rows)}
                pipes.log.info(f"quality {name}: {n_ok}/{len(rows)} correct, {summary[name]['truncated']} truncated")
            # The outcomes go beside the receipt, not into resolved_config: what describes an arm
            # is compared across the arms (confounders), and a score differs by design.
            (leg.dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
            leg.meta["resolved_config"] = {"model": str(Path(args.model).resolve()), "weights_hash": weights,
                                           **eargs, "problems": version, "passes": list(summary),
                                           "primary_pass": args.passes.split(",")[0]}
            leg.meta["kernels"] = {"rollout": engine.engine_kernels(llm, leg.log_text())}
            engine.shutdown_and_record(llm, leg)
            leg.end()
            leg.finish()
            pipes.report_custom_message({"leg_dir": str(leg.dir), "item": "quality", "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
