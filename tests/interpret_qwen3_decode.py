"""Qwen3-TTS's fused decode (runners/qwen3_tts/fused.py) against its plain modules, in Triton's CPU interpreter.

Run as a subprocess by tests/test_decode_attention.py with TRITON_INTERPRET=1; exits 0 only if
every check holds and the negative control is caught.
One random tiny Qwen3-TTS talker (head_dim 16: tl.dot needs 16; a predictor narrower than the
talker, so small_to_mtp_projection is a Linear), float32, copied: the copy decodes on the fused
kernels, the original on the plain modules with PyTorch attention. Three rows of different
lengths are prefilled on the plain path by both, then decoded for a few steps through the
engine's padded (uncaptured) graph path: the fused model's talker logits and hidden must agree
with the plain one's within float32 rounding, at three rows (cuBLAS and fused_mm), one row (the
GEMVs) and in deterministic mode (invariant_mm). A frame of the code predictor (its 15 sub-steps,
greedy draws, the static buffers, short_attention) on each mode must give the plain frame's codes exactly and its
sub-step logits within float32 rounding; in deterministic mode a row's talker outputs and
sub-step logits must be the same bits alone as among three rows. Negative control: the fused
talker with a rope kernel that skips the per-head q/k norms must differ.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path

import torch

from tests.interpret_decode_attention import (_patch_interpreter_calls, _patch_interpreter_dot,
                                              _patch_interpreter_scalars)

REPO = Path(__file__).resolve().parent.parent
LENS = [5, 9, 3]
STEPS = 3


def tiny_config(hidden: int = 64, inter: int = 96, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                cp_hidden: int = 32, cp_inter: int = 64, cp_layers: int = 1):
    """The embedded tiny config at these widths (two talker layers; tests/test_gpu_qwen3.py: wider)."""
    from omni_cli.runners.qwen3_tts.config import Qwen3TTSConfig

    cfg = json.loads((REPO / "configs/tiny-qwen3-tts/config.json").read_text())
    t, cp = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    t.update(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2, num_attention_heads=heads,
             num_key_value_heads=kv_heads, head_dim=head_dim)
    cp.update(hidden_size=cp_hidden, intermediate_size=cp_inter, num_hidden_layers=cp_layers, num_attention_heads=heads,
              num_key_value_heads=kv_heads, head_dim=head_dim)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(cfg))
        return Qwen3TTSConfig.from_file(path)


def talker_logits(plain, fused, cfg, rows: list[int], deterministic: bool,
                  device: torch.device = torch.device("cpu")) -> tuple[float, torch.Tensor]:
    """Max relative difference of compute_logits' output (logits and hidden) over STEPS decode
    steps of `rows`, each engine prefilling them on the plain path first; and the fused model's
    outputs [STEPS, rows, ...]."""
    from omni_cli.runners.attention import KVCache
    from omni_cli.runners.engine import Engine, ForwardBatch

    t = cfg.talker
    outs = []
    for model in (plain, fused):
        kv = KVCache(t.num_hidden_layers, 5, t.num_key_value_heads, 64, t.head_dim, torch.float32, device)
        engine = Engine(model, kv, device)
        engine.use_graphs(capture=False)
        engine.graphs.kernel = model.fused  # the plain model attends in PyTorch, through a mask
        slots = torch.tensor([2, 0, 3])[rows].to(device)
        lens = [LENS[r] for r in rows]
        n, width = len(rows), max(lens)
        ids = torch.stack([torch.randint(0, t.text_vocab_size, (width,), generator=torch.Generator().manual_seed(r))
                           for r in rows])
        fused_flag, model.fused = model.fused, False  # both prefill on the plain modules, a row at a time:
        for i in range(n):  # the same keys whatever rows decode together
            fb = ForwardBatch(is_prefill=True, rids=[str(rows[i])], slots_gpu=slots[i:i + 1], lengths_cpu=lens[i:i + 1],
                              steps_cpu=[0], steps_gpu=torch.zeros(1, dtype=torch.int64, device=device),
                              positions_gpu=torch.arange(lens[i], device=device)[None],
                              model_inputs={"input_ids": ids[i:i + 1, :lens[i]].to(device)})
            engine.forward(fb)
        model.fused = fused_flag
        got = []
        for step in range(1, STEPS + 1):
            pos = [x + step - 1 for x in lens]
            g = [torch.Generator().manual_seed(100 * r + step) for r in rows]
            frame = torch.stack([torch.randn(1, t.hidden_size, generator=gi) for gi in g])
            text = torch.stack([torch.randint(0, t.text_vocab_size, (1,), generator=gi) for gi in g])
            fb = ForwardBatch(is_prefill=False, rids=[str(r) for r in rows], slots_gpu=slots,
                              lengths_cpu=[p + 1 for p in pos], steps_cpu=[step] * n,
                              steps_gpu=torch.full((n,), step, device=device),
                              positions_gpu=torch.tensor(pos, device=device)[:, None],
                              model_inputs={"frame_embeds": frame.to(device), "text_ids": text.to(device)})
            got.append(engine.graphs.run(fb, deterministic))
        outs.append(torch.stack(got))
    return ((outs[1] - outs[0]).abs().max() / outs[0].abs().max()).item(), outs[1]


def predictor_frame(model, hidden, code0, invariant: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One frame, greedy: (codes [B, 16], the 15 sub-steps' logits [15, B, vocab])."""
    seen = []

    def draw(k, logits):
        seen.append(logits.clone())
        return logits.argmax(dim=-1)

    bufs = model.new_predictor_buffers(hidden.shape[0])
    with torch.inference_mode():
        codes = model.predict_frame(hidden, code0, bufs, draw, invariant).clone()
    return codes, torch.stack(seen)


