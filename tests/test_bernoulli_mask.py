"""pipelstm::bernoulli_mask: the CPU's two-valued random masks (dropout,
DropConnect and zoneout masks), against Philox4x32-10 written here in plain
Python and checked on the published known-answer vectors."""

import pytest
import torch

from pipelstm import regularisation
from pipelstm import _C

_engine = _C.pipeline

ops = torch.ops.pipelstm
M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF


def philox4x32_10(counter, key):
    """Random123's Philox4x32-10 of a 4-word counter under a 2-word key."""
    c, (k0, k1) = list(counter), key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c


def reference_mask(seed, stream, n, p, below, above):
    """Element i: word i of the stream (block i // 4 at counter (i // 4,
    stream)), its top 24 bits as a uniform in [0, 1) compared with p."""
    out = []
    for i in range(n):
        block = i // 4
        words = philox4x32_10([block & M32, block >> 32, stream & M32, stream >> 32], [seed & M32, seed >> 32])
        out.append(below if (words[i % 4] >> 8) / 2**24 < p else above)
    return torch.tensor(out, dtype=torch.float64)


def mask(seed, size, p, below=1.0, above=0.0, dtype=torch.float64):
    return ops.bernoulli_mask(torch.tensor(seed), list(size), p, below, above, dtype)


def test_the_reference_is_philox4x32_10():
    """Random123's known-answer vectors (kat_vectors, philox4x32_10)."""
    assert philox4x32_10([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox4x32_10([M32] * 4, [M32, M32]) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert philox4x32_10([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@pytest.mark.parametrize("seed", [0, 12345, 2**40 + 7, 2**62 - 1])
def test_each_element_is_its_word_of_the_stream(seed):
    got = mask(seed, (7, 43), 0.37, 2.0, -3.0)
    torch.testing.assert_close(got.flatten(), reference_mask(seed, 0, 7 * 43, 0.37, 2.0, -3.0), rtol=0, atol=0)


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def test_the_pipeline_draws_keep_c_and_keep_h_from_streams_0_and_1_of_the_item_seed():
    """An item's seed as the engine derives it from the pass seed, unit,
    micro-batch and chunk (splitmix64, chained)."""
    pass_seed, unit, m, k = 99, 1, 2, 3
    seed = splitmix64(splitmix64(splitmix64(pass_seed ^ unit) ^ m) ^ k)
    c, h = _engine.zoneout_masks(pass_seed, unit, m, k, 5, 13, 0.3, 0.6, torch.empty(0, dtype=torch.float64))
    torch.testing.assert_close(c.flatten(), reference_mask(seed, 0, 65, 0.3, 1.0, 0.0), rtol=0, atol=0)
    torch.testing.assert_close(h.flatten(), reference_mask(seed, 1, 65, 0.6, 1.0, 0.0), rtol=0, atol=0)


def test_the_mask_is_the_same_on_any_number_of_threads():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = mask(7, (301, 997), 0.5)
        torch.set_num_threads(2)
        two = mask(7, (301, 997), 0.5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    assert not torch.equal(one, mask(8, (301, 997), 0.5))


@pytest.mark.parametrize("p", [0.0, 0.05, 0.5, 0.93, 1.0])
def test_below_comes_with_probability_p(p):
    n = 1_000_000
    got = mask(3, (n,), p, 1.0, 0.0, torch.float32)
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(got.mean().item() - p) <= 5 * sigma + 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_every_dtype_holds_the_two_values_exactly(dtype):
    got = mask(5, (64, 33), 0.4, 0.0, 1 / 0.6, dtype)
    want = reference_mask(5, 0, 64 * 33, 0.4, 0.0, 1 / 0.6).to(dtype).view(64, 33)
    assert got.dtype == dtype and torch.equal(got, want)


def test_bad_arguments_are_named():
    with pytest.raises(RuntimeError, match="expected `seed` to be a 0-dim int64 tensor"):
        ops.bernoulli_mask(torch.tensor([1, 2]), [3], 0.5, 1.0, 0.0, torch.float32)
    with pytest.raises(RuntimeError, match=r"expected p in \[0, 1\], got 1.5"):
        mask(1, (3,), 1.5)


def test_the_fake_kernel_gives_shape_and_dtype():
    torch.library.opcheck(ops.bernoulli_mask, (torch.tensor(4), [5, 6], 0.25, 1.0, 0.0, torch.float32),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_manual_seed_reproduces_the_module_masks():
    like = torch.empty(0)
    torch.manual_seed(11)
    a = regularisation.zoneout_mask((6, 5, 40), 0.3, like), regularisation.weight_mask(torch.ones(80, 20), 0.5)
    torch.manual_seed(11)
    b = regularisation.zoneout_mask((6, 5, 40), 0.3, like), regularisation.weight_mask(torch.ones(80, 20), 0.5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
