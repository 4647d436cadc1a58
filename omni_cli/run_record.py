"""run.json: what ran (versions, config, device, command), what came out, and where time went."""

from __future__ import annotations

import platform
from pathlib import Path

from omni_cli import __version__


def versions() -> dict[str, str | None]:
    """From the installed metadata: importing transformers costs seconds, and a run does not use it."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:  # run.json is written after every row: it must not fail here
            return None

    return {"omni_cli": __version__, "torch": installed("torch"), "transformers": installed("transformers"),
            "tokenizers": installed("tokenizers"), "python": platform.python_version()}


def run_record(opts, config, model, results, progress, audio, stats, interrupted: bool, t: dict[str, float]) -> dict:
    """The run's record. ``t``: perf_counter marks start, read, family, loaded, loop, decoded,
    written, end, and the warm-up's seconds as warmup_s."""
    elapsed, fps, asps = progress.rates()
    warmup_s = t["warmup_s"]
    codec_calls = audio.codec_calls
    return {
        "versions": versions(),
        "config": config.as_dict(),
        "device": model.device_name,
        "dtype": config.dtype,
        "kv_slots": model.num_slots,
        "kv_budget": model.kv_budget,  # free memory and what was kept from it (CUDA), MiB
        # the paged KV cache: its blocks, and the most rows a decode step ran (they fit by their own lengths)
        "kv_cache": kv_record(model.runner.kv_blocks, stats),
        # prompt positions computed by prefills, taken from cached blocks instead, cached blocks evicted
        "prefix_cache": model.runner.kv_blocks.stats.as_record() if model.runner.kv_blocks is not None else None,
        "command": {k: (str(v) if isinstance(v, Path) else v) for k, v in opts.__dict__.items()},
        # failed: rows that failed on their own; interrupted_rows, skipped_rows: rows stopped before they ran
        "totals": {"rows": progress.total, "ok": results.ok, "rejected": results.rejected, "failed": results.failed,
                   "interrupted": interrupted,
                   "interrupted_rows": results.interrupted, "skipped_rows": results.skipped,
                   "frames": progress.frames, "audio_s": round(progress.audio_s, 3)},
        # generate_s: after the load and the warm-up (both startup), to the last file
        "timings": {"load_s": round(t["loaded"] - t["start"], 3), "warmup_s": round(warmup_s, 3),
                    # the load's parts: config and prompt file, the model family's imports, then its load's
                    "load_phases": {"imports_s": round(t["family"] - t["start"], 3),
                                    "inputs_s": round(t["read"] - t["family"], 3), **model.load_phases},
                    "generate_s": round(t["end"] - t["loaded"] - warmup_s, 3),
                    # of it: reading (before the load), resampling and encoding the reference voices
                    "references_s": round(t.get("references", t["loaded"]) - t["loaded"], 3),
                    "wall_s": round(t["end"] - t["start"], 3), "frames_per_s": round(fps, 2),
                    "audio_s_per_s": round(asps, 3),
                    # the loop (prefill + decode, files written beside it), then the writers' tail
                    "loop_s": round(t["decoded"] - t["loop"], 3),
                    "prefill_s": round(sum(stats.prefill_ms) / 1e3, 3) if stats else None,
                    "prefill_steps": len(stats.prefill_ms) if stats else None,
                    # of those, the ones that ran beside the running rows' decode step (the refills)
                    "prefill_beside_steps": stats.beside if stats else None,
                    "write_tail_s": round(t["written"] - t["decoded"], 3),
                    # of that tail: until the codec thread's last call returned (its files submitted;
                    # <= 0 when it returned during the loop), and the writers' busy seconds over the run
                    "tail_codec_s": round(audio.codec_done - t["decoded"], 3) if codec_calls else None,
                    "write_busy_s": round(sum(results.write_busy), 3),
                    # the codec thread: its calls (each every row finished so far), their sum and the longest
                    "codec_calls": len(codec_calls), "codec_s": round(sum(codec_calls), 3),
                    "codec_max_call_s": round(max(codec_calls, default=0.0), 3),
                    "step_ms": stats.percentiles() if stats else {}},
        "async_decode": {"enabled": config.async_decode, "query_hits": model.runner.async_query_hit,
                         "query_misses": model.runner.async_query_miss,
                         "sync_routed_steps": stats.sync_routed if stats else 0,
                         # OMNI_TRACE_STEPS: the device's step times and the loop stream's idle gaps
                         **({"trace": model.runner.step_trace.summary()} if model.runner.step_trace else {})},
    }


