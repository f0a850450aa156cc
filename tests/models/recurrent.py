"""An LSTM language model and a GRU encoder: the recurrent families torch.export keeps as aten.lstm/gru."""
import torch
from torch import nn


class LSTMModel(nn.Module):
    def __init__(self, vocab=50, dim=16, hidden=24):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        y, _ = self.rnn(self.embed(tokens))
        return torch.log_softmax(self.head(y), -1)


class GRUModel(nn.Module):
    def __init__(self, dim=12, hidden=20):
        super().__init__()
        self.rnn = nn.GRU(dim, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, 3)

    def forward(self, x):
        y, h = self.rnn(x)
        return self.head(y).tanh(), h


def lstm():
    torch.manual_seed(0)
    return LSTMModel().eval(), (torch.randint(0, 50, (2, 7)),)


def gru():
    torch.manual_seed(0)
    return GRUModel().eval(), (torch.randn(2, 5, 12),)
