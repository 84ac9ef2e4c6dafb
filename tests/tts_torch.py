import torch
from torch import nn


class TinyTTS(nn.Module):
    """Token ids -> encoder -> durations (0-3 frames a token) -> length regulation -> a
    vocoder of HOP samples a frame: a waveform whose length follows the text."""

    def __init__(self, vocab=32, dim=16, hop=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        self.duration = nn.Linear(dim, 1)
        self.vocoder = nn.Sequential(nn.Linear(dim, 64), nn.Tanh(), nn.Linear(64, hop), nn.Tanh())

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens))                       # (1, T, D)
        d = torch.clamp(torch.ceil(torch.relu(self.duration(h))), max=3).long()[0, :, 0]
        frames = torch.repeat_interleave(h[0], d, dim=0)          # (sum d, D)
        return (0.5 * self.vocoder(frames)).reshape(1, -1)        # (1, sum d x hop)


def tiny_tts():
    torch.manual_seed(0)
    return TinyTTS().eval()


class Encoder(nn.Module):
    """Token ids (1, T) -> hidden states (1, T, D) and durations (1, T), frames a token."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, dim))
        self.duration = nn.Linear(dim, 1)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens))
        return h, torch.clamp(torch.ceil(torch.relu(self.duration(h))), max=3)[..., 0]


class Vocoder(nn.Module):
    """Frames (1, C, D) -> samples (1, C x hop), frame by frame."""

    def __init__(self, dim=16, hop=256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 64), nn.Tanh(), nn.Linear(64, hop), nn.Tanh())

    def forward(self, frames):
        return (0.5 * self.net(frames)).reshape(frames.shape[0], -1)


class TTSParts(nn.Module):
    """TinyTTS as its pure-tensor parts (encoder, vocoder) and the length regulation between
    them, the glue a pipeline bundle ships: forward() is the whole model, the original a
    bundle built from the parts is checked against."""

    def __init__(self):
        super().__init__()
        self.encoder, self.vocoder = Encoder(), Vocoder()

    def forward(self, tokens):
        h, d = self.encoder(tokens)
        frames = torch.repeat_interleave(h[0], d[0].long(), dim=0)
        return self.vocoder(frames[None])


def tts_parts():
    torch.manual_seed(1)
    return TTSParts().eval()


class AttentionEncoder(nn.Module):
    """A FastSpeech-like encoder without a mask: every token attends to every other, the pad
    tokens too, so padding a sentence changes its hidden states and durations."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.duration = nn.Linear(dim, 1)

    def forward(self, tokens):
        x = self.embed(tokens)
        weights = torch.softmax(4.0 * self.q(x) @ self.k(x).transpose(1, 2), dim=-1)
        h = torch.tanh(x + 2.0 * self.out(weights @ self.v(x)))
        return h, torch.clamp(torch.ceil(2.0 * torch.relu(self.duration(h))), max=3)[..., 0]


class AttentionParts(TTSParts):
    """TTSParts with the attention encoder: its forward() is the model the bundle must speak
    like, at any length."""

    def __init__(self):
        super().__init__()
        self.encoder = AttentionEncoder()


def attention_parts():
    torch.manual_seed(2)
    return AttentionParts().eval()
