"""What every backend's ``generate`` shares: argument resolution and validation with transformers' semantics,
shape buckets, prompt padding and the statistics of the last call.

Backend-neutral: numpy and the model's config only, so a backend's compiled programs see the same inputs
and users get the same errors whichever backend they run. No torch or jax is imported here.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, Collection

import numpy as np

#: Prompt lengths and new-token counts are padded to powers of two from here, so few programs serve all.
MIN_LENGTH_BUCKET = 16
#: How many tokens a streamer receives at a time (one host sync per chunk).
STREAM_CHUNK = 8

_DEFAULTS = {
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_new_tokens": 0,
    "eos_token_id": None,
    "pad_token_id": None,
    "max_new_tokens": None,
    "seed": 0,
}
#: Settings a backend may implement (it names them to :func:`resolve`), with their defaults.
OPTIONAL = {
    "forced_eos_token_id": -1,  # the last new token is this one (BART-family generation configs)
    "forced_bos_token_id": -1,  # the first new token of an encoder-decoder is this one
    "decoder_start_token_id": None,  # an encoder-decoder's decoder starts from this token
    "begin_suppress_tokens": [],  # never the first new token (Whisper)
}
#: generation_config settings that change tokens, with their neutral values; a backend that does not implement
#: one warns when a model's generation config sets it.
UNSUPPORTED = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "sequence_bias": None,
    "num_beams": 1,
}


def bucket(n: int, minimum: int) -> int:
    """The smallest power-of-two multiple of ``minimum`` that holds ``n``."""
    size = minimum
    while size < n:
        size *= 2
    return size


@dataclasses.dataclass
class GenerateStats:
    """What the last ``generate`` call did: tokens, wall time, and the compilation inside it."""

    new_tokens: int
    seconds: float
    compile_seconds: float
    compiles: int

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of running (compile and trace time excluded)."""
        running = self.seconds - self.compile_seconds
        return self.new_tokens / running if running > 0 else float("nan")


def as_ids(name: str, value: Any) -> np.ndarray:
    """Token ids (numpy, torch, JAX, lists) as an int64 ``[batch, length]`` array, or a clear error."""
    if hasattr(value, "detach"):  # a torch tensor, on any device
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {array.shape}")
    if (
        array.size
        and not np.issubdtype(array.dtype, np.integer)
        and not np.issubdtype(array.dtype, np.bool_)
    ):
        raise TypeError(
            f"{name} must hold integers, got dtype {array.dtype}; pass token ids from the tokenizer"
        )
    return array.astype(np.int64)


def _eos_list(eos: Any) -> list[int]:
    if eos is None:
        return []
    if isinstance(eos, (list, tuple, np.ndarray)):
        return [int(e) for e in eos]
    return [int(eos)]


