"""Every processor twin of hfax.generation.processors against the transformers processor it stands for,
on random scores and histories (eager torch on CPU: the same code the backends trace)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation import logits_process as lp

from hfax.generation import processors

VOCAB, ROWS, LENGTH = 40, 3, 9


def history(ids: torch.Tensor, extra: int = 4) -> processors.History:
    """``ids`` at the start of a buffer with ``extra`` unwritten slots after them."""
    rows, length = ids.shape
    buffer = torch.cat([ids, torch.zeros((rows, extra), dtype=ids.dtype)], 1)
    valid = torch.cat(
        [torch.ones_like(ids, dtype=torch.bool), torch.zeros((rows, extra), dtype=torch.bool)], 1
    )
    return processors.History(buffer, valid, torch.tensor(length), torch.tensor(length))


def run_twin(processor, ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    (step,) = processors.translate([processor], VOCAB)
    arrays = {name: torch.from_numpy(np.asarray(value)) for name, value in step.arrays.items()}
    return processors.apply((step.static,), [arrays], scores.clone(), history(ids))


CASES = {
    "repetition": lambda: lp.RepetitionPenaltyLogitsProcessor(1.7),
    "ngram2": lambda: lp.NoRepeatNGramLogitsProcessor(2),
    "ngram3": lambda: lp.NoRepeatNGramLogitsProcessor(3),
    "bad_words": lambda: lp.NoBadWordsLogitsProcessor([[5], [7, 9], [1, 2, 3]], eos_token_id=[2]),
    "sequence_bias": lambda: lp.SequenceBiasLogitsProcessor(
        [[[4], -3.0], [[6, 8], 5.0], [[3, 1, 4], 2.0]]
    ),
    "min_length": lambda: lp.MinLengthLogitsProcessor(12, eos_token_id=[2, 7]),
    "min_new": lambda: lp.MinNewTokensLengthLogitsProcessor(6, 4, eos_token_id=[3]),
    "forced_bos": lambda: lp.ForcedBOSTokenLogitsProcessor(11),
    "forced_eos": lambda: lp.ForcedEOSTokenLogitsProcessor(10, eos_token_id=[2, 5]),
    "suppress": lambda: lp.SuppressTokensLogitsProcessor([1, 4, 30]),
    "suppress_at_begin": lambda: lp.SuppressTokensAtBeginLogitsProcessor(
        [3, 9], begin_index=LENGTH
    ),
    "temperature": lambda: lp.TemperatureLogitsWarper(0.6),
    "top_k": lambda: lp.TopKLogitsWarper(7),
    "top_k_keep": lambda: lp.TopKLogitsWarper(1, min_tokens_to_keep=3),
    "top_p": lambda: lp.TopPLogitsWarper(0.7),
    "top_p_keep": lambda: lp.TopPLogitsWarper(0.05, min_tokens_to_keep=2),
    "min_p": lambda: lp.MinPLogitsWarper(0.2),
    "typical": lambda: lp.TypicalLogitsWarper(0.6),
    "epsilon": lambda: lp.EpsilonLogitsWarper(0.03),
    "eta": lambda: lp.EtaLogitsWarper(0.05, device="cpu"),
    "normalize": lambda: lp.LogitNormalization(),
    "invalid": lambda: lp.InfNanRemoveLogitsProcessor(),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_twin_matches_transformers(case):
    generator = torch.Generator().manual_seed(sorted(CASES).index(case))
    for trial in range(4):
        # Few distinct tokens, so repeats, n-grams and prefixes actually occur.
        ids = torch.randint(0, 12, (ROWS, LENGTH), generator=generator)
        if trial == 1:
            ids[:, -3:] = (
                torch.tensor([6, 8, 6]) if case != "bad_words" else torch.tensor([1, 2, 7])
            )
        scores = torch.randn((ROWS, VOCAB), generator=generator) * 3
        if case == "invalid":
            scores[0, 3], scores[1, 4], scores[2, 5] = float("nan"), float("inf"), -float("inf")
        want = CASES[case]()(ids, scores.clone())
        got = run_twin(CASES[case](), ids, scores)
        np.testing.assert_allclose(
            got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"trial {trial}"
        )


def test_padding_and_unwritten_slots_do_not_count_as_history():
    """A token seen only in the prompt's padding or in slots not written yet is not penalized."""
    ids = torch.tensor([[9, 9, 4, 5], [1, 2, 3, 4]])
    buffer = torch.cat([ids, torch.full((2, 3), 9)], 1)
    valid = torch.cat(
        [
            torch.tensor([[False, False, True, True], [True] * 4]),
            torch.zeros((2, 3), dtype=torch.bool),
        ],
        1,
    )
    step = processors.translate([lp.RepetitionPenaltyLogitsProcessor(2.0)], VOCAB)[0]
    scores = torch.ones((2, VOCAB))
    out = processors.apply(
        (step.static,),
        [{"value": torch.tensor(2.0)}],
        scores,
        processors.History(buffer, valid, torch.tensor(4), torch.tensor(4)),
    )
    assert out[0, 9] == 1 and out[0, 4] == 0.5 and out[1, 9] == 1


def test_a_processor_without_twin_is_named():
    """The processors hfax has no twin of, by name: their call chooses its tokens on the host
    (tests/test_generate_features.py::test_processors_without_a_twin_run_on_the_host)."""
    given = [
        lp.TemperatureLogitsWarper(0.5),
        lp.PrefixConstrainedLogitsProcessor(lambda b, i: [1], 1),
    ]
    assert processors.without_twin(given) == ["PrefixConstrainedLogitsProcessor"]
    assert processors.without_twin(given[:1]) == []


@pytest.mark.parametrize("n", [1, 2, 3])
def test_encoder_ngram_twin_matches_transformers(n):
    # Two inputs, each decoded by two rows (beams): a row may not complete an n-gram of its own input.
    generator = torch.Generator().manual_seed(n)
    source = torch.randint(0, 8, (2, 11), generator=generator)
    for trial in range(4):
        ids = torch.randint(0, 8, (4, LENGTH), generator=generator)
        if trial == 1:  # rows ending in the start of one of their input's n-grams
            ids[0, LENGTH - n + 1 :], ids[3, LENGTH - n + 1 :] = (
                source[0, : n - 1],
                source[1, 3 : n + 2],
            )
        scores = torch.randn((4, VOCAB), generator=generator)
        want = lp.EncoderNoRepeatNGramLogitsProcessor(n, source)(ids, scores.clone())
        (step,) = processors.translate(
            [lp.EncoderNoRepeatNGramLogitsProcessor(n, source)], VOCAB, 2
        )
        arrays = {name: torch.from_numpy(value) for name, value in step.arrays.items()}
        got = processors.apply((step.static,), [arrays], scores.clone(), history(ids))
        np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"trial {trial}")
