"""The logits as vLLM 0.26 hands them to its logprob kernel: a view of the lm_head output over the
vocabulary padded to a multiple of 64, whose rows keep the padded stride. The kernel takes that
stride as an argument (Triton specialises on it), and matrix4 on the H200 showed its bits depend
on it: a trainer that copied the logits to a dense [T, V] tensor failed every cell of every
vocabulary that is not a multiple of 64. These CPU tests hold the trainer to vLLM's layout, with
the dense copy as the negative control."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tica.legs.vllm_kernels import autograd as A  # noqa: E402
from tica.legs.vllm_kernels.kernels import TorchReference, VllmKernels  # noqa: E402
from tica.legs.vllm_kernels.model import KernelLlama, pack  # noqa: E402
from tica.legs.vllm_kernels.probe import logprob_row_strides  # noqa: E402


class StrideRecorder(TorchReference):
    """The reference kernels, padding the vocabulary as VllmKernels does and recording the layout of
    every logits tensor the logprob kernel is handed."""

    vocab_pad = 64
    seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    @classmethod
    def token_logprobs(cls, logits, targets):
        cls.seen.append((tuple(logits.shape), tuple(logits.stride())))
        return TorchReference.token_logprobs(logits, targets)


def _model(vocab: int, kernels=StrideRecorder, tp: int = 1) -> KernelLlama:
    torch.manual_seed(0)
    H, L, nq, nkv, D, I = 32, 1, 4, 2, 8, 64
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L,
           "num_attention_heads": nq, "num_key_value_heads": nkv, "head_dim": D, "vocab_size": vocab,
           "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    sd = {"model.embed_tokens.weight": torch.randn(vocab, H) * 0.1, "model.norm.weight": torch.ones(H),
          "lm_head.weight": torch.randn(vocab, H) * 0.1,
          "model.layers.0.input_layernorm.weight": torch.ones(H), "model.layers.0.post_attention_layernorm.weight": torch.ones(H),
          "model.layers.0.self_attn.q_proj.weight": torch.randn(nq * D, H) * 0.1,
          "model.layers.0.self_attn.k_proj.weight": torch.randn(nkv * D, H) * 0.1,
          "model.layers.0.self_attn.v_proj.weight": torch.randn(nkv * D, H) * 0.1,
          "model.layers.0.self_attn.o_proj.weight": torch.randn(H, nq * D) * 0.1,
          "model.layers.0.mlp.gate_proj.weight": torch.randn(I, H) * 0.1,
          "model.layers.0.mlp.up_proj.weight": torch.randn(I, H) * 0.1,
          "model.layers.0.mlp.down_proj.weight": torch.randn(H, I) * 0.1}
    m = KernelLlama(cfg, {k: v.to(torch.bfloat16) for k, v in sd.items()}, kernels, compute_dtype=torch.float32)
    m.tp = tp
    return m


def _layout_seen(model: KernelLlama) -> tuple[tuple[int, ...], tuple[int, ...]]:
    StrideRecorder.seen = []
    ids, cu, mx = pack([[5, 9, 3, 7, 1], [2, 8, 4]], "cpu")
    model.logprobs(ids, cu, mx)
    assert len(StrideRecorder.seen) == 1
    return StrideRecorder.seen[0]


@pytest.mark.parametrize("vocab", [97, 50257 // 100, 130])
def test_the_logprob_kernel_gets_the_padded_row_stride_at_tp1(vocab):
    shape, stride = _layout_seen(_model(vocab))
    assert shape == (6, vocab)
    assert stride == (-(-vocab // 64) * 64, 1)


def test_the_logprob_kernel_gets_the_padded_row_stride_at_tp2():
    shape, stride = _layout_seen(_model(97, tp=2))
    assert shape == (6, 97) and stride == (128, 1)


def test_without_the_padding_the_rows_are_dense_negative_control():
    m = _model(97)
    m.vocab_pad = 1  # the matrix's unpadded_lm_head variant
    assert _layout_seen(m) == ((6, 97), (97, 1))


def test_a_vocabulary_that_is_a_multiple_of_64_is_dense_either_way():
    assert _layout_seen(_model(128)) == ((6, 128), (128, 1))


def test_padding_and_the_view_change_no_value_and_no_gradient():
    """The padded layout is vLLM's bits on the GPU; on the reference it must be the same function."""
    m_pad, m_dense = _model(97), _model(97)
    m_dense.vocab_pad = 1
    ids, cu, mx = pack([[5, 9, 3, 7, 1], [2, 8, 4]], "cpu")
    outs = []
    for m in (m_pad, m_dense):
        lp = m.logprobs(ids, cu, mx)
        lp.sum().backward()
        outs.append((lp.detach(), m.p("lm_head.weight").grad.clone()))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.allclose(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-7)


class _RawLogprob:
    """Stands in for vLLM's compute_token_logprobs: records the tensor it is handed."""

    def __init__(self):
        self.got = []

    def __call__(self, logits, targets):
        self.got.append(logits)
        return TorchReference.token_logprobs(logits, targets[:, 0]).unsqueeze(-1)


def _vllm_kernels(layout: str) -> VllmKernels:
    k = object.__new__(VllmKernels)  # no vLLM on a CPU: only the logprob call is exercised
    k._lp, k.logits_layout = _RawLogprob(), layout
    return k


def test_vllm_kernels_pass_the_view_on_uncopied():
    k = _vllm_kernels("vllm")
    full = torch.randn(4, 128)
    k.token_logprobs(full[:, :97], torch.tensor([1, 2, 3, 4]))
    got = k._lp.got[0]
    assert got.stride() == (128, 1) and got.data_ptr() == full.data_ptr()


def test_the_dense_probe_variant_copies_negative_control():
    k = _vllm_kernels("dense")
    k.token_logprobs(torch.randn(4, 128)[:, :97], torch.tensor([1, 2, 3, 4]))
    assert k._lp.got[0].stride() == (97, 1)


def test_the_stride_probe_counts_against_vllms_stride():
    """A kernel whose bits follow the stride's divisibility by 16 (the suspected mechanism) is seen at
    every stride that is not a multiple of 16, and nowhere else."""
    class StrideSensitive:
        @staticmethod
        def _lp(logits, targets):
            out = TorchReference.token_logprobs(logits.float(), targets[:, 0]).unsqueeze(-1)
            return out if logits.stride(0) % 16 == 0 else out + 1e-3

    lg = torch.randn(5, 97).to(torch.bfloat16)
    res = logprob_row_strides(StrideSensitive, lg, torch.tensor([0, 1, 2, 3, 4]))
    assert res["reference_stride"] == 128
    assert res["n_diff"] == {97: 5, 98: 5, 112: 0, 128: 0, 192: 0}
