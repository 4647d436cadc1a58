"""Greedy Whisper decoding with a static KV cache, its step one CUDA graph on CUDA: the
`num_beams=1` path of runners/scoring/asr.py for clips of up to 30 s.

transformers' `generate` pays host work every token (its cache objects, logits processors and
stopping checks); at a scoring batch that costs more than the decoder's own four layers. This runs
the checkpoint's own modules (the `WhisperForConditionalGeneration` loaded) in the order
`WhisperDecoder` runs them, with what `generate` does around them for a short-form clip:
- the prompt, as `_retrieve_init_tokens` builds it: <|startoftranscript|>; the checkpoint's
  `forced_decoder_ids` where no language is given; the language (given, or detected where none is
  forced, as `detect_language` does: the first position's logits, argmax over the language tokens);
  <|transcribe|> where a language is given and no task token is there yet; <|notimestamps|>;
- every step: the checkpoint's `suppress_tokens` at -inf, and `begin_suppress_tokens` too at the
  first generated token;
- greedy argmax; a row that emitted EOS emits the pad token from then on; the run ends when every
  row has ended or at the length limit (`new_tokens`).
tests/test_scoring_whisper_greedy.py holds it to `generate(num_beams=1)`, token for token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..device import CAPTURE_LOCK

CHECK_EVERY = 8  # steps between the host's looks at whether every row has ended (one sync each)


class GreedyWhisper:
    """One per loaded model; `decode` per batch of encoded clips."""

    def __init__(self, model, max_new_tokens: int | None):
        gc = model.generation_config
        self.model = model
        self.decoder = model.model.decoder
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.sot = int(gc.decoder_start_token_id)
        self.eos = int(gc.eos_token_id if not isinstance(gc.eos_token_id, list) else gc.eos_token_id[0])
        self.pad = int(gc.pad_token_id if gc.pad_token_id is not None else self.eos)
        self.lang_ids = sorted(int(v) for v in (gc.lang_to_id or {}).values())
        self.task_id = int((gc.task_to_id or {})["transcribe"])
        self.task_ids = {int(v) for v in (gc.task_to_id or {}).values()}
        forced = getattr(gc, "forced_decoder_ids", None) or getattr(model.config, "forced_decoder_ids", None) or []
        self.forced: list[int | None] = []  # prompt tokens 1.. the checkpoint forces (None: detect the language)
        for i, (at, token) in enumerate(forced):
            if at != i + 1:
                break
            self.forced.append(None if token is None else int(token))
        self.no_ts = int(gc.no_timestamps_token_id)
        self.max_new_tokens = max_new_tokens
        self.max_length = int(gc.max_length)  # GenerationConfig's default where the checkpoint sets none
        self.max_positions = int(model.config.max_target_positions)
        vocab = int(model.config.vocab_size)
        # [V] additive masks: 0 where a token may be drawn, -inf where suppressed
        self.suppress_gpu = self._mask(vocab, gc.suppress_tokens)
        self.begin_gpu = self._mask(vocab, list(gc.suppress_tokens or []) + list(gc.begin_suppress_tokens or []))
        self.lang_only_gpu = self._mask(vocab, [t for t in range(vocab) if t not in set(self.lang_ids)])

    @staticmethod
    def eligible(model) -> bool:
        """What this path reproduces: a multilingual checkpoint with language and task tokens."""
        gc = model.generation_config
        return bool(getattr(gc, "is_multilingual", False) and getattr(gc, "lang_to_id", None)
                    and getattr(gc, "task", None) is None and not getattr(gc, "return_timestamps", False)
                    and "transcribe" in (getattr(gc, "task_to_id", None) or {})
                    and getattr(gc, "no_timestamps_token_id", None) is not None
                    and getattr(gc, "decoder_start_token_id", None) is not None)

    def _mask(self, vocab: int, ids) -> torch.Tensor:
        mask = torch.zeros(vocab, dtype=torch.float32, device=self.device)
        if ids:
            mask[torch.as_tensor(list(ids), dtype=torch.long, device=self.device)] = float("-inf")
        return mask

    def new_tokens(self, prompt_len: int) -> int:
        """Tokens generated at most after a prompt of prompt_len, as Whisper's generate bounds them:
        max_new_tokens, else the config's max_length counted past the prompt; never past the
        decoder's positions."""
        n = self.max_new_tokens if self.max_new_tokens is not None else self.max_length
        return max(0, min(n, self.max_positions - prompt_len))

    # ---- the decoder, layer by layer as WhisperDecoder runs it ----
    def _cross(self, enc_gpu: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cross-attention keys and values [B, H, S, Dh] of the encoder states [B, S, D]."""
        out = []
        for layer in self.decoder.layers:
            att = layer.encoder_attn
            shape = (enc_gpu.shape[0], -1, att.num_heads, att.head_dim)
            out.append((att.k_proj(enc_gpu).view(shape).transpose(1, 2).contiguous(),
                        att.v_proj(enc_gpu).view(shape).transpose(1, 2).contiguous()))
        return out

    def _forward(self, ids_gpu, pos_gpu, cache, cross, mask_gpu) -> torch.Tensor:
        """ids [B, T] at positions pos [T] -> the last position's logits [B, V] (float32). Writes the
        self-attention keys and values at pos into cache [(k, v) [B, H, L, Dh] per layer]; mask_gpu
        [T, L] additive (which cached positions each query sees)."""
        dec = self.decoder
        x = dec.embed_tokens(ids_gpu) + dec.embed_positions.weight[pos_gpu]  # [B, T, D]
        for layer, (k_cache, v_cache), (k_x, v_x) in zip(dec.layers, cache, cross):
            att = layer.self_attn
            shape = (x.shape[0], x.shape[1], att.num_heads, att.head_dim)
            h = layer.self_attn_layer_norm(x)
            q = (att.q_proj(h) * att.scaling).view(shape).transpose(1, 2)
            k_cache.index_copy_(2, pos_gpu, att.k_proj(h).view(shape).transpose(1, 2))
            v_cache.index_copy_(2, pos_gpu, att.v_proj(h).view(shape).transpose(1, 2))
            a = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask_gpu.to(q.dtype), scale=1.0)
            x = x + att.out_proj(a.transpose(1, 2).reshape(x.shape))
            cx = layer.encoder_attn
            h = layer.encoder_attn_layer_norm(x)
            q = (cx.q_proj(h) * cx.scaling).view(shape).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k_x, v_x, scale=1.0)
            x = x + cx.out_proj(a.transpose(1, 2).reshape(x.shape))
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(layer.activation_fn(layer.fc1(h)))
        x = dec.layer_norm(x[:, -1])
        return self.model.proj_out(x).float()

    def _causal(self, positions: int, length: int) -> torch.Tensor:
        """[positions, length] additive mask: query i sees cached positions 0..i."""
        keep = torch.arange(length, device=self.device)[None, :] <= torch.arange(positions, device=self.device)[:, None]
        return torch.zeros(keep.shape, device=self.device).masked_fill(~keep, float("-inf"))

    @torch.inference_mode()
    def detect(self, enc_gpu: torch.Tensor) -> torch.Tensor:
        """The language token of each clip [B] (detect_language's rule)."""
        b = enc_gpu.shape[0]
        cache = self._cache(b, 1)
        ids = torch.full((b, 1), self.sot, dtype=torch.long, device=self.device)
        logits = self._forward(ids, torch.zeros(1, dtype=torch.long, device=self.device), cache,
                               self._cross(enc_gpu), self._causal(1, 1))
        return (logits + self.lang_only_gpu).argmax(-1)

    def prompt(self, language_given: bool) -> list[int | None]:
        """The decoder's prompt tokens, None where each row's language goes (module doc)."""
        tokens: list[int | None] = [self.sot] + ([] if language_given else list(self.forced))
        if language_given or len(tokens) == 1 or tokens[1] is None:
            tokens[1:2] = [None]
        if language_given and not self.task_ids & set(tokens):
            tokens.append(self.task_id)
        if tokens[-1] != self.no_ts:
            tokens.append(self.no_ts)
        return tokens

    def _cache(self, b: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        att = self.decoder.layers[0].self_attn
        shape = (b, att.num_heads, length, att.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                 torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in self.decoder.layers]

    @torch.inference_mode()
    def decode(self, enc_gpu: torch.Tensor, lang_gpu: torch.Tensor | None) -> list[list[int]]:
        """Encoder states [B, S, D] and each clip's language token [B] (None: detect) -> each clip's
        generated tokens (prompt and EOS excluded, as generate returns them)."""
        b = enc_gpu.shape[0]
        tokens = self.prompt(lang_gpu is not None)
        if None in tokens and lang_gpu is None:
            lang_gpu = self.detect(enc_gpu)
        columns = [lang_gpu.to(self.device).long() if t is None else
                   torch.full((b,), t, dtype=torch.long, device=self.device) for t in tokens]
        prompt = torch.stack(columns, dim=1)  # [B, P]
        p = prompt.shape[1]
        new = self.new_tokens(p)
        if new == 0:
            return [[] for _ in range(b)]
        length = p + new
        cache, cross = self._cache(b, length), self._cross(enc_gpu)
        logits = self._forward(prompt, torch.arange(p, device=self.device), cache, cross, self._causal(p, length))
        out_gpu = torch.full((b, new), self.pad, dtype=torch.long, device=self.device)
        tok_gpu = (logits + self.begin_gpu).argmax(-1)  # [B]
        out_gpu[:, 0] = tok_gpu
        done_gpu = tok_gpu == self.eos
        step = self._stepper(b, length, cache, cross, out_gpu, tok_gpu, done_gpu, p)
        for i in range(1, new):
            step(i)
            if i % CHECK_EVERY == 0 and bool(done_gpu.all()):
                break
        rows = out_gpu.tolist()
        return [r[: r.index(self.eos)] if self.eos in r else r for r in rows]

    def _stepper(self, b, length, cache, cross, out_gpu, tok_gpu, done_gpu, p):
        """step(i): token i of every row from token i-1 (at position p+i-1), in place. One CUDA
        graph per (B, length) on CUDA, replayed; eager on the CPU."""
        pos_gpu = torch.zeros(1, dtype=torch.long, device=self.device)
        index = torch.arange(length, device=self.device)

        def body():
            mask = torch.zeros(1, length, device=self.device).masked_fill(index[None, :] > pos_gpu, float("-inf"))
            logits = self._forward(tok_gpu[:, None], pos_gpu, cache, cross, mask)
            nxt = torch.where(done_gpu, torch.full_like(tok_gpu, self.pad), (logits + self.suppress_gpu).argmax(-1))
            tok_gpu.copy_(nxt)
            done_gpu.logical_or_(nxt == self.eos)
            out_gpu.index_copy_(1, pos_gpu - (p - 1), nxt[:, None])

        if self.device.type != "cuda":
            def eager(i: int) -> None:
                pos_gpu.fill_(p + i - 1)
                body()
            return eager
        # NOTE: the graph reads the cache, cross, out, tok and done tensors of this call by address:
        # it is captured per call (cheap next to the tokens it replays), never kept past it
        pos_gpu.fill_(p)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        snapshot = [t.clone() for t in (tok_gpu, done_gpu, out_gpu)] + [(k.clone(), v.clone()) for k, v in cache]
        # CAPTURE_LOCK: a kernel's first launch may synchronize the device, and a capture must not
        # meet another thread's (the codec's, the engine's)
        with CAPTURE_LOCK, torch.cuda.stream(side):
            body()  # warm-up (allocator, kernels) on a side stream, as capture requires
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # NOTE: thread_local: the decode loop's thread keeps launching while this (scoring) thread captures
        with CAPTURE_LOCK, torch.cuda.graph(graph, capture_error_mode="thread_local"):
            body()
        for t, s in zip((tok_gpu, done_gpu, out_gpu), snapshot[:3]):  # undo the warm-up's and capture's writes
            t.copy_(s)
        for (k, v), (ks, vs) in zip(cache, snapshot[3:]):
            k.copy_(ks)
            v.copy_(vs)

        def replay(i: int) -> None:
            pos_gpu.fill_(p + i - 1)
            graph.replay()
        return replay
