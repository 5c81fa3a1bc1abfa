"""The corpus of shrunk failures: every generated failure, once shrunk, is kept here forever
and replayed first by ``make parity`` and ``make test`` (parity-contract.md §1: a case is a
sequence of steps over persistent caches).

An entry is two files in :data:`CORPUS_DIR` (or any directory):

* ``<name>.json``: the human-readable case: configuration, cache geometry, and per step the
  requests (``[cached_len, query_len, block_table, ring_block]``), FULL-mode flags, output buffer,
  metadata patch, expected error, prefix-cache forks and how the values were generated, plus provenance (``found_by``,
  ``fault``: what was wrong, ``note``) and ``expect``: ``"pass"`` (the replay must pass with the
  production kernels) or ``"fail:<mutant>"`` entries that document a planted fault (replayed
  with that mutant, they must still fail; with the real kernels they must pass).
* ``<name>.pt``: the exact tensors: the APE and every step's ``k``, ``gate``, ``q``, ``weights``
  (so a replay never depends on today's generators).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from kpool.config import KPoolConfig
from kpool.metadata import BatchSpec, RequestSpec

from .patches import MetadataPatch
from .spec import Case, CacheGeometry, OutputBufferSpec, Step

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
FORMAT = 1


class SavedInputs:
    """``Step.inputs`` callable returning stored tensors (fresh copies each call), for the corpus
    and the repro bundles (:mod:`parity.bundle`).

    A metamorphic relation may ask for the same live rows under more FULL-mode padding rows
    (``metadata.num_tokens`` above the stored row count, the live rows unchanged): the extra rows
    get the large padding garbage of :mod:`cases.values`, as a generator would give them.

    Raises (on call):
        ValueError: the metadata needs fewer rows than stored, or more live rows than stored.
    """

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def __call__(self, case, step, metadata) -> dict:
        out = {n: t.clone() for n, t in self.tensors.items()}
        stored = next(iter(out.values())).shape[0] if out else 0
        T, t_live = int(metadata.num_tokens), int(metadata.num_live_tokens)
        if T == stored or not out:
            return out
        if T < stored or t_live > stored:
            raise ValueError(f"step {step.name}: the stored inputs have {stored} rows, the metadata needs "
                             f"{T} ({t_live} live)")
        from .values import PAD_GATE, PAD_K, PAD_Q, PAD_W
        fill = {"k": PAD_K, "gate": PAD_GATE, "q": PAD_Q, "weights": PAD_W}
        return {n: torch.cat([t, torch.full((T - stored, *t.shape[1:]), fill.get(n, 0.0), dtype=t.dtype)])
                for n, t in out.items()}


def _error_name(exc_type) -> Optional[str]:
    return None if exc_type is None else exc_type.__name__


def _error_type(name: Optional[str]):
    if name is None:
        return None
    import kpool.errors as errors
    return getattr(errors, name)


def case_to_json(case: Case, **info) -> Tuple[dict, dict]:
    """Serialise ``case``: ``(json dict, tensor dict)``. Inputs are materialised per step.

    Raises:
        ValueError: a step's ``patch_metadata`` is not a :class:`cases.patches.MetadataPatch`.
    """
    from .scenarios import step_metadata
    from .values import case_ape, make_inputs

    steps, tensors = [], {"ape": case_ape(case).clone(), "inputs": []}
    for step in case.steps:
        if step.patch_metadata is not None and not isinstance(step.patch_metadata, MetadataPatch):
            raise ValueError(f"step {step.name}: patch {step.patch_metadata!r} is not serialisable")
        b = step.batch
        steps.append({
            "name": step.name,
            "request_ids": list(step.request_ids),
            "requests": [[r.cached_len, r.query_len, list(r.block_table), r.ring_block] for r in b.requests],
            "num_tokens": b.num_tokens, "full_mode": b.full_mode, "num_padded_requests": b.num_padded_requests,
            "block_table_width": b.block_table_width, "stale_tail_slots": b.stale_tail_slots,
            "compute_topk": step.compute_topk, "seed": step.seed,
            "output_buffer": asdict(step.output_buffer) if step.output_buffer else None,
            "patch": step.patch_metadata.to_json() if step.patch_metadata is not None else None,
            "expect_error": _error_name(step.expect_error),
            "forks": [list(f) for f in step.forks],
            "max_score_rows": step.max_score_rows,
            # how the tensors in the .pt were generated (informational: replays read the tensors)
            "values": step.inputs.to_json() if hasattr(step.inputs, "to_json") else None,
        })
        meta = step_metadata(case, step)
        tensors["inputs"].append({n: t.clone() for n, t in make_inputs(case, step, meta).items()})
    doc = {"format": FORMAT, "name": case.name, "size": case.size, "description": case.description,
           "tags": list(case.tags), **info, "config": asdict(case.config), "geometry": asdict(case.geometry),
           "values": case.values, "seed": case.seed, "steps": steps}
    return doc, tensors


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
            cases.grow`` write :data:`CORPUS_DIR`.
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
    steps = []
    for s, inputs in zip(doc["steps"], tensors["inputs"]):
        batch = BatchSpec([RequestSpec(c, q, list(bt), ring) for c, q, bt, ring in s["requests"]],
                          num_tokens=s["num_tokens"], full_mode=s["full_mode"],
                          num_padded_requests=s["num_padded_requests"], block_table_width=s["block_table_width"],
                          stale_tail_slots=s["stale_tail_slots"])
        steps.append(Step(
            name=s["name"], batch=batch, request_ids=list(s["request_ids"]), compute_topk=s["compute_topk"],
            output_buffer=OutputBufferSpec(**s["output_buffer"]) if s["output_buffer"] else None,
            seed=s["seed"], inputs=SavedInputs(inputs),
            patch_metadata=MetadataPatch.from_json(s["patch"]) if s["patch"] else None,
            expect_error=_error_type(s["expect_error"]), forks=tuple(tuple(f) for f in s["forks"]),
            max_score_rows=s.get("max_score_rows")))
    case = Case(name=doc["name"], size=doc["size"], config=KPoolConfig(**doc["config"]),
                geometry=CacheGeometry(**doc["geometry"]), steps=steps, ape=tensors["ape"], seed=doc["seed"],
                values=doc["values"], description=doc.get("description", ""), tags=tuple(doc.get("tags", ())))
    return case, doc


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
