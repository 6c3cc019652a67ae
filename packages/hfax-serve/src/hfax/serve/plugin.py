"""hfax-serve's hook implementations (entry point ``serve`` in group ``hfax``): the ``hfax serve`` command.

Importing this module imports neither torch, jax nor the HTTP server: :mod:`hfax.serve.command` imports
them when the command runs.
"""

from __future__ import annotations

from typing import Any

from hfax import hookimpl


@hookimpl
def hfax_register_commands(cli: Any) -> None:
    """``hfax serve`` (:mod:`hfax.serve.command`)."""
    from hfax.serve import command

    command.register(cli)
