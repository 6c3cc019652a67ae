"""Whisper's ``generate``: a decoder prompt of special tokens, its own options, its own result.

transformers' ``WhisperForConditionalGeneration.generate`` builds the decoder prompt (the start token,
then the language and task tokens) from the audio features and its own arguments (``language``,
``task``, ...), sets the generated length by its own rule (20 new tokens by default), and returns the new
tokens without the prompt. hfax's generate does the same through this family's traits
(:class:`~hfax.generation.traits.GenerationTraits`), calling transformers' Whisper methods for the
prompt; the long-form and timestamp features it does not run are refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hfax.generation.traits import GenerationTraits

#: Whisper's ``generate`` arguments hfax honours, and those it refuses (long-form and timestamp features).
TAKEN = ("language", "task", "is_multilingual", "return_timestamps")
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
    "force_unique_generate_call": "hfax makes one call already",
    "monitor_progress": "long-form transcription is not implemented",
}


def generation_traits(model: Any, config: Any) -> GenerationTraits | None:
    """Traits of a model that generates the way transformers' Whisper does (``_retrieve_init_tokens``)."""
    if not callable(getattr(model, "_retrieve_init_tokens", None)):
        return None
    return GenerationTraits(
        options=TAKEN, refused_options=REFUSED, decoder_prompt=prompt, result=result
    )


def prompt(
    module: Any, config: Any, source: dict[str, np.ndarray], taken: dict[str, Any]
) -> np.ndarray:
    """Whisper's decoder prompt for the encoder's ``input_features`` (``[batch, mel bins, frames]``): the
    start token, then the language and task tokens, as transformers'
    ``WhisperForConditionalGeneration.generate`` builds them for short-form audio; ``config``'s lengths
    are set as it sets them."""
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


def result(sequences: np.ndarray, width: int, eos: list[int], pad: int) -> np.ndarray:
    """Whisper's ``generate`` result from the decoder's sequences: the prompt cut, each row's padding and
    final EOS cut as transformers cuts them, then rows right-padded with ``pad`` to the longest."""
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
