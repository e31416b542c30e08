"""Op by op: each ATen op family xg.compile translates, against float64 eager on random inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xg
from xgbuild.compiler.importers.torch_export import import_torch
from xgbuild.compiler.ir.graph import Op
from zoo import TOL, rel_err


def r(*shape):
    return torch.randn(*shape)


W4 = torch.randn(6, 3, 3, 3)
WG = torch.randn(6, 2, 3, 3)
WD = torch.randn(6, 1, 3, 3)
WR = torch.randn(5, 3, 2, 3)
B6 = torch.randn(6)
TABLE = torch.randn(10, 5)
MASK = torch.randn(4, 4)
PAD = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
RM, RV = torch.randn(5) * 0.1, torch.rand(5) + 0.5
LN_W, LN_B, ONES3, RMS_W = torch.rand(3, 4) + 1, torch.randn(3, 4), torch.ones(3), torch.arange(4.0) + 1

def _repeat_kv(x, n):
    """transformers' repeat_kv: [B, KVH, S, D] -> [B, KVH * n, S, D]."""
    b, kvh, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kvh, n, s, d).reshape(b, kvh * n, s, d)


CASES = {
    "conv_stride_pad": (lambda x: F.conv2d(x, W4, B6, stride=2, padding=1), (r(2, 3, 9, 9),)),
    "conv_dilation_asym": (lambda x: F.conv2d(x, W4, None, stride=(1, 2), padding=(2, 0), dilation=2), (r(1, 3, 8, 9),)),
    "conv_groups": (lambda x: F.conv2d(x, WG, B6, padding=1, groups=3), (r(2, 6, 5, 5),)),
    # patches that tile the image (ViT): one matmul; rows and columns past the last patch dropped
    "conv_patches": (lambda x: F.conv2d(x, W4, B6, stride=3), (r(2, 3, 11, 10),)),
    "conv_patches_rect": (lambda x: F.conv2d(x, WR, None, stride=(2, 3)), (r(1, 3, 8, 9),)),
    "conv_depthwise": (lambda x: F.conv2d(x, WD, B6, padding=1, groups=6), (r(2, 6, 5, 5),)),
    "max_pool": (lambda x: F.max_pool2d(x, 3, 2, 1), (r(2, 3, 7, 7),)),
    "max_pool_ceil": (lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True), (r(1, 2, 6, 6),)),
    "avg_pool_exclude_pad": (lambda x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False), (r(2, 3, 5, 5),)),
    "avg_pool_include_pad": (lambda x: F.avg_pool2d(x, 2, 2, 1), (r(2, 3, 5, 5),)),
    "adaptive_avg_2x2": (lambda x: F.adaptive_avg_pool2d(x, 2), (r(2, 3, 6, 4),)),
    "cat_dims": (lambda x, y: torch.cat([x, y, x], dim=1) + torch.cat([x, x], dim=0).sum(0, keepdim=True)[:, :1],
                 (r(2, 3, 4), r(2, 5, 4))),
    "chunk_split": (lambda x: sum(c * i for i, c in enumerate(x.chunk(3, dim=-1))) + x.split([2, 4], 1)[0].sum(),
                    (r(4, 6),)),
    "permute_expand": (lambda x, y: x.permute(2, 0, 1) * y.expand(5, 2, 3), (r(2, 3, 5), r(1, 2, 1))),
    "softmax_dim1": (lambda x: F.softmax(x, dim=1) + F.log_softmax(x, dim=-1), (r(2, 5, 3),)),
    "sdpa_float_mask": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=MASK), (r(2, 3, 4, 8),) * 3),
    "sdpa_bool_mask_scale": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m > -0.5, scale=0.3),
                             (r(1, 2, 4, 8), r(1, 2, 4, 8), r(1, 2, 4, 8), r(1, 1, 4, 4))),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (r(2, 2, 5, 4),) * 3),
    "sdpa_fused_cpu_variant": (lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, True)[0], (r(2, 2, 5, 4),) * 3),
    # grouped-query attention: 6 query heads over 2 key/value heads, by SDPA's enable_gqa or by
    # transformers' repeat_kv; masks broadcast over heads, per head, or of rank 2
    "sdpa_gqa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                        (r(2, 6, 5, 8), r(2, 2, 5, 8), r(2, 2, 5, 8))),
    "sdpa_gqa_head_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
                           (r(2, 6, 4, 8), r(2, 2, 7, 8), r(2, 2, 7, 3), r(2, 6, 4, 7))),
    "sdpa_gqa_unequal_groups": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                                (r(1, 6, 4, 8), r(1, 6, 4, 8), r(1, 2, 4, 8))),
    "sdpa_gqa_3d": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=MASK, enable_gqa=True),
                    (r(4, 4, 8), r(2, 4, 8), r(2, 4, 8))),
    "sdpa_repeat_kv": (lambda q, k, v, m: F.scaled_dot_product_attention(q, _repeat_kv(k, 3), _repeat_kv(v, 3),
                                                                         attn_mask=m > 0),
                       (r(2, 6, 5, 8), r(2, 2, 5, 8), r(2, 2, 5, 8), r(2, 1, 5, 5))),
    # an integer padding mask cast to bool: the cast keeps its dtype when split over the heads
    "sdpa_repeat_kv_int_mask": (lambda q, k, v: F.scaled_dot_product_attention(
        q, _repeat_kv(k, 3), _repeat_kv(v, 3), attn_mask=PAD[:, None, None, :].bool()),
        (r(2, 6, 5, 8), r(2, 2, 5, 8), r(2, 2, 5, 8))),
    "layer_norm_2d": (lambda x: F.layer_norm(x, (3, 4), LN_W, LN_B), (r(2, 3, 4),)),
    "rms_norm": (lambda x: F.rms_norm(x, (4,), RMS_W, 1e-6), (r(3, 4),)),
    "batch_norm_1d": (lambda x: F.batch_norm(x, RM, RV, RV * 2, B6[:5]),
                      (r(4, 5),)),
    "embedding": (lambda i: F.embedding(i, TABLE) * 2, (torch.randint(0, 10, (3, 4)),)),
    "reductions": (lambda x: x.mean((0, 2)).sum() + x.sum(1).amax(-1) - x.amin(dim=(1, 2)).mean(), (r(3, 4, 5),)),
    "activations": (lambda x: F.relu(x) + torch.tanh(x) + torch.sigmoid(x) + F.silu(x) + F.gelu(x)
                    + F.gelu(x, approximate="tanh") + torch.exp(-x * x) + torch.abs(x).sqrt(), (r(4, 6),)),
    "where_fill_clamp": (lambda x: torch.where(x > 0, x, x * 0.1).masked_fill(x < -1, 3.0).clamp(-0.5, 2.0)
                         + x.pow(2) - 1 / (x * x + 1), (r(5, 5),)),
    "int_float_mix": (lambda x, i: x * i + i.float().mean() + i * 0.5, (r(3, 4), torch.randint(-4, 4, (3, 4)))),
    "matmul_vec_bmm": (lambda a, b, v: torch.bmm(a, b).sum(-1) @ ONES3 + (a @ v).sum(), (r(2, 3, 4), r(2, 4, 3), r(4))),
    "more_activations": (lambda x: F.leaky_relu(x, 0.2) + F.elu(x) + F.hardsigmoid(x) + F.hardswish(x) + F.relu6(x * 4)
                         + F.softplus(x) + F.softplus(x * 30, beta=2) + F.mish(x) + torch.log1p(x * x) + x.square(),
                         (r(4, 6),)),
    "var_std_max": (lambda x: x.var(1) + x.std(dim=(0, 1), keepdim=True).sum() + x.var(0, unbiased=False).sum()
                    + x.max(dim=1).values + x.min(-1, keepdim=True)[0].squeeze(-1) + torch.max(x) + torch.max(x, x * 2).sum(0)[:4],
                    (r(4, 5),)),
    "stack_repeat_tril": (lambda x, y: torch.stack([x, y], dim=1).sum(1) + x.repeat(1, 2)[:, :3] + torch.tril(x, -1)
                          + torch.triu(y, 1), (r(4, 3), r(4, 3))),
    "view_transpose_select": (lambda x: x.view(4, 6).t()[1:5:2, -1] + x.reshape(-1)[3] + x.flatten().unflatten(0, (6, 4))[2, 1],
                              (r(2, 3, 4),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op(name: str) -> None:
    fn, inputs = CASES[name]
    engine = xg.compile(fn, inputs, kernels=False)
    fresh = tuple(torch.randn_like(x) if x.is_floating_point() else x for x in inputs)
    got = engine(*fresh)
    dbl = tuple(x.double() if x.is_floating_point() else x for x in fresh)
    g = {k: v for k, v in globals().items() if isinstance(v, torch.Tensor)}
    for k, v in g.items():
        globals()[k] = v.double()
    try:
        ref = fn(*dbl)
    finally:
        globals().update(g)
    assert got.shape == ref.shape
    assert rel_err(got, ref) < TOL, f"{name}: {rel_err(got, ref):.2e}"


class _Embed(torch.nn.Module):
    """Token rows at run-time indices plus position rows at `arange` (a slice of the table)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(37, 6).to(dtype)
        self.pos = torch.nn.Embedding(8, 6).to(dtype)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[-1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 3, 5)], ids=["1d", "2d", "3d"])
def test_embedding_is_a_gather_and_arange_a_slice(dtype: torch.dtype, shape: tuple) -> None:
    model = _Embed(dtype).eval()
    idx = torch.randint(0, 37, shape)
    ops = [n.op for n in import_torch(model, (idx,)).optimized.main.nodes]
    assert ops.count(Op.GATHER) == 1 and Op.MATMUL not in ops
    engine = xg.compile(model, (idx,), kernels=False)
    fresh = torch.randint(0, 37, shape)
    fresh.view(-1)[:2] = torch.tensor([0, 36])
    with torch.no_grad():
        want = model(fresh)
    # Rows are copied, then added in the table's dtype, as eager does.
    assert engine(fresh).dtype == dtype and torch.equal(engine(fresh), want)


@pytest.mark.parametrize("name", ["sdpa_gqa_causal", "sdpa_repeat_kv"])
def test_grouped_query_attention_reads_each_key_head_in_place(name: str) -> None:
    """The products broadcast a key head over its group of query heads ([B, KVH, n, T, S] scores):
    nothing writes keys or values repeated per query head."""
    fn, inputs = CASES[name]
    graph = import_torch(fn, inputs).optimized.main
    products = [n for n in graph.nodes if n.op is Op.MATMUL]
    assert [tuple(n.shape) for n in products] == [(2, 2, 3, 5, 5), (2, 2, 3, 5, 8)]
    assert not [n for n in graph.nodes if n.op is Op.ADD and len(n.shape) == 5]


def test_patch_convolution_is_one_matmul() -> None:
    conv = torch.nn.Conv2d(3, 8, 4, stride=4).eval()
    x = torch.randn(2, 3, 16, 18)
    imported = import_torch(conv, (x,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    ops = [n.op for n in imported.optimized.main.nodes]
    assert ops.count(Op.MATMUL) == 1
    engine = xg.compile(conv, (x,), kernels=False, dynamic_shapes=({0: torch.export.Dim("batch")},))
    y = torch.randn(5, 3, 16, 18)
    with torch.no_grad():
        assert rel_err(engine(y), conv.double()(y.double())) < TOL


def test_the_callers_profile_rides_on_the_imported_program() -> None:
    from xgbuild.hw import load_profile
    profile = load_profile("GB200")
    imported = import_torch(lambda x: torch.relu(x) * 2.0, (torch.randn(4, 8),), target=profile.name, profile=profile)
    assert imported.lowered.profile is profile and imported.optimized.profile is profile
    assert import_torch(torch.relu, (torch.randn(4, 8),)).optimized.profile is None


class _Positions(torch.nn.Module):
    """Row and column positions from `arange` of the input's own (dynamic) sizes."""

    def forward(self, x):
        rows = torch.arange(x.shape[0]).unsqueeze(1).to(x.dtype)
        return x + rows + torch.arange(1, 2 * x.shape[1] + 1, 2).to(x.dtype)


def test_arange_of_a_dynamic_size() -> None:
    """`arange(x.shape[0])` under a dynamic batch follows the batch (it was an IndexError)."""
    model = _Positions()
    engine = xg.compile(model, (r(4, 3),), kernels=False, dynamic_shapes=({0: torch.export.Dim("batch")},))
    for batch in (2, 7):
        x = r(batch, 3)
        assert rel_err(engine(x), model(x.double())) < TOL
