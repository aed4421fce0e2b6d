"""Policy backends: sample K candidate assistant turns per state, and score continuations.

`make_policy(backend="hf", model="smollm2")` builds one; see dataengine.policy.base for the types,
dataengine.policy.factory for the factory.
"""

from dataengine.policy.base import (
    STOP_STRINGS,
    Conversation,
    Policy,
    PolicyStats,
    Sample,
    cut_at_stop,
)
from dataengine.policy.factory import make_policy, policy_from_config

__all__ = ["STOP_STRINGS", "Conversation", "Policy", "PolicyStats", "Sample", "cut_at_stop", "make_policy", "policy_from_config"]
