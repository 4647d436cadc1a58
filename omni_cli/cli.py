"""The `omni` command line: thin Typer commands over the run functions.

Exit codes: 0 every row ok; 1 some rows failed (the others were written);
2 bad usage, config or input file (nothing generated); 3 the run itself failed;
130 interrupted (SIGINT), 143 terminated (SIGTERM).
Import-light: torch and the run code load inside the commands, never for --help.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from omni_cli import __version__, cli_folders
from omni_cli.cli_common import _Command, _run
from omni_cli.errors import OmniError

EXIT_CODES = ("Exit codes: 0 every row ok; 1 some rows failed (the others were written; rows found bad "
              "before the run and --max-failures included); 2 bad usage, config or input file, or an output "
              "folder in use or unwritable (nothing generated); 3 the run itself failed (every row recorded, "
              "run.json written); 130 interrupted (SIGINT); 143 terminated (SIGTERM). On a signal the rows in "
              "flight are written, the rest recorded as interrupted; a second signal exits at once.")

# plain (click) help: the rich panels print <bool> beside every switch and cut long option names
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Batch text-to-speech generation.", epilog=EXIT_CODES)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"omni-cli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """omni: turn prompt files into speech datasets."""


# generate's options besides the sampling fields whose default is the model config's
_CONFIG_KEYS = ("max_batch_size", "deterministic", "async_decode")


def _config_defaults() -> tuple[str, dict[str, object]]:
    """The default config's file name, and {option name: its default there, or None if it does not load}."""
    from omni_cli.config import DEFAULT_CONFIG, load_config
    from omni_cli.runners.sampling.params import FIELD_NAMES

    try:
        cfg = load_config(None)
    except OmniError:  # help must still render; it then names no values
        return f"{DEFAULT_CONFIG}.yaml", dict.fromkeys(FIELD_NAMES + _CONFIG_KEYS)
    values = {k: getattr(cfg.sampling, k) for k in FIELD_NAMES}
    return cfg.path.name, values | {k: getattr(cfg, k) for k in _CONFIG_KEYS}


def _default_text(param, value: object) -> str:
    if value is None:
        return "from the model config"
    if isinstance(value, bool):  # a switch: name the flag in effect, as click does
        value = param.opts[0] if value else param.secondary_opts[0]
    elif isinstance(value, tuple):
        value = ",".join(map(str, value)) or "none"
    return f"{value}, from the model config"


class _ConfigDefaultsCommand(_Command):
    """Shows the model config's defaults in --help, reading the YAML only when help is asked for."""

    def format_help(self, ctx, formatter) -> None:
        name, values = _config_defaults()
        for p in self.params:
            if p.name in values:
                base = p.__dict__.setdefault("_base_help", p.help or "")  # idempotent if help is shown twice
                p.help = f"{base}  [default: {_default_text(p, values[p.name])}]"
        self.help = (self.help or "").replace("{default_config}", name)
        super().format_help(ctx, formatter)


