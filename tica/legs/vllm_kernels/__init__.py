"""A trainer backend on vLLM 0.26's own kernels, for Llama/Qwen2-family dense models.

The BI=1 arm's trainer: "the training forward calls the vLLM kernels and reads the deployed
bytes". The forward of every op is the kernel vLLM 0.26 runs for that op under
``VLLM_BATCH_INVARIANT=1`` (see :mod:`.pin` for the list and why each is the one vLLM picks);
the backward of every op is written here (:mod:`.autograd`) and checked against a float64
reference (:mod:`.gradcheck`, ``tests/test_vllm_kernels_backward.py``).

Layout:
  pin.py        the vLLM version and kernel choices this depends on; a clear error if they moved
  kernels.py    two kernel sets with one interface: ``VllmKernels`` (GPU, the real kernels)
                and ``TorchReference`` (any device/dtype, plain torch, for tests)
  autograd.py   torch.autograd.Functions: forward = a kernel set's op, backward = written here
  model.py      ``KernelLlama``: fp32 master weights under HF names, the forward fused like vLLM
  moe.py        ``KernelMoe``: Qwen3-MoE, Mixtral and Qwen2-MoE on vLLM's MoE kernels, with routing
                receipts; moe_backward.py its MoE block's analytic backward and check;
                routing.py compares receipts (stdlib only)
  gradcheck.py  analytic backward vs float64 autograd of the reference, with a planted-error control
  probe.py      batch-invariance probe of each forward kernel on the GPU (kernel_probe.json)
  legio.py      leg directories per docs/receipts.md (stdlib/numpy + tica.seal/tica.metrics)
  producers.py  the H200 legs' entry point (``python -m tica.legs.vllm_kernels.producers CMD``),
                its code by concern in: seeded_model.py (make-model), rollout.py (step schedule,
                vLLM's offline engine, the dry run's fake), forward_leg.py (forward legs, planted
                faults, bi0), backward_update.py (backward, AdamW step, reload), bi1.py, tp.py
                (bi1-tp), server.py (throughput), launcher.py (``all`` and the command line)
  pipes_child.py  one producer command as a Dagster Pipes child on leased GPUs

Measured on the H200 (tests/fixtures/h200): vLLM 0.26's ``_C.fused_add_rms_norm`` changes the
bits of some rows with the number of tokens in the call (>= 256 or not), so vLLM's decode steps
differ from its prefill. ``KernelLlama.decode_rows`` makes the trainer run each row as the
engine ran it (prompt rows as one prefill call, generated-token rows in calls of <= 255 rows);
with it the trainer equals vLLM's sampled-token logprobs bitwise.

Importing this package imports neither torch nor vLLM; the producers set
``VLLM_BATCH_INVARIANT`` before anything imports vLLM.
"""

VLLM_PINNED = "0.26.0"
