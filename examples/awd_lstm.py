"""An AWD-LSTM-style word language model (Merity et al. 2017), at a size that
trains on 2 cores in minutes.

The LSTM part of the recipe: DropConnect on the recurrent weights
(``weight_hh``), variational (locked) dropout on the embeddings, between
the layers and on the LSTM's output, a 3-layer stack, SGD with gradient
clipping and truncated backpropagation through time. (The full recipe adds
embedding dropout, activation regularisation and averaged SGD; they are
independent of the LSTM and left out.)

``--lstm pipelstm`` builds it on ``pipelstm.LSTM(weight_dropout=...,
dropout_mode="variational")``; ``--lstm nn`` builds the same recipe the
way it is written for ``torch.nn.LSTM``: one single-layer LSTM per layer,
each wrapped to drop its ``weight_hh`` before every forward, with locked
dropout between them. Both start from the same weights for one seed.

Data: ``--data DIR`` with ``train.txt``/``valid.txt``/``test.txt`` (without
``train.txt``: trains on ``valid.txt``, validates on ``test.txt``), or,
without ``--data``, the text of ``pydoc_data.topics`` that every Python
ships.

    python examples/awd_lstm.py --lstm pipelstm --epochs 3
    python examples/awd_lstm.py --lstm nn --epochs 3 --json nn.json
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import pipelstm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from word_language_model import Corpus, add_recipe_options, batchify, get_batch, repackage_hidden  # noqa: E402


class LockedDropout(nn.Module):
    """Dropout with one mask per sequence over ``[T, B, F]`` (the same at every step)."""

    def forward(self, x: torch.Tensor, p: float) -> torch.Tensor:
        if not self.training or p == 0:
            return x
        mask = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - p).div_(1 - p)
        return x * mask


class WeightDrop(nn.Module):
    """A single-layer ``nn.LSTM`` whose ``weight_hh_l0`` is dropped before
    each forward: the raw weight is a parameter of its own, and the dropped
    copy is set on the LSTM (AWD-LSTM's and fastai's way)."""

    def __init__(self, lstm: nn.LSTM, p: float) -> None:
        super().__init__()
        self.lstm, self.p = lstm, p
        raw = lstm.weight_hh_l0
        del lstm._parameters["weight_hh_l0"]
        self.weight_hh_raw = nn.Parameter(raw.detach().clone())
        lstm.weight_hh_l0 = raw.detach().clone()

    def forward(self, x, hx):
        # A view even where dropout hands back the parameter itself (p = 0,
        # evaluation): a Parameter set here would become the LSTM's own.
        w = F.dropout(self.weight_hh_raw, p=self.p, training=self.training).view_as(self.weight_hh_raw)
        self.lstm.weight_hh_l0 = w
        return self.lstm(x, hx)


class AWDModel(nn.Module):
    def __init__(self, lstm: str, ntoken: int, emsize: int, nhid: int, nlayers: int, dropout_in: float,
                 dropout_between: float, dropout_out: float, weight_dropout: float) -> None:
        super().__init__()
        self.encoder = nn.Embedding(ntoken, emsize)
        self.decoder = nn.Linear(nhid, ntoken)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        self.lockdrop = LockedDropout()
        self.nlayers, self.nhid, self.kind = nlayers, nhid, lstm
        self.p = dict(dropout_in=dropout_in, dropout_between=dropout_between, dropout_out=dropout_out)
        # pipelstm's stack first, so both kinds start from its weights for one seed.
        stack = pipelstm.LSTM(emsize, nhid, nlayers, dropout=dropout_between, weight_dropout=weight_dropout,
                              dropout_mode="variational")
        if lstm == "pipelstm":
            self.rnn = stack
        else:
            layers = []
            for k in range(nlayers):
                layer = nn.LSTM(emsize if k == 0 else nhid, nhid)
                layer.load_state_dict({name.replace(f"_l{k}", "_l0"): w for name, w in stack.state_dict().items()
                                       if name.endswith(f"_l{k}")})
                layers.append(WeightDrop(layer, weight_dropout))
            self.rnns = nn.ModuleList(layers)

    def forward(self, input, hidden):
        x = self.lockdrop(self.encoder(input), self.p["dropout_in"])
        if self.kind == "pipelstm":
            out, hidden = self.rnn(x, hidden)
        else:
            hs, cs = [], []
            for k, rnn in enumerate(self.rnns):
                x, (h, c) = rnn(x, (hidden[0][k:k + 1], hidden[1][k:k + 1]))
                hs.append(h)
                cs.append(c)
                if k < self.nlayers - 1:
                    x = self.lockdrop(x, self.p["dropout_between"])
            out, hidden = x, (torch.cat(hs), torch.cat(cs))
        return self.decoder(self.lockdrop(out, self.p["dropout_out"])), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def evaluate(model, data, bptt, bsz, max_batches=None) -> float:
    model.eval()
    total, count, hidden = 0.0, 0, model.init_hidden(bsz)
    with torch.no_grad():
        for i in range(0, data.size(0) - 1, bptt)[:max_batches]:
            x, y = get_batch(data, i, bptt)
            out, hidden = model(x, hidden)
            total += len(x) * F.cross_entropy(out.view(-1, out.size(-1)), y).item()
            count += len(x)
    return total / count


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_options(p, nhid=400, nlayers=3, epochs=3)
    p.add_argument("--dropout-in", type=float, default=0.4, help="locked dropout on the embeddings")
    p.add_argument("--dropout-between", type=float, default=0.25, help="locked dropout between LSTM layers")
    p.add_argument("--dropout-out", type=float, default=0.4, help="locked dropout on the LSTM's output")
    p.add_argument("--weight-dropout", type=float, default=0.5, help="DropConnect on weight_hh")
    p.add_argument("--json", default=None, help="write the run (each epoch's validation perplexity and time) here")
    args = p.parse_args(argv)
    for name in ("dropout_in", "dropout_between", "dropout_out", "weight_dropout"):
        if not 0 <= getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    corpus = Corpus(args.data)
    train, valid = batchify(corpus.train, args.batch_size), batchify(corpus.valid, 10)
    model = AWDModel(args.lstm, len(corpus.dictionary), args.emsize, args.nhid, args.nlayers, args.dropout_in,
                     args.dropout_between, args.dropout_out, args.weight_dropout)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    run = dict(lstm=args.lstm, seed=args.seed, threads=torch.get_num_threads(), epochs=[])
    print(f"{args.lstm}: {len(corpus.dictionary)} words, {train.numel()} training tokens, {args.nlayers} x "
          f"LSTM({args.nhid}), weight_dropout {args.weight_dropout}, {torch.get_num_threads()} threads", flush=True)
    for epoch in range(1, args.epochs + 1):
        model.train()
        hidden, start, batches = model.init_hidden(args.batch_size), time.perf_counter(), 0
        for i in range(0, train.size(0) - 1, args.bptt):
            if args.max_batches is not None and batches >= args.max_batches:
                break
            x, y = get_batch(train, i, args.bptt)
            hidden = repackage_hidden(hidden)
            out, hidden = model(x, hidden)
            loss = F.cross_entropy(out.view(-1, out.size(-1)), y)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            batches += 1
        seconds = time.perf_counter() - start
        valid_loss = evaluate(model, valid, args.bptt, 10, args.eval_batches)
        run["epochs"].append(dict(epoch=epoch, seconds=seconds, batches=batches, valid_ppl=math.exp(valid_loss)))
        print(f"epoch {epoch}: {seconds:.1f} s, {batches} batches, valid ppl {math.exp(valid_loss):.2f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(run, f, indent=1)
    return run


if __name__ == "__main__":
    main()
