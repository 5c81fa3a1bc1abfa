"""Stage 5 of ``parity/`` (docs/design.md "Layout"): Hugging Face transformers' indexer as a third
implementation (``--oracle hf``; docs/hf-oracle.md): driven with a case's own inputs
(:mod:`.hf_oracle`), its differences from ours classified (:mod:`.hf_classify`) and run next to
the parity run as a step observer (:mod:`.hf_run`). May import the folders of stages 1-4
(findings, implementations, checking, running).
"""
