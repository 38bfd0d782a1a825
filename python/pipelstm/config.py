"""What this pipelstm is and how it is set: :func:`config_info` (a dict),
:func:`show_config` (printed, as ``torch.__config__.show()`` is torch's).
"""

import logging
from typing import Any, Callable, Dict

import torch

from . import _C, backends
from ._version import __version__
from ._build_check import build_info

__all__ = ["config_info", "show_config", "log_choices"]

logger = logging.getLogger("pipelstm")


def _or_error(read: Callable[[], Any]) -> Any:
    """read(), or the error it raised as text (a switch's variable with a
    value it does not take): the report shows it instead of failing."""
    try:
        return read()
    except (RuntimeError, ValueError) as e:
        return f"error: {e}"


def config_info() -> Dict[str, Any]:
    """This build and its settings.

    Returns:
        A dict: ``version`` (pipelstm's), ``torch_built`` (the torch it was
        built against; None for a build that did not record it),
        ``torch_running``, ``cuda_built`` (the CUDA kernels compiled in),
        ``cuda_archs`` (their architectures), ``torch_cuda_built`` (the CUDA
        version of the torch built against), ``cpu_isa`` (the fused CPU
        kernels' ISA), ``cpu_isa_chosen`` (whether a call has chosen it;
        the ISA switch is then fixed), ``cpu_gemm`` (what runs the CPU
        GEMMs now), ``cpu`` (the CPU's vendor, family, model and class:
        ``pipelstm.backends.cpu.current_cpu()``), ``cpu_paths`` (the paths
        chosen by timing so far: ``pipelstm.backends.cpu.chosen_paths()``),
        and ``switches``: for each switch by environment
        variable, ``value``, ``source`` (``python``, ``env`` or
        ``default``) and ``attribute`` (its name in pipelstm.backends, None
        for the ones set by the variable only). A value that cannot be read
        (a variable holding a value its switch does not take) is
        ``"error: ..."``.
    """
    info = build_info()
    attributes = backends.attributes()
    switches = {}
    for name in _C._switch_names():
        read = _or_error(lambda: _C._get_switch(name))
        value, source = (read, "env") if isinstance(read, str) else read
        switches[name] = dict(value=value, source=source, attribute=attributes.get(name))
    return dict(
        version=__version__,
        torch_built=info.torch_version if info else None,
        torch_running=torch.__version__,
        cuda_built=_C.built_with_cuda(),
        cuda_archs=list(info.cuda_archs) if info else [],
        torch_cuda_built=info.torch_cuda_version if info else None,
        cpu_isa=_or_error(_C.cpu_isa),
        cpu_isa_chosen=_C._cpu_isa_chosen(),
        cpu_gemm=_or_error(_C.cpu_gemm),
        cpu=backends.cpu.current_cpu(),
        cpu_paths=backends.cpu.chosen_paths(),
        switches=switches,
    )


def _render(info: Dict[str, Any]) -> str:
    cuda = f"yes ({', '.join(info['cuda_archs']) or 'archs not recorded'})" if info["cuda_built"] else "no"
    isa = info["cpu_isa"] + ("" if info["cpu_isa_chosen"] else " (what the first call will choose)")
    cpu = info["cpu"]
    lines = [
        f"pipelstm {info['version']}",
        f"  torch built against: {info['torch_built'] or 'not recorded'}",
        f"  torch running:       {info['torch_running']}",
        f"  CUDA kernels:        {cuda}",
        f"  CPU:                 {cpu['vendor']} family {cpu['family']} model {cpu['model']} "
        f"({cpu['microarchitecture']}, {cpu['vector_datapath_bits']}-bit FMA units)",
        f"  CPU kernels' ISA:    {isa}",
        f"  CPU GEMMs:           {info['cpu_gemm']}",
    ]
    if info["cpu_paths"]:
        lines.append("  CPU paths chosen by timing (pipelstm.backends.cpu.benchmark):")
        lines += [f"    {p['shape'].split(' paths=')[0]}: {p['path']}" for p in info["cpu_paths"]]
    lines.append("  switches (value, from where; Python attribute):")
    width = max(len(name) for name in info["switches"])
    for name, s in info["switches"].items():
        where = f"; {s['attribute']}" if s["attribute"] else "; environment only"
        lines.append(f"    {name:<{width}} = {s['value']} ({s['source']}{where})")
    return "\n".join(lines)


def show_config() -> None:
    """Prints :func:`config_info`: the versions, the CUDA build, the CPU
    kernels' ISA and GEMMs, and every switch with its value and its source."""
    print(_render(config_info()))


def log_choices() -> None:
    """Logs (DEBUG, logger ``pipelstm``) the CPU kernels' ISA and what runs
    the CPU GEMMs; nothing is chosen by it (the ISA still can be set)."""
    if logger.isEnabledFor(logging.DEBUG):
        isa, gemm = _or_error(_C.cpu_isa), _or_error(_C.cpu_gemm)
        isa_switch, gemm_switch = (_or_error(lambda n=n: _C._get_switch(n)) for n in ("PIPELSTM_CPU_ISA",
                                                                                      "PIPELSTM_CPU_GEMM"))
        logger.debug("CPU kernels: %s (PIPELSTM_CPU_ISA: %s); whole-batch CPU GEMMs: %s (PIPELSTM_CPU_GEMM: %s)",
                     isa, _describe(isa_switch), gemm, _describe(gemm_switch))


def _describe(read: Any) -> str:
    return read if isinstance(read, str) else f"{read[0]}, from {read[1]}"
