"""Finding checkpoints (local folder or hub id) and loading safetensors weights."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from omni_cli.errors import OmniError


def resolve_folder(spec: str, what: str) -> Path:
    """A local folder as it is; a hub id through huggingface_hub's cache/download."""
    local = Path(spec)
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt"]))
    except Exception as e:  # offline, unknown repo, auth: all are the user's to fix
        raise OmniError(f"{what} {spec!r}: not a local folder, and the hub download failed: {e}") from None


def read_safetensors(folder: Path, prefixes: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """All tensors of every *.safetensors file in ``folder`` (sharded or not).

    ``prefixes`` keeps only keys starting with one of them.
    """
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise OmniError(f"no *.safetensors weights in {folder}")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                if prefixes is None or key.startswith(prefixes):
                    out[key] = st.get_tensor(key)
    return out


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Turn weight-norm pairs into plain weights: w = g * v / ||v|| (norm over all dims but 0).

    Checkpoints converted from DAC may store either ``weight_g``/``weight_v`` or
    the parametrization's ``parametrizations.weight.original0/1``.
    """
    out = dict(state)
    pairs = (("weight_g", "weight_v"), ("parametrizations.weight.original0", "parametrizations.weight.original1"))
    for key in list(state):
        for g_name, v_name in pairs:
            if key.endswith(g_name):
                base = key[: -len(g_name)]
                g, v = out.pop(base + g_name), out.pop(base + v_name)
                norm = v.flatten(1).norm(dim=1).view(-1, *([1] * (v.dim() - 1)))
                out[base + "weight"] = g * v / norm
    return out


def load_into(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path,
              ignore: tuple[str, ...] = ()) -> None:
    """Load ``state`` into ``module``; any missing or unexpected key is an error naming it."""
    state = {k: v for k, v in state.items() if k not in ignore}
    expected = set(module.state_dict().keys())
    missing = sorted(expected - state.keys())
    unexpected = sorted(state.keys() - expected)
    if missing or unexpected:
        raise OmniError(
            f"weights in {source} do not match the model: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    module.load_state_dict(state, strict=True)
