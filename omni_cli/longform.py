"""Long-form text, the pure part: sentences, chunks, chunk seeds, the crossfade join.

No model, no device: omni_cli/chunked.py schedules the chunks this module plans.

Splitting (``split_sentences``). A sentence ends after a run of stops (``.``, ``!``, ``?``,
``…``, ``...``, CJK ``。！？``), any closing quotes or brackets right after it, and then
whitespace or the end of the text; after a CJK stop (or a closing bracket after one), no
whitespace is needed. A ``.`` does not end a sentence after a known abbreviation (``Dr.``,
``e.g.``, see ABBREVIATIONS), after a single-letter initial (``J. Smith``), or where the next
word starts in lower case (``... and then``, ``"Why?" she asked``). A dot with no space
after it (``3.14``, ``U.S.A``) never ends one. Sentences
are slices of the text, stripped: nothing is lost or reordered, the text's whitespace
between them is all that is dropped (so the chunks joined with single spaces give back the
text's words, and their non-space characters are the text's).

Packing (``plan_chunks``). A sentence is estimated at CHARS_PER_S characters a second (about
150 words a minute), CJK characters (east Asian wide/full width) at WIDE_CHARS_PER_S, plus
OVERHEAD_S a chunk (Higgs's delay ramp and staircase: 10 frames at 25 a second), in frames at the
model's frame rate (Higgs 25, Qwen3-TTS 12.5). Method:
- ``auto`` (the default): a row whose whole text is estimated within max_new_frames stays one
  chunk; else consecutive sentences are packed greedily while their estimate fits.
- ``sentence``: one chunk per sentence, whatever fits.
- ``none``: one chunk (a long text then ends at max_new_frames, as without chunking).
A single sentence over the budget stays one chunk (no split inside a sentence).

Seeds (``chunk_seed``). Chunk 0 uses the row seed itself (a one-chunk row is the row as
before); chunk k > 0 uses ``derive_seed("omni-cli-chunk", row seed, str(k))`` (BLAKE2b-64 of
``omni-cli-chunk:<row seed>:<k>``, 31 bits, runners/sampling/seeds.py): it depends only on the
row seed and the index, never on what ran beside the row.

Joining (``crossfade_join``). Consecutive chunks overlap by CROSSFADE_S seconds (40 ms, 960
samples at 24 kHz; less where a chunk is shorter than that) with an equal-power fade: the
earlier chunk's tail times cos(pi/2 t), the later one's head times sin(pi/2 t), t = (i + 0.5)
/ overlap. The joined length is the sum of the chunks' lengths minus the overlaps; each
chunk's first sample in the join is recorded (``chunk_samples``).
"""

from __future__ import annotations

import math
import re
import unicodedata

import numpy as np

from omni_cli.runners.sampling.seeds import derive_seed

CHUNK_METHODS = ("auto", "sentence", "none")
DEFAULT_CHUNK_METHOD = "auto"
DEFAULT_CHUNK_BUFFER = 2  # earlier chunks a chunk's prompt holds (Higgs's generation_chunk_buffer_size)
CHUNK_NAMESPACE = "omni-cli-chunk"

CHARS_PER_S = 15  # characters a second: about 150 words a minute
WIDE_CHARS_PER_S = 4.5  # CJK characters a second
OVERHEAD_S = 0.4  # a chunk's time besides its speech (Higgs: the BOS frame and the 8-stream delay staircase)
CROSSFADE_S = 0.04

ABBREVIATIONS = frozenset(
    "mr mrs ms mx dr prof sr jr st mt vs e.g i.e eg ie cf al approx dept fig figs inc ltd corp "
    "vol vols pp ed eds gen gov col lt sgt capt cmdr rev hon jan feb mar apr jun jul aug sep sept "
    "oct nov dec a.m p.m u.s u.k ph.d".split())

_CJK_STOPS = "。！？"
_STOPS = ".!?…" + _CJK_STOPS
_CLOSERS = "\"'”’)]}»」』）】〉》"
_END = re.compile(rf"[{re.escape(_STOPS)}]+[{re.escape(_CLOSERS)}]*")


