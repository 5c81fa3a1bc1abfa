"""The cases of a verb that takes ``run``'s selection options (``ab``, ``golden``; the options:
:func:`parity.selection.kernel_cases.add_selection_arguments`), chosen through the public API."""
from __future__ import annotations


def select(args, device: str, console) -> list:
    """The cases ``run``'s selection options in ``args`` choose on ``device``
    (:func:`parity.api.list_cases`), as the harness's ``Selected`` records.

    Raises:
        KeyError / ValueError: as :func:`parity.api.list_cases`.
    """
    from .. import api
    return [ref.selected for ref in api.list_cases(args.suite, args.size, args.case, device=device,
                                                   profile=args.profile, seed=args.seed,
                                                   oracle=not args.no_oracle, console=console)]
