import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

SCRIPT = """
import json, sys, jax, numpy as np
hits = []
jax.monitoring.register_event_listener(lambda event, **_: hits.append(event) if event.endswith("cache_hits") else None)
import hfax
model = hfax.AutoModelForTPU.from_pretrained(sys.argv[1], backend="jax")
# Count traces of the model's Python forward without touching the model: a profiler sees each call.
code, forwards = type(model.module).forward.__code__, []
sys.setprofile(lambda frame, event, _: forwards.append(1) if event == "call" and frame.f_code is code else None)
tokens = np.asarray(model.generate(np.array([[1, 5, 9]]), max_new_tokens=8)).tolist()
sys.setprofile(None)
print(json.dumps({"tokens": tokens, "hits": len(hits), "forwards": len(forwards)}))
"""


@pytest.fixture(scope="module")
def run_in_process(tiny):
    """``run(cache, **env)``: generate in a fresh process with ``cache`` as hfax's cache; returns what it
    printed and its stderr."""
    import json

    directory, _, _ = tiny("gpt2")

    def run(cache, **extra_env: str) -> dict:
        env = {**os.environ, "HFAX_CACHE": str(cache), **extra_env}
        if "HFAX_NO_COMPILATION_CACHE" not in extra_env:
            env.pop("HFAX_NO_COMPILATION_CACHE", None)
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(directory)], env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}

    return run


@pytest.fixture(scope="module")
def first_run(run_in_process, tmp_path_factory):
    """One cold run whose cache folder did not exist yet: ``(its parent, the cache, what it printed)``.
    The tests below read that cache where it lies (JAX's compilation key holds the cache's path, so a copy
    would miss), each of their processes costing a start of torch and jax."""
    parent = tmp_path_factory.mktemp("first")
    cache = parent / "new" / "cache"
    return parent, cache, run_in_process(cache)


def test_a_second_process_reads_programs_from_the_persistent_cache(run_in_process, first_run):
    _, cache, first = first_run
    assert first["hits"] == 0 and any((cache / "jax").iterdir())
    # the model's Python forward, traced for prefill and for the decode step
    assert first["forwards"] == 2
    second = run_in_process(cache)
    assert second["tokens"] == first["tokens"]
    # the generate program came from disk instead of being compiled again ...
    assert second["hits"] >= 1
    # ... and the model was not traced again: the traced program came from disk too (programs.py)
    assert second["forwards"] == 0


def test_an_unreadable_traced_program_is_traced_again(run_in_process, first_run):
    # The damaged programs are traced again and replaced: the cache is whole again for any later test.
    _, cache, first = first_run
    stored = sorted((cache / "jax" / "hfax-programs").glob("*.bin"))  # prefill and decode
    assert stored
    for program in stored:
        program.write_bytes(b"not a program")
    second = run_in_process(cache)
    assert second["tokens"] == first["tokens"]
    assert second["forwards"] == first["forwards"]
    for program in stored:
        assert program.read_bytes() != b"not a program"  # replaced by the new trace
        assert f"traced program {program} is not used" in second["stderr"]


def test_a_cache_that_is_a_file_is_a_warning_and_an_uncached_run(
    run_in_process, first_run, tmp_path
):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    second = run_in_process(blocker)
    assert second["tokens"] == first_run[2]["tokens"]
    assert second["stderr"].count("cannot use the traced-program cache") == 1


def test_the_cache_folders_are_private_to_the_user(first_run):
    parent = first_run[0]
    for folder in ("new", "new/cache", "new/cache/jax", "new/cache/jax/hfax-programs"):
        assert (parent / folder).stat().st_mode & 0o777 == 0o700, folder


def test_no_compilation_cache_keeps_no_traced_programs(run_in_process, tmp_path):
    run_in_process(tmp_path, HFAX_NO_COMPILATION_CACHE="1")
    assert not (tmp_path / "jax" / "hfax-programs").exists()


