"""Inputs for tiny models, as numpy: left-padded token batches, and what a multimodal processor returns."""

from __future__ import annotations

import numpy as np

from hfax.testing.configs import IMAGE_TOKEN, IMAGE_TOKENS


def left_padded(prompts: list[list[int]], pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token lists as one left-padded ``(input_ids, attention_mask)`` batch."""
    width = max(map(len, prompts))
    ids = np.full((len(prompts), width), pad_token_id, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = prompt
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def right_padded(prompts: list[list[int]], pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token lists as one right-padded ``(input_ids, attention_mask)`` batch, as seq2seq tokenizers pad
    their sources."""
    width = max(map(len, prompts))
    ids = np.full((len(prompts), width), pad_token_id, np.int64)
    mask = np.zeros((len(prompts), width), np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)], mask[row, : len(prompt)] = prompt, 1
    return ids, mask


def multimodal_inputs(name: str, seed: int = 0, batch: int = 2) -> dict[str, np.ndarray]:
    """What the processor of :func:`tiny_multimodal_config` ``name`` returns for up to two prompts with
    one image each (Whisper: audio features): image tokens expanded in ``input_ids``, left padding, and the
    model's own extra inputs (Qwen2-VL's image grid and token types, Gemma 3's token types)."""
    rng = np.random.default_rng(seed)
    if name == "whisper":
        return {"input_features": rng.standard_normal((batch, 8, 32)).astype(np.float32)}
    image = [IMAGE_TOKEN] * IMAGE_TOKENS[name]
    if name == "qwen2_vl":  # between its vision start and end tokens, as its processor writes them
        image = [5, *image, 6]
    rows = [[1, 7, *image, 9, 10], [1, *image, 11, 12, 13, 14]][:batch]
    ids, mask = left_padded(rows)
    inputs = {"input_ids": ids, "attention_mask": mask}
    if (
        name == "qwen2_vl"
    ):  # 16 patches of 3 x 2 x 4 x 4 values per image, merged 2 x 2 into 4 tokens
        inputs["pixel_values"] = rng.standard_normal((batch * 16, 96)).astype(np.float32)
        inputs["image_grid_thw"] = np.array([[1, 4, 4]] * batch)
        inputs["mm_token_type_ids"] = (ids == IMAGE_TOKEN).astype(np.int64)
    else:
        inputs["pixel_values"] = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
    if name == "gemma3":
        inputs["token_type_ids"] = (ids == IMAGE_TOKEN).astype(np.int64)
    return inputs
