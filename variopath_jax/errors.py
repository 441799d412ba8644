"""Exception types. Every error names the input and what is wrong with it."""

from __future__ import annotations


class VarioPathError(ValueError):
    """Base class of every error variopath_jax raises on bad input."""


class TopologyError(VarioPathError):
    """A topology (model, preset, spec or parsed source) is invalid."""


class ParseError(TopologyError):
    """A topology source could not be parsed; names the source and the line or field."""

    def __init__(self, source: str, where: str, message: str) -> None:
        self.source = source
        self.where = where
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")


class AssumedTopologyWarning(UserWarning):
    """A topology source left something to assumption (the link generation or GPU P2P of
    ``nvidia-smi topo -m`` text); the warning names it and how to say it instead."""
