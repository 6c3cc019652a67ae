"""The continuous-batching engine of ``hfax serve``: rows joining and leaving a running batch, and the cache
moving under them, give every request the tokens ``generate`` gives it alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hfax.backends.jax import monitor
from hfax.backends.jax.slots import SlotEngine, check_servable
from hfax.generation.rows import Sampling
from hfax.generation.slots import Admission

PROMPTS = [
    [1, 5, 9, 30, 40],
    [1, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23],
    [1, 50],
]
NEW = 12
SAMPLED = dict(temperature=0.7, top_p=0.9, seed=11)


def _generated(model, prompt, **options):
    out = np.asarray(model.generate(np.array([prompt]), max_new_tokens=NEW, **options))
    return out[0, len(prompt) :].tolist()


def _admit(engine: SlotEngine, row: int, prompt: list[int], sampling: Sampling, **options) -> dict:
    """One request admitted alone: its first token's choice."""
    return engine.admit([Admission(row, prompt, sampling, NEW, **options)])[0]


def _run(engine: SlotEngine, schedule) -> dict[int, list[int]]:
    """Admit ``(row, prompt, sampling)`` entries chunk by chunk (one list per chunk, admitted together;
    ``int`` entries shift the cache by that much first), and collect every row's tokens until all
    finished."""
    tokens: dict[int, list[int]] = {}
    for entries in schedule:
        for entry in entries:
            if isinstance(entry, int):
                engine.shift(entry)
        admitted = [Admission(*entry, NEW) for entry in entries if not isinstance(entry, int)]
        for request, chosen in zip(admitted, engine.admit(admitted) if admitted else []):
            tokens[request.row] = [int(chosen["token"])]
        engine.decode(engine.chunk, max(tokens) + 1)
        chunk = engine.read()
        for row in tokens:
            tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
    while not chunk.finished[list(tokens)].all():
        engine.decode(engine.chunk, max(tokens) + 1)
        chunk = engine.read()
        for row in tokens:
            tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
    return tokens


@pytest.mark.parametrize("sizes", [None, {"data": 4, "model": 2}], ids=["one-device", "mesh"])
def test_rows_joining_a_running_batch_get_their_generate_tokens(tiny, sizes):
    import hfax

    directory, _, model = tiny("llama")
    if sizes is not None:
        model = hfax.AutoModelForCausalLM.from_pretrained(
            str(directory), backend="jax", mesh=hfax.make_mesh(**sizes)
        )
    greedy = [_generated(model, p, do_sample=False) for p in PROMPTS]
    sampled = _generated(model, PROMPTS[0], do_sample=True, top_k=0, **SAMPLED)
    engine = SlotEngine(model, slots=4, length=96, chunk=4)
    schedule = [
        [40, (0, PROMPTS[0], Sampling(0.0))],
        [(2, PROMPTS[1], Sampling(0.0))],  # joins after row 0's first chunk
        [
            -8,
            (1, PROMPTS[2], Sampling(0.0)),
            (3, PROMPTS[0], Sampling(**SAMPLED)),
        ],  # the cache moves
    ]
    tokens = _run(engine, schedule)
    assert tokens[0] == greedy[0] and tokens[2] == greedy[1] and tokens[1] == greedy[2]
    assert tokens[3] == sampled


def test_prompts_admitted_together_get_their_generate_tokens(tiny):
    # Three prompts of 5, 18 and 2 tokens, greedy and sampled, prefilled in one program beside a running
    # row: padded into the 32-token bucket of the longest, with a fourth row of padding that lands in no row
    # (had it been clipped into the last row, row 4's request would be lost), each gets the tokens
    # generate gives it alone, and the running row keeps its own.
    _, _, model = tiny("llama")
    greedy = [_generated(model, p, do_sample=False) for p in PROMPTS]
    sampled = _generated(model, PROMPTS[0], do_sample=True, top_k=0, **SAMPLED)
    engine = SlotEngine(model, slots=5, length=96, chunk=4)
    schedule = [
        [40, (1, PROMPTS[1], Sampling(0.0))],
        [
            (4, PROMPTS[2], Sampling(0.0)),
            (0, PROMPTS[0], Sampling(**SAMPLED)),
            (2, PROMPTS[1], Sampling(0.0)),
        ],
    ]
    tokens = _run(engine, schedule)
    assert tokens[1] == greedy[1] and tokens[2] == greedy[1] and tokens[4] == greedy[2]
    assert tokens[0] == sampled


