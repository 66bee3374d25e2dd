"""Moved to :mod:`detloader.balance.class_aware`: this import path stays until its importers point there."""

from detloader.balance.class_aware import BalancedBatchSampler as BalancedBatchSampler
