"""Moved to :mod:`detloader.stats.report`: this import path stays until its importers point there."""

from detloader.stats.report import use_log_scale as use_log_scale
