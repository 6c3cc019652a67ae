"""Ovis2's visual indicator tokens, placed without a branch on the data, on every backend.

Ovis2's model gives every visual indicator token (the tokens that frame an image and its tiles) its
indicator's learned embedding, one indicator at a time: ``if mask.any(): inputs_embeds[mask] = feature``.
The branch reads a value, which ``jax.jit`` cannot trace and where torch_xla's dynamo bridge breaks its
graph, and the boolean write has a shape that depends on the data. ``torch.where`` over the same mask
writes the same rows, and nothing where no token matches, which is what the branch skips.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def model_forward(
    self: Any,
    input_ids: Any = None,
    pixel_values: Any = None,
    attention_mask: Any = None,
    position_ids: Any = None,
    inputs_embeds: Any = None,
    labels: Any = None,
    use_cache: Any = None,
    mm_encoder_outputs: Any = None,
    **kwargs: Any,
) -> Any:
    """``Ovis2Model.forward``: token ids and images are merged into embeddings here (the image features
    at the image tokens, as transformers scatters them, and the indicators by ``torch.where``), then
    transformers' forward runs the language model on them. Any other call is transformers' own."""
    # The cache, if any, is among kwargs under the release's name for it.
    rest = dict(
        attention_mask=attention_mask,
        position_ids=position_ids,
        labels=labels,
        use_cache=use_cache,
        **kwargs,
    )
    if input_ids is None or inputs_embeds is not None or pixel_values is None or mm_encoder_outputs:
        return type(self).forward(
            self,
            input_ids,
            pixel_values,
            inputs_embeds=inputs_embeds,
            mm_encoder_outputs=mm_encoder_outputs,
            **rest,
        )
    import torch

    embeds = self.get_input_embeddings()(input_ids)
    image = self.get_image_features(pixel_values=pixel_values, return_dict=True)
    features = image.pooler_output
    at_images = self.get_placeholder_mask(input_ids, inputs_embeds=embeds, image_features=features)
    embeds = embeds.masked_scatter(at_images, features.to(embeds.device, embeds.dtype))
    for indicator, token in zip(image.visual_indicator_features, self.visual_indicator_token_ids):
        embeds = torch.where((input_ids == token)[..., None], indicator.to(embeds.dtype), embeds)
    output = type(self).forward(self, inputs_embeds=embeds, **rest)
    # What transformers' forward returns beside the states: the image encoder's whole output where the
    # output class holds one (transformers 5.24's ``image_outputs``), else its pooled features (5.23's).
    fields = {field.name for field in dataclasses.fields(type(output))}
    if "image_outputs" in fields:
        output["image_outputs"] = image
    else:
        output["image_hidden_states"] = features
    return output


#: Ovis2's model, merging images without a branch on the data: class name -> (method, its replacement).
PATCHES = {"Ovis2Model": ("forward", model_forward)}
