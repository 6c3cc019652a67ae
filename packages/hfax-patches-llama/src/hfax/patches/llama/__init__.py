"""hfax's Llama family: Llama, Mistral, Ministral, Qwen2, Qwen3, SmolLM3 and Granite. The hooks are in :mod:`hfax.patches.llama.plugin`."""
