"""Stage 6 of ``parity/`` (docs/design.md "Layout"): the results of a run as tables, on the
terminal (rich), in CSV, JSON, markdown and JUnit XML (:mod:`.report`). Nothing here runs a
case; it may import the folders of stages 1-5 (it reads findings and the comparators' names).
"""
