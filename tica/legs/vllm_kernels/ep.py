"""Expert parallelism as vLLM 0.26 runs it at TP=2 with ``enable_expert_parallel=True`` and no
data parallelism (read from the 0.26.0 wheel, not guessed):

* ``FusedMoEParallelConfig.make`` (fused_moe/config.py): with EP the MoE layer's TP size becomes 1
  and its EP size the TP size (2); every other layer stays tensor-parallel at 2. ``use_all2all_kernels``
  needs data, context or sequence parallelism (``ParallelConfig.use_sequence_parallel_moe`` needs
  ``data_parallel_size > 1``), so the default all2all backend (allgather_reducescatter) is never
  used here and there is no dispatch/combine: both ranks see every token (the router, a
  ``ReplicatedLinear``, is computed on each) and the prepare/finalize is ``MoEPrepareAndFinalizeNoDPEP``
  (``output_is_reduced`` False); the unquantized backend is TRITON on sm90 with or without EP
  (oracle/unquantized.py ``_get_priority_backends``);
* ``determine_expert_map`` (fused_moe/expert_map_manager.py): whole experts per rank, ``linear`` by
  default (``ParallelConfig.expert_placement_strategy``); ``round_robin`` is kept only for models
  with expert groups (``num_expert_group > 1``: ``determine_expert_placement_strategy`` falls back
  to linear otherwise, so never for Qwen3-MoE, Mixtral or Qwen2-MoE);
* each rank's ``fused_experts`` gets its local w13/w2, ``global_num_experts`` and the ``expert_map``:
  a slot routed to another rank's expert is skipped in ``moe_align_block_size`` and its row of the
  down projection's output is zero (``fused_experts_impl`` zeroes ``intermediate_cache3``;
  ``fused_moe_kernel`` writes zeros for expert id -1), then ``moe_sum`` adds the top-k rows (so at
  top-2 a token's routed output is one rounded a + b on either layout; past top-2 the ranks' sums
  group the slots differently from TP=1's);
* ``MoERunner._maybe_reduce_final_output`` (fused_moe/runner/moe_runner.py): ``shared_output +
  fused_output`` per rank, then one ``tensor_model_parallel_all_reduce`` over the TP group (the late
  all-reduce, as at TP=2 without EP). A shared expert (Qwen2-MoE's ``Qwen2MoeMLP``, built with
  ``MergedColumnParallelLinear`` / ``RowParallelLinear`` and ``reduce_results=False``) is not an
  expert of the map: it stays tensor-parallel, each rank adding its partial.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it runs: the matrix's orchestrator imports this module without it
    import torch

PLACEMENTS = ("linear", "round_robin")

TRAINER_EP_LAYOUT = ("2 ranks emulated on the trainer's one device with vLLM's expert parallelism: attention and dense "
                     "layers as at TP=2; each MoE layer's router replicated, each rank's fused_experts over its whole "
                     "experts (vLLM's linear expert map) with the other rank's slots zero, a shared expert's TP partial "
                     "added, the two partials summed in fp32 and rounded to bf16 once (the late all-reduce)")
DRY_EP = ("CPU dry run, no engine: EP=2 emulated on one CPU device (KernelMoe.ep), each rank's local experts "
          "through the reference kernels, the partials summed in rank order")


def placement(requested: str, num_expert_group: int | None) -> str:
    """The placement vLLM uses (determine_expert_placement_strategy, no redundant experts, no EPLB,
    no all2all backend): round_robin only for a model with expert groups, else linear."""
    if requested not in PLACEMENTS:
        raise ValueError(f"expert placement {requested!r}: vLLM 0.26 has {PLACEMENTS}")
    return requested if requested == "round_robin" and (num_expert_group or 0) > 1 else "linear"


def expert_map(ep_size: int, ep_rank: int, n_experts: int, strategy: str = "linear") -> torch.Tensor:
    """vLLM's determine_expert_map: int32 [n_experts], the local index of each expert on this rank
    or -1; the first ``n_experts % ep_size`` ranks hold one expert more."""
    import torch

    if not 0 <= ep_rank < ep_size:
        raise ValueError(f"rank {ep_rank} of {ep_size}")
    base, rem = divmod(n_experts, ep_size)
    local = base + 1 if ep_rank < rem else base
    out = torch.full((n_experts,), -1, dtype=torch.int32)
    if strategy == "linear":
        start = ep_rank * base + min(ep_rank, rem)
        out[start:start + local] = torch.arange(local, dtype=torch.int32)
    elif strategy == "round_robin":
        out[torch.arange(ep_rank, n_experts, ep_size)] = torch.arange(local, dtype=torch.int32)
    else:
        raise ValueError(f"expert placement {strategy!r}: vLLM 0.26 has {PLACEMENTS}")
    return out


def check_expert_maps(maps: list[torch.Tensor], n_experts: int) -> None:
    """Refuses maps under which some expert is computed on no rank or on two, or whose local
    indices are not 0..local-1 (a rank's stacked weights would be read at the wrong expert)."""
    import torch

    owners = torch.stack([(m >= 0).to(torch.int64) for m in maps]).sum(0)
    if owners.shape != (n_experts,) or bool((owners != 1).any()):
        bad = [int(e) for e in torch.nonzero(owners != 1).flatten()]
        raise ValueError(f"expert map: experts {bad[:8]} are held by {[int(owners[e]) for e in bad[:8]]} ranks, not 1")
    for r, m in enumerate(maps):
        local = sorted(int(x) for x in m[m >= 0])
        if local != list(range(len(local))):
            raise ValueError(f"expert map of rank {r}: local indices {local[:8]} are not 0..{len(local) - 1}")


def local_experts(m: torch.Tensor) -> torch.Tensor:
    """The global ids of a rank's experts in local order (its stacked w13/w2 rows)."""
    import torch

    held = torch.nonzero(m >= 0).flatten()
    return held[torch.argsort(m[held])]


def engine_expert_maps(model) -> dict[str, list[int]]:
    """Runs in each vLLM worker (``LLM.apply_model``): every MoE layer's expert map as the engine
    holds it (RoutedExperts' ``_expert_map`` buffer; None without EP)."""
    out = {}
    for name, mod in model.named_modules():
        m = getattr(mod, "_expert_map", None)
        if m is not None:
            out[name] = [int(x) for x in m.flatten().tolist()]
    return out


def engine_maps_differ(per_rank: list[dict[str, list[int]]], maps: list[torch.Tensor]) -> str | None:
    """Why the engine's expert maps (one dict per rank, rank order) are not the trainer's, or None."""
    if len(per_rank) != len(maps):
        return f"the engine reported expert maps from {len(per_rank)} ranks, the trainer emulates {len(maps)}"
    for r, (layers, want) in enumerate(zip(per_rank, maps)):
        if not layers:
            return f"rank {r} of the engine holds no expert map, so vLLM did not run expert parallelism"
        bad = [n for n, m in layers.items() if m != [int(x) for x in want.tolist()]]
        if bad:
            return (f"rank {r} of the engine holds expert map {layers[bad[0]]} at {bad[0]} ({len(bad)} layers), "
                    f"the trainer's is {[int(x) for x in want.tolist()]}")
    return None


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (its shape and dtype written before them)."""
    import hashlib

    import torch

    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(f"{list(t.shape)} {t.dtype}|".encode() + raw).hexdigest()


def engine_expert_digests(model) -> dict[str, tuple[str, str]]:
    """Runs in each vLLM worker (``LLM.apply_model``): (dtype, digest) of every MoE layer's w13/w2 as
    this rank holds them (with EP its local experts), so no tensor crosses between processes."""
    return {n: (str(p.dtype).removeprefix("torch."), tensor_digest(p)) for n, p in model.named_parameters()
            if ("w13_weight" in n or "w2_weight" in n) and "layers" in n.split(".")}


def reloaded_experts_equal(per_rank: list[dict[str, tuple[str, str]]], model) -> dict:
    """Each rank's reloaded w13/w2 against the trainer's stacked deployed bytes of that rank's experts."""
    import torch

    maps = model.expert_maps()
    if len(per_rank) != len(maps):
        return {"error": f"digests from {len(per_rank)} ranks, the trainer emulates {len(maps)}"}
    want = {i: model.expert_weights(f"model.layers.{i}.") for i in model.sparse_layers}
    equal, differ = 0, []
    for r, (got, m) in enumerate(zip(per_rank, maps)):
        for n, (dtype, digest) in got.items():
            parts = n.split(".")
            i = int(parts[parts.index("layers") + 1])
            ref = want[i][0 if "w13" in n else 1]
            if digest == tensor_digest(ref[local_experts(m).to(ref.device)].to(getattr(torch, dtype))):
                equal += 1
            else:
                differ.append(f"rank {r}: {n}")
    return {"tensors": equal + len(differ), "equal": equal, "differ": differ}