def _is_break(text: str, start: int, end: int) -> bool:
    """Whether the stop run text[start:end] (closers included) ends a sentence."""
    stops = text[start:end].rstrip(_CLOSERS)
    if any(c in _CJK_STOPS for c in stops):
        return True  # CJK: no space needed after it
    nxt = text[end:end + 1]
    if nxt and not nxt.isspace():
        return False  # "3.14", "e.g.,", "U.S.A": no space, no break
    after = text[end:].lstrip()
    if not after:
        return True
    if stops == ".":
        word = re.search(r"(\S*)$", text[:start]).group(1).lstrip("\"'“‘([{«「『（")
        if word.lower() in ABBREVIATIONS or (len(word) == 1 and word.isupper()):
            return False  # "Dr. Smith", "e.g. this", "J. Smith"
    if after[0].islower():
        return False  # "... and then", '"Really?" she asked': the sentence goes on
    return True


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence in text, stripped of surrounding whitespace, in order."""
    spans, at = [], 0
    for m in _END.finditer(text):
        if _is_break(text, m.start(), m.end()):
            spans.append((at, m.end()))
            at = m.end()
    spans.append((at, len(text)))
    out = []
    for s, e in spans:
        piece = text[s:e]
        if piece.strip():
            lead = len(piece) - len(piece.lstrip())
            out.append((s + lead, s + len(piece.rstrip())))
    return out


def split_sentences(text: str) -> list[str]:
    """The text's sentences (slices of it, stripped), in order."""
    return [text[s:e] for s, e in sentence_spans(text)]


def estimate_frames(text: str, frame_rate: float = 25.0) -> int:
    """Frames a chunk of this text is expected to need (speech and the per-chunk overhead) at
    `frame_rate` frames a second."""
    wide = sum(unicodedata.east_asian_width(c) in "WF" for c in text)
    narrow = sum(not c.isspace() for c in text) - wide + text.count(" ")
    # in 25ths of a second, so Higgs's frames come out exact (no float rounding past the ceiling)
    twentyfifths = narrow * 25 / CHARS_PER_S + wide * 25 / WIDE_CHARS_PER_S + OVERHEAD_S * 25
    return math.ceil(twentyfifths * frame_rate / 25)


def plan_chunks(text: str, method: str, max_new_frames: int, frame_rate: float = 25.0) -> list[str]:
    """The row's chunk texts, in order (one: the row is not split). See the module's doc."""
    if method not in CHUNK_METHODS:
        raise ValueError(f"chunk method must be one of {', '.join(CHUNK_METHODS)}, got {method!r}")
    if method == "none" or (method == "auto" and estimate_frames(text, frame_rate) <= max_new_frames):
        return [text]
    spans = sentence_spans(text)
    if len(spans) <= 1:
        return [text]
    if method == "sentence":
        return [text[s:e] for s, e in spans]
    groups: list[tuple[int, int]] = []
    for s, e in spans:
        if groups and estimate_frames(text[groups[-1][0]:e], frame_rate) <= max_new_frames:
            groups[-1] = (groups[-1][0], e)
        else:
            groups.append((s, e))
    return [text[s:e] for s, e in groups]


def chunk_seed(row_seed: int, index: int) -> int:
    """Chunk `index`'s seed: the row seed for chunk 0, else derived from (row seed, index)."""
    return row_seed if index == 0 else derive_seed(CHUNK_NAMESPACE, row_seed, str(index))


def crossfade_samples(sample_rate: int) -> int:
    return round(CROSSFADE_S * sample_rate)


def crossfade_join(chunks: list[np.ndarray], overlap: int) -> tuple[np.ndarray, list[int]]:
    """int16 chunks -> (the joined int16 audio, each chunk's first sample in it plus the total
    length: [n + 1] offsets). Neighbours overlap by min(overlap, either's length) samples,
    faded at equal power; the sum is computed in float64 and rounded to int16."""
    offsets = [0]
    if not chunks:
        return np.zeros(0, dtype=np.int16), offsets
    out = np.asarray(chunks[0], dtype=np.float64)
    for c in chunks[1:]:
        c = np.asarray(c, dtype=np.float64)
        k = min(overlap, len(out) - offsets[-1], len(c))
        start = len(out) - k
        if k:
            t = (np.arange(k) + 0.5) / k
            mixed = out[start:] * np.cos(0.5 * np.pi * t) + c[:k] * np.sin(0.5 * np.pi * t)
            out = np.concatenate([out[:start], mixed, c[k:]])
        else:
            out = np.concatenate([out, c])
        offsets.append(start)
    offsets.append(len(out))
    return np.clip(np.rint(out), -32768, 32767).astype(np.int16), offsets


def texts_array(texts: list[str]) -> np.ndarray:
    """The chunk texts for the npz: a 1-d numpy unicode array (np.load reads it without pickle)."""
    return np.array(texts, dtype=str)
