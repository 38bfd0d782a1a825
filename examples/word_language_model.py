"""A word-level LSTM language model, written the ordinary way for torch.nn.LSTM.

Embedding -> LSTM -> Linear, truncated backpropagation through time with the
hidden state detached between batches, gradient clipping, plain SGD,
evaluation under torch.no_grad(), torch.save of the model and, with
``--onnx-export PATH``, its export to ONNX as pytorch/examples does it. The only switch
between nn.LSTM and pipelstm.LSTM is ``--lstm``; everything else, including
the random number stream, is the same, so two runs with one seed can be
compared loss for loss.

Data: ``--data DIR`` with ``train.txt``, ``valid.txt``, ``test.txt`` (PTB /
WikiText layout; without ``train.txt`` the model trains on ``valid.txt`` and
validates on ``test.txt``). Without ``--data`` it uses a corpus that ships
with every Python: the text of ``pydoc_data.topics``.

    python examples/word_language_model.py --lstm pipelstm --epochs 2
"""

import argparse
import json
import math
import os
import time
from typing import Dict, List, Optional

import torch
from torch import nn

import pipelstm


class Dictionary:
    def __init__(self) -> None:
        self.word2idx: Dict[str, int] = {}
        self.idx2word: List[str] = []

    def add_word(self, word: str) -> int:
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)


