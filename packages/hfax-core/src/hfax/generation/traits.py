"""What generation needs to know about a model that only its family knows: :class:`GenerationTraits`.

A family plugin answers the ``hfax_generation_traits`` hook for the models it claims (a reason no static
cache can hold their decode state, a local-attention window, a token appended to every forward's input,
a decoder prompt built from special tokens, the ``generate`` options their own ``generate`` takes);
:func:`generation_traits` merges every plugin's answer, and the generation core acts on the result
without naming any architecture. Importing this module imports neither torch nor jax.

Inside :func:`asked_once` (every ``generate`` call: :func:`hfax.generation.driver.generate`) each model's
traits are asked of the plugins once, and the settings, the shapes and the engine read that one answer.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Callable, Iterator, Mapping


@dataclasses.dataclass(frozen=True)
class Appended:
    """What every forward of a model's ``generate`` reads after the tokens so far: ``token``, and a
    ``langs`` input of ``lang`` at every position (``None`` passes none)."""

    token: int
    lang: int | None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a ``generate`` call made, before it is handed back, for a family's
    :attr:`GenerationTraits.result`.

    ``sequences`` ``[rows, width + new]`` (numpy) start with the decoder prompt of ``width`` tokens;
    ``fields`` are the other fields of the ``return_dict_in_generate`` output by name (per-step tuples of
    ``[rows, ...]`` arrays, ``beam_indices``, the encoder's per-layer outputs, ``past_key_values`` as a
    transformers ``Cache``), ``None`` when the call returns the sequences alone. ``eos`` and ``pad`` are the
    call's EOS ids and padding token; ``options`` the model's own ``generate`` options as the call gave
    them (:attr:`GenerationTraits.options`); ``repeats`` how many rows the family's decoder prompt made of
    each of the caller's rows (1 unless it repeated them).
    """

    sequences: Any
    fields: dict[str, Any] | None
    width: int
    eos: list[int]
    pad: int
    options: Mapping[str, Any]
    repeats: int = 1


@dataclasses.dataclass(frozen=True)
class GenerationTraits:
    """What a family tells generation about one model; every field's default means "nothing special".

    ``refused``
        why hfax's ``generate`` cannot run the model, naming the fix: it raises ``NotImplementedError``
        with this text before anything compiles.
    ``no_static_cache``
        why no static cache can hold the model's decode state (state kept in module attributes, positions
        a slot cache does not keep): it decodes without a cache, re-reading the sequence at every step,
        and a warning gives this reason.
    ``local_attention_window``
        the window of local-attention layers that mask by a table of their own, sliced as if the cache
        held exactly the tokens so far: a call needing more positions than this decodes without a cache.
    ``appended``
        the token read after the tokens so far at every forward (:class:`Appended`): the model then takes
        no cache and re-reads the sequence at every step, as transformers' ``generate`` for it does.
    ``options``
        ``generate`` keyword arguments the model's own ``generate`` takes besides transformers' settings;
        their values (``None`` when not given) go to ``configure``, ``decoder_prompt`` and ``result``.
    ``refused_options``
        ``generate`` keyword arguments refused when given (not ``None``), with why.
    ``configure``
        ``configure(module, generation_config, options) -> None``: changes the call's merged generation
        config (in place) as the model's own ``generate`` does before it decodes (a setting of its own that
        decides sampling, say), before hfax checks or reads any of it; an option not given (``None``) may
        be set there from the config, where the model's own ``generate`` reads it.
    ``decoder_prompt``
        ``decoder_prompt(module, generation_config, source, options, given) -> ids``: an encoder-decoder's
        decoder prompt (``[batch, length]`` integers) built from special tokens, given the encoder's inputs
        by name (numpy), the ``options`` taken and the call's ``decoder_input_ids`` (numpy, or ``None``),
        which it takes or refuses as the model's own ``generate`` does. It settles the generated length in ``generation_config`` as the
        model's own ``generate`` does, so hfax adds no default length of its own. Where that ``generate``
        runs each input several times, it repeats the rows of ``source`` (in place) and returns a prompt
        row for each: the call's batch is then the prompt's rows.
    ``result``
        ``result(outcome) -> (sequences, fields)``: the model's own ``generate`` result from what the call
        made (an :class:`Outcome`), where it differs from transformers' plain one.
    ``no_forward_padding``
        why the model's logits at its real positions change when its ids are padded on the right (it
        reads the padding as tokens): its forward runs every call at the call's own shape
        (:mod:`hfax.forward_buckets`).
    """

    refused: str = ""
    no_static_cache: str = ""
    local_attention_window: int | None = None
    appended: Appended | None = None
    options: tuple[str, ...] = ()
    refused_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    configure: Callable[..., Any] | None = None
    decoder_prompt: Callable[..., Any] | None = None
    result: Callable[..., Any] | None = None
    no_forward_padding: str = ""