def main() -> int:
    _patch_interpreter_calls()
    _patch_interpreter_scalars()
    _patch_interpreter_dot()  # tl.dot adds in k order, as the tensor cores do (numpy's order follows the tile)
    import omni_cli.runners.attention as attention
    import omni_cli.runners.cuda_graphs as cuda_graphs
    from omni_cli.runners.qwen3_tts.talker import Talker

    cfg = tiny_config()
    torch.manual_seed(0)
    plain = Talker(cfg, 64).eval()
    with torch.no_grad():  # norms away from 1, so a skipped weight shows
        for name, p in plain.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand_like(p) + 0.5)
    fused = copy.deepcopy(plain)
    attention.fused_kernels_available = cuda_graphs.fused_kernels_available = lambda device: True
    fused.to_runtime(torch.device("cpu"), torch.float32)
    assert fused.fused and fused.code_predictor.fused
    import omni_cli.runners.fused_gemv as fused_gemv

    fused_gemv.TILE = (64, 64, 4, 64)  # wide tiles: the interpreter runs program by program
    ok, det_out = True, {}
    for rows, det in (([0, 1, 2], False), ([1], False), ([0, 1, 2], True), ([1], True)):
        worst, out = talker_logits(plain, fused, cfg, rows, det)
        print(f"talker, rows {rows}, deterministic {det}: max relative difference {worst:.2e}")
        ok &= worst < 1e-5
        if det:
            det_out[len(rows)] = out
    invariant = torch.equal(det_out[1][:, 0], det_out[3][:, 1])
    print(f"talker, deterministic: a row's outputs alone equal among three: {invariant}")
    ok &= invariant
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(3, cfg.talker.hidden_size, generator=g)
    code0 = torch.randint(0, cfg.code_vocab, (3,), generator=g)
    want_codes, want_logits = predictor_frame(plain, hidden, code0, False)
    got = {}
    for name, h, c, inv, want in (("fused", hidden, code0, False, slice(None)), ("gemv", hidden[1:2], code0[1:2], False, slice(1, 2)),
                                  ("invariant", hidden, code0, True, slice(None))):
        codes, logits = got[name] = predictor_frame(fused, h, c, inv)
        diff = ((logits - want_logits[:, want]).abs().max() / want_logits.abs().max()).item()
        same = torch.equal(codes, want_codes[want])
        print(f"predictor {name}: codes equal {same}, max relative sub-step logit difference {diff:.2e}")
        ok &= same and diff < 1e-5
    _, alone = predictor_frame(fused, hidden[1:2], code0[1:2], True)
    invariant = torch.equal(alone[:, 0], got["invariant"][1][:, 1])
    print(f"predictor, deterministic: a row's sub-step logits alone equal among three: {invariant}")
    ok &= invariant
    import omni_cli.runners.fused_ops as fused_ops  # the negative control: a rope kernel without the q/k norms

    shipped = fused_ops.rope_kv_write
    fused_ops.rope_kv_write = lambda *args, qk_norm=None: shipped(*args)
    caught = talker_logits(plain, fused, cfg, [0, 1, 2], False)[0] > 1e-3
    fused_ops.rope_kv_write = shipped
    print(f"negative control (the fused rope without the q/k norms) caught: {caught}")
    return 0 if ok and caught else 1


if __name__ == "__main__":
    sys.exit(main())
