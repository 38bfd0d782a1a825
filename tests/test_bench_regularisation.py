"""python -m pipelstm.bench regularisation: the peer it times is the weight
drop users write for nn.LSTM, and the bench runs and writes its JSON."""

import json

import torch
from torch import nn

from pipelstm.bench import regularisation


def test_the_peer_drops_weight_hh_and_trains_the_raw_weight():
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 6, num_layers=2)
    ref = nn.LSTM(4, 6, num_layers=2)
    ref.load_state_dict(lstm.state_dict())
    peer = regularisation.WeightDropLSTM(lstm, 0.5)
    x = torch.randn(5, 3, 4)
    torch.testing.assert_close(peer.eval()(x)[0], ref(x)[0])  # evaluation: the raw weights
    peer.train()
    out = peer(x)[0]
    assert not torch.allclose(out, ref(x)[0])
    out.sum().backward()
    raw = peer.weight_hh_l0_raw
    assert raw.grad is not None and (raw.grad == 0).any()  # dropped weights get no gradient
    assert "weight_hh_l0" not in dict(lstm.named_parameters())


def test_the_zoneout_loop_is_the_lstm_and_blends_with_its_masks():
    # With p = 0 it is nn.LSTM's stack (no dropout); with p_h near 1 every
    # step keeps the initial zeros; in between the output differs from both.
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 6, num_layers=2)
    x = torch.randn(5, 3, 4)
    torch.testing.assert_close(regularisation.ZoneoutCellLoop(lstm, (0.0, 0.0))(x)[0], lstm(x)[0])
    kept = regularisation.ZoneoutCellLoop(lstm, (0.0, 1.0 - 1e-9))(x)[0]
    assert torch.count_nonzero(kept) == 0
    zoned = regularisation.ZoneoutCellLoop(lstm, (0.5, 0.05))(x)[0]
    assert not torch.allclose(zoned, lstm(x)[0])


def test_quick_run_writes_every_column(tmp_path):
    path = tmp_path / "r.json"
    rows = regularisation.main(["--quick", "--threads", "1", "--repeats", "5", "--json", str(path)])
    data = json.loads(path.read_text())
    assert data["bench"] == "regularisation" and len(rows) == 1
    for key in ("plain", "weight", "variational", "both", "peer", "both_cost", "speedup", "zoneout", "cell_loop",
                "zoneout_cost", "zoneout_speedup"):
        assert rows[0][key] > 0 and data["rows"][0][key] == rows[0][key]

