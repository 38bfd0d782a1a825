"""Train an LSTM language model with data + pipeline parallelism (pipelstm's main job).

    torchrun --nproc-per-node=2 examples/train_lm.py --pp 2            # 2 stages
    torchrun --nproc-per-node=4 examples/train_lm.py --pp 2 --dp 2     # 2 replicas x 2 stages
    torchrun --nproc-per-node=2 examples/train_lm.py --pp auto         # the simulator picks dp x pp, K, M
    python examples/train_lm.py                                          # 1 process

Embedding -> N LSTM layers -> dropout -> decoder, truncated BPTT (the LSTM
state carries from batch to batch), on a corpus that ships with every Python
(pydoc's topics, character-level) or ``--data DIR`` with train.txt /
valid.txt / test.txt (PTB / WikiText layout, word-level). Every rank builds
the same model from ``--seed``; ``pipelstm.distributed.PipelineParallel``
keeps each rank's stage, and the loop below is an ordinary one: a step,
gradient clipping over the whole model, an optimizer and a scheduler.
"""

import argparse
import math
import os
import signal
import sys
import time
from typing import List, Optional, Tuple

import torch
from torch import nn

import pipelstm
import pipelstm.distributed as pdist


# --- data ------------------------------------------------------------------------------


class Corpus:
    """Token ids of the train / valid / test splits and the vocabulary."""

    def __init__(self, path: Optional[str]) -> None:
        if path is None:
            texts = self._embedded_texts()
            self.level = "char"
            self.vocab = sorted(set("".join(texts)))
            index = {ch: i for i, ch in enumerate(self.vocab)}
            self.train, self.valid, self.test = (torch.tensor([index[c] for c in t], dtype=torch.int64) for t in texts)
        else:
            self.level = "word"
            texts = []
            for name in ("train.txt", "valid.txt", "test.txt"):
                full = os.path.join(path, name)
                if not os.path.exists(full):
                    raise SystemExit(f"train_lm.py: --data {path}: {name} is missing (expected train.txt, valid.txt, "
                                     "test.txt as in PTB / WikiText)")
                with open(full, encoding="utf8") as f:
                    texts.append([w for line in f for w in line.split() + ["<eos>"]])
            self.vocab = sorted(set(w for t in texts for w in t))
            index = {w: i for i, w in enumerate(self.vocab)}
            self.train, self.valid, self.test = (torch.tensor([index[w] for w in t], dtype=torch.int64) for t in texts)

    @staticmethod
    def _embedded_texts() -> Tuple[str, str, str]:
        from pydoc_data.topics import topics

        text = "\n".join(topics[k].strip() for k in sorted(topics))
        n = len(text)
        return text[: n * 9 // 10], text[n * 9 // 10 : n * 19 // 20], text[n * 19 // 20 :]


def batchify(data: torch.Tensor, batch_size: int) -> torch.Tensor:
    """[N] -> [N // batch_size, batch_size]: each column a contiguous stream."""
    n = data.size(0) // batch_size
    return data[: n * batch_size].view(batch_size, n).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of step ``i`` (time-major [T, B])."""
    start = i * bptt
    T = min(bptt, source.size(0) - 1 - start)
    return source[start : start + T], source[start + 1 : start + 1 + T]


def num_batches(source: torch.Tensor, bptt: int) -> int:
    return math.ceil((source.size(0) - 1) / bptt)


# --- model -----------------------------------------------------------------------------


def build_model(vocab: int, emb: int, hidden: int, layers: int, dropout: float, seed: int, *,
                weight_dropout: float = 0.0, dropout_mode: str = "element", zoneout: float = 0.0) -> nn.Sequential:
    """The same model on every rank: built from the same seed. ``weight_dropout``,
    ``dropout_mode`` and ``zoneout`` are pipelstm.LSTM's (DropConnect on the
    recurrent weights; variational dropout between the layers; zoneout of
    the cell and hidden states)."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Embedding(vocab, emb),
        pipelstm.LSTM(emb, hidden, num_layers=layers, dropout=dropout, weight_dropout=weight_dropout,
                      dropout_mode=dropout_mode, zoneout=zoneout),
        nn.Dropout(dropout),
        nn.Linear(hidden, vocab),
    )
    with torch.no_grad():  # as in pytorch/examples word_language_model
        model[0].weight.uniform_(-0.1, 0.1)
        model[3].weight.uniform_(-0.1, 0.1)
        model[3].bias.zero_()
    return model


