"""Sharded against unsharded generate on the ~134M benchmark Llama (random weights), in one run.

    python benchmarks/sharding.py [--devices 8] [--batch 8] [--new-tokens 32] [--runs 2]

For one device and each mesh: the weight bytes each device holds (planned before loading, and as
placed), load time, generate tokens/s (compile excluded, best of ``--runs``) and whether
the tokens equal the unsharded run's; then host memory around the unsharded load. On a CPU host the "devices" are XLA host devices sharing the
host's cores, so a mesh adds collectives without adding compute: expect it to be slower there. The
numbers that carry over to TPUs are the bytes per device and the collectives (test_sharding.py).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

MESHES = {
    "one device": None,
    "model=8": {"model": 8},  # 12 heads do not split 8 ways: attention stays whole, the MLP splits
    "data=2,model=4": {"data": 2, "model": 4},
    "fsdp=8": {"fsdp": 8},
}


def rss(reset_peak: bool = False) -> tuple[float, float]:
    """Resident and peak resident host memory of this process, in GB (Linux; NaN elsewhere)."""
    values = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(value.split()[0]) * 1024 / 1e9
        if reset_peak:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # the peak starts again from the current resident size
    except OSError:
        pass
    return values.get("VmRSS", float("nan")), values.get("VmHWM", float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8, help="XLA host devices to create (CPU)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16, help="prompt length")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    os.environ["XLA_FLAGS"] = (
        f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"
    )

    import jax
    import numpy as np
    import torch
    import transformers

    import hfax

    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=2048,
    )
    ids = np.random.default_rng(0).integers(3, config.vocab_size, (args.batch, args.prompt))
    options = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens}
    print(
        f"jax {jax.__version__} on {jax.device_count()} {jax.devices()[0].platform} devices, {os.cpu_count()} CPU cores"
    )
    with tempfile.TemporaryDirectory() as directory:
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(config).save_pretrained(directory)
        gc.collect()
        print(
            f"batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens, float32, best of {args.runs} runs\n"
        )
        print(
            f"{'mesh':<16}{'weights/device':>15}{'planned':>10}{'load s':>8}{'compile s':>10}{'tokens/s':>10}  same tokens"
        )
        reference, memory = None, []
        for label, sizes in MESHES.items():
            planned = hfax.AutoModelForTPU.plan(directory, mesh=sizes)
            memory = memory or [rss(reset_peak=True)[0]]
            started = time.perf_counter()
            model = hfax.AutoModelForTPU.from_pretrained(
                directory, mesh=hfax.make_mesh(**sizes) if sizes else None
            )
            loaded = time.perf_counter() - started
            memory = memory if len(memory) > 1 else [memory[0], *rss()]
            placed = model.sharding_report()
            speeds, compile_seconds = [], 0.0
            for _ in range(args.runs + 1):  # the first run compiles
                tokens = np.asarray(model.generate(ids, **options))
                stats = model.last_generate_stats
                compile_seconds = max(compile_seconds, stats.compile_seconds)
                if stats.compiles == 0:
                    speeds.append(stats.tokens_per_second)
            reference = tokens if reference is None else reference
            same = "yes" if np.array_equal(tokens, reference) else "NO"
            print(
                f"{label:<16}{placed.bytes_per_device / 1e6:>12.1f} MB{planned.bytes_per_device / 1e6:>7.1f} MB"
                f"{loaded:>8.1f}{compile_seconds:>10.1f}{max(speeds):>10.1f}  {same}",
                flush=True,
            )
            del model
            gc.collect()
        before, after, peak = memory
        print(
            f"\nweights {placed.bytes / 1e9:.2f} GB in all. Unsharded load, host RSS: {before:.2f} GB before, "
            f"{after:.2f} GB after, {peak:.2f} GB at peak (on CPU the device arrays are host memory too)"
        )


if __name__ == "__main__":
    sys.exit(main())
