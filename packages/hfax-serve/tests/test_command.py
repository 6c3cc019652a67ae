"""``hfax serve`` as hfax-serve's plugin adds it: listed by ``hfax --help``, refused on a backend without a
continuous-batching engine before anything loads, and driving the engine the backend declares
(:meth:`hfax.Backend.serving_engine`). The server itself is tested with the official openai client in the
repository's tests/test_serve.py."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import hfax
from hfax import serve
from hfax.cli import app
from hfax.plugins import plugin_infos, reset_plugins
from hfax.testing import installed_distribution

NO_ENGINE_BACKEND = """
import hfax

class NoEngine(hfax.Backend):
    name = "noengine"

    def devices(self):
        return ["noengine:0"]

    def build(self, model, *, params, family, plan, mesh):
        raise AssertionError("hfax serve loaded a model on a backend that cannot serve it")

@hfax.hookimpl
def hfax_backends():
    return [hfax.BackendSpec("noengine", "noengine_backend:NoEngine")]
"""


@pytest.fixture(autouse=True)
def fresh_plugins():
    reset_plugins()
    yield
    reset_plugins()


def test_serve_comes_from_the_hfax_serve_plugin():
    infos = {info.name: info for info in plugin_infos()}
    assert infos["serve"].distribution == "hfax-serve" and infos["serve"].status == "loaded"
    result = CliRunner().invoke(app, ["--help"])
    assert (
        result.exit_code == 0 and "serve" in result.output and "OpenAI-compatible" in result.output
    )


def test_serve_on_a_backend_without_an_engine_fails_before_loading_anything(tmp_path):
    # The model folder is empty: had hfax serve started loading, the error would be about config.json.
    model = tmp_path / "model"
    model.mkdir()
    modules = {"noengine_backend": NO_ENGINE_BACKEND}
    with installed_distribution(
        tmp_path / "dist", "hfax-noengine", {"noengine": "noengine_backend"}, modules
    ):
        result = CliRunner().invoke(app, ["serve", "-b", "noengine", "-m", str(model)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        "hfax: error: -b noengine: the noengine backend has no continuous-batching engine, so hfax serve "
        "cannot run on it; serve with a backend that has one (-b jax)"
    )


class RecordingEngine:
    """Records what the warm-up asks of it; a chunk finishes every row at once."""

    prefixes = 0  # no prefix store

    def __init__(self, slots: int, piece: int, lookup: int = 0) -> None:
        self.slots, self.piece, self.lookup, self.calls = slots, piece, lookup, []

    def bucket(self, length):
        return 16

    def admit(self, requests):
        self.calls.append(("admit", [request.row for request in requests]))

    def decode(self, steps, rows, guess=False):
        self.calls.append(("guess" if guess else "decode", rows))

    def read(self):
        self.calls.append(("read",))

    def prefill(self, pieces):
        self.calls.append(("prefill", [(p.admission.row, p.start, p.end) for p in pieces]))

    def move(self, source, target):
        self.calls.append(("move", source, target))

    def release(self, free):
        self.calls.append(("release", bool(np.all(free))))

    def shift(self, delta):
        self.calls.append(("shift", delta))

    def restart(self, clock):
        self.calls.append(("restart", clock))


class Serving(hfax.Backend):
    name = "serving"

    def devices(self):
        return []

    def build(self, model, *, params, family, plan, mesh):
        return model

    def serves(self):
        return True

    def serving_engine(self, model, *, slots, length, chunk, prefixes=0, piece=0, lookup=0):
        self.asked = (model, slots, length, chunk, prefixes, piece)
        return RecordingEngine(slots, piece, lookup)


def test_the_server_warms_up_the_engine_its_backend_declares():
    backend, model = Serving(), object()
    engine = serve.engine(backend, model, slots=4, length=64)
    assert backend.asked == (model, 4, 64, serve.CHUNK, 0, 0)
    # A prefill of 1, 2 and 4 prompts together and a decode program for as many busy rows; then, every
    # row free, a decode of 1, 2 and 4 rows that runs no step (an engine's programs over whole rows,
    # where its busy rows' decodes ran over a short window), and the clock back at 0.
    decodes = [call[1] for call in engine.calls if call[0] == "decode"]
    assert decodes == [1, 2, 4, 1, 2, 4]
    admits = [call[1] for call in engine.calls if call[0] == "admit"]
    assert admits == [[0], [0, 1], [0, 1, 2, 3]]
    released = engine.calls.index(("release", True))
    assert not any(call[0] == "admit" for call in engine.calls[released:])
    assert [call[1] for call in engine.calls[released:] if call[0] == "decode"] == [1, 2, 4]
    assert engine.calls[-2:] == [("shift", 0), ("restart", 0)]
    assert not any(call[0] == "prefill" for call in engine.calls)
    assert not any(call[0] == "guess" for call in engine.calls)


def test_the_warm_up_of_an_engine_guessing_tokens_compiles_its_guessing_decodes():
    """With prompt lookup, the warm-up also runs a guessing decode of greedy rows for every power of two
    of rows up to the scheduler's ``LOOKUP_ROWS``, busy and then free (a short window and whole rows)."""
    from hfax.serve.scheduler import LOOKUP_ROWS

    backend, model = Serving(), object()
    engine = serve.engine(backend, model, slots=8, length=64, lookup=3)
    assert LOOKUP_ROWS == 4
    guesses = [call[1] for call in engine.calls if call[0] == "guess"]
    assert guesses == [1, 2, 4, 1, 2, 4]
    decodes = [call[1] for call in engine.calls if call[0] == "decode"]
    assert decodes == [1, 2, 4, 8, 1, 2, 4, 8]
    released = engine.calls.index(("release", True))
    assert [call[1] for call in engine.calls[released:] if call[0] == "guess"] == [1, 2, 4]


def test_the_warm_up_prefills_a_piece_of_every_power_of_two_of_prompts():
    """With prompts prefilled in pieces of 32 (:func:`hfax.serve.prefill_piece`: the default of 256 is
    off in rows of 64 columns), the warm-up also prefills one-token pieces in 1, 2 and 4 rows together,
    the clock where a piece fits before it."""
    backend, model = Serving(), object()
    assert serve.prefill_piece(None, 64) == 0 and serve.prefill_piece(None, 1024) == serve.PIECE
    with pytest.raises(ValueError, match="--prefill-chunk 64"):
        serve.prefill_piece(64, 64)
    engine = serve.engine(backend, model, slots=4, length=64, piece=32)
    assert backend.asked == (model, 4, 64, serve.CHUNK, 0, 32)
    start = engine.calls.index(("restart", 32))
    assert engine.calls[start + 1 : start + 4] == [
        ("prefill", [(row, 0, 1) for row in range(n)]) for n in (1, 2, 4)
    ]
    assert engine.calls[-1] == ("restart", 0)
