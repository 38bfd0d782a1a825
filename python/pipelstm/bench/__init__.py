"""Benchmarks: ``python -m pipelstm.bench {layer,module} [options]``.

Every row times pipelstm and its peer (torch.nn.LSTM) in the same process,
interleaved, and reports medians and their ratio, so machine noise affects
both sides alike.
"""
