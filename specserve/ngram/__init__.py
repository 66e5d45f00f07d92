"""N-gram language models over token ids (torch-free): the Katz back-off trigram model drafters use."""
from .katz import KatzModel, good_turing_discounts

__all__ = ["KatzModel", "good_turing_discounts"]
