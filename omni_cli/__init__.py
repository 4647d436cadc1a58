"""omni-cli: batch text-to-speech generation on GPUs."""

__version__ = "0.1.0"
