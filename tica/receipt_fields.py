"""Every field of every receipt model, and what reads it: a rule (the module that holds it) or
nothing, declared informational with the reason. tests/core/test_receipt_fields.py walks the
models: a field added without a line here fails, and so does a line naming a module that never
mentions the field. Values: "rule: <module>: <what it decides>" or "informational: <why>".
"""

from __future__ import annotations

_LEG = {
    "schema_": "rule: tica/receipts.py: the format version, refused unless tica.leg/1",
    "item": "rule: tica/judging.py: a leg of another item is not judged as this one",
    "arm": "rule: tica/binding.py: the arm must match the switch it records",
    "round": "rule: tica/items/throughput/judge.py: rounds pair legs in the frozen order",
    "slot": "rule: tica/items/throughput/judge.py: slot order against the frozen order",
    "concurrency": "rule: tica/binding.py: a throughput leg runs at a pinned concurrency",
    "producer": "informational: provenance; what binds a leg is the candidate identity it records",
    "producer_version": "informational: provenance; a parser change is the judge's version, not the producer's",
    "trainer": "rule: tica/items/forward/judge.py: BI=1 needs a trainer other than the rollout engine",
    "env": "rule: tica/binding.py: env.VLLM_BATCH_INVARIANT must be the arm's switch",
    "versions": "rule: tica/binding.py: pinned package versions",
    "device": "rule: tica/binding.py: the accelerator and driver",
    "kernels": "rule: tica/binding.py: the attention backend and engine settings",
    "resolved_config": "rule: tica/binding.py: weights, TP, dtype, graph and cache settings, workload",
    "profiled": "rule: tica/items/throughput/judge.py: a profiled run is no formal measurement",
    "source": "rule: tica/binding.py: the source commit and overlay",
    "image_digest": "rule: tica/binding.py: the image by digest",
    "started_at": "rule: tica/leg_times.py: a leg's times never contradict themselves",
    "ended_at": "rule: tica/leg_times.py: a leg's times never contradict themselves",
    "processes": "rule: tica/items/clean_exit/judge.py: every process's exit",
    "not_run_reason": "rule: tica/items/clean_exit/judge.py: a leg that did not run is no evidence",
    "errors": "rule: tica/judges/__init__.py: a leg whose producer caught errors is incomplete",
    "telemetry": "rule: tica/items/throughput/judge.py: what each leg of a tiered arm ran under, in the tiers table",
    "alive_at_end": "rule: tica/items/clean_exit/judge.py: one process's exit stands for each leg it lived through",
}
_TIERS = "rule: tica/items/throughput/tiers.py: compared between the fast and the slow legs to name the tiers' cause"
_TELEMETRY = {
    **{k: _TIERS for k in ("samples", "sm_clock_mhz_median", "mem_clock_mhz_median", "power_w_median",
                           "temperature_c_max", "gpu_util_pct_median", "throttle_reasons", "cpu_load_1m_end", "cpu_util",
                           "served_before", "prefix_cache_hit_rate", "preemptions", "engine_steps",
                           "tokens_per_step", "involuntary_switches_per_s", "cpu_steal_pct", "cpu_busy_pct",
                           "cpu_mhz_median", "cpu_probe_ms_median", "engine_itl_ms_mean", "engine_cpu_moves_pct",
                           "engine_sibling_busy_pct", "engine_cpu_loop_ms")},
    "cpu_loop_ms_min": "informational: the fastest CPU's pinned loop, shown beside the engine's CPU, which the rule compares",
    "cpu_loop_ms_max": "informational: the slowest CPU's pinned loop, shown beside the engine's CPU, which the rule compares",
    "engine_cpus": "informational: which CPUs the engine core was seen on; how often it moved is what the rule reads",
    "engine_numa_nodes": "informational: the NUMA nodes of those CPUs, shown with them",
    "cpu_probe_ms_max": "informational: shown beside the probe's median, which the rule compares",
    "cpu_probes": "informational: how many times the probe ran; its median is what the rule reads",
    "source": "informational: which sampler measured; samples (0: nothing measured) is what the rule reads",
    "interval_ms": "informational: the sampling period, shown with the samples",
    "sm_clock_mhz_min": "informational: shown beside the median, which the rule compares",
    "cpu_load_1m_start": "informational: shown in the tiers table; the rule compares the load at the end",
    "cuda_graphs": "informational: these servers run eager (resolved_config.enforce_eager binds it)",
    "prefix_cache_reset": "informational: how the leg began; the hit rate it leads to is what the tiers rule compares",
}
_EXIT = {
    "role": "rule: tica/items/clean_exit/judge.py: each role verified on its own",
    "pid": "informational: names the process in the table; pids are reused, never an identity",
    "exit_code": "rule: tica/process_exits.py: an exit code other than 0 is not clean",
    "end_state": "rule: tica/process_exits.py: only `exited` can be clean",
    "signal": "rule: tica/process_exits.py: an exit that names a signal is not clean",
    "evidence": "rule: tica/process_exits.py: vLLM's force-kill line is not clean",
    "name": "informational: the OS's process name, shown beside the role",
    "command": "informational: the command line, shown; the role decides what is required",
    "identity": "rule: tica/items/clean_exit/judge.py: a process counts once by content, whatever its role and pid",
}
_PROCESS_IDENTITY = {
    "create_time": "rule: tica/items/clean_exit/judge.py: exits of one create time, name and command line are one process",
    "name": "rule: tica/items/clean_exit/judge.py: exits of one create time, name and command line are one process",
    "cmdline": "rule: tica/items/clean_exit/judge.py: exits of one create time, name and command line are one process",
}
_LIVE = {
    "role": "rule: tica/items/clean_exit/judge.py: the live process must be the exit's, role and pid alike",
    "pid": "rule: tica/items/clean_exit/judge.py: the live process must be the exit's, role and pid alike",
    "identity": "rule: tica/items/clean_exit/judge.py: the live process must be the exit's by content",
    "read_at": "rule: tica/items/clean_exit/judge.py: read alive once the leg's work had ended",
}
_STEP = {
    "step": "rule: tica/items/forward/judge.py: every step present, none numbered 0",
    "step_basis": "rule: tica/forward_reading.py: a BI=1 step must be tied to a checkpoint",
    "checkpoint_version": "rule: tica/forward_reading.py: a BI=1 step must be tied to a checkpoint",
    "within_group_rewards": "rule: tica/grad_reading.py: a grad norm of 0 is read against the rewards",
    "grad_norm": "rule: tica/forward_reading.py: the BI=0 smoke check's grad norm is finite",
}
_FORWARD = {
    **_STEP,
    "probs_diff_max": "rule: tica/forward_reading.py: BI=1 max = 0; checked against the arrays",
    "probs_diff_mean": "rule: tica/forward_reading.py: BI=1 mean = 0, BI=0 of the reference's magnitude",
    "probs_diff_std": "rule: tica/forward_reading.py: a BI=1 std other than 0 fails",
    "pearson": "rule: tica/forward_reading.py: checked against the arrays",
    "k3_kl": "rule: tica/forward_reading.py: a BI=1 k3 other than 0 fails",
    "n_tokens": "rule: tica/forward_reading.py: a step of 0 tokens is no measurement",
    "n_bitwise_diff": "rule: tica/forward_reading.py: BI=1 logprobs bitwise equal",
    "logprob_abs_diff_max": "rule: tica/forward_reading.py: a BI=1 |diff| other than 0 fails",
    "content_sha256": "rule: tica/forward_reading.py: a logged-only BI=1 step needs it; one content counts once",
}
_BACKWARD = {
    **_STEP,
    "step_basis": "rule: tica/grad_reading.py: shown in the table; one basis per file (tica/receipts.py)",
    "checkpoint_version": "informational: shown; a backward step is not compared across checkpoints",
    "grad_norm": "rule: tica/grad_reading.py: finite, and 0 only with equal rewards",
    "grad_finite": "rule: tica/grad_reading.py: gradients must be finite",
    "params_total": "rule: tica/grad_reading.py: the share of parameters reached",
    "params_with_grad": "rule: tica/grad_reading.py: the share of parameters reached",
    "params_nonzero_grad": "rule: tica/grad_reading.py: gradients reach the master weights",
    "deployed_bytes_equal": "rule: tica/grad_reading.py: forward equals the deployed bytes",
    "gradcheck_pass": "rule: tica/grad_reading.py: checked against gradcheck.json",
    "gradcheck_controls_caught": "rule: tica/grad_reading.py: the check's planted errors were caught",
}
_UPDATE = {
    **_BACKWARD,
    "checkpoint_version": "rule: tica/items/update/judge.py: the post-update forward ran the updated weights",
    "optimizer": "rule: tica/items/update/judge.py: the question's optimizer",
    "weights_changed_tensors": "rule: tica/items/update/judge.py: a real step changes the weights",
    "weights_total_tensors": "rule: tica/items/update/judge.py: the share of tensors changed",
    "updated_weights_hash": "rule: tica/items/update/judge.py: the re-check ran on these weights",
    "reloaded_by_rollout": "rule: tica/items/update/judge.py: the rollout engine reloaded the update",
    "rerun": "rule: tica/items/update/judge.py: reproduced_on_rerun compares the rerun with the step",
}
_UPDATE_RERUN = {
    "grad_norm": "rule: tica/items/update/judge.py: equal to the step's grad norm",
    "updated_weights_hash": "rule: tica/items/update/judge.py: equal to the step's updated weights hash",
    "how": "informational: what was run again, and where",
    "grad_norm_equal": "informational: the producer's comparison (the judge compares the values)",
    "weights_equal": "informational: the producer's comparison (the judge compares the hashes)",
    "tensors_differ": "informational: the first tensors whose bytes differed",
    "n_tensors_differ": "informational: how many tensors differed",
}
_BENCH = {
    "num_prompts": "rule: tica/items/throughput/judge.py: the workload's request count",
    "max_concurrency": "rule: tica/items/throughput/judge.py: the concurrency point",
    "duration": "rule: tica/items/throughput/judge.py: part of a run's content identity",
    "completed": "rule: tica/items/throughput/judge.py: the arms completed the same volume",
    "failed": "rule: tica/items/throughput/judge.py: a failed request invalidates the leg",
    "total_input_tokens": "rule: tica/items/throughput/judge.py: the workload's input tokens",
    "total_output_tokens": "rule: tica/items/throughput/judge.py: the workload's output tokens",
    "request_throughput": "rule: tica/items/throughput/judge.py: a throughput metric a question may name",
    "output_throughput": "rule: tica/items/throughput/judge.py: the default throughput metric",
    "total_token_throughput": "rule: tica/items/throughput/judge.py: a throughput metric a question may name",
    "mean_ttft_ms": "rule: tica/items/throughput/judge.py: reported per leg; part of a run's content identity",
    "median_ttft_ms": "rule: tica/items/throughput/judge.py: part of a run's content identity",
    "p99_ttft_ms": "rule: tica/items/throughput/judge.py: part of a run's content identity",
    "mean_tpot_ms": "rule: tica/items/throughput/judge.py: reported per leg; part of a run's content identity",
    "median_tpot_ms": "rule: tica/items/throughput/judge.py: part of a run's content identity",
    "p99_tpot_ms": "rule: tica/items/throughput/judge.py: part of a run's content identity",
    "mean_itl_ms": "rule: tica/items/throughput/judge.py: with the median (tiers.tier_shape), whether a tier is every token slower or a few pauses",
    "median_itl_ms": "rule: tica/items/throughput/judge.py: with the mean (tiers.tier_shape), whether a tier is every token slower or a few pauses",
    "errors": "rule: tica/receipts.py: counted with `failed` (error_count)",
    "arm": "rule: tica/receipts.py: must agree with leg.json",
    "round": "rule: tica/receipts.py: must agree with leg.json",
    "slot": "rule: tica/receipts.py: must agree with leg.json",
    "num_warmups": "rule: tica/items/throughput/judge.py: the workload's warm-ups",
    "ignore_eos": "rule: tica/items/throughput/judge.py: a fixed-length workload ignores EOS",
    "profiled": "rule: tica/receipts.py: a profiled run is no formal measurement",
}
_PROBLEM = {
    "problem_id": "rule: tica/items/quality/judge.py: pairs the arms' results",
    "correct": "rule: tica/items/quality/judge.py: the 2x2 and the scores",
    "prompt_hash": "rule: tica/items/quality/judge.py: a problem's content identity",
    "response": "informational: kept for a person to read; the scorer's verdict is `correct`",
    "extracted": "informational: kept for a person to read; the scorer's verdict is `correct`",
    "truncated": "rule: tica/items/quality/judge.py: the truncation ratio beside accuracy",
}
_SAMPLING = {
    "temperature": "rule: tica/receipts.py: greedy or not decides which parameters must be known",
    "top_p": "rule: tica/receipts.py: part of the sampling contract item",
    "top_k": "rule: tica/receipts.py: part of the sampling contract item",
    "seed": "rule: tica/receipts.py: part of the sampling contract item",
    "n": "rule: tica/receipts.py: part of the sampling contract item",
    "stop": "rule: tica/receipts.py: part of the sampling contract item",
}
_CONTRACT = {
    "dataset_version": "rule: tica/receipts.py: contract item",
    "prompt_template": "rule: tica/receipts.py: contract item",
    "thinking_mode": "rule: tica/receipts.py: contract item (with the template)",
    "sampling": "rule: tica/receipts.py: contract item",
    "repeats": "rule: tica/items/quality/judge.py: contract item; the statistical basis needs it",
    "scorer": "rule: tica/receipts.py: contract item",
    "length_cap": "rule: tica/receipts.py: contract item",
}
_GRADCHECK_OP = {
    "op": "rule: tica/grad_reading.py: names the op checked and the op a control planted",
    "rel_err": "rule: tica/grad_reading.py: against the question's gradcheck_rel_tol",
    "finite": "rule: tica/grad_reading.py: a non-finite backward fails",
    "tol": "informational: the producer's tolerance; the pass line is the question's",
    "max_rel_err": "informational: recomputed from rel_err",
    "forward_rel_err": "informational: the forward's error, shown",
    "pass_": "informational: recomputed under the question's tolerance",
}
_GRADCHECK_RUN = {
    "kernels": "rule: tica/grad_reading.py: the check must be of the leg's trainer",
    "device": "informational: where the check ran",
    "dtype": "informational: the dtype checked",
    "planted": "rule: tica/grad_reading.py: a control is caught only by its planted op",
    "tol": "informational: the producer's tolerance; the pass line is the question's",
    "ops": "rule: tica/grad_reading.py: every op checked",
    "pass_": "informational: recomputed under the question's tolerance",
}
_GRADCHECK = {
    "check": "rule: tica/grad_reading.py: the check of the real backward",
    "controls": "rule: tica/grad_reading.py: the planted-error controls",
    "controls_caught": "informational: recomputed per planted op",
    "pass_": "informational: recomputed under the question's tolerance",
}
_RECIPE = {
    "RecipeDryRuns": {"schema_": "rule: tica/receipts.py: the format version",
                      "recipe": "informational: names the recipe in the report",
                      "combos": "rule: tica/judges/recipe_identity.py: every mode x optimizer x arm"},
    "RecipeCombo": {"mode": "rule: tica/judges/recipe_identity.py: each mode judged",
                    "optimizer": "rule: tica/judges/recipe_identity.py: each optimizer judged",
                    "arm": "rule: tica/judges/recipe_identity.py: BI=1 byte-identical, BI=0 names only",
                    "before": "rule: tica/judges/recipe_identity.py: the command before the change",
                    "after": "rule: tica/judges/recipe_identity.py: the command after the change"},
    "ResolvedCommand": {"command": "rule: tica/judges/recipe_identity.py: compared by sha256",
                        "rc": "rule: tica/judges/recipe_identity.py: every combination returns 0"},
}

