"""A stand-in ``torchaudio`` for the reference implementation, used by tests only.

transformers' ``modeling_higgs_audio_v2_tokenizer`` imports torchaudio at module
level but only calls ``torchaudio.functional.resample`` on its encode path.
PyPI's torchaudio wheels load only beside their own CUDA torch build, so on the
CPU torch used here the real package cannot be imported. Tests install this
module into ``sys.modules`` *before* importing the reference; its resample
raises, so a test that reaches the encode path fails loudly instead of running
on a fake resampler. The runtime (``omni_cli``, ``runners``) never imports it.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types


def _resample(*_args, **_kwargs):
    raise NotImplementedError("torchaudio stand-in: resample is not available in tests")


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
