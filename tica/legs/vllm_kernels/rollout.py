"""Rollouts and the step schedule of the forward legs: which prompts each step generates from and
which neighbours join its scoring batch (``schedule``), and the engines that run them: vLLM's
offline engine in this process (``VllmRollout``) or, in CPU dry runs, the reference model
(``FakeRollout``).
"""

from __future__ import annotations

import random
from pathlib import Path

from tica import leg_settings

FORWARD_CFG = dict(dtype="bfloat16", enforce_eager=True, enable_prefix_caching=False, seed=0,
                   gpu_memory_utilization=0.3, max_model_len=4096, attention_backend="FLASH_ATTN",
                   skip_tokenizer_init=True,
                   # a step's prompts (<= 10 x 1900 tokens) prefill in one engine step, so every later
                   # step is pure decode: no decode token shares a step with a prefill chunk
                   max_num_batched_tokens=32768)
# the engine as RL frameworks run it in production (verl's vLLM rollout defaults): CUDA graphs on,
# prefix caching on, chunked prefill with 8192 tokens a step; async scheduling left as vLLM resolves it
ACCEPT_CFG = dict(enforce_eager=False, enable_prefix_caching=True, enable_chunked_prefill=True,
                  max_num_batched_tokens=8192, shutdown_timeout=30)
# the same with CUDA graphs captured from the eager kernels (FULL_DECODE_ONLY) and no torch.compile:
# under vLLM 0.26's default compile, RMSNorm runs as torch code that Inductor fuses (custom_ops none),
# which no trainer on vLLM's kernels reproduces (the accept run's first call: every token differed)
GRAPHS_CFG = dict(ACCEPT_CFG, compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"})
ENGINES: dict[str, dict] = {"eager": {}, "production": ACCEPT_CFG, "graphs": GRAPHS_CFG}
N_STEPS = leg_settings.n_steps()  # 5 on the device; smaller only in CPU smoke runs
SCHEDULE_SEED = 20261129


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
        self.reload_ranks: list[int] = []  # the last reload's loaded tensors, per worker (rank order)

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

    def reload(self, safetensors_path: Path, *, layerwise: bool = False) -> int:
        """Load updated weights into the running engine, then drop its prefix cache: KV computed by
        the old weights would otherwise serve the next rollout's shared prefixes (as RL frameworks
        do after a weight sync; without it, every post-update re-check under prefix caching failed).

        layerwise: through the worker's ``reload_weights`` (vLLM 0.26's layerwise reload: each layer
        restored to its checkpoint form, loaded, and processed again, so online-quantized layers are
        quantized again from the new bf16 weights); a plain ``load_weights`` would write bf16 into
        the processed FP8 parameters."""
        path = str(safetensors_path)
        if layerwise:
            def _reload(worker):
                from safetensors.torch import load_file

                sd = load_file(path, device="cuda")
                worker.reload_weights(weights_iterator=iter(sd.items()), is_checkpoint_format=True)
                return len(sd)

            self.reload_ranks = [int(x) for x in self.llm.collective_rpc(_reload)]
            loaded = self.reload_ranks[0]
            if not self.llm.reset_prefix_cache() and self.cfg.get("enable_prefix_caching") is not False:
                raise RuntimeError("vLLM did not reset its prefix cache after the weight reload")
            return loaded

        def _load(model):
            from safetensors.torch import load_file

            sd = load_file(path, device="cuda")
            loaded = model.load_weights(iter(sd.items()))
            return len(loaded) if loaded is not None else len(sd)

        if int(self.cfg.get("tensor_parallel_size", 1)) > 1:
            # Past one worker the executor pickles apply_model's function as an argument (plain pickle:
            # this closure is refused) but cloudpickles a collective_rpc callable: reload through that.
            # Each worker loads the full tensors and its weight_loaders keep its rank's shard.
            def _load_on_worker(worker):
                return _load(worker.get_model())

            self.reload_ranks = [int(x) for x in self.llm.collective_rpc(_load_on_worker)]
        else:
            self.reload_ranks = [int(x) for x in self.llm.apply_model(_load)]
        loaded = self.reload_ranks[0]
        if not self.llm.reset_prefix_cache() and self.cfg.get("enable_prefix_caching") is not False:
            raise RuntimeError("vLLM did not reset its prefix cache after the weight reload")
        return loaded

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
        """The engine as vLLM resolved it (tica.legs.engine.resolved_engine_config: parallel sizes,
        dtypes, cache, scheduler, graphs, shutdown), with the attention backend it selected."""
        from tica.legs.engine import resolved_engine_config

        try:
            vc = self.llm.llm_engine.vllm_config
            backend = getattr(vc.attention_config, "backend", None)
        except AttributeError as err:
            return {"error": repr(err)[:200]}
        resolved = resolved_engine_config(vc)
        if "config_error" in resolved:
            return {"error": resolved["config_error"]}
        return {"attention": None if backend is None else str(getattr(backend, "name", backend)),
                "attention_backend": str(backend), **resolved}


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
