"""transformers' logits processors as static-shape twins, written in torch ops so every backend runs them
compiled: the JAX backend traces them through torchax, torch_xla runs them natively.

transformers builds the processors a request needs (``GenerationMixin._get_logits_processor``), in its own
order and with its own validation; :func:`translate` turns each into a :class:`Step`. transformers' own
objects cannot run inside a compiled decode loop: they keep their settings as Python numbers (so every new
``temperature`` would be a new program), call ``torch.topk`` with a Python ``k``, read a history whose
length grows by one every token, and some build CPU tensors when first called. A twin keeps its settings
as arrays (``Step.arrays``: traced, so changing ``repetition_penalty`` or ``temperature`` compiles
nothing), and reads the history from a fixed-size buffer in which only the ``valid`` slots count.
Whether a processor runs at all is part of the program's static structure, so a feature that is off costs
nothing. Every twin is tested against the transformers processor it stands for.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

#: EOS and suppressed-token lists are padded with -1 to a multiple of this, so their length rarely
#: changes the program.
ID_SLOTS = 4


@dataclasses.dataclass(frozen=True)
class Step:
    """One processor of a request: its ``kind`` and static ``shape`` (hashable: part of the program's
    structure) and its settings as host ``arrays`` (traced values)."""

    kind: str
    shape: tuple[int, ...] = ()
    arrays: dict[str, np.ndarray] = dataclasses.field(
        default_factory=dict, compare=False, hash=False
    )

    @property
    def static(self) -> tuple[str, tuple[int, ...]]:
        return (self.kind, self.shape)


@dataclasses.dataclass
class History:
    """What the processors may read of the tokens so far (torch tensors on the device).

    ``ids`` ``[rows, slots]`` holds the prompt's bucket then the new tokens. ``present`` says which slots
    hold the ``input_ids`` transformers would pass (the caller's prompt, its padding included, and the new
    tokens so far: never hfax's bucket filler or slots not yet written); ``valid`` which of those are real
    tokens (the prompt's padding left out, as transformers' repetition penalty leaves it out). ``end``
    (0-d) is the slot after the last token so far; ``length`` (0-d) is transformers' ``cur_len``, the
    length of that ``input_ids``.
    """

    ids: Any
    valid: Any
    end: Any
    length: Any
    present: Any = None

    def __post_init__(self) -> None:
        if self.present is None:
            self.present = self.valid


def padded_ids(values: Any, slots: int = ID_SLOTS) -> np.ndarray:
    """Token ids as an int32 array padded with -1 to a multiple of ``slots`` (at least one slot)."""
    flat = [int(value) for value in np.asarray(values).reshape(-1)] if values is not None else []
    return np.asarray(flat + [-1] * (-len(flat) % slots or (slots if not flat else 0)), np.int32)


def _scalar(value: Any, dtype: Any = np.float32) -> np.ndarray:
    return np.asarray(value, dtype)


def _ids_arg(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def without_twin(processors: Any) -> list[str]:
    """The class names of the processors in ``processors`` that :func:`translate` has no twin of."""
    known = {*_TRANSLATIONS, "EncoderNoRepeatNGramLogitsProcessor"}
    return [type(p).__name__ for p in processors if type(p).__name__ not in known]


def translate(processors: Any, vocab: int, expand: int = 1) -> tuple[Step, ...]:
    """The :class:`Step` for every processor of transformers' ``LogitsProcessorList``, in its order (those
    the settings built, and the caller's own ``logits_processor`` merged in as transformers merges them);
    ``expand`` is the rows each caller's row becomes (beams, or sequences returned). Every processor has a
    twin (:func:`without_twin` is empty); a call with one that has none chooses its tokens on the host
    (:mod:`hfax.generation.host_choice`).
    """
    steps = []
    for processor in processors:
        name = type(processor).__name__
        if name == "EncoderNoRepeatNGramLogitsProcessor":
            steps.append(_encoder_no_repeat_ngram(processor, expand))
        else:
            steps.append(_TRANSLATIONS[name](processor, vocab))
    return tuple(steps)


def _encoder_no_repeat_ngram(processor: Any, expand: int) -> Step:
    """The n-grams of every caller's encoder input (transformers keeps them as dicts from the first n - 1
    tokens to the last ones) as ``grams`` ``[rows, count, n]``, -1 where a row has fewer: one row per
    decoder row (``expand`` per caller's row, as transformers maps a hypothesis to its input), the
    rows and the count padded to powers of two so that other inputs rarely change the program."""
    n = processor.ngram_size
    rows = [
        [(*prefix, token) for prefix, tokens in grams.items() for token in tokens]
        for grams in processor.generated_ngrams
    ]
    count = 1 << max(0, max(map(len, rows)) - 1).bit_length()
    grams = np.full((1 << (len(rows) - 1).bit_length(), count, n), -1, np.int32)
    for row, found in enumerate(rows):
        grams[row, : len(found)] = found
    return Step("encoder_no_repeat_ngram", (n,), {"grams": np.repeat(grams, expand, axis=0)})


def _sequence_bias(processor: Any, vocab: int) -> Step:
    biases = processor.sequence_bias  # {(token, ...): bias}, after transformers' own validation
    for sequence in biases:
        if any(not 0 <= token < vocab for token in sequence):
            raise ValueError(
                f"sequence_bias / bad_words_ids name token ids {list(sequence)} outside the "
                f"vocabulary [0, {vocab})"
            )
    count = max(len(biases), 1)
    width = max((len(sequence) for sequence in biases), default=1)
    count, width = -(-count // ID_SLOTS) * ID_SLOTS, max(width, 2)
    prefixes = np.full((count, width - 1), -2, np.int32)  # -2: any token (a shorter sequence)
    tokens = np.zeros((count,), np.int32)
    values = np.zeros((count,), np.float32)
    for row, (sequence, bias) in enumerate(biases.items()):
        if len(sequence) > 1:
            prefixes[row, width - len(sequence) :] = sequence[:-1]
        tokens[row], values[row] = sequence[-1], bias
    return Step(
        "sequence_bias", (count, width), {"prefixes": prefixes, "tokens": tokens, "bias": values}
    )


def _min_length(processor: Any, vocab: int) -> Step:
    arrays = {"min_length": _scalar(processor.min_length, np.int32)}
    return Step("min_length", (), {**arrays, "eos": padded_ids(processor.eos_token_id)})


def _min_new_tokens(processor: Any, vocab: int) -> Step:
    # transformers counts new tokens from the input length it was built with.
    arrays = {
        "min_length": _scalar(processor.prompt_length_to_skip + processor.min_new_tokens, np.int32)
    }
    return Step("min_length", (), {**arrays, "eos": padded_ids(processor.eos_token_id)})


def _forced_token(kind: str, attribute: str) -> Any:
    def make(processor: Any, vocab: int) -> Step:
        arrays = {"ids": padded_ids(_ids_arg(getattr(processor, attribute)))}
        if kind == "forced_eos":
            arrays["max_length"] = _scalar(processor.max_length, np.int32)
        return Step(kind, (), arrays)

    return make


def _suppress(processor: Any, vocab: int) -> Step:
    return Step("suppress", (), {"ids": padded_ids(_ids_arg(processor.suppress_tokens))})


def _suppress_at_begin(processor: Any, vocab: int) -> Step:
    arrays = {"ids": padded_ids(_ids_arg(processor.begin_suppress_tokens))}
    return Step(
        "suppress_at_begin", (), {**arrays, "begin": _scalar(processor.begin_index, np.int32)}
    )


def _setting(kind: str, attribute: str, keep: bool = True) -> Any:
    def make(processor: Any, vocab: int) -> Step:
        shape = (int(getattr(processor, "min_tokens_to_keep", 1)),) if keep else ()
        return Step(kind, shape, {"value": _scalar(float(getattr(processor, attribute)))})

    return make


def _top_k(processor: Any, vocab: int) -> Step:
    return Step("top_k", (), {"value": _scalar(min(processor.top_k, vocab), np.int32)})


_TRANSLATIONS = {
    "SequenceBiasLogitsProcessor": _sequence_bias,
    "NoBadWordsLogitsProcessor": _sequence_bias,
    "RepetitionPenaltyLogitsProcessor": _setting("repetition_penalty", "penalty", keep=False),
    "NoRepeatNGramLogitsProcessor": lambda p, vocab: Step("no_repeat_ngram", (p.ngram_size,)),
    "MinLengthLogitsProcessor": _min_length,
    "MinNewTokensLengthLogitsProcessor": _min_new_tokens,
    "ForcedBOSTokenLogitsProcessor": _forced_token("forced_bos", "bos_token_id"),
    "ForcedEOSTokenLogitsProcessor": _forced_token("forced_eos", "eos_token_id"),
    "InfNanRemoveLogitsProcessor": lambda p, vocab: Step("remove_invalid"),
    "SuppressTokensLogitsProcessor": _suppress,
    "SuppressTokensAtBeginLogitsProcessor": _suppress_at_begin,
    "TemperatureLogitsWarper": _setting("temperature", "temperature", keep=False),
    "TopKLogitsWarper": _top_k,
    "TopPLogitsWarper": _setting("top_p", "top_p"),
    "MinPLogitsWarper": _setting("min_p", "min_p"),
    "TypicalLogitsWarper": _setting("typical", "mass"),
    "EpsilonLogitsWarper": _setting("epsilon", "epsilon"),
    "EtaLogitsWarper": _setting("eta", "epsilon"),
    "LogitNormalization": lambda p, vocab: Step("normalize"),
}


# The twins. Every function takes the scores ``[rows, vocab]`` (float32), the step's arrays as tensors,
# its static shape and the History, and returns the processed scores.


def apply(
    steps: tuple[tuple[str, tuple[int, ...]], ...],
    arrays: list[dict[str, Any]],
    scores: Any,
    history: History,
) -> Any:
    """Run the processors ``steps`` (their ``static`` parts) with their ``arrays`` over ``scores``."""
    for (kind, shape), values in zip(steps, arrays):
        scores = _TWINS[kind](scores, values, shape, history)
    return scores


def token_mask(ids: Any, vocab: int) -> Any:
    """``[vocab]`` bool: which tokens ``ids`` (1-D; -1, or an id past the vocabulary: none) names."""
    import torch

    hits = torch.zeros((vocab,), dtype=torch.float32, device=ids.device)
    weights = ((ids >= 0) & (ids < vocab)).to(torch.float32)
    return hits.scatter_add(0, ids.clamp(0, vocab - 1).to(torch.int64), weights) > 0


def _rows_mask(ids: Any, weights: Any, vocab: int) -> Any:
    """``[rows, vocab]`` float: per row, the sum of ``weights`` ``[rows, n]`` at token ``ids`` ``[rows, n]``
    (ids outside the vocabulary count nowhere)."""
    import torch

    hits = torch.zeros((ids.shape[0], vocab), dtype=torch.float32, device=ids.device)
    inside = ((ids >= 0) & (ids < vocab)).to(torch.float32)
    return hits.scatter_add(
        1, ids.clamp(0, vocab - 1).to(torch.int64), weights.to(torch.float32) * inside
    )


def _last_tokens(history: History, count: int) -> Any:
    """``[rows, count]``: the last ``count`` tokens so far, -1 where there is none (before the input)."""
    import torch

    columns = history.end - count + torch.arange(count, device=history.ids.device)
    inside = columns >= 0
    columns = columns.clamp(min=0).to(torch.int64)[None].expand(history.ids.shape[0], count)
    tokens = history.ids.gather(1, columns)
    valid = history.present.gather(1, columns) & inside[None]
    return torch.where(valid, tokens, torch.full_like(tokens, -1))


def _min_length_twin(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    eos = token_mask(a["eos"], scores.shape[-1])
    return scores.masked_fill(eos[None] & (history.length < a["min_length"]), -float("inf"))


def _forced(scores: Any, ids: Any, when: Any) -> Any:
    import torch

    forced = torch.where(token_mask(ids, scores.shape[-1])[None], 0.0, -float("inf")).to(
        scores.dtype
    )
    return torch.where(when, forced.expand_as(scores), scores)


def _forced_bos(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    return _forced(scores, a["ids"], history.length == 1)


def _forced_eos(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    return _forced(scores, a["ids"], history.length == a["max_length"] - 1)


def _suppress_twin(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    return scores.masked_fill(token_mask(a["ids"], scores.shape[-1])[None], -float("inf"))


def _suppress_at_begin_twin(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    suppressed = token_mask(a["ids"], scores.shape[-1])[None] & (history.length == a["begin"])
    return scores.masked_fill(suppressed, -float("inf"))


def _remove_invalid(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    import torch

    finfo = torch.finfo(scores.dtype)
    scores = torch.where(scores != scores, torch.zeros_like(scores), scores)
    scores = torch.where(scores == float("inf"), torch.full_like(scores, finfo.max), scores)
    return torch.where(scores == -float("inf"), torch.full_like(scores, finfo.min), scores)


def _repetition_penalty(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    import torch

    seen = _rows_mask(history.ids, history.valid, scores.shape[-1]) > 0
    penalty = a["value"]
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    return torch.where(seen, penalized, scores)


def _no_repeat_ngram(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    """Ban every token that would complete an n-gram the valid history already holds."""
    import torch

    (n,) = shape
    ids, valid = history.ids, history.present
    starts = ids.shape[1] - n + 1
    if starts <= 0:
        return scores
    windows = torch.stack([ids[:, j : starts + j] for j in range(n)], dim=-1)  # [rows, starts, n]
    complete = torch.stack([valid[:, j : starts + j] for j in range(n)], dim=-1).all(-1)
    last = _last_tokens(history, n - 1)  # [rows, n - 1]; -1 never equals a token
    same = (windows[..., : n - 1] == last[:, None, :]).all(-1) if n > 1 else complete
    banned = _rows_mask(windows[..., n - 1], (same & complete).to(torch.float32), scores.shape[-1])
    return scores.masked_fill(banned > 0, -float("inf"))


def _encoder_no_repeat_ngram_twin(
    scores: Any, a: dict[str, Any], shape: tuple, history: History
) -> Any:
    """Ban every token that would complete an n-gram of the row's encoder input."""
    import torch

    (n,) = shape
    grams = a["grams"]
    # Rows past the request's (hfax's bucket filler) read the last row's n-grams; their tokens are dropped.
    rows = torch.arange(scores.shape[0], device=scores.device).clamp(max=grams.shape[0] - 1)
    grams = grams.index_select(0, rows)  # [rows, count, n]
    last = _last_tokens(history, n - 1)  # [rows, n - 1]; -1 never equals a token
    same = (grams[..., : n - 1] == last[:, None, :]).all(-1) & (grams[..., n - 1] >= 0)
    banned = _rows_mask(grams[..., n - 1], same.to(torch.float32), scores.shape[-1])
    return scores.masked_fill(banned > 0, -float("inf"))


def _sequence_bias_twin(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    import torch

    count, width = shape
    prefixes = a["prefixes"]  # [count, width - 1]
    last = _last_tokens(history, width - 1)  # [rows, width - 1]
    matches = ((last[:, None, :] == prefixes[None]) | (prefixes[None] == -2)).all(-1)
    tokens = a["tokens"][None].expand(scores.shape[0], count)
    bias = torch.where(matches, a["bias"][None], torch.zeros_like(matches, dtype=torch.float32))
    return scores + _rows_mask(tokens, bias, scores.shape[-1]).to(scores.dtype)


def _temperature(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    return scores / a["value"]


def _kth_largest(scores: Any, k: Any) -> Any:
    """``[rows, 1]``: each row's ``k``-th largest score (``k`` a 0-d tensor in [1, vocab])."""
    import torch

    descending = torch.sort(scores, dim=-1, descending=True).values
    index = (k - 1).to(torch.int64).reshape(1, 1).expand(scores.shape[0], 1)
    return descending.gather(1, index)


def _top_k_twin(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    k = a["value"].clamp(1, scores.shape[-1])
    return scores.masked_fill(scores < _kth_largest(scores, k), -float("inf"))


def _keep_first(remove_sorted: Any, keep: int, from_end: bool) -> Any:
    """``remove_sorted`` with the ``keep`` best-ranked entries never removed (at the end of an ascending
    sort, at the start of a descending one)."""
    import torch

    vocab = remove_sorted.shape[-1]
    columns = torch.arange(vocab, device=remove_sorted.device)
    kept = columns >= vocab - keep if from_end else columns < keep
    return remove_sorted & ~kept[None]


def _unsort(remove_sorted: Any, order: Any) -> Any:
    return remove_sorted.scatter(1, order, remove_sorted)


#: Halvings of :func:`_top_p`'s score interval: a range of 50 over 2**32 is below a float32 score's own
#: resolution (1.2e-7 at 1.0), so two tokens the bisection cannot tell apart hardly differ in score.
_TOP_P_HALVINGS = 32


def _top_p(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    """transformers sorts the scores and removes the ascending run whose probabilities sum to at most
    ``1 - top_p``: every token scored at most the highest score ``t`` whose mass (the probabilities of the
    tokens scored at most ``t``) is not above ``1 - top_p``. Here ``t`` is bisected between the lowest
    finite score and the highest: 32 masked sums over the vocabulary, where a sort and its scatter cost more
    than a small model's whole forward on XLA:CPU, and grow as ``V log V``. Tokens of one score at the edge
    are kept or removed together; a sort splits them in the order it happens to leave them."""
    import torch

    probs = scores.softmax(dim=-1, dtype=torch.float32)
    limit = 1 - a["value"]
    finite = torch.where(torch.isfinite(scores), scores, float("inf"))
    # The mass up to `low` is nothing (only -inf scores), the mass up to `high` everything.
    low = finite.amin(dim=-1, keepdim=True) - 1
    high = scores.amax(dim=-1, keepdim=True)
    for _ in range(_TOP_P_HALVINGS):
        middle = (low + high) / 2
        mass = torch.where(scores <= middle, probs, 0).sum(-1, keepdim=True)
        fits = mass <= limit
        low, high = torch.where(fits, middle, low), torch.where(fits, high, middle)
    likeliest = torch.topk(scores, shape[0], dim=-1).values[..., -1:]
    return scores.masked_fill((scores <= low) & (scores < likeliest), -float("inf"))


def _min_p(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    import torch

    probs = torch.softmax(scores, dim=-1)
    remove = probs < a["value"] * probs.amax(dim=-1, keepdim=True)
    order = torch.sort(scores, dim=-1, descending=True).indices
    remove = _keep_first(remove.gather(1, order), shape[0], from_end=False)
    return scores.masked_fill(_unsort(remove, order), -float("inf"))


def _typical(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    import torch

    normalized = torch.log_softmax(scores, dim=-1)
    p = torch.exp(normalized)
    terms = normalized * p
    entropy = -torch.where(terms == terms, terms, torch.zeros_like(terms)).sum(-1, keepdim=True)
    shifted = torch.abs(-normalized - entropy)
    sorted_scores, order = torch.sort(shifted, dim=-1)
    cumulative = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < a["value"]).sum(dim=1).clamp(max=scores.shape[-1] - 1)
    remove = sorted_scores > sorted_scores.gather(1, last.to(torch.int64).view(-1, 1))
    remove = _keep_first(remove, shape[0], from_end=False)
    return scores.masked_fill(_unsort(remove, order), -float("inf"))


def _below_keeping(scores: Any, remove: Any, keep: int) -> Any:
    """``remove``, except the ``keep`` highest scores of each row."""
    import torch

    kth = _kth_largest(scores, torch.tensor(min(keep, scores.shape[-1]), device=scores.device))
    return scores.masked_fill(remove & (scores < kth), -float("inf"))


def _epsilon(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    return _below_keeping(scores, scores.softmax(dim=-1) < a["value"], shape[0])


def _eta(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    import torch

    logp = torch.log_softmax(scores, dim=-1)
    p = torch.exp(logp)
    entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)
    epsilon = a["value"]
    eta = torch.minimum(epsilon, torch.sqrt(epsilon) * torch.exp(-entropy))[..., None]
    return _below_keeping(scores, p < eta, shape[0])


def _normalize(scores: Any, a: dict[str, Any], shape: tuple, history: History) -> Any:
    return scores.log_softmax(dim=-1)


_TWINS = {
    "sequence_bias": _sequence_bias_twin,
    "repetition_penalty": _repetition_penalty,
    "no_repeat_ngram": _no_repeat_ngram,
    "encoder_no_repeat_ngram": _encoder_no_repeat_ngram_twin,
    "min_length": _min_length_twin,
    "forced_bos": _forced_bos,
    "forced_eos": _forced_eos,
    "remove_invalid": _remove_invalid,
    "suppress": _suppress_twin,
    "suppress_at_begin": _suppress_at_begin_twin,
    "temperature": _temperature,
    "top_k": _top_k_twin,
    "top_p": _top_p,
    "min_p": _min_p,
    "typical": _typical,
    "epsilon": _epsilon,
    "eta": _eta,
    "normalize": _normalize,
}
