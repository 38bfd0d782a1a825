"""python -m pipelstm.bench layernorm: the cell loop it times is the same
model as pipelstm.LayerNormLSTM, and the bench runs and writes its JSON."""

import json

import torch

import pipelstm
from pipelstm.bench import layernorm


def test_the_cell_loop_is_the_layernorm_lstm():
    torch.manual_seed(0)
    model = pipelstm.LayerNormLSTM(4, 6, num_layers=2, dtype=torch.float64)
    with torch.no_grad():
        for name, p in model.named_parameters():  # gains and shifts away from 1 and 0
            p.add_(0.3 * torch.randn_like(p))
    loop = layernorm.LayerNormCellLoop(model)
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(loop(x)[0], model(x)[0], atol=1e-12, rtol=0)


def test_quick_run_writes_every_column(tmp_path):
    path = tmp_path / "r.json"
    rows = layernorm.main(["--quick", "--threads", "1", "--repeats", "5", "--json", str(path)])
    data = json.loads(path.read_text())
    assert data["bench"] == "layernorm" and len(rows) == 1
    for key in ("plain", "layernorm", "cell_loop", "cost", "speedup"):
        assert rows[0][key] > 0 and data["rows"][0][key] == rows[0][key]

