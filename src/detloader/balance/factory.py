"""Moved to :mod:`detloader.balance.weights`: this import path stays until its importers point there."""

from detloader.balance.weights import BALANCE_CHOICES as BALANCE_CHOICES
from detloader.balance.weights import make_balanced_sampler as make_balanced_sampler
