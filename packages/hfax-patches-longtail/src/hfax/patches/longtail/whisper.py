"""Whisper's ``generate``: a decoder prompt of special tokens, its own options, its own result.

transformers' ``WhisperForConditionalGeneration.generate`` builds the decoder prompt (the start token,
then the language and task tokens) from the audio features and its own arguments (``language``,
``task``, ...) unless the call gives ``decoder_input_ids``, sets the generated length by its own rule (20
new tokens by default), samples only at a ``temperature`` above 0 that the call gives (``do_sample`` is
not read), runs each input ``num_return_sequences`` times (a beam search then returns its best hypothesis
per run), and returns the new tokens without the prompt, or with ``force_unique_generate_call`` and with
``return_dict_in_generate`` the output of its one underlying ``generate`` call, re-assembled row by row.
hfax's generate does the same through this family's traits
(:class:`~hfax.generation.traits.GenerationTraits`), calling transformers' Whisper methods for the
prompt; the long-form and timestamp features it does not run are refused by name. The tests:
``test_whisper_*`` in ``packages/hfax-jax/tests/test_generate_multimodal.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hfax.generation.traits import GenerationTraits, Outcome

#: Whisper's ``generate`` arguments hfax honours, and those it refuses (long-form and timestamp features).
TAKEN = (
    "language", "task", "is_multilingual", "return_timestamps", "temperature",
    "force_unique_generate_call",
)  # fmt: skip
REFUSED = {
    "prompt_ids": "prompting Whisper with previous text is not implemented",
    "prompt_condition_type": "prompting Whisper with previous text is not implemented",
    "condition_on_prev_tokens": "long-form transcription is not implemented",
    "compression_ratio_threshold": "temperature fallback is not implemented",
    "logprob_threshold": "temperature fallback is not implemented",
    "no_speech_threshold": "no-speech detection is not implemented",
    "return_token_timestamps": "token timestamps are not implemented",
    "return_segments": "long-form transcription is not implemented",
    "time_precision": "timestamps are not implemented",
    "time_precision_features": "timestamps are not implemented",
    "num_segment_frames": "long-form transcription is not implemented",
    "monitor_progress": "long-form transcription is not implemented",
}
#: The fields of Whisper's ``return_dict_in_generate`` output that hold one entry per decoder row and step.
PER_STEP = ("logits", "decoder_attentions", "cross_attentions", "decoder_hidden_states")


def generation_traits(model: Any, config: Any) -> GenerationTraits | None:
    """Traits of a model that generates the way transformers' Whisper does (``_retrieve_init_tokens``)."""
    if not callable(getattr(model, "_retrieve_init_tokens", None)):
        return None
    return GenerationTraits(
        options=TAKEN,
        refused_options=REFUSED,
        configure=configure,
        decoder_prompt=prompt,
        result=result,
    )


def configure(module: Any, config: Any, taken: dict[str, Any]) -> None:
    """Whisper's sampling rule: it samples at the first of the call's ``temperature`` (one, or a list
    it falls back along only with thresholds, which hfax refuses) when above 0, with one beam, and
    otherwise searches at temperature 1, whatever ``do_sample`` says; ``force_unique_generate_call`` not
    given is the generation config's, as there."""
    if taken["force_unique_generate_call"] is None:
        taken["force_unique_generate_call"] = getattr(config, "force_unique_generate_call", False)
    temperature = taken["temperature"]
    if isinstance(temperature, (list, tuple)):
        temperature = temperature[0] if temperature else None
    config.do_sample = temperature is not None and temperature > 0.0
    config.temperature = temperature if config.do_sample else 1.0
    if config.do_sample:
        config.num_beams = 1


def prompt(
    module: Any,
    config: Any,
    source: dict[str, np.ndarray],
    taken: dict[str, Any],
    given: np.ndarray | None,
) -> np.ndarray:
    """Whisper's decoder prompt for the encoder's ``input_features`` (``[batch, mel bins, frames]``): the
    start token, then the language and task tokens, as transformers'
    ``WhisperForConditionalGeneration.generate`` builds them for short-form audio, or the call's
    ``decoder_input_ids`` (``given``) as they are; ``config``'s lengths are set as it sets them. With
    ``num_return_sequences`` above 1, each row of ``source`` is repeated that many times (in place) and
    the config asks for one sequence per row, as there."""
    import torch

    features = source["input_features"]
    encoder = module.model.encoder
    stride = encoder.conv1.stride[0] * encoder.conv2.stride[0]
    segment = stride * module.config.max_source_positions
    if features.ndim != 3 or features.shape[-1] != segment:
        raise ValueError(
            f"input_features has shape {features.shape}; this Whisper reads [batch, "
            f"{module.config.num_mel_bins}, {segment}] (30 s of audio, as its feature extractor pads it). "
            "Long-form audio (more frames) is not implemented: split it into 30 s windows"
        )
    return_timestamps = taken["return_timestamps"]
    if return_timestamps is None:
        return_timestamps = getattr(config, "return_timestamps", None)
    if return_timestamps:
        raise NotImplementedError(
            "hfax's generate does not run Whisper with return_timestamps=True (its timestamp logits "
            "processor branches on Python values); pass return_timestamps=False"
        )
    module._set_return_timestamps(
        return_timestamps=False, is_shortform=True, generation_config=config
    )
    module._set_language_and_task(
        language=taken["language"],
        task=taken["task"],
        is_multilingual=taken["is_multilingual"],
        generation_config=config,
    )
    if getattr(config, "language", None) is None and hasattr(config, "lang_to_id"):
        raise NotImplementedError(
            "hfax's generate does not detect Whisper's language (transformers runs the model on the CPU "
            "for it); pass language= (e.g. language='en')"
        )
    batch = features.shape[0]
    init = type(module)._retrieve_init_tokens(
        _OnCpu(module),
        torch.from_numpy(features),
        batch_size=batch,
        generation_config=config,
        config=module.config,
        num_segment_frames=segment,
        kwargs={},
    )
    repeats = config.num_return_sequences or 1
    # Each input is decoded num_return_sequences times, each run returning one sequence.
    if repeats > 1:
        for name, value in source.items():
            source[name] = np.repeat(value, repeats, axis=0)
        init = init.repeat_interleave(repeats, dim=0)
        config.num_return_sequences = 1
    if given is not None:  # the caller's, taken as they are
        init = torch.from_numpy(np.asarray(given, np.int64))
    module._set_max_new_tokens_and_length(
        config=module.config, decoder_input_ids=init, generation_config=config
    )
    return init.numpy().astype(np.int64)


