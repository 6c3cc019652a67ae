"""A ``generate`` call's settings, decided by transformers itself, then checked against what hfax runs.

transformers' own ``GenerationMixin`` methods, called on the PyTorch module the backend holds, merge the
call's keyword arguments with ``generation_config=`` and the model's generation config, validate them,
pick the special tokens and the generated length, and build the logits processors and stopping criteria
exactly as ``transformers.GenerationMixin.generate`` would. hfax then refuses, before anything compiles,
what it cannot run: every setting either reaches the compiled loop or is named in an error.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from hfax.generation import host_choice, layer_outputs, loaded_cache, outputs, processors
from hfax.generation import inputs as model_inputs
from hfax.generation.shapes import as_ids
from hfax.generation.traits import GenerationTraits, Outcome, generation_traits

#: Arguments of transformers' ``generate`` that hfax cannot honour inside a compiled loop, with why.
REFUSED_ARGUMENTS = {
    "assistant_model": "assisted decoding is not implemented",
    "negative_prompt_ids": "classifier-free guidance is not implemented",
    "negative_prompt_attention_mask": "classifier-free guidance is not implemented",
    "custom_generate": "hfax runs its own compiled loop",
    "synced_gpus": "hfax's loop is one program on every device already",
}
#: transformers' processors that even the host cannot run (:mod:`hfax.generation.host_choice`), with why.
HOST_REFUSED = {
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "classifier-free guidance (guidance_scale) runs the "
    "model's PyTorch forward inside the processor, which hfax's model does not run on the host",
}
#: Generation-config fields that change what comes out but build no processor, with why they are refused.
REFUSED_FIELDS = {
    "token_healing": "token healing is not implemented",
    "low_memory": "transformers itself no longer supports it",
}
#: Criteria generate builds from its settings, each handled by the compiled loop (length, EOS) or between
#: its chunks on the host (stop strings, time), with the setting that builds it.
CRITERIA = {
    "MaxLengthCriteria": "max_new_tokens or max_length",
    "EosTokenCriteria": "eos_token_id",
    "StopStringCriteria": "stop_strings",
    "MaxTimeCriteria": "max_time",
}
#: What an engine records for ``return_dict_in_generate`` beyond scores and logits, by the field that asks
#: (:mod:`hfax.generation.layer_outputs`), and the backend feature it needs.
LAYER_OUTPUTS = {"output_hidden_states": "layer_outputs", "output_attentions": "layer_outputs"}
#: transformers' generation modes hfax runs, and the backend feature each needs.
MODES = {"greedy_search": None, "sample": None, "beam_search": "beams", "beam_sample": "beams"}


@dataclasses.dataclass
class Request:
    """Everything a ``generate`` call asks for, settled on the host.

    ``ids``/``mask`` are the decoder's prompt rows after expansion (``expand`` rows per caller row: the
    beams or the returned sequences), ``source`` the encoder's inputs by ``forward`` name for an
    encoder-decoder (``input_ids`` and ``attention_mask``, or ``input_features``), ``inputs`` a decoder-only
    model's other inputs (images, their sizes, token types: :mod:`hfax.generation.inputs`), run in prefill.
    ``width`` is the length transformers counts as the input (``cur_len`` before the first new token):
    the prompt's, or 0 for a prompt given as ``inputs_embeds`` alone, whose ``ids`` are then placeholders
    (its embeddings reach the model in prefill, among ``inputs``; the result and the processors see only
    the new tokens, as in transformers).
    ``steps`` are the logits processors (:mod:`hfax.generation.processors`), the caller's own
    ``logits_processor`` among them; ``criteria`` the stopping criteria checked on the host between chunks
    (transformers' ``StopStringCriteria`` and the caller's own ``stopping_criteria``), empty if none;
    ``pad_stopped`` whether a row they stop is padded from there on (transformers pads only when its
    criteria include an EOS one, one with ``eos_token_id``) or runs on until every row is done.
    ``finish(sequences, fields) -> (sequences, fields)`` turns the sequences and the other output fields
    (``None`` without ``return_dict_in_generate``) into the model's own result where its ``generate``
    differs (its family's :attr:`~hfax.generation.traits.GenerationTraits.result`). ``cache`` is the caller's transformers
    ``Cache`` of the prompt's first ``cached`` tokens (an earlier result's ``past_key_values``; an
    encoder-decoder's ``EncoderDecoderCache`` of its decoder prompt's). ``held`` are its layers' keys and
    values, read on the host and expanded with the rows, where the engine loads them
    (:mod:`hfax.generation.loaded_cache`); else (``None``) the prefill computes those tokens again from
    the ids and the driver checks they are the cache's.
    ``host`` chooses the tokens on the host when a processor has no compiled twin (``steps`` is then
    empty: :mod:`hfax.generation.host_choice`).
    """

    ids: np.ndarray
    mask: np.ndarray
    source: dict[str, np.ndarray] | None
    batch: int
    expand: int
    config: Any
    width: int
    max_new: int
    eos: list[int]
    pad: int | None
    filler: int
    do_sample: bool
    num_beams: int
    seed: int
    steps: tuple[processors.Step, ...]
    criteria: tuple[Any, ...] = ()
    pad_stopped: bool = True
    deadline: float | None = None
    vocab: int = 0
    inputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    finish: Any = None
    cache: Any = None
    cached: int = 0
    held: tuple[loaded_cache.HeldLayer, ...] | None = None
    host: host_choice.HostChoice | None = None

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    @property
    def head(self) -> np.ndarray:
        """The ids the result starts with: the prompt's (none for ``inputs_embeds`` alone)."""
        return self.ids[:, self.ids.shape[1] - self.width :]