#: Traits a model has at most one of: two plugins giving different ones conflict.
SINGLE = ("appended", "configure", "decoder_prompt", "result")


def merged(answers: list[tuple[str, GenerationTraits]]) -> GenerationTraits:
    """One model's traits from ``(plugin, answer)`` pairs: reasons joined, options and refused options
    united, the smallest local-attention window, and each trait of :data:`SINGLE` from the one plugin
    that gives it (different ones from two plugins are an error naming both)."""
    from hfax.plugins import PluginConflictError

    traits = [answer for _, answer in answers]
    single: dict[str, Any] = {}
    for name in SINGLE:
        given = {
            plugin: getattr(answer, name)
            for plugin, answer in answers
            if getattr(answer, name) is not None
        }
        values = list(given.values())
        if any(value != values[0] for value in values[1:]):
            raise PluginConflictError(
                f"plugins {sorted(given)} give one model different generation traits {name!r}; block "
                "one with HFAX_BLOCK_PLUGINS=<plugin>"
            )
        single[name] = values[0] if values else None
    windows = [t.local_attention_window for t in traits if t.local_attention_window is not None]
    return GenerationTraits(
        refused="; ".join(t.refused for t in traits if t.refused),
        no_static_cache="; ".join(t.no_static_cache for t in traits if t.no_static_cache),
        no_forward_padding="; ".join(t.no_forward_padding for t in traits if t.no_forward_padding),
        local_attention_window=min(windows, default=None),
        options=tuple(dict.fromkeys(name for t in traits for name in t.options)),
        refused_options={name: why for t in traits for name, why in t.refused_options.items()},
        **single,
    )


def generation_traits(module: Any) -> GenerationTraits:
    """What every plugin's ``hfax_generation_traits`` says about ``module`` (a transformers model),
    merged (:func:`merged`); raises the model's refusal (``NotImplementedError``) where a plugin gives
    one."""
    traits = answered_traits(module)
    if traits.refused:
        raise NotImplementedError(traits.refused)
    return traits


#: The traits answered inside :func:`asked_once`, by the ``id`` of the model asked about.
_ANSWERED: contextvars.ContextVar[dict[int, GenerationTraits] | None] = contextvars.ContextVar(
    "hfax_answered_traits", default=None
)


@contextlib.contextmanager
def asked_once() -> Iterator[None]:
    """Within the block, each model's traits are asked of the plugins once (a ``generate`` call: its model
    and config stay what they are while it runs, so every answer would be the same)."""
    token = _ANSWERED.set({})
    try:
        yield
    finally:
        _ANSWERED.reset(token)


def answered_traits(module: Any) -> GenerationTraits:
    """What every plugin's ``hfax_generation_traits`` says about ``module``, merged, a refusal included;
    inside :func:`asked_once`, the first answer for ``module``."""
    answered = _ANSWERED.get()
    if answered is not None and id(module) in answered:
        return answered[id(module)]
    traits = _asked(module)
    if answered is not None:
        answered[id(module)] = traits
    return traits


def _asked(module: Any) -> GenerationTraits:
    """Every plugin's ``hfax_generation_traits`` answer for ``module``, merged."""
    from hfax import plugins

    hook = plugins.get_plugin_manager().hook.hfax_generation_traits
    arguments = {"model": module, "config": module.config}
    answers: list[tuple[str, GenerationTraits]] = []
    for impl in hook.get_hookimpls():  # in the order plugins were registered
        answer = impl.function(*[arguments[name] for name in impl.argnames])
        if answer is not None:
            answers.append((impl.plugin_name, answer))
    return merged(answers)