@app.command(cls=_ConfigDefaultsCommand, epilog=EXIT_CODES)
def generate(
    prompts: str = typer.Argument(..., metavar="PROMPTS", help="Prompt file (.jsonl or .ndjson, a .json array, "
                                  ".csv, or text lines), or - for stdin."),
    out: Path = typer.Option(..., "-o", "--out", help="Output folder."),
    input_format: Optional[str] = typer.Option(None, "--input-format", metavar="jsonl|json|csv|txt",
                                               help="How to read PROMPTS (default: by its extension; stdin and "
                                                    "other names: told from the first record)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model config: a YAML path or a name in configs/ "
                                        "(default: the embedded tiny-higgs-audio-v2)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Run seed; rows without a seed derive theirs from it. "
                                       "Seeds are taken modulo 2^31 (0..2147483647; others are masked, with a warning)."),
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", help="Rows decoded together (KV slots)."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="0 means greedy."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="0 disables."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="1 disables."),
    min_p: Optional[float] = typer.Option(None, "--min-p", help="0 disables."),
    repetition_penalty: Optional[float] = typer.Option(None, "--repetition-penalty", help="1 disables."),
    ras_win_len: Optional[int] = typer.Option(None, "--ras-win-len", help="Repetition-aware sampling window (frames); 0 disables."),
    ras_win_max_num_repeat: Optional[int] = typer.Option(None, "--ras-win-max-num-repeat", help="Redraw a code seen this often in the window."),
    suppress_tokens: Optional[str] = typer.Option(None, "--suppress-tokens", help="Comma-separated token ids never to sample."),
    max_new_frames: Optional[int] = typer.Option(None, "--max-new-frames", help="Frames per row at most (25 per second)."),
    min_new_frames: Optional[int] = typer.Option(None, "--min-new-frames", help="No end of speech before this many frames."),
    subtalker_temperature: Optional[float] = typer.Option(None, "--subtalker-temperature", help="Qwen3-TTS: the "
                                                          "code predictor's temperature (codebooks 1-15); 0 means greedy."),
    subtalker_top_k: Optional[int] = typer.Option(None, "--subtalker-top-k", help="Qwen3-TTS: the code predictor's "
                                                  "top-k; 0 disables."),
    subtalker_top_p: Optional[float] = typer.Option(None, "--subtalker-top-p", help="Qwen3-TTS: the code predictor's "
                                                    "top-p; 1 disables."),
    deterministic: Optional[bool] = typer.Option(None, "--deterministic/--no-deterministic", help="Byte-identical rows "
                                                 "whatever the batching (fixed shapes; slower)."),
    raw_logprobs: bool = typer.Option(False, "--raw-logprobs", help="Also store the unprocessed model logprobs."),
    async_decode: Optional[bool] = typer.Option(None, "--async-decode/--no-async-decode", help="One-step decode "
                                                "lookahead (same output, faster)."),
    fmt: str = typer.Option("wav", "--format", help="Audio format: wav or flac."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing but errors."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace results already in the output folder "
                                   "(removes only the files its manifest names, temporaries, run.json and the manifest)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in the output folder: rows recorded ok "
                                "whose files are intact and whose content is unchanged are kept, the rest redone."),
    max_failures: Optional[int] = typer.Option(None, "--max-failures", help="Stop once this many rows have failed "
                                               "(exit 1; rows not run are recorded with status skipped)."),
    jsonl_stdout: bool = typer.Option(False, "--jsonl-stdout", help="Print each row's manifest line to stdout as "
                                      "it is written (logs and progress stay on stderr)."),
    shard: Optional[str] = typer.Option(None, "--shard", metavar="I/N", help="Run only shard I of N (0 <= I < N): the "
                                        "rows whose id hashes there; join the folders with `omni merge`."),
    voices: Optional[Path] = typer.Option(None, "--voices", help="Voice bank YAML (name: {audio, text}) for rows' "
                                          "`voice` field, over the model config's voices."),
    chunk_method: Optional[str] = typer.Option(None, "--chunk-method", help="Long text: auto splits a row at "
                                               "sentences into chunks when its estimate does not fit max_new_frames; "
                                               "sentence: one chunk a sentence; none: never split. A row's `chunk` "
                                               "field wins. Default: auto (Higgs), none (Qwen3-TTS, as its reference)."),
    chunk_buffer: int = typer.Option(2, "--chunk-buffer", help="Earlier chunks (text and audio) a chunk is "
                                     "generated after, so the voice carries on."),
    devices: Optional[str] = typer.Option(None, "--devices", metavar="LIST", help="One worker process per device "
                                          "on this host: all (every GPU), or a list such as 0,1,2,3, cuda:0 or "
                                          "cpu,cpu; the rows are shared out by a hash of their id, one output folder."),
    ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS", help="Run the job as a Ray Data pipeline "
                                      "(pip install 'omni-cli[ray]'): auto joins a running cluster, local starts one "
                                      "here, or a ray:// address; the output folder must be on a path every node shares."),
    score: Optional[str] = typer.Option(None, "--score", metavar="LIST", help="Score every row as it comes out "
                                        "(pip install 'omni-cli[quality]'): asr, mos, speaker, degenerate, utmos."),
    reject: Optional[str] = typer.Option(None, "--reject", metavar="RULES", help="Rows breaking any rule are "
                                         "rejected, e.g. 'wer>0.1,dnsmos_ovrl<3.0' (default: each score's own "
                                         "threshold; none: reject nothing)."),
    best_of: Optional[int] = typer.Option(None, "--best-of", help="Attempts of every row; the best is kept."),
    retry: Optional[int] = typer.Option(None, "--retry", help="Attempts more, one at a time, while a row is rejected."),
    drop_rejected: Optional[bool] = typer.Option(None, "--drop-rejected/--keep-rejected", help="Rejected rows' "
                                                 "files under rejected/ (default: kept in audio/, marked)."),
    asr_model: Optional[str] = typer.Option(None, "--asr-model", help="Whisper for --score asr: hub id or folder."),
    speaker_model: Optional[str] = typer.Option(None, "--speaker-model", help="WavLM x-vector model for --score "
                                                "speaker: hub id or folder."),
    mos_model: Optional[str] = typer.Option(None, "--mos-model", help="Folder of DNSMOS's ONNX files (default: "
                                            "speechmos's)."),
    utmos_model: Optional[str] = typer.Option(None, "--utmos-model", help="UTMOS for --score utmos: a folder "
                                              "holding utmos_state_dict.pt, or a hub id."),
) -> None:
    """Generate speech for every prompt row.

    Defaults marked "from the model config" are the model YAML's: those shown are the embedded
    default's ({default_config}); --model changes them (a Qwen3-TTS checkpoint's generation_config.json
    fills what its YAML leaves out), a flag overrides them for the run, and a prompt row's own fields
    override both for that row.
    """
    from omni_cli.generate import GenerateOptions, run_generate
    from omni_cli.shard import parse_shard

    from omni_cli.workers import parse_devices

    for (a, x), (b, y) in ((("--devices", devices), ("--shard", shard)), (("--ray", ray), ("--devices", devices)),
                           (("--ray", ray), ("--shard", shard))):
        if x is not None and y is not None:
            typer.echo(f"omni: error: {a} and {b} exclude each other", err=True)
            raise typer.Exit(2)
    shard_spec = _run(lambda: parse_shard(shard))
    device_list = _run(lambda: parse_devices(devices))
    try:
        suppress = None if suppress_tokens is None else tuple(int(t) for t in suppress_tokens.split(",") if t.strip())
    except ValueError:
        typer.echo(f"omni: error: --suppress-tokens: expected comma-separated token ids, got {suppress_tokens!r}", err=True)
        raise typer.Exit(2) from None
    opts = GenerateOptions(prompts=prompts, out=out, model=model, seed=seed, max_batch_size=max_batch_size,
                           temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           repetition_penalty=repetition_penalty, ras_win_len=ras_win_len,
                           ras_win_max_num_repeat=ras_win_max_num_repeat, suppress_tokens=suppress,
                           max_new_frames=max_new_frames, min_new_frames=min_new_frames,
                           subtalker_temperature=subtalker_temperature, subtalker_top_k=subtalker_top_k,
                           subtalker_top_p=subtalker_top_p, deterministic=deterministic,
                           raw_logprobs=raw_logprobs, async_decode=async_decode, fmt=fmt, quiet=quiet, overwrite=overwrite,
                           resume=resume, max_failures=max_failures, jsonl_stdout=jsonl_stdout, shard=shard_spec,
                           voices=voices, chunk_method=chunk_method, chunk_buffer=chunk_buffer,
                           devices=device_list, ray=ray, input_format=input_format, score=score, reject=reject,
                           best_of=best_of, retry=retry, drop_rejected=drop_rejected, asr_model=asr_model,
                           speaker_model=speaker_model, mos_model=mos_model, utmos_model=utmos_model)
    from omni_cli.job_settings import with_family_defaults

    opts = _run(lambda: with_family_defaults(opts))
    if ray is not None:
        try:
            from omni_cli.ray import run_ray
        except ImportError as e:
            typer.echo(f"omni: error: --ray needs Ray Data: pip install 'omni-cli[ray]' ({e})", err=True)
            raise typer.Exit(2) from None
        summary = _run(lambda: run_ray(opts))
    elif device_list is not None and len(device_list) > 1:
        from omni_cli.workers import run_devices

        summary = _run(lambda: run_devices(opts))
    else:
        summary = _run(lambda: run_generate(opts))
    if summary.exit_code:
        raise typer.Exit(summary.exit_code)


