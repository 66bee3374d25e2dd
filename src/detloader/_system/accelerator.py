"""The accelerator torch sees: CUDA (and ROCm, which torch calls CUDA) first, then whatever
``torch.accelerator`` reports. Nothing here creates a CUDA context (safe before DataLoader
workers fork) except :func:`accelerator_info` asking for the device name.
"""

from __future__ import annotations

#: Accelerator types whose host-to-device copies benefit from page-locked (pinned) memory.
PINNABLE = ("cuda", "xpu")


def accelerator_kind() -> str | None:
    """Device type of the accelerator torch sees (``"cuda"``, ``"mps"``, ``"xpu"``...), or None."""
    import torch  # torch: lazy, keeps the CLI fast

    if torch.cuda.is_available():
        return "cuda"
    accel = getattr(torch, "accelerator", None)
    if accel is not None and accel.is_available():
        device = accel.current_accelerator()
        return device.type if device is not None else None
    return None


def accelerator_available() -> bool:
    """Whether torch sees a device worth pinning memory for (CUDA, ROCm, XPU, MPS...)."""
    return accelerator_kind() is not None


def accelerator_info() -> tuple[str | None, str | None, int]:
    """``(type, device name, count)`` of the accelerator torch sees, or ``(None, None, 0)``."""
    import torch  # torch: lazy, keeps the CLI fast

    kind = accelerator_kind()
    if kind == "cuda":
        try:
            name = torch.cuda.get_device_name(0)
        except Exception:  # a driver that answers is_available but not the name
            name = None
        return "cuda", name, torch.cuda.device_count()
    if kind is None:
        return None, None, 0
    return kind, kind, int(torch.accelerator.device_count())
