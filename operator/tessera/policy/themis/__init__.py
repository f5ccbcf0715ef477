"""Themis: finish-time fair GPU auctions across training apps (Themis, Mahajan et al., NSDI'20)."""

from tessera.policy.themis.arbiter import Themis, ThemisConfig, admit, filter_apps, participants
from tessera.policy.themis.auction import AuctionResult, run_auction
from tessera.policy.themis.bids import Bid, make_bid

__all__ = [
    "AuctionResult",
    "Bid",
    "Themis",
    "ThemisConfig",
    "admit",
    "filter_apps",
    "make_bid",
    "participants",
    "run_auction",
]
