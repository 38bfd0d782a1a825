"""nn.LSTM and pipelstm.LSTM in lock step inside word_language_model.py's training.

Two independent float32 training runs (``--lstm nn`` and ``--lstm pipelstm``)
drift apart because training amplifies rounding differences batch after batch;
nn.LSTM's own two CPU paths (oneDNN on/off) drift apart just as much. This
script measures the implementation instead: one nn.LSTM run drives training
exactly as ``word_language_model.py --lstm nn`` does, and at every batch a
pipelstm.LSTM model is given the same parameters, the same hidden state and
the same dropout masks (the same random state) and computes its loss and
gradients. The per-batch differences therefore never compound.

Takes the same arguments as word_language_model.py (``--lstm`` is ignored),
plus ``--report FILE`` for the per-batch differences as JSON.

    python examples/word_language_model_lockstep.py --data DIR --max-batches 50
"""

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

import pipelstm


def _load_example():
    path = Path(__file__).with_name("word_language_model.py")
    spec = importlib.util.spec_from_file_location("word_language_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("word_language_model", module)
    spec.loader.exec_module(module)
    return module


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item()
    err = (a - b).abs().max().item()
    return err / scale if scale > 0 else err


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    report = None
    if "--report" in argv:
        k = argv.index("--report")
        report = argv[k + 1]
        del argv[k : k + 2]
    wlm = _load_example()
    args = wlm.parse_args(argv)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = wlm.Corpus(args.data)
    train_data = wlm.batchify(corpus.train, args.batch_size)
    ntokens = len(corpus.dictionary)
    dtype = getattr(torch, args.dtype)
    sizes = (ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.lstm_dropout)
    ref = wlm.RNNModel(nn.LSTM, *sizes).to(dtype)
    with torch.random.fork_rng():  # the nn.LSTM run sees the random stream of a plain --lstm nn run
        ours = wlm.RNNModel(pipelstm.LSTM, *sizes).to(dtype)
    criterion = nn.CrossEntropyLoss()
    names = [n for n, _ in ref.named_parameters()]
    rows = []
    start = time.time()
    ref.train()
    ours.train()
    hidden = ref.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        if args.max_batches is not None and batch >= args.max_batches:
            break
        data, targets = wlm.get_batch(train_data, i, args.bptt)
        hidden = wlm.repackage_hidden(hidden)

        ours.load_state_dict(ref.state_dict())
        with torch.random.fork_rng():  # same dropout masks as the nn.LSTM step below
            out_o, (h_o, c_o) = ours(data, hidden)
            loss_o = criterion(out_o.view(-1, ntokens), targets)
            grads_o = torch.autograd.grad(loss_o, list(ours.parameters()))

        ref.zero_grad()
        out, (h, c) = ref(data, hidden)
        loss = criterion(out.view(-1, ntokens), targets)
        loss.backward()
        grad_errors = [rel(g_o, p.grad) for g_o, p in zip(grads_o, ref.parameters())]
        worst = max(range(len(names)), key=lambda k: grad_errors[k])
        rows.append(dict(
            loss=loss.item(), loss_pipelstm=loss_o.item(),
            loss_rel=abs(loss_o.item() - loss.item()) / abs(loss.item()),
            output_rel=rel(out_o.detach(), out.detach()),
            state_rel=max(rel(h_o.detach(), h.detach()), rel(c_o.detach(), c.detach())),
            grad_rel=grad_errors[worst], grad_rel_param=names[worst],
        ))
        hidden = (h, c)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), args.clip)
        for p in ref.parameters():
            p.data.add_(p.grad, alpha=-args.lr)

    summary = dict(
        batches=len(rows),
        max_loss_rel=max(r["loss_rel"] for r in rows),
        max_output_rel=max(r["output_rel"] for r in rows),
        max_state_rel=max(r["state_rel"] for r in rows),
        max_grad_rel=max(r["grad_rel"] for r in rows),
        seconds=time.time() - start,
    )
    print(f"{summary['batches']} batches in lock step ({args.dtype}): max relative difference "
          f"loss {summary['max_loss_rel']:.2e}, logits {summary['max_output_rel']:.2e}, "
          f"(h_n, c_n) {summary['max_state_rel']:.2e}, gradients {summary['max_grad_rel']:.2e}", flush=True)
    if report:
        with open(report, "w") as f:
            json.dump(dict(summary=summary, batches=rows), f, indent=1)
    return dict(summary=summary, batches=rows)


if __name__ == "__main__":
    main()
