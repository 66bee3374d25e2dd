"""Moved to :mod:`detloader.balance.wrapper`: this import path stays until its importers point there."""

from detloader.balance.wrapper import AspectRatioBatchSampler as AspectRatioBatchSampler