# The matrix producer's `tica/*` keys on a forward step row (ForwardStep keeps extra keys): each is
# read by a rule or declared informational, like a model's field; tests/core/test_receipt_fields.py
# checks every key the committed matrix receipts carry against this.
MATRIX_ROW_EXTRAS: dict[str, str] = {
    "tica/load": "rule: tica/judges/matrix.py: the cell's load, one cell per (candidate, shape, load, scoring)",
    "tica/scored": "rule: tica/judges/matrix.py: decode or prefill scoring, a cell of its own",
    "tica/variants": "rule: tica/judges/matrix.py: a one-change variant that matches names a failing cell's cause",
    "tica/vllm_decode_vs_prefill_n_bitwise_diff": "rule: tica/judges/matrix.py: vLLM's own decode against its prefill names an engine-step cause",
    "tica/vllm_alone_vs_batch_n_bitwise_diff": "rule: tica/judges/matrix.py: vLLM's own alone-vs-batch scoring names a batch-variant engine",
    "tica/vllm_alone_vs_batch_n_tokens": "informational: the denominator shown beside the alone-vs-batch count",
    "tica/load_spec": "informational: the load's shape (sequences, prompt and response lengths), shown",
    "tica/n_generated": "informational: generated tokens of the batch; the scored count is tica/n_tokens",
    "tica/seq_len_max": "informational: the longest sequence of the batch, shown",
    "tica/planted_fault": "informational: the fault a canary leg planted; tica/judges/planted.py reads it from resolved_config",
    "tica/routes": "informational: a summary of the routes; the judge compares the arrays (tica/routing.py)",
    "tica/ep_rank_routes": "informational: a summary of the EP ranks' routes; the judge reads the arrays' trainer_experts_ranks (tica/judges/matrix.py)",
    "tica/largest_kernel_call_rows": "informational: the largest packed call per row-wise kernel, shown against the row limit",
    "tica/packed_rows": "informational: rows of the one packed forward, shown against the row limit",
    "tica/row_call_elems": "informational: the element bound each row-wise call was cut to, shown",
}

FIELD_RULES: dict[str, dict[str, str]] = {
    "LegMeta": _LEG, "LegTelemetry": _TELEMETRY, "ProcessExit": _EXIT, "ProcessIdentity": _PROCESS_IDENTITY, "LiveProcess": _LIVE, "ForwardStep": _FORWARD, "BackwardStep": _BACKWARD,
    "UpdateStep": _UPDATE, "UpdateRerun": _UPDATE_RERUN, "BenchResult": _BENCH, "ProblemResult": _PROBLEM, "Sampling": _SAMPLING,
    "RecordedEvalContract": _CONTRACT, "GradcheckOp": _GRADCHECK_OP, "GradcheckRun": _GRADCHECK_RUN,
    "GradcheckFile": _GRADCHECK, **_RECIPE,
}
