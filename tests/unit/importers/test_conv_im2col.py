"""A convolution imports as one matmul per image, W [O, K] @ cols [K, ho*wo] over its taps' windows
stacked along the channels (im2col, K = kh*kw*C): one float32-accumulated product rounded once,
not a rounded partial sum per tap. Grouped and depthwise convolutions keep a product per tap."""

from __future__ import annotations

import warnings

import pytest
import torch

from xgbuild.compiler.codegen.schedule import schedule
from xgbuild.compiler.ir.graph import Op
from xgbuild.compiler.importers.torch_export import import_torch
from xgbuild.runtime.cpu import CpuExecutor


def _imported(conv: torch.nn.Module, x: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return import_torch(conv, (x,))


@pytest.mark.parametrize("conv, x_shape", [
    (torch.nn.Conv2d(8, 16, 3, padding=1), (2, 8, 10, 9)),
    (torch.nn.Conv2d(8, 16, (3, 5), stride=2, padding=(1, 2), dilation=(2, 1)), (2, 8, 13, 12)),
    (torch.nn.Conv1d(6, 10, 3, padding=1), (2, 6, 17)),
    (torch.nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False), (2, 3, 15, 16)),
])
def test_a_convolution_is_one_product_over_its_taps(conv, x_shape):
    torch.manual_seed(0)
    x = torch.randn(x_shape)
    imported = _imported(conv, x)
    graph = imported.optimized.main
    products = [n for n in graph.nodes if n.op is Op.MATMUL]
    assert len(products) == 1
    taps = conv.kernel_size[0] * (conv.kernel_size[1] if len(conv.kernel_size) > 1 else 1)
    assert graph.node(products[0].inputs[0]).shape[-1] == taps * conv.in_channels
    values = {imported.inputs[0]: x, **imported.weights}
    (out,) = CpuExecutor(float64=True, check=False).run(graph, values).values.values()
    ref = conv.double()(x.double())
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-12


def test_grouped_and_depthwise_convolutions_keep_a_product_per_tap():
    x = torch.randn(2, 8, 9, 9)
    products = {}
    for name, conv in (("depthwise", torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)),
                       ("grouped", torch.nn.Conv2d(8, 16, 3, padding=1, groups=2))):
        graph = _imported(conv, x).optimized.main
        products[name] = sum(n.op is Op.MATMUL for n in graph.nodes)
    assert products == {"depthwise": 0, "grouped": 9}


def test_a_1x1_convolution_reads_the_image_in_place():
    """W [O, C] @ x[n] viewed [C, H*W]: no copy of the image, the result already NCHW."""
    x = torch.randn(2, 8, 6, 5)
    graph = _imported(torch.nn.Conv2d(8, 16, 1), x).optimized.main
    assert [k.kind for k in schedule(graph).kernels] == ["matmul"]