def test_the_key_follows_what_the_trace_depends_on(tmp_path):
    import torch
    import transformers

    from hfax.backends.jax import programs

    def llama(**overrides):
        config = transformers.LlamaConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            **overrides,
        )
        return transformers.LlamaForCausalLM(config)

    torch.manual_seed(0)
    a, b = llama(), llama()
    assert programs.model_fingerprint(a, "llama") == programs.model_fingerprint(
        b, "llama"
    )  # weights are arguments
    assert programs.model_fingerprint(a, "llama") != programs.model_fingerprint(a, "generic")
    assert programs.model_fingerprint(a, "llama") != programs.model_fingerprint(
        llama(rope_theta=500.0), "llama"
    )
    eager = llama()
    eager.config._attn_implementation = "eager"
    assert programs.model_fingerprint(a, "llama") != programs.model_fingerprint(eager, "llama")

    from hfax.patching import Patcher, unpatch

    before = programs.model_fingerprint(b, "llama")
    Patcher(b).setattr(b.model, "some_switch", True)
    assert programs.model_fingerprint(b, "llama") != before
    unpatch(b)
    assert programs.model_fingerprint(b, "llama") == before

    x = jax.numpy.zeros((2, 3), jax.numpy.float32)
    key = programs.call_key("generate", ("static", 1), ({"w": x}, np.int32(3)))
    assert key == programs.call_key(
        "generate", ("static", 1), ({"w": x}, np.int32(4))
    )  # values do not matter
    assert key != programs.call_key("generate", ("static", 2), ({"w": x}, np.int32(3)))
    assert key != programs.call_key(
        "generate", ("static", 1), ({"w": x.astype(jax.numpy.bfloat16)}, np.int32(3))
    )
    assert key != programs.call_key("generate", ("static", 1), ({"v": x}, np.int32(3)))
    assert key != programs.call_key("generate", ("static", 1), ({"w": x[:1]}, np.int32(3)))


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """Traced programs of this test go to (and come from) a folder of its own."""
    from hfax.backends.jax import programs

    folder = tmp_path / "hfax-programs"
    monkeypatch.setattr(programs, "cache_dir", lambda: folder)
    return folder


def _forward_matches(model, reference, ids):
    import torch

    expected = reference(torch.tensor(ids)).logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(model(np.array(ids)).logits), expected, atol=1e-4)


def _gpt2(tiny, **overrides):
    """A fresh hfax model of the tiny GPT-2 checkpoint (its own programs) and the PyTorch reference."""
    import hfax

    directory, reference, _ = tiny("gpt2")
    return hfax.AutoModelForCausalLM.from_pretrained(str(directory), backend="jax"), reference


@pytest.mark.parametrize("swap", ["module", "instance forward"])
def test_a_modified_model_and_the_plain_one_do_not_share_programs(tiny, own_cache, swap):
    import torch
    import transformers

    import hfax

    directory, reference, _ = tiny("gpt2")
    modified = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    if swap == "module":
        modified.transformer.h[0].mlp.act = torch.nn.ReLU()
    else:
        modified.transformer.h[0].mlp.act.forward = torch.relu
    expected = modified(torch.tensor([[1, 5, 9]])).logits.detach().numpy()
    first = hfax.AutoModelForCausalLM.from_model(modified, backend="jax")
    np.testing.assert_allclose(np.asarray(first(np.array([[1, 5, 9]])).logits), expected, atol=1e-4)
    plain = hfax.AutoModelForCausalLM.from_pretrained(str(directory), backend="jax")
    _forward_matches(plain, reference, [[1, 5, 9]])  # not the modified model's program
    assert len(list(own_cache.glob("forward-*.bin"))) == 2


def test_a_model_holding_code_without_a_source_file_is_not_kept_on_disk(tiny, own_cache):
    import torch
    import transformers

    import hfax

    directory, _, _ = tiny("gpt2")
    modified = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    namespace: dict = {}
    exec("def act(x):\n    return x * 2.0", namespace)  # as typed into an interactive session
    modified.transformer.h[0].mlp.act.forward = namespace["act"]
    expected = modified(torch.tensor([[1, 5, 9]])).logits.detach().numpy()
    model = hfax.AutoModelForCausalLM.from_model(modified, backend="jax")
    np.testing.assert_allclose(np.asarray(model(np.array([[1, 5, 9]])).logits), expected, atol=1e-4)
    assert not own_cache.exists()


def test_damaged_and_swapped_entries_are_traced_again_and_replaced(tiny, own_cache, caplog):
    # Two programs: the forward pads ids into buckets of 16 and 32 columns (hfax.forward_buckets).
    shapes = [[[1, 5, 9]], [[1, 5, 9, 2, 7] * 4]]

    def run_fresh_model() -> list[str]:
        """Both shapes through a new model (new programs, read from disk); the warnings it logged."""
        caplog.clear()
        model, reference = _gpt2(tiny)
        with caplog.at_level("WARNING", logger="hfax"):
            for ids in shapes:
                _forward_matches(model, reference, ids)
        return [record.getMessage() for record in caplog.records]

    assert run_fresh_model() == []
    a, b = sorted(own_cache.glob("forward-*.bin"))
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(
        b_bytes
    )  # each file in the other's slot: a valid program with the wrong signature
    b.write_bytes(a_bytes)
    warnings = run_fresh_model()
    assert len(warnings) == 2 and all("stored under another key" in w for w in warnings)
    assert {str(a), str(b)} == {w.split()[3] for w in warnings}
    assert run_fresh_model() == []  # replaced by good ones

    data = bytearray(a.read_bytes())
    data[-100] ^= 0x10  # one bit flipped inside the serialized program
    a.write_bytes(bytes(data))
    (warning,) = run_fresh_model()
    assert str(a) in warning and "checksum" in warning
    assert run_fresh_model() == []


