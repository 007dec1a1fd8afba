"""Packed bitmasks applied to the logits as they are (masking.apply_bitmask, mask_logits on int32
masks): the same masked logits as the unpacked bool masks, bit for bit."""

import pytest
import torch

from specdec.constraints import masking
from tests.grammar_toy import only_token


def random_bits(rows: int, words: int, seed: int) -> torch.Tensor:
    bits = torch.randint(-2**31, 2**31 - 1, (rows, words), dtype=torch.int32, generator=torch.Generator().manual_seed(seed))
    bits[1] = 0  # a row after the grammar's end: everything allowed
    bits[2, 1:] = 0
    bits[2, 0] = -2**31  # one token allowed, by bit 31
    return bits


@pytest.mark.parametrize("vocab", [50, 96, 130, 400])  # fewer columns than bits, as many, more
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_packed_mask_gives_the_unpacked_masks_logits(vocab, dtype):
    bits = random_bits(4, 3, seed=vocab)
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(7)).to(dtype)
    expected = torch.where(masking.unpack_bitmask(bits, vocab), logits, float("-inf"))
    got = masking.apply_bitmask(logits, bits)
    assert got.dtype == dtype and torch.equal(got, expected)
    assert torch.isinf(got[0]).any() and not torch.isinf(got[1]).any()  # a mask was applied; the empty row kept all


@pytest.mark.parametrize("width", [1, 31, 32, 70, 96])
def test_the_device_bit_reads_equal_the_hosts(width):
    bits = random_bits(5, 3, seed=width)
    assert torch.equal(masking.bit_columns(bits, width, host=False), masking.bit_columns(bits, width, host=True))
    assert torch.equal(masking.bit_columns(bits, width), masking.unpack_bitmask(bits, 96)[:, :width] & (bits != 0).any(1, keepdim=True))


def test_mask_logits_on_packed_masks_equals_it_on_bool_masks():
    offsets = [0, 2, 5, 6, 9]  # four sequences: constrained, not, constrained, constrained
    bits = [random_bits(3, 2, seed=s) for s in (1, 2, 3)]
    packed = [bits[0][:2], None, bits[1][:1], bits[2]]
    logits = torch.randn(9, 80, generator=torch.Generator().manual_seed(3))
    unpacked = [None if b is None else masking.unpack_bitmask(b, 80) for b in packed]
    got = masking.mask_logits(logits, offsets, packed)
    assert torch.equal(got, masking.mask_logits(logits, offsets, unpacked))
    assert torch.equal(got[2:5], logits[2:5]) and torch.isinf(got[:2]).any()


def test_a_packed_mask_of_the_wrong_rows_is_refused():
    with pytest.raises(ValueError, match="rows"):
        masking.mask_logits(torch.randn(3, 40), [0, 3], [torch.zeros(2, 2, dtype=torch.int32)])


def test_single_rows_agrees_with_only_token():
    bits = random_bits(6, 3, seed=5)
    bits[3] = 0
    bits[3, 2] = 1 << 4  # one token, last word
    bits[4] = 0
    bits[4, 0], bits[4, 1] = 1, 1  # two words
    bits[5] = 0
    bits[5, 1] = 0b101  # two bits of one word
    assert masking.single_rows(bits) == [only_token(row) is not None for row in bits]
    assert masking.single_rows(bits) == [False, False, True, True, False, False]
