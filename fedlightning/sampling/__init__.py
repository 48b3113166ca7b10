"""Client samplers: callbacks that choose each round's cohort."""

from fedlightning.sampling.uniform import FullParticipation, UniformSampler

__all__ = ["FullParticipation", "UniformSampler"]
