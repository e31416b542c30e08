"""The indexing, padding, scan, boolean and convolution ops transformers' models use, as small
functions with inputs (shared by test_torch_indexing.py and the interpreter run of their kernels).
Index inputs are drawn in range, negative ones included where torch allows them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def r(*shape):
    return torch.randn(*shape)


def ints(lo, hi, *shape):
    return torch.randint(lo, hi, shape)


W1 = torch.randn(6, 4, 3)
W1G = torch.randn(6, 2, 3)
W3 = torch.randn(5, 2, 2, 3, 3)
B6 = torch.randn(6)
W7 = torch.randn(4, 3, 7, 7)
W33 = torch.randn(5, 4, 3, 3)
GW, GB = torch.rand(6) + 0.5, torch.randn(6)
WN_V, WN_G = torch.randn(6, 4, 3), torch.rand(1, 1, 3) + 0.5

CASES = {
    # boolean logic, as transformers' mask code writes it
    "bool_and_or_xor_not": (lambda a, b: ((a > 0) & (b > 0)) | ~(a > b) ^ (b < -1), (r(3, 5), r(3, 5))),
    "any_all": (lambda x: (x > 1).any(dim=-1, keepdim=True).float() + (x > -1).all(dim=0, keepdim=True).float() + (x > 2).any().float(),
                (r(4, 6),)),
    # scans and differences over integers and floats
    "cumsum_int64": (lambda m: torch.cumsum(m, dim=1) * m - 1, (ints(0, 2, 3, 7),)),
    "cumsum_float_dim0": (lambda x: torch.cumsum(x, 0) + x.cumsum(-1), (r(5, 4),)),
    "diff_prepend": (lambda p: torch.diff(p, prepend=p[:, :1] - 1, dim=-1) != 1, (ints(0, 9, 2, 6),)),
    # gathers: index_select, torch.gather, advanced indexing (broadcast aranges, negative indices)
    "index_select_dim1": (lambda x, i: torch.index_select(x, 1, i), (r(3, 7, 2), ints(0, 7, 5))),
    "gather_dim1": (lambda x, i: torch.gather(x, 1, i), (r(3, 7, 4), ints(0, 7, 3, 5, 4))),
    "gather_last_smaller": (lambda x, i: torch.gather(x, -1, i), (r(4, 6), ints(0, 6, 3, 2))),
    "index_two_tensors": (lambda m: m[torch.arange(3)[:, None, None], torch.arange(5)[None, None, :]], (r(3, 5),)),
    "index_middle_dim": (lambda x, i: x[:, i], (r(2, 6, 3), ints(-6, 6, 4, 2))),
    "index_non_adjacent": (lambda x, i, j: x[i, :, j], (r(4, 3, 5), ints(0, 4, 2), ints(-5, 5, 2))),
    "index_bool_table": (lambda m, b, k: m[b, k], ((torch.rand(3, 8) > 0.5), ints(0, 3, 3, 1), ints(0, 8, 1, 8))),
    # padding and concatenation of any dtype
    "pad_constant_value": (lambda x: F.pad(x, (1, 2, 0, 3), value=-1.5), (r(2, 3, 4),)),
    "pad_negative_crop": (lambda x: F.pad(x, (-1, 2, 1, -1)), (r(2, 5, 4),)),
    "pad_reflect_replicate": (lambda x: F.pad(x, (2, 1), mode="reflect") + F.pad(x, (2, 1), mode="replicate"),
                              (r(2, 3, 5),)),
    "pad_reflect_2d": (lambda x: F.pad(x, (1, 1, 2, 0), mode="reflect"), (r(1, 2, 4, 5),)),
    "zero_pad2d_module": (lambda x: torch.nn.ZeroPad2d((0, 1, 0, 1))(x), (r(1, 2, 3, 3),)),
    "cat_int_bool": (lambda a, b: torch.cat([a, b], dim=1) + torch.cat([a > 0, b < 0], dim=1).sum(0, keepdim=True),
                     (ints(-5, 5, 2, 3), ints(-5, 5, 2, 4))),
    # convolutions of rank 1 and 3
    "conv1d_pad_stride": (lambda x: F.conv1d(x, W1, B6, stride=2, padding=1), (r(2, 4, 11),)),
    "conv1d_groups_dilation": (lambda x: F.conv1d(x, W1G, None, padding="same", dilation=2, groups=2), (r(1, 4, 9),)),
    # 2-D: the im2col GATHER (a 7x7 stride-2 stem, a 3x3 with dilation and uneven padding)
    "conv2d_7x7_stride2": (lambda x: F.conv2d(x, W7, None, stride=2, padding=3), (r(2, 3, 13, 12),)),
    "conv2d_3x3_dilated": (lambda x: F.conv2d(x, W33, None, padding=(2, 1), dilation=(2, 1)), (r(2, 4, 9, 7),)),
    "conv2d_3x3_unpadded": (lambda x: F.conv2d(x, W33, None, stride=2), (r(3, 4, 9, 8),)),
    "conv3d": (lambda x: F.conv3d(x, W3, None, stride=(2, 1, 1), padding=(1, 0, 1)), (r(2, 2, 5, 4, 6),)),
    # norms and pooling of speech and vision models (Wav2Vec2, Swin)
    "group_norm": (lambda x: F.group_norm(x, 3, GW, GB, 1e-5), (r(2, 6, 5),)),
    "group_norm_2d": (lambda x: F.group_norm(x, 2, None, None), (r(2, 6, 3, 4),)),
    "weight_norm_conv1d": (lambda x: F.conv1d(x, torch._weight_norm(WN_V, WN_G, 2), None, padding=1), (r(2, 4, 7),)),
    "adaptive_avg_pool1d": (lambda x: F.adaptive_avg_pool1d(x, 1) + F.adaptive_avg_pool1d(x, 2).sum(-1, keepdim=True),
                            (r(2, 3, 8),)),
    # ALiBi (Bloom): a constant base to tensor powers, and baddbmm
    "pow_tensor_exponent": (lambda p: torch.pow(0.5, p) + torch.pow(2, p.float()) + torch.pow(torch.full([], 0.25), p),
                            (ints(1, 9, 4),)),
    "baddbmm": (lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), (r(2, 3, 4), r(2, 3, 5), r(2, 5, 4))),
    # sin / cos (RoPE)
    "rope": (lambda x, p: x * torch.cos(p) + torch.cat([-x[..., 2:], x[..., :2]], dim=-1) * torch.sin(p),
             (r(2, 3, 4), r(3, 4))),
}


def fresh(inputs: tuple) -> tuple:
    """New values of the same kind: floats redrawn, index tensors redrawn in the same range."""
    out = []
    for x in inputs:
        if x.is_floating_point():
            out.append(torch.randn_like(x))
        elif x.dtype == torch.bool:
            out.append(torch.rand(x.shape) > 0.5)
        else:
            lo, hi = int(x.min()), int(x.max()) + 1
            out.append(torch.randint(min(lo, 0), max(hi, lo + 1), x.shape))
    return tuple(out)
