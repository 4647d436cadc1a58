"""A stand-in ``torchaudio`` for the reference implementation, used by tests only.

transformers' ``modeling_higgs_audio_v2_tokenizer`` imports torchaudio at module
level but only calls ``torchaudio.functional.resample`` on its encode path.
PyPI's torchaudio wheels load only beside their own CUDA torch build, so on the
CPU torch used here the real package cannot be imported. Tests install this
module into ``sys.modules`` *before* importing the reference; its resample is
ours (runners/resample.py, torchaudio's algorithm at its defaults), so in CI the
reference's encode path runs on our resampler, and an encode parity test checks
everything after the resampling. tests/test_resample.py checks the resampler
itself: against analytic results here, against the real torchaudio on the
device. Where a real torchaudio imports, it wins and nothing is stood in. The
runtime (``omni_cli``, ``runners``) never imports this module.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


def _resample(waveform, orig_freq, new_freq, lowpass_filter_width=6, rolloff=0.99,
              resampling_method="sinc_interp_hann", beta=None):
    """torchaudio.functional.resample's signature; only its defaults are implemented."""
    from omni_cli.runners.resample import resample

    if (lowpass_filter_width, rolloff, resampling_method, beta) != (6, 0.99, "sinc_interp_hann", None):
        raise NotImplementedError("torchaudio stand-in: resample implements only the default filter")
    return resample(waveform, orig_freq, new_freq)


def install() -> None:
    """Put the stand-in into sys.modules unless a real torchaudio imports."""
    if "torchaudio" in sys.modules:
        return
    try:
        import torchaudio  # noqa: F401  (a working real install wins)
        return
    except Exception:  # the CPU-torch case: the wheel fails to load its library
        sys.modules.pop("torchaudio", None)
    mod = types.ModuleType("torchaudio")
    # transformers checks availability with importlib.util.find_spec, which
    # reads __spec__ of a module already in sys.modules.
    mod.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    mod.__version__ = "0.0.0+standin"
    functional = types.ModuleType("torchaudio.functional")
    functional.__spec__ = importlib.machinery.ModuleSpec("torchaudio.functional", None)
    functional.resample = _resample
    mod.functional = functional
    sys.modules["torchaudio"] = mod
    sys.modules["torchaudio.functional"] = functional
