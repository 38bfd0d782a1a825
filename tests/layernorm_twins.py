"""A bfloat16/float16 pipelstm.LayerNormLSTM and the float32 model whose
calls it must round (tests/test_layernorm_lstm.py and its GPU twin)."""

import pipelstm


def float32_twin(m: pipelstm.LayerNormLSTM) -> pipelstm.LayerNormLSTM:
    """A float32 model on m's device with m's values, each layer direction's
    bias_ih + bias_hh summed in m's dtype (as m's layer op takes them) and
    bias_hh zero: m's results should be its results rounded to m's dtype."""
    twin = pipelstm.LayerNormLSTM(m.input_size, m.hidden_size, m.num_layers, bidirectional=m.bidirectional,
                                  device=m.weight_ih_l0.device)
    state = {k: v.float() for k, v in m.state_dict().items()}
    for name in state:
        if name.startswith("bias_ih"):
            hh = name.replace("bias_ih", "bias_hh")
            state[name] = (m.state_dict()[name] + m.state_dict()[hh]).float()
            state[hh] = state[hh].new_zeros(state[hh].shape)
    twin.load_state_dict(state)
    return twin.train(m.training)