def _family_options(
    module: Any, traits: GenerationTraits, options: dict[str, Any]
) -> dict[str, Any]:
    """Take the ``generate`` arguments of the model's own ``generate`` (its family's traits) out of
    ``options``; refuse those its family says hfax does not run."""
    for name, why in traits.refused_options.items():
        if options.pop(name, None) is not None:
            raise NotImplementedError(
                f"hfax's generate does not take {name} for {type(module).__name__}: {why}"
            )
    return {name: options.pop(name, None) for name in traits.options}


def _refuse_arguments(options: dict[str, Any]) -> None:
    for name, why in REFUSED_ARGUMENTS.items():
        value = options.pop(name, None)
        if (
            value is not None
            and value is not False
            and not (hasattr(value, "__len__") and not len(value))
        ):
            raise NotImplementedError(f"hfax's generate does not take {name}: {why}")


def _check_fields(config: Any, features: frozenset[str]) -> str:
    """The generation mode, after refusing what hfax cannot run."""
    for name, why in REFUSED_FIELDS.items():
        if getattr(config, name, None):
            raise NotImplementedError(
                f"hfax's generate does not support {name}={getattr(config, name)!r}: {why}"
            )
    if not isinstance(config.num_beams, int) or config.num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1, got {config.num_beams!r}")
    if not isinstance(config.num_return_sequences, int) or config.num_return_sequences < 1:
        raise ValueError(
            f"num_return_sequences must be an integer >= 1, got {config.num_return_sequences!r}"
        )
    mode = str(getattr(config.get_generation_mode(), "value", config.get_generation_mode()))
    if mode not in MODES:
        raise NotImplementedError(
            "hfax's generate runs greedy search, sampling, beam search and beam sampling; these "
            f"settings ask for transformers' {mode!r} mode"
        )
    if MODES[mode] and MODES[mode] not in features:
        raise NotImplementedError(
            f"this backend's generate does not implement {mode} (it supports {sorted(features)})"
        )
    if config.return_dict_in_generate:
        for name, feature in LAYER_OUTPUTS.items():
            if getattr(config, name, False) and feature not in features:
                raise NotImplementedError(
                    f"this backend's generate does not record {name} (it supports {sorted(features)}); "
                    "run the model's forward on the sequences generate returns to get them"
                )
    return mode


#: Ranges of the sampling settings: transformers skips a processor whose setting is out of range (a
#: top_p of 1.5 builds none), so hfax checks them itself rather than ignore them.
RANGES = {
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "typical_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "min_p": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "epsilon_cutoff": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "eta_cutoff": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "repetition_penalty": (lambda v: v > 0, "a number > 0 (1.0 disables it)"),
    "top_k": (lambda v: _is_count(v), "an integer >= 0 (0 disables it)"),
    "no_repeat_ngram_size": (lambda v: _is_count(v), "an integer >= 0 (0 disables it)"),
}


def _is_count(value: Any) -> bool:
    return _is_integer(value) and value >= 0


#: Generation-config fields holding a token id (or, for EOS, a list of them).
TOKEN_FIELDS = ("eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id",
                "forced_bos_token_id", "forced_eos_token_id")  # fmt: skip


