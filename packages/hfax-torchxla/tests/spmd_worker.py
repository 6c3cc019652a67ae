"""Run in a fresh process by test_sharding.py: SPMD must be chosen before the process's first XLA call."""

import json
import sys

import numpy as np

import hfax
from hfax.backends.torchxla.sharding import spec_of
from hfax.testing import as_numpy, reference_generate, save_tiny, tiny_config


def main(directory: str, mesh: str) -> None:
    sizes = {axis: int(size) for axis, size in (part.split("=") for part in mesh.split(","))}
    ref = save_tiny(tiny_config("llama"), directory)
    model = hfax.AutoModelForTPU.from_pretrained(directory, backend="torch_xla", mesh=sizes)
    ids = np.array([[1, 5, 9, 23, 7, 3], [1, 4, 8, 2, 9, 11]])
    with __import__("torch").no_grad():
        want_logits = ref(__import__("torch").as_tensor(ids)).logits.numpy()
    logits = as_numpy(model(input_ids=ids).logits)
    tokens = as_numpy(model.generate(ids, max_new_tokens=12))
    specs = {name: spec_of(tensor) for name, tensor in model.params.items()}
    print(
        json.dumps(
            {
                "logits_error": float(np.abs(logits - want_logits).max()),
                "same_tokens": bool(
                    (tokens == reference_generate(ref, ids, max_new_tokens=12)).all()
                ),
                "q_proj": specs["model.layers.0.self_attn.q_proj.weight"],
                "k_proj": specs["model.layers.0.self_attn.k_proj.weight"],
                "down_proj": specs["model.layers.0.mlp.down_proj.weight"],
                "devices": len(hfax.get_backend("torch_xla").devices()),
                "report_q_proj": dict((p.name, p.spec) for p in model.sharding_report().placements)[
                    "model.layers.0.self_attn.q_proj.weight"
                ],
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