def outside_loss(pipe):
    """The loss function train_step/eval_step take when the pipeline has none inside."""
    if pipe.computes_loss:
        return None
    return lambda out, y: nn.functional.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))


# --- progress --------------------------------------------------------------------------


class Progress:
    """A progress bar with tokens/s and loss on a terminal; a line every
    ``interval`` steps elsewhere (logs, CI)."""

    def __init__(self, total: int, interval: int, enabled: bool) -> None:
        self.total, self.interval, self.enabled = total, interval, enabled
        self.tty = sys.stdout.isatty()
        self.start = time.perf_counter()
        self.tokens = 0

    def update(self, epoch: int, i: int, loss: float, tokens: int, lr: float) -> None:
        if not self.enabled:
            return
        self.tokens += tokens
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        done = (i + 1) / self.total
        bar = "#" * int(24 * done) + "-" * (24 - int(24 * done))
        line = (f"epoch {epoch} [{bar}] {i + 1:>5}/{self.total} | loss {loss:6.3f} | ppl {math.exp(min(loss, 50)):9.2f}"
                f" | {rate:8.0f} tok/s | lr {lr:.3g}")
        if self.tty:
            print("\r" + line, end="\n" if i + 1 == self.total else "", flush=True)
        elif (i + 1) % self.interval == 0 or i + 1 == self.total:
            print(line, flush=True)


# --- training --------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="folder with train.txt, valid.txt, test.txt (default: pydoc's topics, "
                                                  "character-level)")
    ap.add_argument("--dp", type=int, default=None, help="data-parallel replicas (default: world size / pp)")
    ap.add_argument("--pp", type=int_or_auto, default=1,
                    help="pipeline stages (processes per pipeline), or 'auto': the fastest layout the simulator "
                         "predicts for this model and world (then K and M default to 'auto' too)")
    ap.add_argument("--chunks", type=int_or_auto, default=None, help="time chunks per step (K), or 'auto'; default 4")
    ap.add_argument("--micro-batches", type=int_or_auto, default=None,
                    help="micro-batches per step (M), or 'auto'; default 2")
    ap.add_argument("--balance", default="auto", help="'auto' or units per stage, e.g. 3,3")
    ap.add_argument("--loss-outside", action="store_true",
                    help="compute the loss from the logits on the last rank's caller thread, not inside the pipeline")
    ap.add_argument("--recompute", choices=("never", "except_last", "always"), default="never",
                    help="activation recomputation per stage (trades compute for memory)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps in all")
    ap.add_argument("--seed", type=int, default=1111)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints")
    ap.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --checkpoint-dir")
    ap.add_argument("--timeline", default=None, metavar="PATH", help="write the pipeline timeline of a training step "
                                                                     "(PATH.json, and PATH.png with matplotlib)")
    ap.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                    help="how long any collective or point-to-point operation may wait")
    ap.add_argument("--emb", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--weight-dropout", type=float, default=0.0,
                    help="DropConnect on the LSTM's recurrent weights, one mask per training step (AWD-LSTM)")
    ap.add_argument("--dropout-mode", choices=("element", "variational"), default="element",
                    help="the dropout between LSTM layers: per element, or one mask per sequence")
    ap.add_argument("--zoneout", type=float, default=0.0,
                    help="zoneout of the LSTM's cell and hidden states: the probability each keeps its previous value")
    ap.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    ap.add_argument("--lr", type=float, default=None, help="default 3e-3 (adam), 20 (sgd)")
    ap.add_argument("--clip", type=float, default=0.25)
    ap.add_argument("--bptt", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32, help="global batch (split over the replicas)")
    ap.add_argument("--eval-batches", type=int, default=None, help="validate on at most this many batches")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="where each stage computes (default: a GPU per process where there are enough, NCCL; "
                         "else the CPU, gloo); cuda with fewer GPUs than processes shares them over gloo")
    ap.add_argument("--log-interval", type=int, default=20)
    ap.add_argument("--save-model", default=None, metavar="PATH",
                    help="write the final unsplit state_dict here (rank 0)")
    ap.add_argument("--inject-fault", default=None, metavar="KIND:RANK:STEP",
                    help="testing: rank RANK kills (kill) or stops (stop) itself before step STEP, first attempt only")
    args = ap.parse_args(argv)
    if args.pp == "auto" and args.dp is not None:
        ap.error("--dp goes with a number of stages: --pp auto chooses dp too")
    default = "auto" if args.pp == "auto" else None
    args.chunks = args.chunks or default or 4
    args.micro_batches = args.micro_batches or default or 2
    return args


