import os

# Before jax is imported anywhere: eight CPU devices for sharding tests, strict plugins.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HFAX_STRICT_PLUGINS", "1")

import pytest  # noqa: E402
import transformers  # noqa: E402

SPECIAL = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
CONFIGS = {
    "llama": transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=256, **SPECIAL,
    ),
    "gemma": transformers.GemmaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, vocab_size=128, max_position_embeddings=256, **SPECIAL,
    ),
    "gpt2": transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256, **SPECIAL),
    "bert": transformers.BertConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128,
        max_position_embeddings=128, num_labels=3,
    ),
}  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def _compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ.setdefault("HFAX_CACHE", str(tmp_path_factory.mktemp("hfax-cache")))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """``tiny(name, auto_class)`` -> (checkpoint dir, PyTorch reference model, hfax JAX model), built once."""
    import hfax
    from hfax.testing import save_tiny

    built = {}

    def build(name: str, auto_class: str = "AutoModelForCausalLM"):
        if (name, auto_class) not in built:
            directory = tmp_path_factory.mktemp(f"{name}-{auto_class}")
            reference = save_tiny(CONFIGS[name], directory, auto_class)
            model = getattr(hfax, auto_class).from_pretrained(str(directory), backend="jax")
            built[name, auto_class] = directory, reference, model
        return built[name, auto_class]

    return build
