"""Splitting one parity run over a CI matrix of hosts: ``python -m parity run --shard i/n``
(like vLLM's ``--shard-id`` / ``--num-shards``), and the manifest a shard leaves for
``python -m parity merge`` (:mod:`parity.verbs.merge`).

A run is a list of *units*, in run order: every corpus and seed case (``name[size]``), every
public case (``C09``), every generated kind (``generated:batch``, ``generated:engine``). Shard
``i`` of ``n`` runs the units whose index ``k`` has ``k % n == i``: deterministic, needs no
coordination, and strided so that the slow GLM-size seed cases spread over the shards. Every run
that writes a report (``--report DIR``) also writes ``DIR/shard.json``: the shard, the whole
run's unit list and the units it ran.

Importing this module imports neither torch nor the harness (the CLI parser uses it).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

MANIFEST = "shard.json"
MANIFEST_FORMAT = 1
Shard = Tuple[int, int]


def parse_shard(text: str) -> Shard:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n`` (an argparse ``type``).

    Raises:
        argparse.ArgumentTypeError: not ``i/n`` with integers in range.
    """
    try:
        i, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/n (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"shard {text!r}: need 0 <= i < n")
    return i, n


def in_shard(index: int, shard: Optional[Shard]) -> bool:
    """Whether unit ``index`` of the run belongs to ``shard`` (``None``: the whole run)."""
    return shard is None or index % shard[1] == shard[0]


def shard_units(units: Sequence[str], shard: Optional[Shard]) -> List[str]:
    """The units of ``units`` that ``shard`` runs, in run order."""
    return [u for k, u in enumerate(units) if in_shard(k, shard)]


def write_manifest(directory: str, *, shard: Optional[Shard], units: Sequence[str], ran: Sequence[str],
                   suite: str, parts: Dict[str, str]) -> str:
    """Write ``directory/shard.json`` (module docstring; ``parts``: the suite of every unit);
    returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, MANIFEST)
    i, n = shard or (0, 1)
    with open(path, "w") as f:
        json.dump({"format": MANIFEST_FORMAT, "shard": [i, n], "suite": suite, "units": list(units),
                   "parts": {u: parts[u] for u in units}, "ran": list(ran)}, f, indent=1)
    return path


def read_manifest(directory: str) -> dict:
    """The manifest of a report directory.

    Raises:
        ValueError: no manifest, or not one this version writes.
    """
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{directory}: no readable {MANIFEST} (was it written by python -m parity run "
                         f"--report?): {exc}") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{path}: not a shard manifest of format {MANIFEST_FORMAT}")
    return data
