"""Encoder-decoder sequence classifiers (BART, mBART, PLBart, MVP, BigBird-Pegasus, T5, mT5, UMT5) that
classify the decoder's state at each row's last ``<eos>``, with static shapes, on every backend.

transformers selects those states with a boolean index (``hidden_states[eos_mask, :]``, as many rows as
the batch has ``<eos>`` tokens: a data-dependent shape, which no compiled program has) and checks with
``unique_consecutive`` that every row holds the same number. Here each row's last ``<eos>`` is found by
position and gathered: the same states whenever transformers' checks pass. The checks run on the host
before anything compiles (:func:`check_eos_counts`, bound as the model's
:data:`hfax.validation.CHECK_IDS`), with transformers' messages, so a batch they refuse is refused here too.

The families' modules (:mod:`~hfax.patches.longtail.bart`, :mod:`~hfax.patches.longtail.t5`,
:mod:`~hfax.patches.longtail.mvp`) name their classifiers; :func:`classifiers` and :func:`bind_check` are
what they bind (``PATCHES``, ``patch_model``).
"""

from __future__ import annotations

from typing import Any

from hfax.signatures import cache_field, output_cache
from hfax.validation import CHECK_IDS


def last_eos_forward(
    self: Any,
    input_ids: Any = None,
    attention_mask: Any = None,
    decoder_input_ids: Any = None,
    decoder_attention_mask: Any = None,
    encoder_outputs: Any = None,
    inputs_embeds: Any = None,
    decoder_inputs_embeds: Any = None,
    labels: Any = None,
    use_cache: Any = None,
    **kwargs: Any,
) -> Any:
    """The classifier's ``forward``: transformers' arguments and ``Seq2SeqSequenceClassifierOutput``."""
    if input_ids is None:  # transformers refuses embeddings alone: its own forward says so
        return type(self).forward(
            self,
            input_ids,
            attention_mask,
            decoder_input_ids,
            decoder_attention_mask,
            encoder_outputs,
            inputs_embeds,
            decoder_inputs_embeds,
            labels,
            use_cache,
            **kwargs,
        )
    import torch
    from transformers.modeling_outputs import Seq2SeqSequenceClassifierOutput

    # T5's classifiers make the decoder's input themselves; BART's base model does it inside.
    if (
        decoder_input_ids is None
        and decoder_inputs_embeds is None
        and hasattr(self, "_shift_right")
    ):
        decoder_input_ids = self._shift_right(input_ids)
    outputs = getattr(self, self.base_model_prefix)(
        input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
        encoder_outputs=encoder_outputs,
        inputs_embeds=inputs_embeds,
        decoder_inputs_embeds=decoder_inputs_embeds,
        use_cache=False if labels is not None else use_cache,
        **kwargs,
    )
    states = outputs[0]
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    is_eos = input_ids == self.config.eos_token_id
    last_eos = torch.where(is_eos, positions, 0).amax(-1)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    logits = self.classification_head(states[rows, last_eos])
    loss = None
    if labels is not None:
        loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
    cache = {cache_field(Seq2SeqSequenceClassifierOutput): output_cache(outputs)}
    return Seq2SeqSequenceClassifierOutput(
        loss=loss,
        logits=logits,
        **cache,
        decoder_hidden_states=outputs.decoder_hidden_states,
        decoder_attentions=outputs.decoder_attentions,
        cross_attentions=outputs.cross_attentions,
        encoder_last_hidden_state=outputs.encoder_last_hidden_state,
        encoder_hidden_states=outputs.encoder_hidden_states,
        encoder_attentions=outputs.encoder_attentions,
    )


def check_eos_counts(module: Any, input_ids: Any) -> None:
    """transformers' checks of a batch for these classifiers: every row holds at least one ``<eos>`` and
    all rows the same number. ``input_ids`` is a host (numpy) array."""
    counts = (input_ids == module.config.eos_token_id).sum(-1)
    if len(set(counts.tolist())) > 1:
        raise ValueError(
            f"All examples must have the same number of <eos> tokens (token {module.config.eos_token_id}); "
            f"the rows hold {counts.tolist()}. {type(module).__name__} classifies the state at each "
            "row's last <eos>: end every row with the same number of them, as its tokenizer does."
        )
    if counts.size and counts[0] < 1:
        raise ValueError(
            f"Each example must contain at least one <eos> token (token {module.config.eos_token_id}): "
            f"{type(module).__name__} classifies the state at each row's last <eos>."
        )


def classifiers(names: tuple[str, ...]) -> dict[str, tuple[str, Any]]:
    """The classifiers ``names`` (class names), their forwards replaced: class name -> (method, its
    replacement)."""
    return {name: ("forward", last_eos_forward) for name in names}


def bind_check(names: tuple[str, ...]) -> Any:
    """A family module's ``patch_model``: a ``model`` of one of the classifiers ``names`` checks its
    ids' ``<eos>`` counts on the host (:func:`check_eos_counts` as its :data:`hfax.validation.CHECK_IDS`)."""

    def patch(model: Any, patcher: Any) -> None:
        if type(model).__name__ in names:
            patcher.bind(model, CHECK_IDS, check_eos_counts)

    return patch
