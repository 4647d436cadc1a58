"""The device layer: the runner contract, the engine, kernels, the codec stage and one
package per model family. Installed as ``omni_cli.runners``; it never imports the rest of
omni_cli (tests/test_layers.py)."""
