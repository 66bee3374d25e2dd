"""Moved to :mod:`detloader.balance.wrapper`: this import path stays until its importers point there."""

from detloader.balance.wrapper import PARTNER_EPOCHS as PARTNER_EPOCHS
from detloader.balance.wrapper import PartnerSampler as PartnerSampler
