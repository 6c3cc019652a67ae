"""Token choice on the host, for a call whose logits processors include one hfax has no compiled twin of:
a processor class of the caller's own, the one ``prefix_allowed_tokens_fn`` builds, or one of transformers'
that :mod:`hfax.generation.processors` does not translate.

transformers hands a processor the ``input_ids`` so far, a tensor one column longer every step, and lets
it run any Python. A compiled loop holds one buffer of a fixed width and runs no Python, so such a
processor cannot run inside it without changing what it sees. The call therefore runs one token at a time:

    engine.advance   the model on the token fed; its logits kept (``Decoding.host_choice``)   (device)
    engine.read      the token state and those logits                                         (host)
    HostChoice.take  transformers' whole LogitsProcessorList on them, with the input_ids so far,
                     the token chosen as transformers chooses it                               (host)
    engine.take_tokens  the host's token in place of the device's placeholder; rows it finished

The list is the one transformers builds for the call (the settings' processors and the caller's, merged
as transformers merges them), run as transformers runs it, so the tokens are transformers' own. Greedy
search takes the ``argmax``; sampling draws ``torch.multinomial`` from the softmax, with torch's global
generator as transformers does (``torch.manual_seed`` before the call gives transformers' draws), or one
seeded with ``seed=``. The device's own choice (greedy, no processors) is only a placeholder: it marks
no row finished. The cost is one round trip to the host per token, which a warning says when the call
starts.

Tested by tests/test_generate_features.py::test_processors_without_a_twin_run_on_the_host.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np


@dataclasses.dataclass
class HostChoice:
    """What the host needs to choose each token: transformers' ``processors`` (a ``LogitsProcessorList``),
    whether to sample and with which torch ``generator`` (``None``: torch's global one), and whether the
    result records ``scores`` / ``logits``, which the host then keeps per step."""

    processors: Any
    do_sample: bool
    generator: Any
    record_scores: bool
    record_logits: bool
    scores: list[np.ndarray] = dataclasses.field(default_factory=list)
    logits: list[np.ndarray] = dataclasses.field(default_factory=list)

    def take(
        self, engine: Any, run: Any, state: dict[str, np.ndarray], request: Any, prompt: int
    ) -> tuple[Any, dict[str, np.ndarray]]:
        """Choose the newest token of every running row (new token ``step - 1``, for which the device
        chose a placeholder), hand the tokens and the rows they finish to the engine, and return the run
        and the host's state as it now stands."""
        import torch

        rows, step = request.rows, int(state["step"])
        column = prompt + step - 1
        ids, finished = np.array(state["ids"]), np.array(state["finished"])
        so_far = torch.from_numpy(ids[:rows, prompt - request.width : column].astype(np.int64))
        logits = torch.from_numpy(np.array(state["next_logits"][:rows], np.float32))
        scores = self.processors(so_far, logits.clone())
        if self.do_sample:
            probabilities = torch.nn.functional.softmax(scores, dim=-1)
            chosen = torch.multinomial(probabilities, 1, generator=self.generator).squeeze(1)
        else:
            chosen = torch.argmax(scores, dim=-1)
        token = np.where(finished[:rows], request.filler, chosen.numpy()).astype(ids.dtype)
        ids[:rows, column] = token
        finished[:rows] |= np.isin(token, request.eos)
        run = engine.take_tokens(run, ids[:, column], finished)
        state = {**state, "ids": ids, "finished": finished}
        for name, value, kept in (("scores", scores, self.scores), ("logits", logits, self.logits)):
            if getattr(self, f"record_{name}"):
                kept.append(value.numpy())
                state[name] = np.stack(kept, axis=1)
        return run, state


def start(processors: Any, do_sample: bool, seed: int | None, config: Any) -> HostChoice:
    """The host's choice for a call whose ``processors`` hold one without a compiled twin (the warning
    names them); ``seed`` is the caller's ``seed=`` if given, ``config`` the call's generation config."""
    import torch

    from hfax.generation.processors import without_twin

    names = ", ".join(without_twin(processors))
    warnings.warn(
        f"hfax has no compiled twin of {names}: this generate call chooses every token on the host, one "
        "round trip to the device per token (see docs/GENERATION.md)",
        stacklevel=4,
    )
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    recorded = bool(config.return_dict_in_generate)
    return HostChoice(
        processors,
        do_sample,
        generator,
        recorded and bool(config.output_scores),
        recorded and bool(config.output_logits),
    )
