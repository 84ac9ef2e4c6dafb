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