def test_admit_refuses_what_it_cannot_do_before_running(tiny):
    _, _, model = tiny("llama")
    engine = SlotEngine(model, slots=2, length=96, chunk=4)
    with pytest.raises(ValueError, match="distinct rows from 0 to 1"):
        engine.admit([Admission(1, [1], Sampling(), NEW), Admission(1, [2], Sampling(), NEW)])
    with pytest.raises(ValueError, match="distinct rows from 0 to 1"):
        engine.admit([Admission(2, [1], Sampling(), NEW)])
    with pytest.raises(ValueError, match="row 0 is empty"):
        engine.admit([Admission(0, [], Sampling(), NEW)])
    with pytest.raises(ValueError, match="at least one request"):
        engine.admit([])


def test_sampled_rows_without_top_p_draw_generates_tokens_with_or_without_a_top_p_neighbour(tiny):
    # A batch whose sampled rows all keep top_p 1 skips the top-p cutoff (rows.WORKS); once a row with top_p
    # 0.9 joins, every row goes through it. Either way a row draws what generate draws alone.
    _, _, model = tiny("llama")
    plain = dict(temperature=0.7, seed=5)
    alone = _generated(model, PROMPTS[1], do_sample=True, top_k=0, top_p=1.0, **plain)
    nucleus = _generated(model, PROMPTS[0], do_sample=True, top_k=0, **SAMPLED)
    engine = SlotEngine(model, slots=2, length=96, chunk=4)
    schedule = [[40, (0, PROMPTS[1], Sampling(**plain))], [(1, PROMPTS[0], Sampling(**SAMPLED))]]
    tokens = _run(engine, schedule)
    assert tokens[0] == alone and tokens[1] == nucleus


def test_new_settings_and_rows_compile_nothing(tiny):
    _, _, model = tiny("llama")
    engine = SlotEngine(model, slots=4, length=96, chunk=4)
    # Decode programs for 1, 2 and 4 rows; prefills of one and of two requests admitted together.
    _run(
        engine,
        [
            [40, (0, PROMPTS[0], Sampling(0.0))],
            [(1, PROMPTS[2], Sampling(**SAMPLED))],
            [(2, PROMPTS[0], Sampling(0.0)), (3, PROMPTS[2], Sampling(0.0))],
        ],
    )
    before = monitor.snapshot().compiles
    for i, prompt in enumerate(PROMPTS[::2] * 2):
        _run(engine, [[(i, prompt, Sampling(0.1 * i, 1 - 0.1 * i, seed=i, choice=i))], [-2]])
    assert monitor.snapshot().compiles == before


def test_models_the_engine_cannot_run_are_refused_by_name(tiny):
    _, _, model = tiny("mamba")
    with pytest.raises(NotImplementedError, match="hfax serve"):
        check_servable(model, 64)
    # GPT-Neo's local layers are right only while the cache fits in their window (40 here): rows longer than
    # that are refused, since hfax serve cannot decode without a cache as generate then does.
    _, _, model = tiny("gpt_neo")
    check_servable(model, 32)
    with pytest.raises(NotImplementedError, match="needs a static cache.*window_size 40"):
        check_servable(model, 64)


def test_a_request_moved_to_another_row_keeps_its_generate_tokens(tiny):
    # hfax serve packs requests into the leading rows so that a chunk runs as few rows as possible: a
    # greedy and a sampled request move from rows 3 and 2 to rows 0 and 1 mid-generation, and the chunks
    # after run two rows.
    _, _, model = tiny("llama")
    greedy = _generated(model, PROMPTS[1], do_sample=False)
    sampled = _generated(model, PROMPTS[0], do_sample=True, top_k=0, **SAMPLED)
    engine = SlotEngine(model, slots=4, length=96, chunk=4)
    engine.shift(40)
    tokens = {
        3: [int(_admit(engine, 3, PROMPTS[1], Sampling(0.0))["token"])],
        2: [int(_admit(engine, 2, PROMPTS[0], Sampling(**SAMPLED))["token"])],
    }
    engine.decode(engine.chunk, 4)
    chunk = engine.read()
    for row in tokens:
        tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
    finished = chunk.finished[[3, 2]]
    engine.move(3, 0)
    engine.move(2, 1)
    tokens = {0: tokens[3], 1: tokens[2]}
    while not finished.all():
        engine.decode(engine.chunk, 2)
        chunk = engine.read()
        assert chunk.finished[2:].all() and not chunk.count[2:].any()  # the rows left are free
        for row in tokens:
            tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
        finished = chunk.finished[:2]
    assert tokens[0] == greedy and tokens[1] == sampled