@pytest.mark.parametrize("damage", ["cache is a file", "entry is a folder", "read-only folder"])
def test_an_unusable_cache_is_one_warning_and_an_uncached_run(tiny, own_cache, caplog, damage):
    if damage == "read-only folder" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    model, reference = _gpt2(tiny)
    _forward_matches(model, reference, [[1, 5, 9]])
    (entry,) = own_cache.glob("forward-*.bin")
    if damage == "cache is a file":
        for stored in own_cache.iterdir():
            stored.unlink()
        own_cache.rmdir()
        own_cache.write_text("")
    elif damage == "entry is a folder":
        entry.unlink()
        entry.mkdir()
    else:
        entry.unlink()
        own_cache.chmod(0o500)
    caplog.clear()
    model, reference = _gpt2(tiny)
    with caplog.at_level("WARNING", logger="hfax"):
        _forward_matches(model, reference, [[1, 5, 9]])
    (warning,) = [record.getMessage() for record in caplog.records]
    assert "cannot use the traced-program cache" in warning


def test_the_key_ignores_where_the_checkpoint_lies(tiny, tmp_path):

    import transformers

    from hfax.backends.jax import programs

    directory, _, _ = tiny("gpt2")
    shutil.copytree(directory, tmp_path / "elsewhere")
    here = transformers.AutoModelForCausalLM.from_pretrained(directory)
    there = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "elsewhere")
    assert here.config._name_or_path != there.config._name_or_path
    assert programs.model_fingerprint(here, "generic") == programs.model_fingerprint(
        there, "generic"
    )


def test_the_key_follows_the_jax_flags_that_change_numerics(tiny):
    import transformers

    from hfax.backends.jax import programs

    directory, _, _ = tiny("gpt2")
    module = transformers.AutoModelForCausalLM.from_pretrained(directory)
    before = programs.model_fingerprint(module, "generic")
    flag = jax.config.jax_threefry_partitionable
    try:
        jax.config.update("jax_threefry_partitionable", not flag)
        assert programs.model_fingerprint(module, "generic") != before
    finally:
        jax.config.update("jax_threefry_partitionable", flag)
    assert programs.model_fingerprint(module, "generic") == before


def test_the_digest_of_installed_files_is_kept_per_file_set(tmp_path):
    from hfax.backends.jax import programs

    package, memo = tmp_path / "transformers", tmp_path / "memo"
    (package / "models").mkdir(parents=True)
    (package / "activations.py").write_text("def gelu(x):\n    return x\n")
    (package / "models" / "m.py").write_text("")
    memo.mkdir()
    first = programs.installed_digest(package, memo)
    assert programs.installed_digest(package, memo) == first
    assert len(list(memo.iterdir())) == 1  # computed once for this file set
    (package / "activations.py").write_text("def gelu(x):\n    return -x\n")  # same version string
    assert programs.installed_digest(package, memo) != first


def test_private_folders_are_created_0700(tmp_path):
    from hfax.backends.jax import programs

    programs.make_private_dir(tmp_path / "a" / "b")
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == 0o700


def test_a_peft_wrapped_model_is_keyed_by_its_adapters(tiny):
    peft = pytest.importorskip("peft")
    import transformers

    from hfax.backends.jax import programs

    directory, _, _ = tiny("llama")
    plain = transformers.AutoModelForCausalLM.from_pretrained(directory)
    wrapped = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_pretrained(directory),
        peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    ).base_model.model
    keys = {
        programs.model_fingerprint(plain, "llama"),
        programs.model_fingerprint(wrapped, "llama"),
    }
    for module in wrapped.modules():
        if isinstance(getattr(module, "scaling", None), dict):
            module.scaling["default"] = 5.0  # a Python float the trace bakes in
    keys.add(programs.model_fingerprint(wrapped, "llama"))
    assert None not in keys and len(keys) == 3
