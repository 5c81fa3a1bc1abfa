"""Development tools that check the sources (lint-style); not part of any runtime package:
nothing in ``kpool``, ``reference``, ``cases`` or ``parity`` imports them."""
