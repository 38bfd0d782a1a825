"""How a stack of layers runs: ``route`` picks, once per call, layers one
after another, the CUDA layer wavefront (``wavefront``) or the CUDA stack
graph (``graph``)."""
