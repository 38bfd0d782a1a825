"""pipelstm/distributed/checkpoint.py in one process (a gloo group of one):
a rank's checkpoint round-trips exactly through torch.load(weights_only=True),
a file whose pickle would run code is refused, and state that the safe
loader could not read back is refused before anything is written. The
multi-process resume after a killed rank is tests/test_distributed.py's."""

import copy
import os

import pytest
import torch
from torch import nn

import pipelstm
import pipelstm.distributed as pdist
from distributed_utils import needs_gloo

pytestmark = needs_gloo

V = 10


def _training(mesh):
    """(pipe, optimizer, scheduler, step) of a small LM with dropout (the RNG
    state matters), Adam (tensors and plain values in its state) and a
    scheduler, carrying the LSTM state between steps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(V, 8), pipelstm.LSTM(8, 16, num_layers=2, dropout=0.3), nn.Linear(16, V))
    pipe = pdist.PipelineParallel(model, mesh, chunks=2, threads=1, carry_state=True)
    opt = torch.optim.Adam(pipe.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    data = torch.Generator().manual_seed(1)

    def step():
        x, y = torch.randint(0, V, (6, 4), generator=data), torch.randint(0, V, (6, 4), generator=data)
        pipe.train_step(x, y, lambda out, t: nn.functional.cross_entropy(out.reshape(-1, V), t.reshape(-1)))
        opt.step()
        opt.zero_grad()
        sched.step()

    return pipe, opt, sched, step


def _assert_same(a, b, where="state"):
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_a_checkpoint_round_trips_exactly(mesh, tmp_path):
    pipe, opt, sched, step = _training(mesh)
    step()
    step()
    extra = dict(epoch=2, name="run", losses=[1.5, 2.25], best=(0.5, 3), tags={"a", "b"}, mask=torch.arange(3))
    pdist.save_checkpoint(str(tmp_path / "ckpt"), 2, pipe, opt, sched, extra=extra)
    saved = copy.deepcopy(dict(model=pipe.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(),
                               hidden=pipe.hidden_state(), rng=torch.get_rng_state()))
    step()  # what the saved run does next
    expected = {k: v.clone() for k, v in pipe.state_dict().items()}

    torch.manual_seed(123)  # a different RNG state: the checkpoint must restore it
    pipe2, opt2, sched2, _ = _training(mesh)
    restored = pdist.load_checkpoint(str(tmp_path / "ckpt"), pipe2, opt2, sched2)
    assert restored["step"] == 2
    _assert_same(restored["extra"], extra, "extra")
    _assert_same(pipe2.state_dict(), saved["model"], "model")
    _assert_same(opt2.state_dict(), saved["opt"], "optimizer")
    _assert_same(sched2.state_dict(), saved["sched"], "scheduler")
    _assert_same(pipe2.hidden_state(), saved["hidden"], "hidden")
    _assert_same(torch.get_rng_state(), saved["rng"], "rng")
    x_gen = torch.Generator().manual_seed(1)  # the third batch of _training's data
    for _ in range(4):
        torch.randint(0, V, (6, 4), generator=x_gen)
    x, y = torch.randint(0, V, (6, 4), generator=x_gen), torch.randint(0, V, (6, 4), generator=x_gen)
    pipe2.train_step(x, y, lambda out, t: nn.functional.cross_entropy(out.reshape(-1, V), t.reshape(-1)))
    opt2.step()
    _assert_same(pipe2.state_dict(), expected, "the next step's parameters")  # dropout masks included


class _RunsCode:
    """Unpickling it calls os.mkdir(path): what a malicious checkpoint would do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_a_checkpoint_whose_pickle_runs_code_is_refused(mesh, tmp_path):
    pipe, opt, sched, step = _training(mesh)
    step()
    folder = pdist.save_checkpoint(str(tmp_path / "ckpt"), 1, pipe, opt, sched)
    path = os.path.join(folder, "rank-00000.pt")
    state = torch.load(path, weights_only=True)
    marker = str(tmp_path / "code-ran")
    state["extra"] = _RunsCode(marker)
    torch.save(state, path)
    with pytest.raises(RuntimeError, match=r"load_checkpoint: .*rank-00000\.pt holds objects that "
                                           r"torch\.load\(weights_only=True\) refuses"):
        pdist.load_checkpoint(str(tmp_path / "ckpt"), pipe, opt, sched)
    assert not os.path.exists(marker)