@app.command(cls=_Command, epilog="Exit codes: 0 every row valid; 2 a row or the config has a problem, or the "
                                   "file cannot be read.")
def validate(
    prompts: str = typer.Argument(..., metavar="PROMPTS", help="Prompt file (.jsonl or .ndjson, a .json array, "
                                  ".csv, or text lines), or - for stdin."),
    model: Optional[str] = typer.Option(None, "--model", help="Model config: a YAML path or a name in configs/."),
    voices: Optional[Path] = typer.Option(None, "--voices", help="Voice bank YAML, as omni generate takes it."),
    input_format: Optional[str] = typer.Option(None, "--input-format", metavar="jsonl|json|csv|txt",
                                               help="How to read PROMPTS, as omni generate takes it."),
    chunk_method: Optional[str] = typer.Option(None, "--chunk-method", help="Long text, as omni generate takes it: each "
                                     "chunk's prompt is checked against the context."),
) -> None:
    """Check every row as omni generate would, without loading the model's weights (its tokenizer and
    configs are read); print each problem."""
    from omni_cli.validate import run_validate

    bad = _run(lambda: run_validate(prompts, model, voices, input_format, chunk_method))
    for r in bad:
        given = "(none given)" if r.given_id is None else repr(r.given_id)
        renamed = f" (written as {r.id!r})" if r.given_id is None or str(r.given_id) != r.id else ""
        typer.echo(f"id {given}{renamed}: {r.error}")
    typer.echo(f"omni: {len(bad)} invalid rows" if bad else "omni: every row is valid", err=True)
    if bad:
        raise typer.Exit(2)


