"""Save and restore a (partially) searched tree, so a run can resume mid-search."""

from __future__ import annotations

import dataclasses
import os

import torch

from mcts.tree import Tree

# Bumped when the Tree fields change; load_tree refuses other versions.
FORMAT_VERSION = 1


def save_tree(tree: Tree, path: str | os.PathLike) -> None:
    """Write the tree's tensors (moved to CPU) and the format version with torch.save."""
    payload = {name: t.detach().cpu() for name, t in tree.tensors().items()}
    torch.save({"format_version": FORMAT_VERSION, "tensors": payload}, path)


def load_tree(path: str | os.PathLike, device: torch.device | str = "cpu") -> Tree:
    """Read a tree written by save_tree onto `device`."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or "tensors" not in data:
        raise ValueError(f"{path} is not a tree written by mcts.save_tree")
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path} has tree format {version}; this mcts reads format {FORMAT_VERSION}")
    names = {f.name for f in dataclasses.fields(Tree)}
    missing = names - set(data["tensors"])
    if missing:
        raise ValueError(f"{path} lacks tree fields {sorted(missing)}")
    return Tree(**{name: data["tensors"][name].to(device) for name in names})
