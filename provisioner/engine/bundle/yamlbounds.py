"""What one manifest file may cost, checked before it is built into objects: its size,
how deep it nests and how far its aliases expand.

Where it sits: below the format loaders (``formats_plain``, ``formats_registry``), which
call :func:`check` on a file's text before composing it. A standing provisioner loads
every BundleDeployment's content in one process, so a hostile file (a YAML "billion
laughs" of nested aliases, a document nested thousands deep, a file of gigabytes) must be
refused by name, quickly and in bounded memory, instead of taking the process down for
the others. The check reads libyaml's event stream (iterative: no recursion, no objects
built), counting the nodes a file would expand to once every alias is replaced by its
anchor's subtree; the bounds are far above what an object the API server accepts (3 MiB
a request) can hold.
"""

from __future__ import annotations

import yaml

from provisioner.engine.errors import BundleInvalid

MAX_FILE_BYTES = 32 * 1024 * 1024
"""Bytes one manifest file may hold."""
MAX_DEPTH = 256
"""Collections one node may be nested in (Kubernetes objects nest a few dozen deep)."""
ALIAS_FLOOR = 100_000
"""Nodes aliases may add to a file whatever its size; beyond it, at most as many nodes as
the file holds itself (Go's yaml.v3 bounds aliasing the same way, by a ratio)."""
MAX_OBJECTS = 50_000
"""Objects one bundle may hold (the loaders check it): an install of more is refused by
name rather than applied for hours."""

_EVENTS: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_size(file: str, size: int) -> None:
    """BundleInvalid when a file of ``size`` bytes is too large to read."""
    if size > MAX_FILE_BYTES:
        raise BundleInvalid(
            f"{file}: {size} bytes, more than the {MAX_FILE_BYTES // (1024 * 1024)} MiB a "
            "manifest file may hold; split it"
        )


def check(file: str, text: str) -> None:
    """BundleInvalid naming ``file`` when its text is too large, nests deeper than
    :data:`MAX_DEPTH` or contains excessive aliasing; syntax errors are left to the
    parse that follows (it words them with their line)."""
    check_size(file, len(text))  # characters: no more than its bytes
    loader = _EVENTS(text)
    written = expanded = depth = 0
    anchored: dict[str, int] = {}
    open_: list[tuple[str | None, int]] = []  # (anchor, expanded count at its start)
    try:
        while loader.check_event():
            event = loader.get_event()  # type: ignore[no-untyped-call]
            if isinstance(event, yaml.AliasEvent):
                expanded += anchored.get(str(event.anchor), 1)
                written += 1
            elif isinstance(event, yaml.ScalarEvent):
                expanded += 1
                written += 1
                if event.anchor is not None:
                    anchored[str(event.anchor)] = 1
            elif isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else 0
                    raise BundleInvalid(
                        f"{file} (line {line}): nested more than {MAX_DEPTH} levels deep"
                    )
                open_.append((event.anchor, expanded))
                expanded += 1
                written += 1
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                anchor, start = open_.pop()
                if anchor is not None:
                    anchored[str(anchor)] = expanded - start
            if expanded - written > max(ALIAS_FLOOR, written):
                raise BundleInvalid(
                    f"{file}: document contains excessive aliasing (more than "
                    f"{expanded} nodes once its aliases are expanded, from {written} written)"
                )
    except yaml.YAMLError:
        return
    finally:
        loader.dispose()


def check_count(count: int) -> None:
    """BundleInvalid when a bundle holds more than :data:`MAX_OBJECTS` objects."""
    if count > MAX_OBJECTS:
        raise BundleInvalid(
            f"the bundle holds {count} objects, more than the {MAX_OBJECTS} one bundle may "
            "install; split it into several bundles"
        )
