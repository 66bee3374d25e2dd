"""Moved to :mod:`detloader.balance.weighted`: this import path stays until its importers point there."""

from detloader.balance.weighted import RepeatFactorSampler as RepeatFactorSampler
