"""KPool pooled sparse-attention indexer backend (GLM-5.3-Flash).

Importing this package (or ``kpool.config``, ``kpool.metadata``, ``kpool.cache``) never imports
Triton; the kernels are imported by :class:`kpool.backend.KPoolIndexerBackend` at construction
or by ``kpool.indexer`` on first use.
"""
from .config import GLM53_FLASH, SMALL, KPoolConfig

__all__ = ["KPoolConfig", "GLM53_FLASH", "SMALL"]
