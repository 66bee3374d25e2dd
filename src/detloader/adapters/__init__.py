"""Other projects' training loops with detloader's balanced draw inside: Lightning
(``lightning.py``), Ultralytics (``ultralytics.py``) and Hugging Face transformers
(``transformers.py``). Each is imported as ``detloader.lightning`` / ``detloader.ultralytics`` /
``detloader.transformers`` and needs its extra.
"""

__all__: list[str] = []
