"""The value-range and layout families on generated cases (issue 19 families 1 and 2).

:func:`widen_case` gives a generated case (:mod:`cases.strategies`) a range class
(:mod:`cases.ranges`) on every step plus an APE from the whole range, and a strided layout
(:mod:`cases.layouts`) per step with padded cache rows in some. The choices are pure functions of seeds hypothesis already drew
(the case seed, each step's seed), not new draws: a new draw would shift every later example of
the derandomized ``ci`` budget, whose planted-fault searches and coverage the tests pin
(``CI_SEED`` in :mod:`cases.profiles`). So the ``ci`` profile draws the same configurations,
batches and engine sequences as before, now with these values and layouts on a share of them.

Why one range class per case, not per step: pooled keys persist in the cache, so a step of
huge weights scoring the huge keys an earlier step compressed could overflow fp32 in one
summation order and not in another (a certificate question, not a kernel one).
"""
from __future__ import annotations

import dataclasses

from .families import enabled
from .genvalues import ValueSpec
from .layouts import layout_for
from .ranges import range_ape, range_class_for, seeded_chance


def widen_case(case, *, case_seed: int, family: str, value_range_chance: int, layout_chance: int):
    """``case`` with the value-range family (about ``value_range_chance`` % of the cases of the
    ``random`` value family: ``exact`` must stay bitwise, parity-contract.md §3.2, and the tie
    families keep their structured keys, the only source of the near-tie coverage) and
    the layout family (about ``layout_chance`` % of the cases, every step its own layout), each
    unless switched off (:mod:`cases.families`). Tags ``range:CLASS`` / ``layouts:strided``.

    Returns:
        a :class:`cases.spec.Case` (``case`` itself when neither family applies).
    """
    steps, tags, ape = list(case.steps), list(case.tags), case.ape
    cls = range_class_for(case_seed, value_range_chance) if enabled("values") and family == "random" else None
    if cls is not None:
        steps = [dataclasses.replace(s, inputs=dataclasses.replace(s.inputs, range_class=cls))
                 if isinstance(s.inputs, ValueSpec) else s for s in steps]
        cfg = case.config
        ape = range_ape(cfg.index_kpool, cfg.index_head_dim, case_seed)
        tags.append(f"range:{cls}")
    if enabled("layouts") and seeded_chance("layouts", case_seed, layout_chance):
        cfg = case.config
        steps = [dataclasses.replace(s, layout=layout_for(case_seed * 1000 + i, heads=cfg.index_n_heads,
                                                          head_dim=cfg.index_head_dim))
                 for i, s in enumerate(steps)]
        tags.append("layouts:strided")
        geometry = _padded_rows(case, case_seed)
    else:
        geometry = case.geometry
    if steps == list(case.steps) and ape is case.ape:
        return case
    return dataclasses.replace(case, steps=steps, ape=ape, tags=tuple(tags), geometry=geometry)


def _padded_rows(case, case_seed: int):
    """``case.geometry`` with cache rows padded in about half the strided cases (the guard grows
    with the ring block, so a ``-1`` slot used as an index still lands in it)."""
    pad = (0, 1, 3, case.config.index_head_dim)[case_seed % 4]
    geo = case.geometry
    return dataclasses.replace(geo, row_padding=pad, guard=geo.guard + 2 * case.config.ring_capacity * pad)
