"""Greedy parity of hfax's generate with transformers, for the decoder families hfax's benchmarks run.

    python benchmarks/parity.py            # tiny llama, gemma, gpt2, gemma3_text, mistral; float32
    python benchmarks/parity.py --dtypes float32,bfloat16 --new-tokens 24

Each tiny model (random weights, saved and loaded from a temp dir) continues a left-padded batch of three
prompts with transformers on PyTorch/CPU and with hfax (whole-program, streamed, and the first prompt
alone). In float32 every new token must match; in 16-bit types, where PyTorch's and XLA's kernels round
differently and near-ties flip, the first difference is reported without failing. A quick check to run
after changing generation, the cache, masks or attention; the tests under packages/ hold the same
promise for the families they cover.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np

SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def configs() -> dict[str, object]:
    import transformers

    small = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=128, max_position_embeddings=256)
    return {
        "llama": transformers.LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, **small, **SPECIAL),
        "gemma": transformers.GemmaConfig(num_hidden_layers=2, num_key_value_heads=1, head_dim=16, **small, **SPECIAL),
        "gpt2": transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, **SPECIAL),
        "gemma3_text": transformers.Gemma3TextConfig(
            num_hidden_layers=4, num_key_value_heads=1, head_dim=16, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"] * 2, **small, **SPECIAL,
        ),
        "mistral": transformers.MistralConfig(num_hidden_layers=2, num_key_value_heads=2, sliding_window=8, **small, **SPECIAL),
    }  # fmt: skip


class Collect:
    """A streamer that keeps what it is given."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []

    def put(self, tokens: object) -> None:
        self.chunks.append(np.asarray(tokens))

    def end(self) -> None:
        pass


def check(name: str, config: object, dtype: str, new_tokens: int) -> list[str]:
    """The mismatches of one family in one dtype (empty when hfax matches transformers)."""
    import torch
    import transformers

    import hfax

    torch.manual_seed(0)
    directory = tempfile.mkdtemp(prefix=f"hfax-parity-{name}-")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=getattr(torch, dtype)).eval()
    model = hfax.AutoModelForCausalLM.from_pretrained(directory, backend="jax", dtype=dtype)
    ids = np.array([[1, 5, 9, 23, 7, 3, 44, 12], [0, 0, 0, 4, 8, 2, 60, 61], [0, 0, 0, 0, 0, 0, 6, 90]])
    mask = (ids != 0).astype(np.int64)
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        want = reference.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), **options).numpy()
    failures = []
    whole = np.asarray(model.generate(ids, attention_mask=mask, **options))
    if not np.array_equal(whole, want):
        failures.append(f"generate: first difference at new token {first_difference(whole, want, ids.shape[1])}")
    streamer = Collect()
    streamed = np.asarray(model.generate(ids, attention_mask=mask, streamer=streamer, **options))
    if not np.array_equal(streamed, want) or not np.array_equal(np.concatenate(streamer.chunks[1:], axis=1), want[:, ids.shape[1] :]):
        failures.append(f"streamed: first difference at new token {first_difference(streamed, want, ids.shape[1])}")
    single = np.asarray(model.generate(ids[:1], **options))
    if not np.array_equal(single, want[:1]):
        failures.append(f"batch of one: first difference at new token {first_difference(single, want[:1], ids.shape[1])}")
    return failures


def first_difference(got: np.ndarray, want: np.ndarray, prompt: int) -> int:
    columns = np.nonzero((got != want).any(axis=0))[0]
    return int(columns[0]) - prompt if columns.size else -1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(configs()))
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--new-tokens", type=int, default=20)
    args = parser.parse_args(argv)
    table = configs()
    failed = False
    for dtype in args.dtypes.split(","):
        for name in args.families.split(","):
            failures = check(name, table[name], dtype, args.new_tokens)
            exact = dtype == "float32"
            failed |= exact and bool(failures)
            verdict = "ok" if not failures else ("MISMATCH: " if exact else "differs (rounding): ") + "; ".join(failures)
            print(f"{name:<12} {dtype:<9} {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
