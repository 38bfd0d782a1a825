"""pipelstm.memory_stats / empty_cache: the CPU buffer cache of
csrc/cpu/huge_pages.h seen and emptied from Python.

Buffers of 64 KiB and more are mappings of pipelstm's own; a freed one is
kept for the next request of about its size. The counters are checked
against what the test does (sizes, reuse), and empty_cache against the
process's resident memory, read from /proc (an independent view).
"""

import os
import subprocess
import sys

import pytest

import pipelstm
from pipelstm import _C

MIB = 1 << 20
FLOATS_PER_MIB = MIB // 4

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the cache maps buffers on Linux")


@pytest.fixture(autouse=True)
def _cache_on(monkeypatch):
    monkeypatch.delenv("PIPELSTM_BUFFER_CACHE_MB", raising=False)
    _C._set_switch("PIPELSTM_BUFFER_CACHE_MB", None)
    yield
    _C._set_switch("PIPELSTM_BUFFER_CACHE_MB", None)


def _written(mib: int):
    t = _C._empty_buffer(mib * FLOATS_PER_MIB)
    t.fill_(1.0)
    return t


def test_a_freed_buffer_is_kept_reused_and_released():
    pipelstm.empty_cache()
    start = pipelstm.memory_stats()
    assert start["kept_bytes"] == 0 and start["kept_mappings"] == 0

    buf = _written(48)
    held = pipelstm.memory_stats()
    # 48 MiB and the 2 MiB of room that aligns it to a huge page.
    assert held["in_use_bytes"] - start["in_use_bytes"] == 50 * MIB
    assert held["misses"] == start["misses"] + 1 and held["hits"] == start["hits"]
    assert held["peak_mapped_bytes"] >= held["mapped_bytes"] >= held["in_use_bytes"]

    del buf
    kept = pipelstm.memory_stats()
    assert kept["kept_bytes"] == 50 * MIB and kept["kept_mappings"] == 1
    assert kept["in_use_bytes"] == start["in_use_bytes"]

    again = _written(48)  # served by the kept mapping
    reused = pipelstm.memory_stats()
    assert reused["hits"] == kept["hits"] + 1 and reused["misses"] == kept["misses"]
    assert reused["kept_bytes"] == 0
    del again

    assert pipelstm.empty_cache() is None
    empty = pipelstm.memory_stats()
    assert empty["kept_bytes"] == 0 and empty["kept_mappings"] == 0
    assert empty["mapped_bytes"] == kept["mapped_bytes"] - 50 * MIB


def test_a_cache_of_zero_keeps_nothing():
    pipelstm.empty_cache()
    pipelstm.backends.cpu.buffer_cache_mb = 0
    before = pipelstm.memory_stats()
    del_me = _written(8)
    del del_me
    after = pipelstm.memory_stats()
    assert after["kept_bytes"] == 0
    assert after["mapped_bytes"] == before["mapped_bytes"]  # unmapped at once


# Resident memory (VmRSS) in a process of its own: nothing else's buffers
# come and go while it is read.
_RSS_SCRIPT = """
import pipelstm
from pipelstm import _C

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024

t = _C._empty_buffer(200 * (1 << 18))  # 200 MiB
t.fill_(1.0)
del t
kept = rss_mib()
stats = pipelstm.memory_stats()
pipelstm.empty_cache()
print(stats["kept_bytes"] >> 20, round(kept - rss_mib()))
"""


def test_empty_cache_gives_the_memory_back():
    done = subprocess.run([sys.executable, "-c", _RSS_SCRIPT], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "PIPELSTM_BUFFER_CACHE_MB"})
    assert done.returncode == 0, done.stderr
    kept_mib, released_mib = (int(v) for v in done.stdout.split())
    assert kept_mib == 202
    assert released_mib >= 190, released_mib  # the kept buffer was resident, and is no more
