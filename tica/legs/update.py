"""Update leg: a real update. The rollout engine samples groups, the trainer takes its backward
and one AdamW step (fp32 master weights), the updated weights are written as safetensors,
reloaded by the rollout engine in place, and the forward is re-checked (post_forward/).

    python -m tica.legs.update --out LEG_DIR --arm bi0 --model MODEL_DIR [--trainer transformers]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from tica.legs import common

common.observe_worker_exits(__name__)  # in the EngineCore vLLM spawns from this producer

WEIGHTS_SUBDIR = "weights"


def write_updated_checkpoint(trainer, model_dir: Path, out: Path) -> Path:
    """The checkpoint's own files with every weight tensor replaced by the trainer's, same names."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "tica_model.json":
            shutil.copy2(f, out / f.name)
    params = trainer.hf_state_dict()
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors = {}
        with safe_open(str(f), framework="pt") as st:
            meta = st.metadata()
            for key in st.keys():
                orig = st.get_tensor(key)
                src = params.get(key)
                tensors[key] = (src if src is not None else orig).to(orig.dtype).contiguous().clone()
        save_file(tensors, str(out / f.name), metadata=meta or {"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> int:
    from tica.legs.forward import add_engine_args, add_trainer_args

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(ap)
    add_trainer_args(ap)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--gen-tokens", type=int, default=12)
    ap.add_argument("--post-steps", type=int, default=5)
    ap.add_argument("--n-prompts", type=int, default=2)
    args = ap.parse_args(argv)
    common.set_arm_env(args.arm)
    common.grant_worker_shutdown(args.shutdown_timeout)
    with common.pipes_context() as pipes:
        leg = common.Leg(args.out, item="update", arm=args.arm, producer="tica.legs.update", trainer=args.trainer)
        with leg.errors_recorded():
            from tica.legs.forward import bi1_not_run, start_engine_or_not_run, model_vocab, run_steps, step_prompts

            if bi1_not_run(leg, args, pipes.log):
                return 0
            import numpy as np
            import torch

            from tica.legs import engine
            from tica.legs.backward import GROUP_SIZE, MasterAdamW, deployed_bytes_equal, group_advantages, policy_loss, toy_reward
            from tica.legs.trainer_base import trainer_resolved
            from tica.legs.trainers import load_trainer
            from tica.models.hashing import weights_hash

            torch.manual_seed(args.seed)
            model_dir = Path(args.model).resolve()
            before = weights_hash(model_dir)
            vocab = model_vocab(model_dir)
            if (started := start_engine_or_not_run(leg, args, model_dir)) is None:
                return 0
            llm, eargs = started
            trainer = load_trainer(args.trainer, model_dir, dtype=args.trainer_dtype, command=args.trainer_command)
            prompts = [p for p in step_prompts(args.seed + 100, 1, vocab)[0][: args.n_prompts]]
            gens = engine.generate(llm, prompts, max_tokens=args.gen_tokens, temperature=1.0, seed=args.seed, n=GROUP_SIZE)
            responses = [[toks for toks, _ in samples] for samples in gens]
            rewards = [[toy_reward(r) for r in g] for g in responses]
            advs = group_advantages(rewards)
            probe = [p + r for p, g in zip(prompts, responses) for r in g]
            rollout_before = np.concatenate(engine.score(llm, probe))
            dbe = deployed_bytes_equal(trainer, model_dir)
            opt = MasterAdamW(trainer, lr=args.lr)
            opt.zero_grad()
            loss = policy_loss(trainer, prompts, responses, advs)
            loss.backward()
            g = opt.grads_to_master()
            changed = opt.step()
            pipes.log.info(f"update: grad_norm {g['actor/grad_norm']:.4g}, {changed}/{g['params_total']} tensors changed")
            wdir = write_updated_checkpoint(trainer, model_dir, leg.dir / WEIGHTS_SUBDIR)
            after = weights_hash(wdir)
            reloaded, reload_error = False, None
            try:
                llm.collective_rpc("reload_weights", kwargs={"weights_path": str(wdir)})
                llm.reset_prefix_cache()
                reloaded = True
            except Exception as err:
                reload_error = f"{type(err).__name__}: {err}"
            rollout_after = np.concatenate(engine.score(llm, probe))
            rollout_changed = not np.array_equal(rollout_before.view(np.uint32), rollout_after.view(np.uint32))
            row = {"step": 1, **g, "loss": float(loss.detach()), "within_group_rewards": rewards, "deployed_bytes_equal": dbe,
                   "optimizer": "adamw", "lr": args.lr, "weights_changed_tensors": changed,
                   "weights_total_tensors": g["params_total"], "weights_hash_before": before,
                   "updated_weights_hash": after, "reloaded_by_rollout": bool(reloaded and rollout_changed),
                   "tica/reload_rpc_ok": reloaded, "tica/reload_error": reload_error,
                   "tica/rollout_logprobs_changed_after_reload": rollout_changed}
            common.write_jsonl(leg.dir / "metrics.jsonl", [row])
            post = leg.dir / "post_forward"
            post.mkdir()
            trainer.model.eval() if hasattr(trainer, "model") else None
            run_steps(llm, trainer, step_prompts(args.seed + 200, args.post_steps, vocab), post,
                      checkpoint_version=after, gen_tokens=args.gen_tokens, seed=args.seed + 200, log=pipes.log)
            (post / "resolved_config.json").write_text(json.dumps({"weights_dir": WEIGHTS_SUBDIR, "weights_hash": after,
                                                                   "steps": args.post_steps}, indent=1))
            leg.meta["resolved_config"] = {"model": str(model_dir), "weights_hash": before, **eargs,
                                           "updated_weights_dir": WEIGHTS_SUBDIR, "updated_weights_hash": after,
                                           "optimizer": {"name": "adamw", "lr": args.lr, "betas": [0.9, 0.999], "eps": 1e-8,
                                                         "weight_decay": 0.0, "master_weights": "float32"},
                                           "loss": "policy gradient, GRPO group advantages, toy reward (first token even)",
                                           "group_size": GROUP_SIZE, "weight_sync": "vLLM collective_rpc('reload_weights', weights_path=...)",
                                           "trainer": trainer.describe()}
            leg.meta["kernels"] = {"rollout": engine.engine_kernels(llm, leg.log_text()),
                                   "trainer": {**trainer.describe(), **trainer_resolved(trainer)}}
            engine.shutdown_and_record(llm, leg)
            leg.end()
            leg.finish()
            pipes.report_custom_message({"leg_dir": str(leg.dir), "item": "update", "metrics": [row]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