class _OnCpu:
    """``module`` as transformers' Whisper helpers see it, on the CPU: they make their tensors on the module's
    device, which is the backend's (whose tensors only its runtime makes)."""

    def __init__(self, module: Any) -> None:
        self._module = module

    @property
    def device(self) -> Any:
        import torch

        return torch.device("cpu")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def result(outcome: Outcome) -> tuple[np.ndarray, dict[str, Any] | None]:
    """Whisper's ``generate`` result. Returning the sequences alone, without
    ``force_unique_generate_call``: the prompt cut, each row's padding and final EOS cut as transformers
    cuts them, rows right-padded to the longest (with it: the sequences as they are). With
    ``return_dict_in_generate``: the output of its one ``generate`` call split into rows and stacked again
    (``_postprocess_outputs``, ``_stack_split_outputs``), which keeps the first row of each per-step field
    for every sequence (beam search's per-beam rows cut to as many as the sequences), gives each sequence
    the scores of the beam its ``beam_indices`` name at each step, and keeps the encoder's outputs and the
    cache of every ``num_return_sequences``-th run."""
    sequences, fields = outcome.sequences, outcome.fields
    if fields is None:
        if outcome.options["force_unique_generate_call"]:
            return sequences, None
        return _cut(sequences, outcome.width, outcome.eos, outcome.pad), None
    rows, fields = len(sequences), dict(fields)
    beams = fields.get("beam_indices")
    if fields.get("scores") is not None:
        scores = fields["scores"]
        fields["scores"] = (
            [step[:rows] for step in scores]
            if beams is None
            else [step[beams[:, index]] for index, step in enumerate(scores[: beams.shape[1]])]
        )
    for name in PER_STEP:
        if fields.get(name) is not None:
            fields[name] = [_rows(step, rows) for step in fields[name]]
    for name in ("encoder_attentions", "encoder_hidden_states"):
        if fields.get(name) is not None:
            fields[name] = [layer[:rows][:: outcome.repeats] for layer in fields[name]]
    if fields.get("past_key_values") is not None:
        fields["past_key_values"] = _cache_rows(fields["past_key_values"], rows)
    return sequences, fields


def _rows(step: Any, rows: int) -> Any:
    """One step's per-layer outputs (or a ``[rows, ...]`` array), cut to the first ``rows`` rows."""
    if isinstance(step, (list, tuple)):
        return tuple(layer[:rows] for layer in step)
    return step[:rows]


def _cache_rows(cache: Any, rows: int) -> Any:
    """An ``EncoderDecoderCache`` of its first ``rows`` rows, rebuilt as transformers' Whisper rebuilds it
    (from per-layer key and value tensors)."""
    from transformers.cache_utils import EncoderDecoderCache

    layers = zip(cache.self_attention_cache.layers, cache.cross_attention_cache.layers)
    return EncoderDecoderCache(
        tuple(
            (own.keys[:rows], own.values[:rows], cross.keys[:rows], cross.values[:rows])
            for own, cross in layers
        )
    )


def _cut(sequences: np.ndarray, width: int, eos: list[int], pad: int) -> np.ndarray:
    """The new tokens of each row, its padding and final EOS cut as transformers cuts them, then rows
    right-padded with ``pad`` to the longest."""
    rows = []
    for row in sequences[:, width:]:
        if row.size and row[-1] == pad:  # transformers removes as many tokens as the row has pads
            count = int((row == pad).sum()) - (1 if pad in eos else 0)
            row = row[: row.size - count] if count else row
        if row.size and row[-1] in eos:
            row = row[:-1]
        rows.append(row)
    longest = max((row.size for row in rows), default=0)
    result = np.full((len(rows), longest), pad, np.int64)
    for index, row in enumerate(rows):
        result[index, : row.size] = row
    return result
