"""Configs read within bounds: a size cap on the file and a cap on the YAML once its aliases are expanded.

A YAML alias (`*a`) repeats the node its anchor (`&a`) names; nine aliases of nine aliases of ... make a few hundred
bytes stand for millions of values (the "billion laughs"), which anything walking the config would then expand.
`load_yaml` composes the document, counts its nodes with every alias expanded (each node counted once per use,
memoised, so the count itself is cheap) and refuses past `MAX_NODES`; a recursive alias is refused outright. Both
caps, and the file size cap, are one sentence and exit code 2, and an environment variable lifts each.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from gradian.errors import InputError

MAX_BYTES, BYTES_VARIABLE = 1 << 20, "GRADIAN_MAX_CONFIG_BYTES"  # a training config is a few KB
MAX_NODES, NODES_VARIABLE = 100_000, "GRADIAN_MAX_CONFIG_NODES"  # values once aliases are expanded


def _limit(variable: str, default: int) -> int:
    try:
        return int(os.environ.get(variable, default))
    except ValueError:
        raise InputError(f"should be a whole number of {'bytes' if 'BYTES' in variable else 'values'}.",
                         f"${variable}") from None


def check_size(path: Path) -> None:
    """`InputError` when the config file is larger than the cap (`$GRADIAN_MAX_CONFIG_BYTES`, default 1 MiB)."""
    size, cap = path.stat().st_size, _limit(BYTES_VARIABLE, MAX_BYTES)
    if size > cap:
        raise InputError(f"is {size:,} bytes, more than the {cap:,} a training config may be; pass the config itself, "
                         f"or set {BYTES_VARIABLE} to a larger number of bytes.", path)


def load_yaml(text: str, path: Path) -> Any:
    """`yaml.safe_load(text)`, refused when its aliases expand past `$GRADIAN_MAX_CONFIG_NODES` values (default
    100,000) or an alias is used inside its own anchor."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        cap = _limit(NODES_VARIABLE, MAX_NODES)
        total = _expanded(node, {}, set(), path)
        if total > cap:
            raise InputError(f"expands to {total:,} values once its YAML aliases are repeated, more than {cap:,}; "
                             f"write the values out, or set {NODES_VARIABLE} to a larger number.", path)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int], path: Path) -> int:
    """How many nodes `node` stands for with every alias expanded (`sizes` memoises shared nodes)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:
        raise InputError("uses a YAML alias inside its own anchor (a recursive value); write the values out.", path)
    open_nodes.add(key)
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = []
    try:
        total = 1 + sum(_expanded(child, sizes, open_nodes, path) for child in children)
    except RecursionError:
        raise InputError("is nested too deeply to read; flatten the config.", path) from None
    open_nodes.discard(key)
    sizes[key] = total
    return total
