"""Small real PyTorch models for the export tests, loaded as `tests/torch_models.py:FACTORY`."""

import torch
import torch.nn as nn


class TinyCNN(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(2 * width, classes)

    def forward(self, image):
        return self.head(self.features(image))


def cnn(width: int = 16, classes: int = 10, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyCNN(width, classes)


class Encoder(nn.Module):
    """A sentence-embedding model: token ids + attention mask -> mean-pooled embedding."""

    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2,
                 ffn: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(128, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        h = self.embed(input_ids) + self.position(positions)
        h = self.encoder(h, src_key_padding_mask=attention_mask == 0)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp(min=1.0)


def encoder(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Encoder()


class LSTMStep(nn.Module):
    """One streaming step: features plus the carried state in, output plus new state out."""

    def __init__(self, features: int = 20, hidden: int = 32):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=1, batch_first=True)
        self.proj = nn.Linear(hidden, 8)

    def forward(self, x, h0, c0):
        y, (h, c) = self.lstm(x, (h0, c0))
        return self.proj(y), h, c


def lstm() -> nn.Module:
    torch.manual_seed(0)
    return LSTMStep()


class TwoPart(nn.Module):
    """Like a TTS model: an encoder (ids -> features) and a decoder (features -> frames).

    The whole pipeline (a Python loop, string I/O) is not exportable; its parts are.
    """

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 32), nn.Tanh())
        self.dec = nn.Sequential(nn.Conv1d(32, 32, 3, padding=1), nn.ReLU(),
                                 nn.Conv1d(32, 16, 3, padding=1))

    def forward(self, text: str):
        raise NotImplementedError("the pipeline takes text; export its parts")


def two_part() -> nn.Module:
    torch.manual_seed(0)
    return TwoPart()


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


class Unsupported(nn.Module):
    def forward(self, x):
        return torch.special.i0(x)


class NumpyDetour(nn.Module):
    """Goes through numpy: the trace records a constant, so the ONNX graph ignores its input."""

    def forward(self, x):
        return torch.from_numpy(x.numpy() * 2.0) + x


def broken_factory():
    raise ValueError("config file model.yaml not found")


def topic_batch(generator: torch.Generator, n: int = 32, length: int = 32, vocab: int = 1000):
    """Token sequences whose class is the 'topic' (a quarter of the vocabulary) they draw from."""
    y = torch.randint(0, 4, (n,), generator=generator)
    ids = torch.randint(1, vocab, (n, length), generator=generator)
    quarter = vocab // 4
    topic = torch.randint(0, quarter, (n, length), generator=generator) + y[:, None] * quarter
    ids = torch.where(torch.rand(n, length, generator=generator) < 0.5, topic, ids)
    lengths = torch.randint(8, length + 1, (n,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return ids * mask, mask, y


def train_encoder(steps: int = 150, model: nn.Module | None = None, batch: int = 32,
                  length: int = 32) -> nn.Module:
    """A briefly trained encoder: random weights make a pooled embedding of near-random tokens,
    whose quantization error says nothing about real models."""
    model = model if model is not None else encoder()
    head = nn.Linear(model.embed.embedding_dim, 4)
    opt = torch.optim.Adam([*model.parameters(), *head.parameters()], 1e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids, mask, y = topic_batch(g, batch, length, model.embed.num_embeddings)
        loss = nn.functional.cross_entropy(head(model(ids, mask)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


class ConvHeavy(nn.Module):
    """Wide 3x3 convolutions: where INT8 kernels beat FP32 by a wide margin."""

    def __init__(self):
        super().__init__()
        layers, width = [], 3
        for out in (64, 64, 64, 64):
            layers += [nn.Conv2d(width, out, 3, padding=1), nn.ReLU()]
            width = out
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(64, 10))

    def forward(self, image):
        return self.body(image)


def conv_heavy() -> nn.Module:
    torch.manual_seed(0)
    return ConvHeavy()


class Elementwise(nn.Module):
    """No convolution or matrix product: nothing INT8 kernels can speed up."""

    def forward(self, x):
        return torch.sigmoid(x * 1.5 + 0.5) * x


class Sensitive(nn.Module):
    """A small classifier with one layer whose activations have a huge outlier channel.

    With per-tensor INT8 activations, the outlier sets the scale and the other channels round
    to a handful of levels: the classifier after it falls apart. Keeping that one layer in FP32
    restores the accuracy.
    """

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.spike = nn.Linear(32, 64)
        self.head = nn.Linear(64, 10)
        with torch.no_grad():
            self.spike.weight[0] *= 400.0          # channel 0: values ~400x the others
            self.spike.bias[0] = 2000.0
            self.head.weight[:, 0] *= 1e-3         # ... which the head barely uses

    def forward(self, image):
        return self.head(self.spike(self.stem(image)))


def sensitive() -> nn.Module:
    torch.manual_seed(0)
    return Sensitive()


class BertSelfAttention(nn.Module):
    """Hugging Face BERT's attention, written out: separate query/key/value Linears, heads split
    with view + permute, an additive mask."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.size = heads, dim // heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))

    def split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.size).permute(0, 2, 1, 3)

    def forward(self, h, mask):
        q, k, v = self.split(self.query(h)), self.split(self.key(h)), self.split(self.value(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) / self.size ** 0.5 + mask
        context = torch.matmul(scores.softmax(-1), v).permute(0, 2, 1, 3).contiguous()
        return context.view(context.shape[0], context.shape[1], -1)


class BertLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.attention = BertSelfAttention(dim, heads)
        self.attention_output, self.attention_norm = nn.Linear(dim, dim), nn.LayerNorm(dim)
        self.intermediate, self.output = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
        self.output_norm = nn.LayerNorm(dim)

    def forward(self, h, mask):
        h = self.attention_norm(self.attention_output(self.attention(h, mask)) + h)
        return self.output_norm(self.output(nn.functional.gelu(self.intermediate(h))) + h)


class MiniBert(nn.Module):
    """A small BERT in the Hugging Face layout (embeddings + LayerNorm, post-norm layers, the
    [CLS] vector out), the export users get from `transformers` without downloading one."""

    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, layers: int = 2,
                 ffn: int = 128, positions: int = 128):
        super().__init__()
        self.word, self.position = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
        self.token_type = nn.Embedding(2, dim)
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(BertLayer(dim, heads, ffn) for _ in range(layers))

    def forward(self, input_ids, attention_mask):
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        h = self.norm(self.word(input_ids) + self.position(positions)
                      + self.token_type(torch.zeros_like(input_ids)))
        mask = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        for layer in self.layers:
            h = layer(h, mask)
        return h[:, 0]


def mini_bert(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MiniBert()


class TorchEncoder(nn.Module):
    """nn.TransformerEncoder as users write it, with the options its attention export turns on:
    batch-first or sequence-first, a causal mask besides the padding mask. Weights perturbed so
    that no bias is zero and a wrong rewrite shows."""

    def __init__(self, dim: int = 64, heads: int = 4, layers: int = 2, ffn: int = 128,
                 batch_first: bool = True, causal: bool = False):
        super().__init__()
        self.embed = nn.Embedding(1000, dim)
        self.batch_first, self.causal = batch_first, causal
        layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.0, activation="gelu",
                                           batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        with torch.no_grad():
            for p in self.parameters():
                p.add_(torch.randn_like(p) * 0.05)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids)
        causal = nn.Transformer.generate_square_subsequent_mask(h.shape[1], dtype=h.dtype) \
            if self.causal else None
        pad = torch.zeros(attention_mask.shape, dtype=h.dtype).masked_fill(
            attention_mask == 0, float("-inf")) if self.causal else attention_mask == 0
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.encoder(h, mask=causal, src_key_padding_mask=pad)
        if not self.batch_first:
            h = h.transpose(0, 1)
        return h * attention_mask.unsqueeze(-1)


def torch_encoder(seed: int = 0, **options) -> nn.Module:
    torch.manual_seed(seed)
    return TorchEncoder(**options)


class PackedSelfAttention(nn.Module):
    """The other way attention gets written: one QKV Linear, heads split with view + permute,
    F.scaled_dot_product_attention (its own *scale* if given)."""

    def __init__(self, dim: int = 64, heads: int = 4, scale: float | None = None):
        super().__init__()
        self.embed = nn.Embedding(1000, dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.heads, self.scale = heads, scale

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids)
        b, s, d = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        context = nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return (self.out(context.transpose(1, 2).reshape(b, s, d)) + h) * \
            attention_mask.unsqueeze(-1)


def packed_attention(seed: int = 0, scale: float | None = None) -> nn.Module:
    torch.manual_seed(seed)
    return PackedSelfAttention(scale=scale)


def transformers_bert(seed: int = 0) -> nn.Module:
    """A small random `transformers` BertModel as exported today (separate query/key/value
    Linears, a boolean mask spread with And/Where, an IsNaN guard after the Softmax); needs
    the zoo extra's transformers."""
    from transformers import BertConfig, BertModel

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(BertConfig(vocab_size=1000, hidden_size=64,
                                             num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=128, max_position_embeddings=64))

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    torch.manual_seed(seed)
    return Bert().eval()
