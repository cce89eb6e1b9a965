"""The allocation API's client lives in the core (:mod:`awm.episode.allocation`): trainers,
adapters and the UI use it without importing the operator. This name stays for existing callers."""

from awm.episode.allocation import (AllocationClient, AllocationError, bearer, new_connection,  # noqa: F401
                                    past_standby)