def test_state_the_safe_loader_cannot_read_is_refused_before_writing(mesh, tmp_path):
    pipe, opt, sched, step = _training(mesh)
    step()
    pdist.save_checkpoint(str(tmp_path / "ckpt"), 1, pipe, opt, sched)
    with pytest.raises(TypeError, match=r"save_checkpoint: the checkpoint\['extra'\]\['schedule'\]\[1\] is a "
                                        r"builtins\.function"):
        pdist.save_checkpoint(str(tmp_path / "ckpt"), 2, pipe, opt, sched, extra=dict(schedule=[1, lambda: 0]))
    assert pdist.latest_checkpoint(str(tmp_path / "ckpt")).endswith("step-00000001")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["latest", "step-00000001"]


def _two_checkpoints(mesh, tmp_path):
    """(pipe, opt, sched, directory, the first checkpoint's parameters): steps 1 and 2 saved."""
    pipe, opt, sched, step = _training(mesh)
    directory = str(tmp_path / "ckpt")
    step()
    pdist.save_checkpoint(directory, 1, pipe, opt, sched)
    first = {k: v.clone() for k, v in pipe.state_dict().items()}
    step()
    pdist.save_checkpoint(directory, 2, pipe, opt, sched)
    return pipe, opt, sched, directory, first


@pytest.mark.parametrize("damage", ["truncated", "missing", "not a checkpoint"])
def test_a_damaged_newest_checkpoint_resumes_from_the_one_before(mesh, tmp_path, damage):
    pipe, opt, sched, directory, first = _two_checkpoints(mesh, tmp_path)
    path = os.path.join(directory, "step-00000002", "rank-00000.pt")
    if damage == "truncated":
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    elif damage == "missing":
        os.unlink(path)
    else:
        torch.save({"step": 2}, path)
    pipe2, opt2, sched2, _ = _training(mesh)
    with pytest.warns(UserWarning, match=r"skipped step-00000002, which cannot be read: .*rank-00000\.pt.*"
                                         r"resuming from step-00000001"):
        restored = pdist.load_checkpoint(directory, pipe2, opt2, sched2)
    assert restored["step"] == 1
    _assert_same(pipe2.state_dict(), first, "the first checkpoint's parameters")


def test_a_damaged_latest_marker_resumes_from_the_newest_folder(mesh, tmp_path):
    pipe, opt, sched, directory, _ = _two_checkpoints(mesh, tmp_path)
    open(os.path.join(directory, "latest"), "w").close()  # empty: names nothing
    pipe2, opt2, sched2, _ = _training(mesh)
    assert pdist.load_checkpoint(directory, pipe2, opt2, sched2)["step"] == 2
    _assert_same(pipe2.state_dict(), pipe.state_dict(), "the newest checkpoint's parameters")


def test_no_readable_checkpoint_is_an_error_naming_each(mesh, tmp_path):
    pipe, opt, sched, directory, _ = _two_checkpoints(mesh, tmp_path)
    for step in (1, 2):
        open(os.path.join(directory, f"step-{step:08d}", "rank-00000.pt"), "wb").write(b"not a zip")
    with pytest.raises(RuntimeError, match=r"no checkpoint in .* can be read by every rank: step-00000002: .*"
                                           r"cannot be read .* \| step-00000001: "):
        pdist.load_checkpoint(directory, pipe, opt, sched)

