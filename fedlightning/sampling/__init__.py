"""Client samplers: callbacks that choose each round's cohort (and, for OCS, its uploaders)."""

from fedlightning.sampling.independent import ImportanceSampler, IndependentSampler
from fedlightning.sampling.optimal import ApproximateOptimalClientSampler, OptimalClientSampler
from fedlightning.sampling.uniform import FullParticipation, UniformSampler

__all__ = [
    "ApproximateOptimalClientSampler",
    "FullParticipation",
    "ImportanceSampler",
    "IndependentSampler",
    "OptimalClientSampler",
    "UniformSampler",
]
