"""Paths computed from another attribute, for the tests' small "where things are" classes.

Where it sits: ``tests.cluster.node.NodeLayout``, ``tests.cluster.localcluster.LocalCluster``,
``tests.csi_helpers.PluginProcess`` and ``tests.install_helpers.RukpakSystem`` each keep
their files under one work directory. ``kubelet_dir = below("workdir", "kubelet")`` says
where one of them is in a line, instead of a read-only property per path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, overload


class _Below:
    """A read-only attribute: ``Path(<attribute of the instance>, *parts)`` on each read."""

    def __init__(self, attribute: str, parts: tuple[str, ...], doc: str) -> None:
        self.attribute = attribute
        self.parts = parts
        self.__doc__ = doc or f"``{'/'.join((attribute, *parts))}``"

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> _Below: ...

    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None) -> Path: ...

    def __get__(self, obj: object, owner: type[Any] | None = None) -> Path | _Below:
        if obj is None:
            return self
        value: Any = obj
        for name in self.attribute.split("."):
            value = getattr(value, name)
        return Path(value, *self.parts)


def below(attribute: str, *parts: str, doc: str = "") -> _Below:
    """A path below the instance's ``attribute`` (dotted names follow attributes:
    ``below("layout.kubelet_dir")`` is ``Path(self.layout.kubelet_dir)``)."""
    return _Below(attribute, parts, doc)