class Corpus:
    def __init__(self, path: Optional[str]) -> None:
        self.dictionary = Dictionary()
        if path is None:
            train, valid, test = self._embedded_texts()
        else:
            read = lambda name: open(os.path.join(path, name), encoding="utf8").read()  # noqa: E731
            has_train = os.path.exists(os.path.join(path, "train.txt"))
            train = read("train.txt") if has_train else read("valid.txt")
            valid = read("valid.txt") if has_train else read("test.txt")
            test = read("test.txt")
        self.train, self.valid, self.test = (self.tokenize(t) for t in (train, valid, test))

    @staticmethod
    def _embedded_texts():
        from pydoc_data.topics import topics

        lines = [line for key in sorted(topics) for line in topics[key].splitlines() if line.strip()]
        n = len(lines)
        parts = ("\n".join(lines[: n * 8 // 10]), "\n".join(lines[n * 8 // 10 : n * 9 // 10]), "\n".join(lines[n * 9 // 10 :]))
        return parts

    def tokenize(self, text: str) -> torch.Tensor:
        ids = []
        for line in text.splitlines():
            for word in line.split() + ["<eos>"]:
                ids.append(self.dictionary.add_word(word))
        return torch.tensor(ids, dtype=torch.int64)


class RNNModel(nn.Module):
    def __init__(self, lstm_class, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float, lstm_dropout: float):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = lstm_class(ninp, nhid, nlayers, dropout=lstm_dropout if nlayers > 1 else 0.0)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    """Detach the hidden state from its history (truncated BPTT)."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def evaluate(model, data, bptt, eval_batch_size, criterion, max_batches=None) -> float:
    model.eval()
    total, count, hidden = 0.0, 0, model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for batch, i in enumerate(range(0, data.size(0) - 1, bptt)):
            if max_batches is not None and batch >= max_batches:
                break
            inputs, targets = get_batch(data, i, bptt)
            output, hidden = model(inputs, hidden)
            total += len(inputs) * criterion(output.view(-1, output.size(-1)), targets).item()
            count += len(inputs)
    return total / count


def export_onnx(model, path: str, batch_size: int, seq_len: int) -> None:
    """The model in ONNX format, as pytorch/examples exports it: one batch of
    ``seq_len`` token ids and the hidden state in, logits and the hidden state out."""
    print(f"The model is also exported in ONNX format at {os.path.realpath(path)}.", flush=True)
    model.eval()
    dummy_input = torch.zeros(seq_len, batch_size, dtype=torch.int64)
    hidden = model.init_hidden(batch_size)
    torch.onnx.export(model, (dummy_input, hidden), path)


def add_recipe_options(p: argparse.ArgumentParser, nhid: int, nlayers: int, epochs: int) -> None:
    """The options of the recipe (data, LSTM, sizes, SGD over truncated
    backpropagation through time) that examples/awd_lstm.py shares."""
    p.add_argument("--data", default=None, help="folder with train/valid/test.txt (default: embedded corpus)")
    p.add_argument("--lstm", choices=["nn", "pipelstm"], default="pipelstm")
    p.add_argument("--emsize", type=int, default=200)
    p.add_argument("--nhid", type=int, default=nhid)
    p.add_argument("--nlayers", type=int, default=nlayers)
    p.add_argument("--lr", type=float, default=20.0)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--max-batches", type=int, default=None, help="stop each epoch after this many batches")
    p.add_argument("--eval-batches", type=int, default=None, help="evaluate on this many batches only (default: all)")
    p.add_argument("--batch-size", type=int, default=20)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--seed", type=int, default=1111)
    p.add_argument("--threads", type=int, default=None)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_recipe_options(p, nhid=200, nlayers=2, epochs=1)
    p.add_argument("--dropout", type=float, default=0.2,
                   help="dropout on embeddings, between LSTM layers and on the decoder input")
    p.add_argument("--lstm-dropout", type=float, default=None,
                   help="the LSTM's own inter-layer dropout, if it should differ from --dropout")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--log-interval", type=int, default=50)
    p.add_argument("--save", default=None, help="where to torch.save the model")
    p.add_argument("--onnx-export", default="", help="path to export the final model in ONNX format")
    p.add_argument("--loss-log", default=None, help="write every batch's training loss here as JSON")
    args = p.parse_args(argv)
    if args.lstm_dropout is None:
        args.lstm_dropout = args.dropout
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = Corpus(args.data)
    train_data = batchify(corpus.train, args.batch_size)
    val_data = batchify(corpus.valid, 10)
    ntokens = len(corpus.dictionary)
    lstm_class = nn.LSTM if args.lstm == "nn" else pipelstm.LSTM
    model = RNNModel(lstm_class, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.lstm_dropout)
    model = model.to(getattr(torch, args.dtype))
    criterion = nn.CrossEntropyLoss()
    print(f"{args.lstm} LSTM, {ntokens} words, {train_data.numel()} training tokens", flush=True)

    losses: List[float] = []
    val_losses: List[float] = []
    lr = args.lr
    start, train_seconds = time.time(), 0.0
    for epoch in range(1, args.epochs + 1):
        epoch_start = time.time()
        model.train()
        hidden = model.init_hidden(args.batch_size)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            if args.max_batches is not None and batch >= args.max_batches:
                break
            data, targets = get_batch(train_data, i, args.bptt)
            hidden = repackage_hidden(hidden)
            model.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output.view(-1, ntokens), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            losses.append(loss.item())
            if (batch + 1) % args.log_interval == 0:
                recent = losses[-args.log_interval :]
                tokens = (batch + 1) * data.numel()
                print(f"| epoch {epoch} | batch {batch + 1} | loss {sum(recent) / len(recent):.2f} | "
                      f"ppl {math.exp(sum(recent) / len(recent)):.1f} | {tokens / (time.time() - epoch_start):.0f} tok/s", flush=True)
        train_seconds += time.time() - epoch_start
        val_loss = evaluate(model, val_data, args.bptt, 10, criterion, args.eval_batches)
        val_losses.append(val_loss)
        print(f"| end of epoch {epoch} | valid loss {val_loss:.2f} | valid ppl {math.exp(val_loss):.1f}", flush=True)
        lr /= 4.0 if len(val_losses) > 1 and val_loss > min(val_losses[:-1]) else 1.0

    if args.save:
        torch.save(model, args.save)
        reloaded = torch.load(args.save, weights_only=False)
        assert evaluate(reloaded, val_data, args.bptt, 10, criterion, args.eval_batches) == val_losses[-1]
    if args.onnx_export:
        export_onnx(model, args.onnx_export, batch_size=1, seq_len=args.bptt)
    if args.loss_log:
        with open(args.loss_log, "w") as f:
            json.dump(dict(losses=losses, val_losses=val_losses, train_seconds=train_seconds), f)
    print(f"| {len(losses)} training batches in {train_seconds:.1f} s | {time.time() - start:.1f} s in all", flush=True)
    return dict(losses=losses, val_losses=val_losses, train_seconds=train_seconds, seconds=time.time() - start)


if __name__ == "__main__":
    main()
