"""Small models the pipeline tests split into stages."""

from torch import nn

import pipelstm


def lm_model(V=37, E=6, H=8, O=5):
    # units: 0, 1.l0, 1.l1, 1.l2, 2, 3
    return nn.Sequential(nn.Embedding(V, E), pipelstm.LSTM(E, H, num_layers=3), nn.Dropout(0.25), nn.Linear(H, O))


def weight_dropped_model(V=19, E=6, H=8):
    # units: 0, 1.l0, 1.l1, 2 (DropConnect on each layer's weight_hh)
    return nn.Sequential(nn.Embedding(V, E), pipelstm.LSTM(E, H, num_layers=2, weight_dropout=0.3),
                         nn.Linear(H, V)).double()