def int_or_auto(text: str):
    """A positive int, or 'auto'."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int or 'auto', got {text!r}")
    return value


def parse_balance(text: str):
    if text == "auto":
        return "auto"
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise SystemExit(f"train_lm.py: --balance must be 'auto' or comma-separated unit counts, got {text!r}")


def maybe_inject_fault(spec: Optional[str], rank: int, step: int) -> None:
    if spec is None or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    kind, who, when = spec.split(":")
    if int(who) == rank and int(when) == step:
        print(f"[rank {rank}] injected fault: {kind} before step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)


def evaluate(pipe, data: torch.Tensor, mesh, bptt: int, max_batches: Optional[int]) -> float:
    pipe.eval()
    pipe.reset_state()
    total, count = 0.0, 0
    n = num_batches(data, bptt) if max_batches is None else min(max_batches, num_batches(data, bptt))
    for i in range(n):
        x, y = get_batch(data, i, bptt)
        loss = pipe.eval_step(mesh.shard(x), mesh.shard(y), outside_loss(pipe))
        total += float(loss) * x.size(0)
        count += x.size(0)
    pipe.reset_state()
    pipe.train()
    return total / max(count, 1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if "RANK" not in os.environ:  # a plain `python train_lm.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
    corpus = Corpus(args.data)
    model = build_model(len(corpus.vocab), args.emb, args.hidden, args.layers, args.dropout, args.seed,
                        weight_dropout=args.weight_dropout, dropout_mode=args.dropout_mode, zoneout=args.zoneout)
    loss_fn = None if args.loss_outside else nn.CrossEntropyLoss()
    try:
        mesh = pdist.init_mesh(pp=args.pp, dp=args.dp, timeout=args.timeout,
                               device=None if args.device == "auto" else args.device, model=model,
                               sample=(args.bptt, args.batch_size), loss_fn=loss_fn)
    except ValueError as e:  # a layout or device this launch cannot have: the reason, not a traceback
        raise SystemExit(f"train_lm.py: {e}") from None
    if args.pp != "auto" and args.pp > args.layers:
        torch.distributed.barrier()  # every rank is here: each says why before torchrun stops the others
        raise SystemExit(f"train_lm.py: --pp {args.pp} is larger than the number of LSTM layers ({args.layers}); "
                         "every pipeline stage needs at least one layer")
    log = mesh.rank == 0
    if args.batch_size < mesh.dp:
        raise SystemExit(f"train_lm.py: --batch-size {args.batch_size} is smaller than dp={mesh.dp}")
    train = batchify(corpus.train, args.batch_size)
    valid = batchify(corpus.valid, args.batch_size)
    pipe = pdist.PipelineParallel(model, mesh, chunks=args.chunks, micro_batches=args.micro_batches,
                                  balance=parse_balance(args.balance), checkpoint=args.recompute, loss_fn=loss_fn)
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(pipe.parameters(), lr=args.lr or 3e-3)
    else:
        optimizer = torch.optim.SGD(pipe.parameters(), lr=args.lr or 20.0)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.25, patience=0)
    torch.manual_seed(args.seed + mesh.rank)  # dropout masks differ per rank
    steps_per_epoch = num_batches(train, args.bptt)
    total_steps = args.epochs * steps_per_epoch
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    if log:
        print(f"{mesh.world_size} processes: pp={mesh.pp} x dp={mesh.dp} ({mesh.backend}); corpus: "
              f"{'pydoc topics' if args.data is None else args.data} ({corpus.level}-level, {len(corpus.vocab)} "
              f"tokens, {corpus.train.numel():,} train); {steps_per_epoch} steps/epoch of {args.bptt} x "
              f"{args.batch_size}; balance {pipe.balance}", flush=True)
    print(f"[rank {mesh.rank}] {pipe.extra_repr()}", flush=True)

    step, history = 0, []
    if args.resume and args.checkpoint_dir:
        restored = pdist.load_checkpoint(args.checkpoint_dir, pipe, optimizer, scheduler)
        if restored is not None:
            step = restored["step"]
            if log:
                print(f"resumed from {restored['folder']} (step {step})", flush=True)
    pipe.train()
    timeline_step = min(10, total_steps)
    start = time.perf_counter()
    while step < total_steps:
        epoch, i = divmod(step, steps_per_epoch)
        if i == 0:
            pipe.reset_state()
        progress = Progress(min(steps_per_epoch, total_steps - epoch * steps_per_epoch), args.log_interval, log)
        progress_i = i
        for i in range(i, steps_per_epoch):
            if step >= total_steps:
                break
            maybe_inject_fault(args.inject_fault, mesh.rank, step)
            x, y = get_batch(train, i, args.bptt)
            loss = pipe.train_step(mesh.shard(x), mesh.shard(y), outside_loss(pipe))
            pdist.clip_grad_norm_(pipe.parameters(), args.clip, mesh)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            progress.update(epoch + 1, progress_i, float(loss), x.numel(), optimizer.param_groups[0]["lr"])
            progress_i += 1
            if args.timeline and step == timeline_step:
                summary = pipe.timeline(args.timeline)
                if log:
                    print(f"timeline: {summary.get('png', summary['json'])} (bubble: forward "
                          f"{summary['forward_bubble']:.2f}, backward {summary['backward_bubble']:.2f}, theory "
                          f"{summary['theoretical_bubble']:.2f})", flush=True)
            if args.checkpoint_dir and step % args.checkpoint_every == 0:
                pdist.save_checkpoint(args.checkpoint_dir, step, pipe, optimizer, scheduler, extra=dict(epoch=epoch))
        if i == steps_per_epoch - 1 and step == (epoch + 1) * steps_per_epoch:  # the epoch is complete
            val = evaluate(pipe, valid, mesh, args.bptt, args.eval_batches)
            scheduler.step(val)
            history.append(math.exp(val))
            if log:
                print(f"| end of epoch {epoch + 1} | {time.perf_counter() - start:6.1f} s | valid loss {val:.3f} | "
                      f"valid ppl {math.exp(val):9.2f}", flush=True)
    if args.save_model:
        full = pipe.consolidated_state_dict()
        if log:
            pdist.atomic_save(full, args.save_model)
    if log:
        print(f"done: {step} steps in {time.perf_counter() - start:.1f} s", flush=True)
    torch.distributed.destroy_process_group()
    return dict(steps=step, valid_ppl=history)


if __name__ == "__main__":
    main()