def resolve(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    settings: dict[str, Any],
    optional: Collection[str] = (),
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Fill defaults from the model's generation config and reject bad input before anything compiles.

    ``settings`` are generate's keyword arguments other than ``streamer`` (``None``: unset); an unknown one is
    a ``TypeError``. ``optional`` names the settings of :data:`OPTIONAL` the backend implements; the others
    are unknown, and a generation config setting them (or anything of :data:`UNSUPPORTED`) gets a warning
    that the tokens may differ from transformers'. ``model`` has ``generation_config``, ``config`` and
    ``module`` (the transformers model). Returns the ids, a boolean mask (inferred from the pad token when
    not given, as transformers does) and every setting of ``generate`` filled in; ``eos_token_id`` becomes
    a list.
    """
    unknown_optional = sorted(set(optional) - set(OPTIONAL))
    if unknown_optional:
        raise ValueError(
            f"resolve(optional=...) names {unknown_optional}; the optional settings are {sorted(OPTIONAL)}"
        )
    defaults = {**_DEFAULTS, **{key: OPTIONAL[key] for key in optional}}
    unknown = sorted(set(settings) - set(defaults))
    if unknown:
        raise TypeError(
            f"generate() got an unexpected keyword argument {unknown[0]!r}; it takes {sorted(defaults)} and streamer"
        )
    config = model.generation_config
    ignored = {
        key: OPTIONAL[key]
        for key in ("forced_eos_token_id", "begin_suppress_tokens")
        if key not in optional
    }
    _warn_unsupported(config, {**UNSUPPORTED, **ignored})
    s = {key: settings.get(key) for key in defaults}
    for key, default in defaults.items():
        if s[key] is None:
            s[key] = getattr(config, key, None) if key != "seed" else None
        if s[key] is None:
            s[key] = default
    ids = as_ids("input_ids", input_ids)
    if s["max_new_tokens"] is None:
        s["max_new_tokens"] = max(int(getattr(config, "max_length", None) or 20) - ids.shape[1], 0)
    max_new = s["max_new_tokens"]
    if isinstance(max_new, bool) or not isinstance(max_new, (int, np.integer)) or max_new < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new!r}")
    if s["do_sample"] and not s["temperature"] > 0:
        raise ValueError(
            f"temperature must be > 0 when sampling, got {s['temperature']!r}; use do_sample=False for greedy"
        )
    if not 0 < s["top_p"] <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {s['top_p']!r}")
    if (
        isinstance(s["top_k"], bool)
        or not isinstance(s["top_k"], (int, np.integer))
        or s["top_k"] < 0
    ):
        raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {s['top_k']!r}")
    if s["min_new_tokens"] < 0:
        raise ValueError(f"min_new_tokens must be >= 0, got {s['min_new_tokens']!r}")
    vocab = model.module.get_input_embeddings().num_embeddings
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise ValueError(
            f"token id {bad} is outside the vocabulary [0, {vocab}); check the tokenizer matches the model"
        )
    max_positions = getattr(model.config, "max_position_embeddings", None)
    decoded = (
        1 + max_new if is_encoder_decoder(model) else ids.shape[1] + max_new
    )  # the decoder's tokens
    if (
        max_positions and max_positions > 0 and max(decoded, ids.shape[1]) > max_positions
    ):  # -1: unbounded (XLNet)
        raise ValueError(
            f"prompt ({ids.shape[1]} tokens) and max_new_tokens ({max_new}) need {max(decoded, ids.shape[1])} positions, "
            f"more than the model's max_position_embeddings ({max_positions}); shorten the prompt or ask for fewer tokens"
        )
    eos = _eos_list(s["eos_token_id"])
    if s["pad_token_id"] is None or s["pad_token_id"] == []:
        s["pad_token_id"] = eos[0] if eos else 0
    s["eos_token_id"] = eos
    if attention_mask is None:
        # transformers infers padding from the pad token when it cannot be mistaken for EOS.
        pad = s["pad_token_id"]
        infer = pad is not None and pad not in eos and (ids == pad).any()
        mask = (ids != pad) if infer else np.ones_like(ids, dtype=bool)
    else:
        mask = as_ids("attention_mask", attention_mask)
        if mask.shape != ids.shape:
            raise ValueError(f"attention_mask has shape {mask.shape} but input_ids has {ids.shape}")
        if not np.isin(mask, (0, 1)).all():
            raise ValueError("attention_mask must hold only 0 and 1")
        mask = mask.astype(bool)
    return ids, mask, s


def _warn_unsupported(config: Any, neutral_values: dict[str, Any]) -> None:
    for key, neutral in neutral_values.items():
        value = getattr(config, key, neutral)
        if value not in (neutral, None, 0, -1, [], {}):
            warnings.warn(
                f"hfax's generate ignores generation_config.{key}={value!r}; its tokens may differ from transformers'",
                UserWarning,
                stacklevel=4,
            )


def is_encoder_decoder(model: Any) -> bool:
    """Whether ``model`` (anything with a transformers ``config``) is an encoder-decoder (T5, BART, ...)."""
    return bool(getattr(model.config, "is_encoder_decoder", False))


def decoder_start(model: Any, ids: np.ndarray, s: dict[str, Any]) -> np.ndarray:
    """An encoder-decoder's first decoder tokens ``[batch, 1]``, as transformers picks them: the setting
    ``decoder_start_token_id``, else the config's, else the generation config's BOS."""
    for value in (
        s.get("decoder_start_token_id"),
        getattr(model.config, "decoder_start_token_id", None),
        getattr(model.generation_config, "bos_token_id", None),
    ):
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return np.full((ids.shape[0], 1), int(value), np.int64)
    raise ValueError(
        f"{type(model.module).__name__} is an encoder-decoder without a decoder_start_token_id (or bos_token_id) in "
        "its generation config; set model.generation_config.decoder_start_token_id"
    )


def check_streamer(streamer: Any) -> None:
    """Reject a streamer without ``put`` and ``end`` before anything runs."""
    if streamer is not None and not (
        callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))
    ):
        raise TypeError(
            "streamer must have put() and end() methods, like transformers.TextStreamer"
        )


def pad_prompts(
    ids: np.ndarray,
    mask: np.ndarray,
    pad_token_id: int,
    row_multiple: int = 1,
    *,
    length: int | None = None,
    left: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Pad a batch into its bucket: rows to a power of two (times ``row_multiple``), length to ``length`` or
    else a power-of-two multiple of :data:`MIN_LENGTH_BUCKET`, on the left (or the right: an encoder's input,
    whose positions count from its first token). Filler rows repeat row 0 and are discarded after."""
    batch, width = ids.shape
    batch_size = -(-bucket(batch, 1) // row_multiple) * row_multiple
    size = bucket(width, MIN_LENGTH_BUCKET) if length is None else length
    if size < width:
        raise ValueError(f"cannot pad {width} tokens into {size}")
    padded_ids = np.full((batch_size, size), pad_token_id, np.int32)
    padded_mask = np.zeros((batch_size, size), bool)
    columns = slice(size - width, size) if left else slice(0, width)
    padded_ids[:batch, columns], padded_mask[:batch, columns] = ids, mask
    padded_ids[batch:], padded_mask[batch:] = padded_ids[0], padded_mask[0]
    return padded_ids, padded_mask


def accepts(module: Any, argument: str) -> bool:
    """Whether a transformers model's ``forward`` names ``argument`` (``position_ids``, ``logits_to_keep``, ...).

    One reaching only ``**kwargs`` may be ignored: transformers' BART-style decoders take ``position_ids``
    there and count positions from the cache themselves.
    """
    return argument in inspect.signature(module.forward).parameters
