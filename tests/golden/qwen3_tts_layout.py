"""Symbolic layout of the reference's talker prompt, checked against the embeddings it built.

Each prompt position is a sum of up to three parts: a text-track id (through
text_embedding then text_projection), a codec-track id (through the talker's
codec_embedding; -2 stands for the Base speaker vector), and a reference-code
frame (code 0 through the talker's table, codes 1-15 through the predictor's
tables, summed). -1 marks an absent part. The generator saves these arrays so a
native implementation can rebuild the prompt from ids, and verify_layout proves
they describe exactly what qwen-tts 0.1.1 built.
"""

from __future__ import annotations

import numpy as np
import torch


def prompt_layout(cfg: dict, text_ids, instruct_ids, ref_ids, ref_len: int, lang_id,
                  spk_code, icl: bool, non_streaming: bool) -> dict:
    """(text id, codec id, ref frame) per prompt position, and the trailing text ids."""
    tc = cfg["talker_config"]
    pad_t, bos_t, eos_t = cfg["tts_pad_token_id"], cfg["tts_bos_token_id"], cfg["tts_eos_token_id"]
    text = [int(x) for x in text_ids]
    rows: list[tuple[int, int, int]] = []
    if instruct_ids is not None:
        rows += [(int(x), -1, -1) for x in instruct_ids]
    rows += [(x, -1, -1) for x in text[:3]]  # "<|im_start|>assistant\n"
    if lang_id is None:
        codec = [tc["codec_nothink_id"], tc["codec_think_bos_id"], tc["codec_think_eos_id"]]
    else:
        codec = [tc["codec_think_id"], tc["codec_think_bos_id"], lang_id, tc["codec_think_eos_id"]]
    if spk_code is not None:
        codec.append(spk_code)
    codec += [tc["codec_pad_id"], tc["codec_bos_id"]]
    head = codec[:-1]  # the final codec_bos is placed later (or replaced by the ICL block's own)
    rows += [(pad_t if j < len(head) - 1 else bos_t, cid, -1) for j, cid in enumerate(head)]
    body = text[3:-5]  # between the role prefix and "<|im_end|>\n<|im_start|>assistant\n"
    if icl:
        txt = [int(x) for x in ref_ids[3:-2]] + body + [eos_t]
        cod = [(tc["codec_bos_id"], -1)] + [(-1, f) for f in range(ref_len)]
        if non_streaming:
            rows += [(t, tc["codec_pad_id"], -1) for t in txt] + [(pad_t, c, f) for c, f in cod]
            trailing = [pad_t]
        elif len(txt) > len(cod):
            rows += [(txt[k], c, f) for k, (c, f) in enumerate(cod)]
            trailing = txt[len(cod):]
        else:
            rows += [(txt[k] if k < len(txt) else pad_t, c, f) for k, (c, f) in enumerate(cod)]
            trailing = [pad_t]
    elif non_streaming:
        rows += [(t, tc["codec_pad_id"], -1) for t in body + [eos_t]] + [(pad_t, tc["codec_bos_id"], -1)]
        trailing = [pad_t]
    else:
        rows += [(body[0], tc["codec_bos_id"], -1)]
        trailing = body[1:] + [eos_t]
    arr = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return {"prompt_text_ids": arr[:, 0], "prompt_codec_ids": arr[:, 1], "prompt_ref_frame": arr[:, 2],
            "trailing_text_ids": np.array(trailing, dtype=np.int64)}


@torch.no_grad()
def verify_layout(model, lay: dict, calls: dict, item) -> None:
    """Rebuilds the prompt and trailing embeddings from `lay`; raises if they differ from the reference's."""
    talker = model.talker
    text_emb, proj = talker.get_text_embeddings(), talker.text_projection
    codec_emb, cp_embs = talker.get_input_embeddings(), talker.code_predictor.get_input_embeddings()

    def text_part(ids):
        return proj(text_emb(torch.tensor([ids])))[0]

    t_ids = torch.tensor(lay["prompt_text_ids"])
    c_ids = torch.tensor(lay["prompt_codec_ids"])
    frames = torch.tensor(lay["prompt_ref_frame"])
    rebuilt = torch.zeros(len(t_ids), talker.config.hidden_size)
    has_text = t_ids >= 0
    rebuilt[has_text] += text_part(t_ids[has_text].tolist())
    rebuilt[c_ids >= 0] += codec_emb(c_ids[c_ids >= 0])
    if (c_ids == -2).any():
        rebuilt[c_ids == -2] += item.ref_spk_embedding.to(rebuilt.dtype)
    for pos in torch.nonzero(frames >= 0).flatten().tolist():
        code = item.ref_code[int(frames[pos])]
        rebuilt[pos] += codec_emb(code[:1])[0] + sum(cp_embs[i - 1](code[i:i + 1])[0] for i in range(1, 16))
    got = calls["inputs_embeds"][0]
    if got.shape != rebuilt.shape or not torch.allclose(got, rebuilt, atol=1e-5, rtol=1e-5):
        raise AssertionError(f"prompt layout mismatch: {tuple(got.shape)} vs {tuple(rebuilt.shape)}")
    trail = text_part(lay["trailing_text_ids"].tolist())
    if not torch.allclose(calls["trailing_text_hidden"][0], trail, atol=1e-5, rtol=1e-5):
        raise AssertionError("trailing text layout mismatch")