@app.command(cls=_Command, epilog="Needs a GPU for the real shapes: on a machine without CUDA only "
                                   "--shape tiny-higgs-audio-v2 (or tiny-qwen3-tts) --device cpu runs. Exit 1: an "
                                   "omni run failed (the table says which).")
def bench(
    shape: str = typer.Option("higgs-audio-v2-3b", "--shape",
                              help="higgs-audio-v2-3b, qwen3-tts-12hz-0.6b, qwen3-tts-12hz-1.7b, or tiny-higgs-audio-v2, "
                                   "tiny-qwen3-tts."),
    batch: list[int] = typer.Option([1, 8, 64, 256], "--batch", help="Batch sizes (repeat the flag)."),
    frames: int = typer.Option(200, "--frames", help="Frames per request."),
    prompt_len: int = typer.Option(64, "--prompt-len", help="Prompt tokens per request."),
    device: str = typer.Option("auto", "--device"),
    dtype: str = typer.Option("bfloat16", "--dtype", help="float32, bfloat16 or float16."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the results as JSON here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of audio-s/s against batch size here."),
    peers: Optional[str] = typer.Option(None, "--peers", show_default=False,
                                        help="Comma-separated: sync, async, deterministic (async under "
                                             "--deterministic), transformers (Higgs), qwen-tts (Qwen3-TTS). Default: "
                                             "sync,async,transformers; Qwen3-TTS sync,async (and qwen-tts where "
                                             "--qwen-tts-site or --qwen-tts-python is given)."),
    qwen_tts_site: Optional[Path] = typer.Option(None, "--qwen-tts-site", help="A folder put first on qwen-tts's "
                                                 "PYTHONPATH: .whl-qwen/'s wheels installed there (env "
                                                 "OMNI_QWEN_TTS_SITE)."),
    qwen_tts_python: Optional[str] = typer.Option(None, "--qwen-tts-python", help="The interpreter qwen-tts runs "
                                                  "in (env OMNI_QWEN_TTS_PYTHON; default this one)."),
) -> None:
    """Random-weight throughput on a GPU: omni's loops against the family's reference, in one run."""
    from omni_cli.bench import PEERS, PeerEnv, check_bench, default_peers, run_bench
    from omni_cli.runners.device import DTYPES, pick_device

    if dtype not in DTYPES:
        typer.echo(f"omni: error: --dtype must be one of {', '.join(DTYPES)}", err=True)
        raise typer.Exit(2)
    env = PeerEnv.of(qwen_tts_python, qwen_tts_site)
    chosen = tuple(p.strip() for p in peers.split(",") if p.strip()) if peers is not None else default_peers(shape, env)
    if not chosen or any(p not in PEERS for p in chosen):
        typer.echo(f"omni: error: --peers {peers!r}: name some of {', '.join(PEERS)}", err=True)
        raise typer.Exit(2)
    where = _run(lambda: check_bench(shape, batch, frames, prompt_len, device, DTYPES[dtype], chosen))
    _run(lambda: run_bench(shape, batch, frames, prompt_len, pick_device(where), DTYPES[dtype], out, plot, chosen,
                           env))


voices_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                         help="Reference voices: encode a voice bank ahead of runs.")
app.add_typer(voices_app, name="voices")


@voices_app.command("encode", epilog="Exit codes: 0 every voice encoded or cached; 1 a voice failed; 2 bad arguments.")
def voices_encode(
    bank: Optional[Path] = typer.Argument(None, metavar="VOICES_YAML", help="Voice bank (name: {audio, text}); "
                                          "default: the model config's voices."),
    model: Optional[str] = typer.Option(None, "--model", help="Model config: a YAML path or a name in configs/."),
    force: bool = typer.Option(False, "--force", help="Encode again even where the cache has the codes."),
) -> None:
    """Encode each voice's reference audio once and cache its codes (keyed by the audio's sha256 and the
    codec), so runs that use the voices skip the encoder."""
    from omni_cli.voices import cache_dir, run_encode_bank

    report = _run(lambda: run_encode_bank(bank, model, force))
    for name, what in report:
        typer.echo(f"{name}: {what}")
    typer.echo(f"omni: cache {cache_dir()}", err=True)
    if any(what.startswith("failed") for _, what in report):
        raise typer.Exit(1)


# the commands over an output folder (verify, merge, score) live beside this module
cli_folders.register(app)


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # stdout closed by the reader (`| head`): nothing more to say to it
        _close_stdout()
        sys.exit(0)


def _close_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's last flush of a closed pipe raises nothing."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
