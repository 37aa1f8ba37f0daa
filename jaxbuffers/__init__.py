"""jaxbuffers: JAX-native reinforcement-learning experience buffers.

Every buffer is an immutable pytree with pure ``create`` / ``add`` / ``sample`` / ``can_sample`` /
``size`` methods that run inside jitted training steps. This module is the public namespace:
import from here, not from the private modules.
"""

from jaxbuffers.replay import ReplayBuffer, ReplaySample

__version__ = "0.1.0"

__all__ = [
    "ReplayBuffer",
    "ReplaySample",
]
