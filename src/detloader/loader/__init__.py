"""The loader stage, samples to batches: the detection collate (``collate.py``: :class:`Batch`),
:func:`make_loader` and its settings (``make.py``), the ``DataLoader`` it returns with its
worker failures (``workers.py``), and mid-epoch resume (``resume.py``).
"""

from detloader.loader.make import LoaderOptions, accelerator_available, make_loader, set_epoch

__all__ = ["LoaderOptions", "accelerator_available", "make_loader", "set_epoch"]
