import os
import subprocess
import sys

SCRIPT = """
import sys, jax, numpy as np
hits = []
jax.monitoring.register_event_listener(lambda event, **_: hits.append(event) if event.endswith("cache_hits") else None)
import hfax
model = hfax.AutoModelForTPU.from_pretrained(sys.argv[1], backend="jax")
print(np.asarray(model.generate(np.array([[1, 5, 9]]), max_new_tokens=8)).tolist(), len(hits))
"""


def test_a_second_process_reads_programs_from_the_persistent_cache(tiny, tmp_path):
    directory, _, _ = tiny("gpt2")
    env = {**os.environ, "HFAX_CACHE": str(tmp_path)}
    env.pop("HFAX_NO_COMPILATION_CACHE", None)

    def run():
        done = subprocess.run([sys.executable, "-c", SCRIPT, str(directory)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        tokens, hits = done.stdout.strip().rsplit(" ", 1)
        return tokens, int(hits)

    first_tokens, first_hits = run()
    assert first_hits == 0 and any((tmp_path / "jax").iterdir())
    second_tokens, second_hits = run()
    assert second_tokens == first_tokens
    assert second_hits >= 1  # the generate program came from disk instead of being compiled again