def _bits(tokens: list[int], words: int) -> np.ndarray:
    """The packed bitmask of ``hfax.generation.rows.allow`` allowing ``tokens``."""
    bits = np.zeros((words,), np.uint32)
    for token in tokens:
        bits[token // 32] |= np.uint32(1 << (token % 32))
    return bits.view(np.int32)


def test_allowed_tokens_narrow_a_rows_choice_and_leave_its_neighbour_as_it_is(tiny):
    # What a grammar (hfax serve's response_format) does to a row: each step, its first token's included,
    # it chooses the likeliest of the tokens its bits allow (transformers' logits with the rest removed);
    # its logprobs stay the model's own; the row beside it, given every bit, gets generate's tokens.
    import torch

    _, reference, model = tiny("llama")
    greedy = _generated(model, PROMPTS[1], do_sample=False)
    engine = SlotEngine(model, slots=2, length=96, chunk=4)
    engine.shift(40)
    allowed = [5, 31, 40, 77]
    bits = _bits(allowed, (engine.vocab + 31) // 32)
    every = np.full_like(bits, -1)
    first, other = engine.admit(  # together: the row without a grammar is allowed every token
        [
            Admission(0, PROMPTS[0], Sampling(0.0, logprobs=True), NEW, allowed=bits),
            Admission(1, PROMPTS[1], Sampling(0.0), NEW),
        ]
    )
    tokens = {0: [int(first["token"])], 1: [int(other["token"])]}
    logprobs = [float(first["logprob"])]
    finished = np.zeros(2, bool)
    while not finished.all():
        engine.decode(1, 2, allowed=np.stack([bits, every]))
        chunk = engine.read()
        assert chunk.count.max() <= 1
        for row in tokens:
            tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
        logprobs += chunk.logprobs[0, : chunk.count[0]].tolist()
        finished = chunk.finished
    assert tokens[1] == greedy
    expected, want = [], []
    with torch.no_grad():
        for _ in range(NEW):
            logits = reference(torch.tensor([PROMPTS[0] + expected])).logits[0, -1].float()
            token = allowed[int(torch.argmax(logits[allowed]))]
            expected.append(token)
            want.append(float(torch.log_softmax(logits, -1)[token]))
    assert tokens[0] == expected
    np.testing.assert_allclose(logprobs, want, atol=1e-4)


SHARED = [1] + list(range(60, 100))  # 41 tokens: two whole blocks of 16 and more


def _finish(engine: SlotEngine, tokens: dict[int, list[int]], rows: int) -> dict[int, list[int]]:
    """Decode until every row of ``tokens`` finished, collecting their tokens."""
    finished = False
    while not finished:
        engine.decode(engine.chunk, rows)
        chunk = engine.read()
        for row in tokens:
            tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
        finished = chunk.finished[list(tokens)].all()
    return tokens


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_prompts_reusing_a_stored_prefix_get_their_generate_tokens(tiny, name):
    # A prompt is prefilled whole and its first 32 tokens kept in the prefix store; three prompts that
    # begin with them (greedy, sampled, and one that is exactly the kept 32 tokens) then prefill only the
    # rest, attending to the stored columns, while the first decodes: each gets generate's tokens, with
    # its first token's logprob within 1e-4 of the one it gets prefilled whole. Then the first prompt,
    # moved by a shift since its prefill, is kept whole in entry 0 and reused. Gemma 3's sliding layer
    # (a window of 4) sees the tokens it sees in a whole prefill: the stored tokens end where the rest
    # begins, with no padding between them.
    from hfax.generation.slots import Kept, Reuse

    _, _, model = tiny(name)
    prompts = [SHARED + [5, 9], SHARED + [30, 40, 7], SHARED[:32], SHARED + [5, 9, 11, 12]]
    greedy = [_generated(model, p, do_sample=False) for p in prompts]
    sampled = _generated(model, prompts[1], do_sample=True, top_k=0, **SAMPLED)
    whole = SlotEngine(model, slots=4, length=160, chunk=4)
    whole.shift(64)
    alone = [_admit(whole, 0, p, Sampling(0.0)) for p in prompts[1:3]]
    engine = SlotEngine(model, slots=4, length=160, chunk=4, prefixes=2)
    assert engine.prefix_length == 64 and engine.columns(43, 32) == 32 + 16
    engine.shift(64)
    tokens = {0: [int(_admit(engine, 0, prompts[0], Sampling(0.0))["token"])]}
    engine.keep([Kept(0, 1, 32)])
    reused = [
        Admission(1, prompts[1], Sampling(0.0), NEW, reuse=Reuse(1, 32)),
        Admission(2, prompts[2], Sampling(0.0), NEW, reuse=Reuse(1, 31)),
        Admission(3, prompts[1], Sampling(**SAMPLED), NEW, reuse=Reuse(1, 32)),
    ]
    engine.shift(16)  # room for the stored columns' bucket and the rest's
    chosen = engine.admit(reused)
    for one, first in zip(chosen[:2], alone):
        assert int(one["token"]) == int(first["token"])
        np.testing.assert_allclose(one["logprob"], first["logprob"], atol=1e-4)
    tokens.update({r.row: [int(c["token"])] for r, c in zip(reused, chosen)})
    tokens = _finish(engine, tokens, 4)
    assert [tokens[0], tokens[1], tokens[2]] == greedy[:3] and tokens[3] == sampled
    engine.keep([Kept(0, 0, 43)])
    after = engine.admit([Admission(1, prompts[3], Sampling(0.0), NEW, reuse=Reuse(0, 43))])
    assert _finish(engine, {1: [int(after[0]["token"])]}, 4)[1] == greedy[3]
    with pytest.raises(ValueError, match="holds 43 tokens"):
        engine.admit([Admission(0, [1, 2, 3], Sampling(0.0), NEW, reuse=Reuse(0, 2))])
    engine.restart(64)
    with pytest.raises(ValueError, match="80 columns before the clock"):
        engine.admit([Admission(1, prompts[3], Sampling(0.0), NEW, reuse=Reuse(0, 43))])


def test_a_chunked_attention_model_reusing_a_stored_prefix_gets_its_generate_tokens(tmp_path):
    # hfax.testing's tiny Llama 4 (its first layer sees chunks of 4 positions, a 64-token vocabulary):
    # prompts of 39 and 33 tokens reuse the first 32 of another's, stored; chunk boundaries fall inside
    # the stored prefix and after it, and both get generate's tokens, as the prompt kept does.
    import hfax
    from hfax.generation.slots import Kept, Reuse
    from hfax.testing import save_tiny
    from hfax.testing.configs import mask_config

    save_tiny(mask_config("llama4"), tmp_path, "AutoModelForCausalLM")
    model = hfax.AutoModelForCausalLM.from_pretrained(str(tmp_path), backend="jax")
    shared = [1, *np.random.default_rng(3).integers(4, 64, 35).tolist()]
    prompts = [shared + [5, 9], shared + [30, 40, 7], shared[:32] + [11]]
    greedy = [_generated(model, p, do_sample=False) for p in prompts]
    engine = SlotEngine(model, slots=4, length=160, chunk=4, prefixes=2)
    assert engine.prefixes == 2 and engine.prefix_refusal == ""
    engine.shift(64)
    tokens = {0: [int(_admit(engine, 0, prompts[0], Sampling(0.0))["token"])]}
    engine.keep([Kept(0, 1, 32)])
    reused = [
        Admission(row, prompt, Sampling(0.0), NEW, reuse=Reuse(1, 32))
        for row, prompt in ((1, prompts[1]), (2, prompts[2]))
    ]
    engine.shift(16)
    tokens.update({r.row: [int(c["token"])] for r, c in zip(reused, engine.admit(reused))})
    tokens = _finish(engine, tokens, 3)
    assert [tokens[0], tokens[1], tokens[2]] == greedy


LONG = [1, *np.random.default_rng(3).integers(4, 128, 69).tolist()]  # 70 tokens: 6, then two of 32


def _transformers(reference, prompt: list[int]) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of ``prompt`` (``NEW`` tokens, ``generate``) and each token's
    log-softmax from a forward over the prompt and those tokens."""
    import torch

    from hfax.testing import reference_generate

    out = reference_generate(reference, np.array([prompt]), max_new_tokens=NEW)[0]
    expected = out[len(prompt) :].tolist()
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + expected])).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits.float(), -1)[torch.arange(len(expected)), expected]
    return expected, logprobs.tolist()


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_a_long_prompt_prefilled_in_pieces_beside_a_decoding_row_gets_its_generate_tokens(
    tiny, name
):
    # A 70-token prompt prefilled in pieces of 32 (its 6 first, then 32 and 32) while row 0 decodes a
    # chunk between each: the cache shifts (left, then right) and the partly prefilled row moves to
    # another row between pieces. Its row produces nothing until its last piece; then its tokens are
    # generate's and transformers' greedy ones, their logprobs transformers' within 1e-4, and row 0's
    # tokens are generate's too. Gemma 3's sliding layer (a window of 4) sees the same tokens as in a
    # prompt prefilled whole: the pieces sit in consecutive columns ending at the clock.
    from hfax.generation.slots import Piece

    _, reference, model = tiny(name)
    expected, logprobs = _transformers(reference, LONG)
    assert _generated(model, LONG, do_sample=False) == expected
    running = _generated(model, PROMPTS[1], do_sample=False)
    engine = SlotEngine(model, slots=3, length=160, chunk=4, piece=32)
    assert engine.piece == 32 and engine.piece_refusal == ""
    engine.shift(40)
    tokens = {0: [int(_admit(engine, 0, PROMPTS[1], Sampling(0.0))["token"])]}
    long = Admission(1, LONG, Sampling(0.0, logprobs=True), NEW)
    chosen = None
    for start, end, before in ((0, 6, None), (6, 38, -4), (38, 70, 30)):
        if before is not None:
            engine.shift(before)
        if end == 70:
            engine.move(1, 2)
            long = dataclasses.replace(long, row=2)
        (chosen,) = engine.prefill([Piece(long, start, end)])
        assert (chosen is None) == (end < 70)
        engine.decode(engine.chunk, 3)
        chunk = engine.read()
        tokens[0] += chunk.tokens[0, : chunk.count[0]].tolist()
        if end < 70:
            assert chunk.count[1:].sum() == 0 and chunk.finished[1:].all()  # reserved: no tokens
    tokens[2] = [int(chosen["token"])] + chunk.tokens[2, : chunk.count[2]].tolist()
    got = [float(chosen["logprob"])] + chunk.logprobs[2, : chunk.count[2]].tolist()
    while not chunk.finished[[0, 2]].all():
        engine.decode(engine.chunk, 3)
        chunk = engine.read()
        for row in tokens:
            tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
        got += chunk.logprobs[2, : chunk.count[2]].tolist()
    assert tokens[2] == expected and tokens[0] == running
    np.testing.assert_allclose(got, logprobs, atol=1e-4)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_decodes_over_a_short_window_of_columns_get_their_generate_tokens(tiny, name):
    # Rows of 160 columns with a short window of 32: while the unfinished rows' tokens (and the chunk's
    # steps) fit 32 columns, a decode runs over those 32 alone, then over whole rows. A 20-token prompt
    # alone fills its window exactly at its last chunk (20 + 3 chunks of 4); then rows join, the cache
    # shifts left and right, and a 70-token prompt needs whole rows from its start. Every request gets
    # generate's tokens; Gemma 3's sliding layer (a window of 4) sees the same column distances.
    _, _, model = tiny(name)
    prompts = [LONG[:20], *PROMPTS, LONG]
    greedy = [_generated(model, p, do_sample=False) for p in prompts]
    engine = SlotEngine(model, slots=4, length=160, chunk=4, window=32)
    assert engine.windows == (32, 160)
    chosen = []
    window = engine._window
    engine._window = lambda steps, rows: chosen.append(window(steps, rows)) or chosen[-1]
    assert _run(engine, [[100, (0, LONG[:20], Sampling(0.0))]]) == {0: greedy[0]}
    assert chosen == [(72, 32), (76, 32), (80, 32)]  # the last starts at the row's first column, 80
    schedule = [
        [-12, (0, PROMPTS[0], Sampling(0.0))],
        [(1, PROMPTS[2], Sampling(0.0))],
        [-30, (2, PROMPTS[1], Sampling(0.0))],
        [],
        [50, (3, LONG, Sampling(0.0))],  # its bucket of 128 columns ends at the clock, 136
    ]
    tokens = _run(engine, schedule)
    assert [tokens[row] for row in range(4)] == [greedy[1], greedy[3], greedy[2], greedy[4]]
    widths = [columns for _, columns in chosen[3:]]
    assert widths[:2] == [32, 32] and 160 in widths, chosen
    with pytest.raises(ValueError, match="short decode window"):
        SlotEngine(model, slots=4, length=160, chunk=4, window=160)


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_decodes_guessing_by_prompt_lookup_get_their_generate_tokens(tiny, name):
    # Guessing steps (3 tokens a row by prompt lookup, checked in the same forward) give greedy rows
    # generate's tokens, more than one a step where the model agrees with the guess, and a sampled row
    # its own draws one a step; a row whose guesses were cut rolls right (Chunk.moved), the cache then
    # shifts under the rolled rows, and Gemma 3's sliding layer (a window of 4) sees the column distances
    # of plain decoding. Plain chunks after guessing ones continue from the same rows.
    _, _, model = tiny(name)
    prompts = [[1, 5, 9, 30, 5, 9, 30, 5, 9], PROMPTS[1], PROMPTS[0]]
    greedy = [_generated(model, p, do_sample=False) for p in prompts[:2]]
    sampled = _generated(model, prompts[2], do_sample=True, top_k=0, **SAMPLED)
    engine = SlotEngine(model, slots=4, length=96, chunk=4, lookup=3)
    engine.restart(40)
    samplings = [Sampling(0.0), Sampling(0.0), Sampling(**SAMPLED)]
    admitted = [Admission(row, p, s, NEW) for row, (p, s) in enumerate(zip(prompts, samplings))]
    tokens = {a.row: [int(c["token"])] for a, c in zip(admitted, engine.admit(admitted))}
    most, moved = 0, np.zeros((4,), int)
    for guess in (True, True, False, True, True, False, False):
        if not guess:
            engine.shift(-8)
        engine.decode(engine.chunk, 3, guess=guess)
        chunk = engine.read()
        most = max(most, int(chunk.count[:2].max()))
        moved += chunk.moved
        for row in tokens:
            tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
        assert chunk.count[2] <= engine.chunk  # a sampled row: one token a step
    assert chunk.finished[:3].all()
    assert [tokens[0], tokens[1]] == greedy and tokens[2] == sampled
    assert most > engine.chunk and moved[:2].sum() > 0  # guesses were kept, and some cut
    with pytest.raises(ValueError, match="lookup=0"):
        SlotEngine(model, slots=4, length=96, chunk=4).decode(4, 1, guess=True)


@pytest.mark.parametrize("guess", [False, True], ids=["plain", "guessing"])
def test_chunks_decoded_before_the_last_is_read_get_their_generate_tokens(tiny, guess):
    # Every chunk started before the one before it is read (hfax serve's scheduler does so while its
    # rows only decode): the reads return the chunks in order and the rows get generate's tokens, a
    # sampled row its draws. The decode window counts the columns the unread chunk may write (a short
    # window of 32 columns, then whole rows once they may pass it). What places columns by the clock
    # waits for every read.
    _, _, model = tiny("llama")
    prompts = [[1, 5, 9, 30, 5, 9, 30, 5, 9], PROMPTS[0]]
    greedy = _generated(model, prompts[0], do_sample=False)
    sampled = _generated(model, prompts[1], do_sample=True, top_k=0, **SAMPLED)
    engine = SlotEngine(model, slots=2, length=96, chunk=2, window=32, lookup=3)
    engine.restart(16)
    samplings = [Sampling(0.0), Sampling(**SAMPLED)]
    admitted = [Admission(row, p, s, NEW) for row, (p, s) in enumerate(zip(prompts, samplings))]
    tokens = {a.row: [int(c["token"])] for a, c in zip(admitted, engine.admit(admitted))}
    width = engine.chunk * (engine.lookup + 1 if guess else 1)
    engine.decode(engine.chunk, 2, guess=guess)
    reads = 0
    while True:
        engine.decode(engine.chunk, 2, guess=guess)  # before the last one is read
        assert engine.unread == 2 and engine.ahead == 2 * width
        with pytest.raises(ValueError, match="read the 2 decoded chunk"):
            engine.shift(-1)
        chunk = engine.read()
        reads += 1
        for row in tokens:
            tokens[row] += chunk.tokens[row, : chunk.count[row]].tolist()
        if chunk.finished[:2].all():
            break
    last = engine.read()  # it ran no step: every row had finished
    assert engine.unread == 0 and not last.count.any()
    assert tokens[0] == greedy and tokens[1] == sampled
    assert reads == -(-(NEW - 1) // engine.chunk)  # the sampled row: one token a step
    with pytest.raises(ValueError, match="no decoded chunk to read"):
        engine.read()
