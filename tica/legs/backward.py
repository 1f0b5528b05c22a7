"""Backward leg: the trainer's backward over a policy-gradient loss on fixed token histories.
Checks that gradients are finite and reach the (fp32 master) weights, and that the trainer's
forward reads the deployed bytes (bf16 params byte-equal to the checkpoint's safetensors).

    python -m tica.legs.backward --out LEG_DIR --arm bi0 --model MODEL_DIR [--trainer transformers]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

from tica.legs import common

GROUP_SIZE = 4


def toy_reward(response: list[int]) -> float:
    """A deterministic stand-in reward (no scorer needed): 1 when the response's first token id is even."""
    return 1.0 if response and response[0] % 2 == 0 else 0.0


def group_advantages(rewards: list[list[float]]) -> list[list[float]]:
    """GRPO: reward minus its group mean over the group std; a group with equal rewards gets 0."""
    out = []
    for g in rewards:
        mu = sum(g) / len(g)
        sd = math.sqrt(sum((r - mu) ** 2 for r in g) / len(g))
        out.append([(r - mu) / (sd + 1e-6) if sd > 0 else 0.0 for r in g])
    return out


def synthetic_groups(seed: int, vocab: int, n_prompts: int = 2, resp_len: int = 12) -> tuple[list[list[int]], list[list[list[int]]]]:
    rng = random.Random(seed + 7)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(8, 24))] for _ in range(n_prompts)]
    responses = [[[rng.randrange(3, vocab) for _ in range(resp_len)] for _ in range(GROUP_SIZE)] for _ in prompts]
    return prompts, responses


class MasterAdamW:
    """bf16 model params for forward/backward, fp32 master copies that hold grads and the optimizer."""

    def __init__(self, trainer, lr: float, weight_decay: float = 0.0) -> None:
        import torch

        self.names, self.params, self.master = [], [], []
        for name, p in trainer.parameters():
            if not p.requires_grad:
                continue
            self.names.append(name)
            self.params.append(p)
            self.master.append(p.detach().float().clone().requires_grad_(True))
        self.opt = torch.optim.AdamW(self.master, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None

    def grads_to_master(self) -> dict:
        import torch

        total, with_grad, nonzero, finite = len(self.params), 0, 0, True
        sq = torch.zeros((), dtype=torch.float64)
        for p, m in zip(self.params, self.master):
            if p.grad is None:
                continue
            g = p.grad.detach().float()
            m.grad = g.clone()
            with_grad += 1
            nonzero += int(bool(torch.count_nonzero(g)))
            finite &= bool(torch.isfinite(g).all())
            sq += g.double().pow(2).sum()
        return {"actor/grad_norm": float(sq.sqrt()), "grad_finite": finite, "params_total": total,
                "params_with_grad": with_grad, "params_nonzero_grad": nonzero}

    def step(self) -> int:
        import torch

        self.opt.step()
        changed = 0
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                new = m.detach().to(p.dtype)
                changed += int(not torch.equal(new.view(torch.int16) if new.dtype == torch.bfloat16 else new,
                                               p.detach().view(torch.int16) if p.dtype == torch.bfloat16 else p.detach()))
                p.copy_(new)
        return changed


def policy_loss(trainer, prompts, responses, advantages):
    """-mean over response tokens of advantage * logprob (on-policy: importance ratio 1)."""
    import torch

    terms, n = [], 0
    for p, group, advs in zip(prompts, responses, advantages):
        for resp, adv in zip(group, advs):
            lp = trainer.token_logprobs(p + resp)[len(p) - 1 :]
            terms.append(-(adv * lp).sum())
            n += lp.numel()
    return torch.stack(terms).sum() / n


def deployed_bytes_equal(trainer, model_dir: str | Path) -> bool | None:
    """The trainer's forward weights equal the checkpoint's bytes (bf16 deployment: no quantizer)."""
    import torch
    from safetensors import safe_open

    params = dict(trainer.hf_state_dict())
    seen = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if key not in params:
                    continue
                a, b = params[key], st.get_tensor(key)
                if a.shape != b.shape:
                    return False
                # a wider trainer copy (e.g. megatron's fp32 norm weights) counts only if it holds exactly the file's values
                a_file = a.to(b.dtype)
                if not torch.equal(a_file.to(a.dtype), a) or not torch.equal(a_file.contiguous().view(torch.uint8),
                                                                               b.contiguous().view(torch.uint8)):
                    return False
                seen += 1
    return True if seen else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arm", required=True, choices=common.ARM_ENV)
    ap.add_argument("--model", required=True)
    ap.add_argument("--trainer", default="transformers", choices=("transformers", "megatron", "vllm_kernels"))
    ap.add_argument("--trainer-dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1)
    args = ap.parse_args(argv)
    common.set_arm_env(args.arm)
    with common.pipes_context() as pipes:
        leg = common.Leg(args.out, item="backward", arm=args.arm, producer="tica.legs.backward", trainer=args.trainer)
        with leg.errors_recorded():
            from tica.legs.forward import bi1_not_run, model_vocab

            if bi1_not_run(leg, args, pipes.log):
                return 0
            import torch

            from tica.legs.trainer_base import trainer_resolved
            from tica.legs.trainers import load_trainer
            from tica.models.hashing import weights_hash

            torch.manual_seed(args.seed)
            version = weights_hash(args.model)
            leg.begin()  # the leg's work: loading the trainer and its backward steps
            trainer = load_trainer(args.trainer, args.model, dtype=args.trainer_dtype)
            prompts, responses = synthetic_groups(args.seed, model_vocab(args.model))
            rewards = [[toy_reward(r) for r in g] for g in responses]
            advs = group_advantages(rewards)
            opt = MasterAdamW(trainer, lr=0.0)
            dbe = deployed_bytes_equal(trainer, args.model)
            rows = []
            for s in range(1, args.steps + 1):
                opt.zero_grad()
                loss = policy_loss(trainer, prompts, responses, advs)
                loss.backward()
                g = opt.grads_to_master()
                rows.append({"step": s, **g, "loss": float(loss.detach()), "within_group_rewards": rewards,
                             "deployed_bytes_equal": dbe})
                pipes.log.info(f"backward step {s}: grad_norm {g['actor/grad_norm']:.4g}, finite {g['grad_finite']}, "
                               f"{g['params_with_grad']}/{g['params_total']} params with grad")
            leg.end()
            common.write_jsonl(leg.dir / "metrics.jsonl", rows)
            leg.meta["resolved_config"] = {"model": str(Path(args.model).resolve()), "weights_hash": version,
                                           "loss": "policy gradient, GRPO group advantages, toy reward (first token even)",
                                           "group_size": GROUP_SIZE, "master_weights": "float32", "seed": args.seed,
                                           "trainer": trainer.describe(),
                                           # the dtype and parallel sizes as the trainer ran them, read from it
                                           **trainer_resolved(trainer)}
            leg.meta["kernels"] = {"trainer": trainer.describe()}
            leg.finish()
            pipes.report_custom_message({"leg_dir": str(leg.dir), "item": "backward", "metrics": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
