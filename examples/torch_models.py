"""Five small PyTorch models in the shapes common models have, for `xg.compile` and ONNX import.

Random weights, no downloads: an MLP (GELU, SiLU, RMSNorm, dropout, log_softmax, tuple output),
a GPT-2-style decoder stack (token and position embeddings, causal attention, tied head), a
ViT-style encoder (patch conv, class token, nn.TransformerEncoderLayer), a BERT-style encoder
with a padding mask, and a ResNet-style convnet (batch norm, residual blocks, pooling).
`make(name)` gives (model in eval mode, example inputs, dynamic shapes for a batch dim).

    import torch, xg
    from torch_models import make
    model, inputs, dyn = make("gpt")
    engine = xg.compile(model, inputs, dynamic_shapes=dyn)
    print(engine(*inputs).shape)
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in: int = 24, hidden: int = 48, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.norm = nn.RMSNorm(hidden, eps=1e-6)
        self.drop = nn.Dropout(0.1)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        h = self.drop(F.gelu(self.fc1(x)))
        h = self.norm(F.silu(self.fc2(h)) * torch.sigmoid(h) + torch.tanh(h))
        z = self.out(h)
        return F.log_softmax(z, dim=-1), z.amax(dim=-1), z.sum(dim=-1)


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, d)))
        return x + self.drop(self.fc_out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, vocab: int = 64, ctx: int = 16, d: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight          # tied, as GPT-2

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class ViT(nn.Module):
    def __init__(self, image: int = 16, patch: int = 4, d: int = 32, heads: int = 4, layers: int = 2,
                 classes: int = 10) -> None:
        super().__init__()
        n = (image // patch) ** 2
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.1, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(p.shape[0], -1, -1), p], dim=1) + self.pos
        for layer in self.encoder:
            x = layer(x)
        return self.head(self.norm(x)[:, 0])


class BertLayer(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, keep):
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, s, self.heads, d // self.heads).permute(0, 2, 1, 3) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = self.ln1(x + self.out(y.permute(0, 2, 1, 3).reshape(b, s, d)))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class BERT(nn.Module):
    def __init__(self, vocab: int = 64, ctx: int = 16, d: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.words, self.positions, self.types = nn.Embedding(vocab, d), nn.Embedding(ctx, d), nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d, heads) for _ in range(layers))
        self.pool = nn.Linear(d, d)

    def forward(self, input_ids, attention_mask):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device)
        x = self.ln(self.words(input_ids) + self.positions(pos) + self.types(torch.zeros_like(input_ids)))
        keep = attention_mask[:, None, None, :].bool()           # [B, 1, 1, S]: attend to real tokens
        for layer in self.layers:
            x = layer(x, keep)
        return x, torch.tanh(self.pool(x[:, 0]))


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = None
        if stride != 1 or c_in != c_out:
            self.down = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        self.layer1 = BasicBlock(8, 8, 1)
        self.layer2 = BasicBlock(8, 16, 2)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        x = x + F.avg_pool2d(self.depthwise(x), 3, stride=1, padding=1)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def _randomise_bn(model: nn.Module, g: torch.Generator) -> None:
    """Running statistics away from (0, 1), so that batch norm is tested doing something."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)


NAMES = ("mlp", "gpt", "vit", "bert", "resnet")


def make(name: str, batch: int = 2, seed: int = 0):
    """(model in eval mode, example inputs, dynamic_shapes with a `batch` Dim) for one of NAMES."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    batch_dim = torch.export.Dim("batch", min=1, max=1024)
    if name == "mlp":
        model, inputs = MLP(), (torch.randn(batch, 24, generator=g),)
        dyn = ({0: batch_dim},)
    elif name == "gpt":
        model, inputs = GPT(), (torch.randint(0, 64, (batch, 16), generator=g),)
        dyn = ({0: batch_dim},)
    elif name == "vit":
        model, inputs = ViT(), (torch.randn(batch, 3, 16, 16, generator=g),)
        dyn = ({0: batch_dim},)
    elif name == "bert":
        ids = torch.randint(0, 64, (batch, 16), generator=g)
        mask = torch.ones(batch, 16, dtype=torch.int64)
        mask[0, 11:] = 0                                      # one padded sequence
        model, inputs = BERT(), (ids, mask)
        dyn = ({0: batch_dim}, {0: batch_dim})
    elif name == "resnet":
        model, inputs = ResNet(), (torch.randn(batch, 3, 16, 16, generator=g),)
        dyn = ({0: batch_dim},)
    else:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(NAMES)}")
    with torch.no_grad():
        _randomise_bn(model, g)
    return model.eval(), inputs, dyn