def _check_token_ids(config: Any) -> None:
    """Every token-id field holds token ids. A negative EOS id is one transformers takes too: it never
    matches a token, so generation runs to its length (transformers warns so, and so does hfax through its
    ``_prepare_special_tokens``). A negative pad id too (transformers' tests use -1): finished rows and
    the result are padded with it, and the device's buffers hold a token of the vocabulary instead."""
    for name in TOKEN_FIELDS:
        value = getattr(config, name, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        valid, what = (
            (_is_integer, "an integer")
            if name in ("eos_token_id", "pad_token_id")
            else (_is_count, "an integer >= 0")
        )
        if value is not None and not all(valid(v) for v in values):
            raise ValueError(f"{name} must be a token id ({what}) or a list of them, got {value!r}")


def _is_integer(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def _check_ranges(config: Any) -> None:
    for name, (ok, what) in RANGES.items():
        value = getattr(config, name, None)
        if value is not None and not (isinstance(value, (int, float, np.number)) and ok(value)):
            raise ValueError(f"{name} must be {what}, got {value!r}")
    if config.do_sample and config.temperature is not None and not config.temperature > 0:
        raise ValueError(
            f"temperature must be > 0 when sampling, got {config.temperature!r}; use do_sample=False for greedy"
        )


def _count(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _seed(seed: Any, rng: Any, do_sample: bool) -> int:
    """The sampling seed: ``seed``, else one drawn from ``rng`` (a JAX key), else from torch's global
    generator, so that unseeded calls differ and ``torch.manual_seed`` makes them reproducible."""
    if seed is not None and rng is not None:
        raise ValueError("pass seed= or rng=, not both")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        return int(seed) & 0x7FFFFFFF
    if rng is not None:
        import jax

        data = np.asarray(
            jax.random.key_data(rng)
            if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
            else rng
        )
        return int(np.bitwise_xor.reduce(data.astype(np.uint32).reshape(-1))) & 0x7FFFFFFF
    if not do_sample:
        return 0
    import torch

    return int(torch.randint(0, 2**31 - 1, ()))


def _vocab(module: Any) -> int:
    return int(module.get_input_embeddings().num_embeddings)


def _check_ids(ids: np.ndarray, vocab: int, name: str = "input_ids") -> None:
    if ids.shape[1] == 0:
        raise ValueError(f"{name} is empty ({ids.shape}): generate needs at least one prompt token")
    if ids.min() < 0 or ids.max() >= vocab:
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise ValueError(
            f"token id {bad} is outside the vocabulary [0, {vocab}); check the tokenizer matches the model"
        )


def _mask(ids: np.ndarray, attention_mask: Any, pad: int | None, eos: list[int]) -> np.ndarray:
    if attention_mask is None:
        # transformers infers padding from the pad token when it cannot be mistaken for EOS.
        infer = pad is not None and pad not in eos and (ids == pad).any()
        return (ids != pad) if infer else np.ones_like(ids, dtype=bool)
    mask = as_ids("attention_mask", attention_mask)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask has shape {mask.shape} but input_ids has {ids.shape}")
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("attention_mask must hold only 0 and 1")
    return mask.astype(bool)


def _ids_list(tensor: Any) -> list[int]:
    return [] if tensor is None else [int(t) for t in np.asarray(tensor).reshape(-1)]


def prepare(
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    options: dict[str, Any],
    features: frozenset[str],
) -> Request:
    """Settle a ``generate`` call the way transformers would, or refuse it with an error naming why.

    ``model`` has ``module`` (the PyTorch model), ``config`` and ``generation_config``; ``options`` are
    generate's keyword arguments other than ``streamer``: settings, and the model's other inputs
    (``pixel_values``, ``input_features``, ...); ``features`` what the backend's engine runs
    (``"beams"``, ``"encoder_decoder"``).
    """
    import torch
    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    module = model.module
    options = dict(options)
    seed, rng = options.pop("seed", None), options.pop("rng", None)
    tokenizer = options.pop("tokenizer", None)
    generation_config = options.pop("generation_config", None)
    own_processors = _callers_list(options.pop("logits_processor", None), "logits_processor")
    allowed_tokens = options.pop("prefix_allowed_tokens_fn", None)
    if allowed_tokens is not None and not callable(allowed_tokens):
        raise TypeError(f"prefix_allowed_tokens_fn must be callable, got {allowed_tokens!r}")
    own_criteria = _callers_list(options.pop("stopping_criteria", None), "stopping_criteria")
    traits = generation_traits(module)
    taken = _family_options(module, traits, options)
    _refuse_arguments(options)
    for name in ("max_new_tokens", "max_length", "min_new_tokens", "min_length"):
        _count(name, options.get(name))
    has_default = {
        name: options.get(name) is None
        and getattr(generation_config, name, None) is None
        and getattr(module.generation_config, name, None) is None
        for name in ("max_length", "min_length")
    }
    config, leftovers = module._prepare_generation_config(generation_config, **options)
    if traits.configure is not None:
        traits.configure(module, config, taken)
    mode = _check_fields(
        config, features
    )  # first: it names settings transformers passes on as inputs
    cache = model_inputs.callers_cache(module, leftovers)
    extra = model_inputs.collect(module, leftovers)
    _check_ranges(config)
    _check_token_ids(config)
    for name in ("max_new_tokens", "max_length", "min_new_tokens", "min_length"):
        _count(name, getattr(config, name, None))

    vocab = _vocab(module)
    encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    if encoder_decoder and "encoder_decoder" not in features:
        raise NotImplementedError("this backend's generate does not run encoder-decoder models")
    reads_ids = getattr(module, "main_input_name", "input_ids") == "input_ids"
    embeds = extra.get("inputs_embeds")
    if embeds is not None:
        embeds = _check_embeddings(module, embeds, input_ids, encoder_decoder)
    if input_ids is None and attention_mask is None and not extra and reads_ids:
        input_ids = _start_from_bos(config)
    embedded = embeds is not None and input_ids is None  # the prompt as embeddings alone
    if embedded:  # placeholder ids (never read) and, without a mask, every embedding is a token
        input_ids = np.zeros(embeds.shape[:2], np.int64)
        if attention_mask is None:
            attention_mask = np.ones(embeds.shape[:2], np.int64)
    main = _main_input(module, input_ids, extra, encoder_decoder)
    ids = main if input_ids is None else as_ids("input_ids", input_ids)
    if input_ids is not None:
        _check_ids(ids, vocab)
    batch = ids.shape[0]
    module._prepare_special_tokens(
        config, attention_mask is not None, device="cpu", batch_size=batch
    )
    eos = [token for token in _ids_list(config._eos_token_tensor) if token >= 0]
    pad_tensor = config._pad_token_tensor
    pad = None if pad_tensor is None else int(pad_tensor)
    mask = _mask(ids, attention_mask, pad, eos) if input_ids is not None else None
    filler = pad if pad is not None and 0 <= pad < vocab else 0  # what padding slots hold on device

    source, finish, repeats = None, None, 1
    if encoder_decoder:
        text = None if input_ids is None or embedded else ids  # embeddings: no ids beside them
        source = _encoder_inputs(module, text, mask, extra)
        if embedded:
            source["attention_mask"] = mask.astype(np.int64)
        decoder_ids = extra.pop("decoder_input_ids", None)
        prompt_mask = extra.pop("decoder_attention_mask", None)
        if traits.decoder_prompt is not None:
            _check_mask_of_ones(prompt_mask, decoder_ids, batch)
            decoder_ids = traits.decoder_prompt(module, config, source, taken, decoder_ids)
            has_default["max_length"] = False  # set by the prompt's builder
            repeats = len(next(iter(source.values()))) // batch  # the builder may repeat the rows
            batch *= repeats
            prompt_mask = None
        elif decoder_ids is not None or prompt_mask is not None:
            if decoder_ids is None:  # a mask over the start token alone
                decoder_ids = _start_tokens(module, config, batch)
            decoder_ids, prompt_mask = _with_start_token(
                module, config, batch, decoder_ids, prompt_mask
            )
        if decoder_ids is None:
            decoder_ids = _start_tokens(module, config, batch)
        ids = as_ids("decoder_input_ids", decoder_ids)
        _check_ids(ids, vocab, "decoder_input_ids")
        if ids.shape[0] != batch:
            raise ValueError(
                f"decoder_input_ids has {ids.shape[0]} rows but the encoder's input {batch}"
            )
        mask = np.ones_like(ids, dtype=bool) if prompt_mask is None else prompt_mask
    width = 0 if embedded and not encoder_decoder else ids.shape[1]  # a decoder prompt of its own
    decoder_mask = encoder_decoder and leftovers.get("decoder_attention_mask") is not None
    cached = _cached_length(cache, ids, embeds is not None, features, decoder_mask)
    held = None
    if cached:
        extra = _token_types_over(extra, ids.shape, cached)
        asked = bool(config.return_dict_in_generate) and any(
            getattr(config, name, False) for name in LAYER_OUTPUTS
        )
        why = loaded_cache.why_not_loaded(
            module, cache, extra, ids, cached, embeds is not None and not encoder_decoder, asked
        )
        if "cache_input" in features and not why:
            # an encoder-decoder's decoder self-attention (its cross-attention prefill computes again)
            decoder = getattr(cache, "self_attention_cache", cache)
            held = loaded_cache.held_layers(module, decoder, cached)
        else:
            why = why or "this backend loads none"
            _check_cached_media(module, ids[:, :cached], extra, why)
            if encoder_decoder and not mask[:, :cached].all():
                raise NotImplementedError(
                    "decoder_attention_mask has zeros over the cached tokens, and hfax computes the "
                    "cache's keys and values again from the ids here (it loads none: "
                    f"{why}); they depend on the mask the cache was made with, which transformers reads "
                    "as the cache holds it: pass a mask of ones over the cached tokens, or continue on "
                    "the JAX backend"
                )
    if "position_ids" in extra:
        _check_given_positions(module, extra["position_ids"], ids, encoder_decoder)
    if traits.result is not None:
        result, outcome = traits.result, dict(width=width, eos=eos, pad=filler, options=taken)

        def finish(sequences: np.ndarray, fields: dict[str, Any] | None) -> Any:
            return result(Outcome(sequences, fields, repeats=repeats, **outcome))

    torch_ids = torch.from_numpy(ids)
    encoder_ids = torch.from_numpy(next(iter(source.values()))) if source else torch_ids
    config = module._prepare_generated_length(
        generation_config=config,
        has_default_max_length=has_default["max_length"],
        has_default_min_length=has_default["min_length"],
        model_input_name="inputs_embeds" if embeds is not None else "input_ids",
        input_ids_length=width,
        inputs_tensor=torch.from_numpy(embeds) if embeds is not None else encoder_ids,
    )
    module._validate_generated_length(config, width, has_default["max_length"])
    prompt = ids.shape[1]
    _check_positions(model, prompt, prompt + int(config.max_length) - width, source)
    if (
        config.return_dict_in_generate
        and config.output_attentions
        and config.use_cache
        and outputs.static_cache_asked(config)
    ):  # the last step's keys: the prompt and every new token but the last
        slots = outputs.static_cache_slots(module, config, prompt - width)
        if why := layer_outputs.rolled_window(slots, prompt + int(config.max_length) - width - 1):
            raise NotImplementedError(why)

    expand = max(config.num_beams, config.num_return_sequences)
    model_kwargs = (
        {"attention_mask": torch.from_numpy(mask.astype(np.int64))} if not encoder_decoder else {}
    )
    processor_list = module._get_logits_processor(
        generation_config=config,
        input_ids_seq_length=width,
        encoder_input_ids=encoder_ids,
        prefix_allowed_tokens_fn=allowed_tokens,
        logits_processor=LogitsProcessorList(own_processors),
        device="cpu",
        model_kwargs=model_kwargs,
    )
    steps, host = (), None
    untranslated = processors.without_twin(processor_list)
    for name in set(untranslated) & set(HOST_REFUSED):
        raise NotImplementedError(f"hfax's generate cannot run {name}: {HOST_REFUSED[name]}")
    if not untranslated:
        steps = processors.translate(processor_list, vocab, expand)
    elif mode in ("beam_search", "beam_sample"):
        raise NotImplementedError(
            f"hfax's beam search runs its logits processors compiled and has no twin of "
            f"{', '.join(untranslated)}: use num_beams=1 (the host then runs them every token), or drop "
            "the processor"
        )
    elif "host_choice" not in features:
        raise NotImplementedError(
            f"hfax has no compiled twin of {', '.join(untranslated)}, and this backend's generate cannot "
            "choose tokens on the host: drop the processor, or use backend='jax'"
        )
    else:
        given = None if seed is None and rng is None else _seed(seed, rng, True)
        host = host_choice.start(processor_list, bool(config.do_sample), given, config)
    built = module._get_stopping_criteria(config, StoppingCriteriaList(), tokenizer=tokenizer)
    criteria = _host_criteria(built, own_criteria)
    if criteria and config.num_beams > 1:
        raise NotImplementedError(
            "hfax's beam search does not take stop_strings or stopping_criteria; use eos_token_id"
        )
    deadline = time.monotonic() + config.max_time if config.max_time is not None else None
    if expand > 1:
        if source is not None:
            source = {name: np.repeat(value, expand, axis=0) for name, value in source.items()}
        elif extra:
            extra = model_inputs.expand(extra, batch, expand)
        ids, mask = np.repeat(ids, expand, axis=0), np.repeat(mask, expand, axis=0)
        if held is not None:
            held = loaded_cache.expanded(held, expand)
    return Request(
        ids=ids,
        mask=mask,
        source=source,
        batch=batch,
        expand=expand,
        config=config,
        width=width,
        max_new=int(config.max_length) - width,
        eos=eos,
        pad=pad,
        filler=filler,
        do_sample=bool(config.do_sample),
        num_beams=int(config.num_beams) if mode in ("beam_search", "beam_sample") else 1,
        seed=0 if host is not None else _seed(seed, rng, bool(config.do_sample)),
        steps=steps,
        criteria=criteria,
        pad_stopped=any(
            hasattr(criterion, "eos_token_id") for criterion in (*built, *own_criteria)
        ),
        deadline=deadline,
        vocab=vocab,
        inputs=extra,
        finish=finish,
        cache=cache if cached else None,
        cached=cached,
        held=held,
        host=host,
    )


def _callers_list(value: Any, name: str) -> list[Any]:
    """The caller's ``logits_processor`` or ``stopping_criteria``: a transformers ``LogitsProcessorList`` /
    ``StoppingCriteriaList`` or a plain list, of callables."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple)) or not all(callable(item) for item in value):
        kind = "LogitsProcessorList" if name == "logits_processor" else "StoppingCriteriaList"
        raise TypeError(
            f"{name} must be a transformers {kind} (a list of callables), got {value!r}"
        )
    return list(value)


def _host_criteria(built: Any, own: list[Any]) -> tuple[Any, ...]:
    """The stopping criteria the host checks between chunks: transformers' ``StopStringCriteria`` if the
    settings built one, then the caller's own. A caller's criterion of a kind the settings also built
    would replace transformers' (its ``_merge_criteria_processor_list``) while hfax's loop keeps the
    setting's: it is refused, naming the setting to use instead."""
    built_kinds = {type(criterion).__name__ for criterion in built}
    unknown = sorted(built_kinds - set(CRITERIA))
    if unknown:
        raise NotImplementedError(f"hfax's generate cannot run the stopping criteria {unknown}")
    for criterion in own:
        kind = type(criterion).__name__
        if kind in built_kinds:
            raise ValueError(
                f"stopping_criteria holds a {kind}, which generate also builds from this call's settings: set "
                f"{CRITERIA[kind]} instead"
            )
    stop = [criterion for criterion in built if type(criterion).__name__ == "StopStringCriteria"]
    return (*stop, *own)


def _check_given_positions(
    module: Any, positions: np.ndarray, ids: np.ndarray, encoder_decoder: bool
) -> None:
    """The caller's ``position_ids``: one per prompt token (``[batch, length]``), which the prefill reads
    as given and the new tokens go on from, as transformers does; multimodal (3-D) positions and an
    encoder-decoder's are refused, since hfax computes those itself."""
    if encoder_decoder or model_inputs.rope_index(module) is not None:
        raise NotImplementedError(
            "hfax's generate computes this model's positions itself (multimodal rotary positions, or an "
            "encoder-decoder's decoder): leave position_ids out"
        )
    if positions.shape != ids.shape:
        raise ValueError(
            f"position_ids has shape {positions.shape} but the prompt {ids.shape}: one position per token"
        )


def _cached_length(
    cache: Any,
    ids: np.ndarray,
    embedded: bool,
    features: frozenset[str],
    decoder_mask: bool = False,
) -> int:
    """How many of the prompt's first tokens the caller's ``cache`` holds (0 for none or an empty one), or
    an error before anything compiles: the cache has the prompt's rows and leaves at least one token to
    feed, as transformers requires (a prompt of ``embedded`` embeddings too: the prefill computes the
    cached positions again from them); the engine can hand caches back (``"cache_output"``), which the check
    of its contents needs where it does not load them (:mod:`hfax.generation.loaded_cache`).

    An encoder-decoder's prompt is ``decoder_input_ids``. transformers reads them as the cached tokens and
    new ones only when ``decoder_attention_mask`` covers them (``decoder_mask``); without it, as the tokens
    after the cached ones, whose ids hfax needs to compute the cache again: that is refused, saying what
    to pass."""
    if cache is None:
        return 0
    length = int(cache.get_seq_length())
    if length == 0:
        return 0
    if "cache_output" not in features:
        raise NotImplementedError("this backend's generate does not take a caller's cache")
    held = getattr(cache, "self_attention_cache", cache)
    name = (
        "decoder_input_ids" if held is not cache else "inputs_embeds" if embedded else "input_ids"
    )
    if held is not cache and not decoder_mask:
        raise NotImplementedError(
            "with an EncoderDecoderCache and no decoder_attention_mask, transformers' generate reads "
            "decoder_input_ids as the tokens after the cached ones, and hfax computes the cache again on "
            "device from the cached tokens' ids: pass decoder_input_ids holding the cached tokens and the "
            "new ones (an earlier result's sequences) with decoder_attention_mask of ones over them"
        )
    rows = (
        held.layers[0].keys.shape[0] if getattr(held.layers[0], "keys", None) is not None else None
    )
    if rows is not None and rows != ids.shape[0]:
        raise ValueError(f"past_key_values holds {rows} rows but {name} has {ids.shape[0]}")
    if length >= ids.shape[1]:
        raise ValueError(
            f"past_key_values holds {length} tokens and {name} {ids.shape[1]}: {name} must hold the "
            "cached tokens and at least one more (the earlier result's sequences)"
        )
    return length


#: Token types transformers' generate extends for each token it generates (its
#: ``_update_model_kwargs_for_generation``): multimodal ones with zeros (text), others with the last value.
EXTENDED_TOKEN_TYPES = {"mm_token_type_ids": "zeros", "token_type_ids": "last"}


def _token_types_over(
    extra: dict[str, np.ndarray], shape: tuple[int, int], cached: int
) -> dict[str, np.ndarray]:
    """``extra`` with token types that cover only the prompt a caller's cache of ``cached`` tokens was
    made from (narrower than the prompt ``shape``, and no wider than the cache) extended over the tokens
    generated after it, as transformers extends them step by step; transformers' own
    ``test_generate_continue_from_past_key_values`` passes them so."""
    extended = dict(extra)
    for name, fill in EXTENDED_TOKEN_TYPES.items():
        value = extra.get(name)
        if value is None or value.ndim != 2 or value.shape[0] != shape[0]:
            continue
        if value.shape[1] < shape[1] and value.shape[1] <= cached and value.shape[1]:
            after = shape[1] - value.shape[1]
            tail = (
                np.zeros((shape[0], after), value.dtype)
                if fill == "zeros"
                else np.repeat(value[:, -1:], after, axis=1)
            )
            extended[name] = np.concatenate([value, tail], axis=1)
    return extended


def _check_cached_media(
    module: Any, cached: np.ndarray, extra: dict[str, np.ndarray], why: str
) -> None:
    """A caller's cache over media placeholders (``cached``: the ids it holds) that the engine does not
    load (``why``: :func:`hfax.generation.loaded_cache.why_not_loaded`) needs the media again: the
    prefill then computes the cached tokens from the ids and the images (or clips), while transformers
    reads the cache and is called without them. Refused before anything compiles, naming the inputs to
    pass."""
    if not cached.size:
        return
    config = module.config
    held = model_inputs.media_placeholders(config, cached)
    media = [name for name in extra if name.startswith(("pixel_values", "input_features"))]
    if held and not media:
        raise NotImplementedError(
            f"past_key_values holds tokens of {held[0]} {getattr(config, held[0])}, and hfax's generate "
            f"does not load this cache into its own ({why}): it computes the cached tokens again from "
            "the ids and media, so pass the same pixel_values (or the model's other media inputs) "
            "the cache was made with"
        )


def _check_embeddings(
    module: Any, embeds: np.ndarray, input_ids: Any, encoder_decoder: bool
) -> np.ndarray:
    """A prompt as ``inputs_embeds`` ``[batch, length, hidden]``: the model's hidden size and, with
    ``input_ids`` (the prompt the result starts with), their shape. An encoder-decoder's are its
    encoder's input, given instead of ``input_ids`` (its encoder takes one or the other)."""
    if encoder_decoder and input_ids is not None:
        raise ValueError(
            f"{type(module).__name__}'s encoder takes input_ids or inputs_embeds, not both: pass one"
        )
    hidden = getattr(module.get_input_embeddings(), "embedding_dim", embeds.shape[-1])
    if (
        embeds.ndim != 3
        or embeds.shape[2] != hidden
        or not np.issubdtype(embeds.dtype, np.floating)
    ):
        raise ValueError(
            f"inputs_embeds must be floats of shape [batch, length, {hidden}] (the model's input "
            f"embeddings, model.get_input_embeddings()(input_ids)), got {embeds.dtype} {embeds.shape}"
        )
    if input_ids is not None and tuple(np.shape(input_ids)) != embeds.shape[:2]:
        raise ValueError(
            f"input_ids has shape {tuple(np.shape(input_ids))} but inputs_embeds {embeds.shape}: with both, "
            "the embeddings are those of the ids' positions"
        )
    return embeds


def _start_from_bos(config: Any) -> np.ndarray:
    """The prompt of a ``generate`` given no input at all: one row holding the BOS token, as transformers
    starts one (for an encoder-decoder model, the encoder's input; a model whose main input is not
    ``input_ids``, audio or pixels, is still asked for it)."""
    bos = config.bos_token_id
    if bos is None:
        raise ValueError(
            "generate was given no input_ids and the model has no bos_token_id to start from: pass "
            "input_ids (the tokenizer's output), or bos_token_id=..."
        )
    return np.full((1, 1), bos, np.int64)


def _main_input(
    module: Any, input_ids: Any, extra: dict[str, np.ndarray], encoder_decoder: bool
) -> Any:
    """The encoder's main input when it is not ``input_ids`` (``input_features`` of a speech encoder),
    else ``None``; an error when the call has neither."""
    name = getattr(module, "main_input_name", "input_ids")
    if input_ids is not None:
        return None
    if encoder_decoder and name != "input_ids" and name in extra:
        return extra[name]
    raise ValueError(
        f"generate needs input_ids{f' or {name}' if encoder_decoder and name != 'input_ids' else ''} "
        f"({type(module).__name__}'s processor returns them): pass the processor's output, "
        "model.generate(**inputs)"
    )


def _encoder_inputs(
    module: Any, ids: np.ndarray | None, mask: np.ndarray | None, extra: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The encoder's inputs by name: the source ids and mask, or the main input (``input_features``), with
    the call's other inputs the encoder takes (and images a model merges into them:
    :func:`hfax.generation.inputs.encode`); any other is refused."""
    import inspect

    accepted = set(inspect.signature(module.get_encoder().forward).parameters)
    if ids is not None and model_inputs.merges_images(module):
        accepted.add("pixel_values")
    source = {} if ids is None else {"input_ids": ids, "attention_mask": mask.astype(np.int64)}
    for name in sorted(extra):
        if name in ("decoder_input_ids", "decoder_attention_mask"):
            continue  # the decoder's prompt
        if name not in accepted:
            raise NotImplementedError(
                f"hfax's generate passes an encoder-decoder's inputs to its encoder, which does not take {name}"
            )
        source[name] = extra.pop(name)
    return source


def _with_start_token(
    module: Any, config: Any, batch: int, decoder_ids: Any, decoder_mask: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The caller's decoder prompt as transformers' generate reads it, by its own
    ``_prepare_decoder_input_ids_for_generation``: rows that all lack the decoder start token get it
    prepended (and ``decoder_mask`` a column of ones before it); Donut's and Whisper's prompts are kept.
    ``decoder_mask`` (the caller's ``decoder_attention_mask``, or ``None``) comes back as bool, checked
    to be 0 and 1 over the whole prompt: its zeros hide those columns' keys from every query, in prefill and
    in every step after, as transformers passes the mask (extended by ones) to each forward."""
    import torch

    prompt = as_ids("decoder_input_ids", decoder_ids)
    kwargs = {"decoder_input_ids": torch.from_numpy(prompt)}
    if decoder_mask is not None:
        given = as_ids("decoder_attention_mask", decoder_mask)
        if given.shape != prompt.shape:
            raise ValueError(
                f"decoder_attention_mask has shape {given.shape} but decoder_input_ids {prompt.shape}: "
                "one entry per decoder prompt token"
            )
        kwargs["decoder_attention_mask"] = torch.from_numpy(given)
    ids, kwargs = module._prepare_decoder_input_ids_for_generation(
        batch,
        getattr(module, "main_input_name", "input_ids"),
        kwargs,
        config._decoder_start_token_tensor,
        device=torch.device("cpu"),
    )
    mask = kwargs.get("decoder_attention_mask")
    if mask is None:
        return ids.numpy(), None
    mask = mask.numpy()
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("decoder_attention_mask must hold only 0 and 1")
    return ids.numpy(), mask.astype(bool)


def _check_mask_of_ones(decoder_mask: Any, decoder_ids: Any, batch: int) -> None:
    """A model whose family builds its decoder prompt (Whisper's task and language tokens) takes a
    ``decoder_attention_mask`` only as ones over the caller's ``decoder_input_ids``: the builder adds
    tokens the caller's mask does not cover, and reads the prompt unpadded."""
    if decoder_mask is None:
        return
    mask = as_ids("decoder_attention_mask", decoder_mask)
    prompt = (batch, 1) if decoder_ids is None else tuple(np.shape(decoder_ids))
    if mask.shape != prompt:
        raise ValueError(
            f"decoder_attention_mask has shape {mask.shape}; it covers the decoder prompt, of shape {prompt}"
        )
    if not (mask == 1).all():
        raise NotImplementedError(
            "this model's family builds its decoder prompt around decoder_input_ids and reads it "
            "unpadded: pass decoder_attention_mask of ones, or none"
        )


def _start_tokens(module: Any, config: Any, batch: int) -> np.ndarray:
    start = config._decoder_start_token_tensor
    if start is None:
        raise ValueError(
            f"{type(module).__name__} is an encoder-decoder without a decoder_start_token_id (or "
            "bos_token_id) in its generation config; set model.generation_config.decoder_start_token_id"
        )
    start = np.asarray(start).reshape(-1)
    return np.broadcast_to(start[:, None] if start.size > 1 else start[None], (batch, 1)).astype(
        np.int64
    )


def _check_positions(model: Any, width: int, max_length: int, source: Any) -> None:
    """The decoder's tokens fit its position table (``max_target_positions`` where the config has one,
    as Whisper's and Speech2Text's decoders do, else ``max_position_embeddings``), and an encoder's text
    its own (``max_source_positions``, else ``max_position_embeddings``); -1 is unbounded (XLNet)."""
    config = model.config
    text = source.get("input_ids") if source else None
    for needed, name, what in (
        (
            max_length,
            "max_target_positions",
            f"the prompt ({width} tokens) and the tokens asked for",
        ),
        (0 if text is None else text.shape[1], "max_source_positions", "the encoder's input"),
    ):
        field = name if getattr(config, name, None) else "max_position_embeddings"
        limit = getattr(config, field, None)
        if isinstance(limit, int) and limit > 0 and needed > limit:
            raise ValueError(
                f"{what} need {needed} positions, more than the model's {field} ({limit}); shorten "
                "the prompt or ask for fewer tokens"
            )
