"""Other projects' training loops with detloader's balanced draw inside: Lightning
(``lightning.py``) and Ultralytics (``ultralytics.py``). Each is imported as
``detloader.lightning`` / ``detloader.ultralytics`` and needs its extra.
"""

__all__: list[str] = []
