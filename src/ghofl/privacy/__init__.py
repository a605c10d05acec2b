"""Differential privacy of the released aggregate (docs/privacy.md).

* :mod:`~ghofl.privacy.sensitivity`: L2 sensitivity per block under clipping ‖z‖ ≤ R;
* :mod:`~ghofl.privacy.accounting`: calibration with ``dp-accounting`` (extra ``privacy``);
* :mod:`~ghofl.privacy.mechanism`: the Gaussian mechanism, its calibration and central mode;
* :mod:`~ghofl.privacy.distributed`: distributed mode (noise shares, removable dropout levels);
* :mod:`~ghofl.privacy.postprocess`: noisy sums → valid statistics.
"""

from ghofl.privacy.accounting import (
    calibrate_noise_multiplier,
    check_epsilon_delta,
    gaussian_epsilon,
)
from ghofl.privacy.distributed import (
    NoiseShareEncoder,
    NoisyDecoder,
    kept_variance,
    noise_share_encoder,
)
from ghofl.privacy.mechanism import (
    DEFAULT_DELTA,
    DP_MODES,
    NOISE_CLAMP_SIGMAS,
    DPConfig,
    DPMode,
    NoisePlan,
    PrivateRelease,
    block_sigmas,
    draw_noise,
    entry_scales,
    plan_noise,
    release_central,
    truncation_probability,
)
from ghofl.privacy.postprocess import (
    clamp_counts,
    denoise_covariance,
    denoised_eigenvalues,
    floor_noise_bulk,
    noise_aware_covariances,
    noise_aware_shrinkage,
    noise_aware_within,
    postprocess,
    project_psd,
)
from ghofl.privacy.sensitivity import (
    block_names,
    block_sensitivities,
    flat_change,
    packed_outer_norm,
    weighted_sensitivity,
)
from ghofl.privacy.split import SPLITS, UNUSED_FRACTION, auto_fractions

#: Default k of the minimum-count rule of DP runs in the CLI and the Flower apps (runs without
#: DP default to 1, i.e. off, so their results stay independent of the partition).
DEFAULT_MIN_CLASS_COUNT = 5

__all__ = [
    "DEFAULT_DELTA",
    "DEFAULT_MIN_CLASS_COUNT",
    "DP_MODES",
    "NOISE_CLAMP_SIGMAS",
    "SPLITS",
    "UNUSED_FRACTION",
    "DPConfig",
    "DPMode",
    "NoisePlan",
    "NoiseShareEncoder",
    "NoisyDecoder",
    "PrivateRelease",
    "auto_fractions",
    "block_names",
    "block_sensitivities",
    "block_sigmas",
    "calibrate_noise_multiplier",
    "check_epsilon_delta",
    "clamp_counts",
    "denoise_covariance",
    "denoised_eigenvalues",
    "draw_noise",
    "entry_scales",
    "flat_change",
    "floor_noise_bulk",
    "gaussian_epsilon",
    "kept_variance",
    "noise_aware_covariances",
    "noise_aware_shrinkage",
    "noise_aware_within",
    "noise_share_encoder",
    "packed_outer_norm",
    "plan_noise",
    "postprocess",
    "project_psd",
    "release_central",
    "truncation_probability",
    "weighted_sensitivity",
]
