"""Does the trainer's update reproduce? (issue 31: the same seed, the same grad norm and weights)

For each shape, one seeded random model (tica.legs.vllm_kernels.seeded_model) and one seeded
packed batch (mixed lengths); each run is a fresh process that loads the model on the GPU with
vLLM's kernels (BI=1), computes a GRPO-style policy-gradient loss through the product trainer,
its backward, the gradient norm and one AdamW step, and hashes the updated bf16 weights. Runs are
repeated per mode of the attention backward:

* ``atomic``: FA2's varlen backward as torch runs it by default (dq accumulated with atomic adds);
* ``deterministic``: FA2's deterministic backward (torch's deterministic algorithms, scoped to
  that call: the trainer's default since this probe).

Writes ``update_repro.json`` under --out: per shape and mode, every run's grad norm (repr), loss,
weights digest and backward seconds, the GPU it ran on, and the package versions. ``--expect``
compares with an earlier file (another machine): the digests that match and those that do not.
A measurement, not a leg: nothing here is judged.

    VLLM_BATCH_INVARIANT=1 python3 scripts/h200/update_repro.py --out "$OUT" --runs 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

MODES = ("atomic", "deterministic")
SEED = 20261205
LR = 5e-3


def batch(vocab: int, n: int, seed: int) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(3, vocab) for _ in range(r.randint(96, 1536))] for _ in range(n)]


def child(a) -> dict:
    import torch

    from tica.legs.vllm_kernels.autograd import backward_impls, deterministic_attention_backward
    from tica.legs.vllm_kernels.backward_update import group_advantages
    from tica.legs.vllm_kernels.kernels import VllmKernels
    from tica.legs.vllm_kernels.model import from_dir, pack

    cfg = json.loads((Path(a.model) / "config.json").read_text())
    seqs = batch(int(cfg["vocab_size"]), a.sequences, SEED)
    _, adv = group_advantages(len(seqs), SEED + 1)
    model = from_dir(a.model, VllmKernels(linear="triton", norm="stock", attention_layout="contiguous"), device="cuda")
    ids, cu, mx = pack(seqs, "cuda")
    with deterministic_attention_backward(a.mode == "deterministic"):
        lp = model.logprobs(ids, cu, mx)
        w = torch.zeros_like(lp, dtype=torch.float32)
        o = 0
        for s, av in zip(seqs, adv):
            n = len(s) - 1
            w[o + n // 2:o + n] = av  # the second half of each sequence is its "response"
            o += n
        loss = -(lp.float() * w).sum() / float((w != 0).sum())
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        t_bwd = time.perf_counter() - t
    grads = [p.grad for p in model.master if p.grad is not None]
    gnorm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    grad_digest = hashlib.sha256(b"".join(g.detach().float().cpu().numpy().tobytes() for g in grads)).hexdigest()
    torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01).step()
    h = hashlib.sha256()
    for k, v in sorted(model.deployed_state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().view(torch.int16).cpu().numpy().tobytes())
    return {"grad_norm": repr(gnorm), "loss": repr(float(loss.detach())), "grad_sha256": grad_digest,
            "weights_sha256": h.hexdigest(), "backward_s": round(t_bwd, 3), "tokens": int(ids.numel()),
            "backward_impls": backward_impls()}


def gpu() -> dict:
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,uuid,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True)
    name, uuid, driver = ([x.strip() for x in q.stdout.splitlines()[0].split(",")] + ["", "", ""])[:3] \
        if q.returncode == 0 and q.stdout.strip() else ("unknown", "unknown", "unknown")
    return {"name": name, "uuid": uuid, "driver": driver}


def versions() -> dict:
    from importlib import metadata

    out = {}
    for p in ("torch", "vllm", "triton"):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def compare(mine: dict, theirs: dict) -> dict:
    """Per shape and mode: does this machine's (every run's) weights digest equal the other's?"""
    out = {}
    for shape, modes in mine["shapes"].items():
        for mode, runs in modes.items():
            other = theirs.get("shapes", {}).get(shape, {}).get(mode)
            if not other:
                continue
            a = {r["weights_sha256"] for r in runs if "weights_sha256" in r}
            b = {r["weights_sha256"] for r in other if "weights_sha256" in r}
            out[f"{shape}/{mode}"] = {"same_weights": a == b and len(a) == 1, "here": sorted(a), "there": sorted(b),
                                      "grad_norm_here": sorted({r.get("grad_norm") for r in runs}),
                                      "grad_norm_there": sorted({r.get("grad_norm") for r in other})}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="mid4,llama3.2-1b_l4")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sequences", type=int, default=48)
    ap.add_argument("--work", default="/tmp/tica_update_repro")
    ap.add_argument("--expect", help="an earlier update_repro.json (another machine) to compare with")
    ap.add_argument("--budget", type=float, default=500.0, help="seconds: no new run starts after this")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("UPDATE_REPRO " + json.dumps(child(a)), flush=True)
        return 0
    if os.environ.get("VLLM_BATCH_INVARIANT") != "1":
        raise SystemExit("update_repro needs VLLM_BATCH_INVARIANT=1 (the trainer's Triton matmul)")
    from tica.legs.vllm_kernels.seeded_model import make_model

    t0 = time.time()
    out, work = Path(a.out), Path(a.work)
    out.mkdir(parents=True, exist_ok=True)
    result = {"gpu": gpu(), "versions": versions(), "seed": SEED, "sequences": a.sequences, "lr": LR, "shapes": {}}
    for shape in a.shapes.split(","):
        md = work / shape
        if not (md / "config.json").exists():
            make_model(md, shape, seed=7, device="cuda")
        per = result["shapes"].setdefault(shape, {})
        for run in range(a.runs):  # modes interleaved, so a drift in the machine touches both alike
            for mode in a.modes.split(","):
                if time.time() - t0 > a.budget:
                    per.setdefault(mode, []).append({"not_run": "budget"})
                    continue
                q = subprocess.run([sys.executable, __file__, "--child", "--out", a.out, "--model", str(md),
                                    "--mode", mode, "--sequences", str(a.sequences)],
                                   capture_output=True, text=True, timeout=300)
                line = next((x for x in q.stdout.splitlines() if x.startswith("UPDATE_REPRO ")), None)
                rec = json.loads(line.split(" ", 1)[1]) if line else {"error": (q.stderr or q.stdout)[-600:], "rc": q.returncode}
                per.setdefault(mode, []).append(rec)
                print(shape, mode, run, {k: rec.get(k) for k in ("grad_norm", "weights_sha256", "backward_s", "error")},
                      flush=True)
    if a.expect:
        result["compared_with"] = {"file": Path(a.expect).name, "gpu": json.loads(Path(a.expect).read_text()).get("gpu"),
                                   "result": compare(result, json.loads(Path(a.expect).read_text()))}
    (out / "update_repro.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
