"""The corpus of shrunk failures: every generated failure, once shrunk, is kept here forever
and replayed first by ``make parity`` and ``make test`` (parity-contract.md §1: a case is a
sequence of steps over persistent caches).

An entry is two files in :data:`CORPUS_DIR` (or any directory):

* ``<name>.json``: the human-readable case (:func:`cases.serialize.case_to_json`: configuration,
  cache geometry, and per step the requests, FULL-mode flags, output buffer, metadata patch,
  expected error, prefix-cache forks and how the values were generated), plus provenance
  (``found_by``, ``fault``: what was wrong, ``note``) and ``expect``: ``"pass"`` (the replay must
  pass with the production kernels) or ``"fail:<mutant>"`` entries that document a planted fault
  (replayed with that mutant, they must still fail; with the real kernels they must pass).
* ``<name>.pt``: the exact tensors: the APE and every step's ``k``, ``gate``, ``q``, ``weights``
  (so a replay never depends on today's generators).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from .serialize import FORMAT, case_from_json, case_to_json
from .spec import Case

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"


def _dumps(obj, indent: int = 0, width: int = 100) -> str:
    """JSON where every list or object that fits in ``width`` characters stays on one line."""
    flat = json.dumps(obj)
    if len(flat) + indent <= width or not isinstance(obj, (list, dict)) or not obj:
        return flat
    pad = " " * (indent + 1)
    if isinstance(obj, list):
        items = [pad + _dumps(v, indent + 1, width) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    items = [f"{pad}{json.dumps(k)}: {_dumps(v, indent + 1, width)}" for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def safe_name(name: str) -> str:
    """File-system safe entry name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def save_case(case: Case, directory, *, name: Optional[str] = None, **info) -> Path:
    """Write ``case`` as ``<name>.json`` + ``<name>.pt`` into ``directory`` (created if needed).

    Args:
        case: the case (inputs are materialised now).
        directory: target directory, always given: a run saves into its own output directory
            (``corpus-candidates``); only ``python -m parity corpus add`` and ``python -m
            parity.verbs.grow`` write :data:`CORPUS_DIR`.
        name: entry name (default ``case.name``).
        info: provenance fields (``found_by``, ``fault``, ``note``, ``expect``...).
    Returns:
        Path of the JSON file.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = safe_name(name or case.name)
    info.setdefault("expect", "pass")
    doc, tensors = case_to_json(case, **info)
    doc["name"] = name
    (directory / f"{name}.json").write_text(_dumps(doc) + "\n")
    torch.save(tensors, directory / f"{name}.pt")
    return directory / f"{name}.json"


def load_case(path) -> Tuple[Case, dict]:
    """Read a corpus entry (``.json`` path; the ``.pt`` next to it).

    Returns:
        ``(case, info)``; ``info`` is the JSON document (provenance fields included).
    Raises:
        ValueError: unknown format. FileNotFoundError: missing file.
    """
    path = Path(path)
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: corpus format {doc.get('format')!r}, expected {FORMAT}")
    tensors = torch.load(path.with_suffix(".pt"), weights_only=True)
    return case_from_json(doc, tensors), doc


def entries(directory=CORPUS_DIR) -> List[Path]:
    """The JSON files of a corpus directory, sorted by name (empty if the directory is missing)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.json") if p.with_suffix(".pt").exists())


def load_all(directory=CORPUS_DIR) -> List[Tuple[Case, dict]]:
    """Every entry of ``directory`` as ``(case, info)``."""
    return [load_case(p) for p in entries(directory)]


def mutant_of(info: dict) -> Optional[str]:
    """The mutant a ``"fail:<mutant>"`` entry documents, else ``None``."""
    expect = info.get("expect", "pass")
    return expect.split(":", 1)[1] if expect.startswith("fail:") else None


def describe(case: Case) -> List[str]:
    """A compact human-readable description of a case (one line per step)."""
    cfg, geo = case.config, case.geometry
    lines = [f"{case.case_id}: H={cfg.index_n_heads} D={cfg.index_head_dim} P={cfg.index_kpool} "
             f"K_tok={cfg.index_topk} C={cfg.ring_capacity} mode={cfg.score_mode} pack_tail={cfg.pack_tail}; "
             f"pages={geo.num_pages}xB={geo.page_size} (+{geo.page_padding}) ring blocks={geo.num_tail_blocks} "
             f"(+{geo.ring_block_padding})"]
    for i, s in enumerate(case.steps):
        reqs = ", ".join(f"r{rid}:{r.cached_len}+{r.query_len}@ring{r.ring_block}"
                         for rid, r in zip(s.request_ids, s.batch.requests))
        flags = []
        if not s.compute_topk:
            flags.append("cache-only")
        if s.batch.full_mode:
            flags.append(f"FULL T={s.batch.num_tokens} padded_reqs={s.batch.num_padded_requests}"
                         + (" stale" if s.batch.stale_tail_slots else ""))
        if s.output_buffer:
            flags.append(f"buffer {s.output_buffer.capacity}x{s.output_buffer.width}/{s.output_buffer.row_step}")
        if s.patch_metadata is not None:
            flags.append(f"patch {getattr(s.patch_metadata, 'kind', s.patch_metadata)}")
        if s.expect_error:
            flags.append(f"expect {s.expect_error.__name__}")
        if s.forks:
            flags.append(f"forks {list(s.forks)}")
        if s.max_score_rows is not None:
            flags.append(f"max_score_rows {s.max_score_rows}")
        spec = s.inputs
        if spec is not None and hasattr(spec, "family"):
            flags.append(f"values {spec.family}" + (f" specials {len(spec.specials)}" if spec.specials else ""))
        lines.append(f"  step {i} {s.name}: [{reqs}]" + (f" ({'; '.join(flags)})" if flags else ""))
    return lines


def default_directory() -> Path:
    """``$KPOOL_CORPUS_DIR`` if set, else :data:`CORPUS_DIR`."""
    return Path(os.environ.get("KPOOL_CORPUS_DIR") or CORPUS_DIR)


def promote(path, directory=None, *, name: Optional[str] = None, force: bool = False) -> Path:
    """Copy one saved case (a ``corpus-candidates`` entry of a run, or any entry) into the corpus
    (``python -m parity corpus add``); the JSON is checked to load first.

    Args:
        path: the entry's ``.json`` (its ``.pt`` next to it).
        directory: the corpus (default :func:`default_directory`).
        name: new entry name (default the entry's own).
        force: replace an entry of that name.
    Returns:
        The new JSON path.
    Raises:
        FileNotFoundError: no such entry. ValueError: not a loadable corpus entry.
        FileExistsError: an entry of that name exists and ``force`` is false.
    """
    path = Path(path)
    if path.suffix != ".json":
        path = path.with_suffix(".json")
    if not path.is_file() or not path.with_suffix(".pt").is_file():
        raise FileNotFoundError(f"{path}: no corpus entry here (need {path.name} and {path.with_suffix('.pt').name})")
    try:
        case, doc = load_case(path)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ValueError(f"{path} is not a loadable corpus entry: {type(exc).__name__}: {exc}") from exc
    directory = Path(directory or default_directory())
    target = directory / f"{safe_name(name or doc['name'])}.json"
    if target.exists() and not force:
        raise FileExistsError(f"{target} exists (pass --name NEW or --force)")
    directory.mkdir(parents=True, exist_ok=True)
    doc["name"] = target.stem
    target.write_text(_dumps(doc) + "\n")
    import shutil
    shutil.copyfile(path.with_suffix(".pt"), target.with_suffix(".pt"))
    return target