def kv_record(pool, stats) -> dict | None:
    if pool is None:
        return None
    return {"blocks": pool.num_blocks, "block_size": pool.block_size, "prefix_sharing": pool.share,
            "peak_rows": stats.peak_rows if stats else None}


def async_summary(enabled: bool, runner, stats) -> str:
    if not enabled:
        return "omni: async decode off (synchronous steps)"
    hits, misses = runner.async_query_hit, runner.async_query_miss
    rate = f"{100 * hits / (hits + misses):.1f}%" if hits + misses else "n/a"
    routed = stats.sync_routed if stats else 0
    return f"omni: async decode on: query hit rate {rate} ({hits} hits, {misses} misses), {routed} steps routed to sync"


def devices_record(opts, config, workers, progress, rows: int, statuses: dict[str, int], code: int,
                   errors: list[str], t0: float) -> dict:
    """--devices' run.json (omni_cli/workers.py): the parent's totals, per device and per worker process."""
    import signal
    import time

    elapsed, fps, asps = progress.rates()
    per_worker = []
    for w in workers:
        status = w.proc.exitcode
        end = w.end[0] if w.end else f"died: {signal.Signals(-status).name if status < 0 else f'exit status {status}'}"
        run = w.end[1] if w.ended("done") else {}  # {}: a worker stopped before any row ran
        per_worker.append({"device": opts.devices[w.slot], "pid": w.proc.pid, "share": f"{w.spec.share}/{w.spec.count}",
                           "attempt": w.spec.attempt, "end": end if end != "error" else f"error: {w.end[1]}",
                           "rows": len(w.spec.rows), "kv_slots": run.get("kv_slots"), "totals": run.get("totals"),
                           "timings": run.get("timings"), "async_decode": run.get("async_decode"),
                           "prefix_cache": run.get("prefix_cache")})
    caches = [w["prefix_cache"] for w in per_worker if w["prefix_cache"]]
    return {
        "versions": versions(), "config": config.as_dict(), "device": list(opts.devices),
        "dtype": config.dtype, "kv_slots": [w["kv_slots"] for w in per_worker if w["kv_slots"] is not None],
        "command": {k: (str(v) if isinstance(v, Path) else v) for k, v in opts.__dict__.items()},
        "totals": {"rows": rows, "ok": statuses.get("ok", 0), "rejected": statuses.get("rejected", 0),
                   "failed": statuses.get("failed", 0),
                   "interrupted": code in (130, 143), "interrupted_rows": statuses.get("interrupted", 0),
                   "skipped_rows": statuses.get("skipped", 0),
                   "frames": progress.frames, "audio_s": round(progress.audio_s, 3),
                   # rows an earlier run finished (--resume): a rerun's kept rows are this run's
                   "kept": sum((w["totals"] or {}).get("kept", 0) for w in per_worker if w["attempt"] == 0),
                   "exit_code": code, "run_error": "; ".join(errors) or None},
        "timings": {"wall_s": round(time.perf_counter() - t0, 3), "generate_s": round(elapsed, 3),
                    "frames_per_s": round(fps, 2), "audio_s_per_s": round(asps, 3)},
        "async_decode": {"enabled": config.async_decode, "query_hits": sum(f.hits for f in progress.figures),
                         "query_misses": sum(f.misses for f in progress.figures)},
        # each worker's prefix cache is its own: their counts summed
        "prefix_cache": {k: sum(c[k] for c in caches) for k in caches[0]} if caches else None,
        "devices": progress.records(),  # per device, its workers together
        "workers": per_worker,
    }
