"""runners/digest.py: a codec's identity is the sha256 of its files, remembered across runs so an
unchanged codec is named without reading it, and hashed again whenever a file is rewritten."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest


def sha256_of(files) -> str:
    """The oracle, written from the format's description: per file its name, NUL, its size, NUL,
    then its bytes."""
    h = hashlib.sha256()
    for f in files:
        data = Path(f).read_bytes()
        h.update(f"{Path(f).name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()


@pytest.fixture
def files(tmp_path):
    a, b = tmp_path / "config.json", tmp_path / "model.safetensors"
    a.write_text('{"x": 1}')
    b.write_bytes(os.urandom(3 << 20))  # several 1 MiB reads
    return [a, b]


def _no_reads(monkeypatch):
    import omni_cli.runners.digest as digest

    def refuse(files):
        raise AssertionError("the files were read")

    monkeypatch.setattr(digest, "hash_files", refuse)


def test_digest_is_the_files_sha256_with_or_without_a_store(tmp_path, files):
    from omni_cli.runners.digest import files_digest

    want = sha256_of(files)
    assert files_digest(files) == want
    assert files_digest(files, tmp_path / "store") == want
    assert files_digest(files[::-1]) != want  # control: the order is part of the identity


def test_a_stored_digest_is_reused_without_reading_the_files(tmp_path, files, monkeypatch):
    from omni_cli.runners.digest import files_digest

    store = tmp_path / "store"
    want = files_digest(files, store)
    _no_reads(monkeypatch)
    assert files_digest(files, store) == want
    with pytest.raises(AssertionError, match="read"):  # control: another file set has no record
        files_digest(files[:1], store)


def test_a_rewritten_file_is_hashed_again(tmp_path, files, monkeypatch):
    """Replaced by a file of the same size and mtime (as a copy that keeps times makes it): the
    inode and ctime tell it is another file."""
    from omni_cli.runners.digest import files_digest

    store = tmp_path / "store"
    before = files_digest(files, store)
    st = files[1].stat()
    data = bytearray(files[1].read_bytes())
    data[12345] ^= 0xFF
    new = files[1].with_suffix(".new")
    new.write_bytes(bytes(data))
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, files[1])
    assert files[1].stat().st_size == st.st_size and files[1].stat().st_mtime_ns == st.st_mtime_ns
    after = files_digest(files, store)
    assert after == sha256_of(files) and after != before
    _no_reads(monkeypatch)
    assert files_digest(files, store) == after  # and the new digest is what is remembered


def test_a_store_that_cannot_be_written_still_gives_the_digest(tmp_path, files):
    from omni_cli.runners.digest import files_digest

    blocked = tmp_path / "store"
    blocked.write_text("a file where the folder would be")
    assert files_digest(files, blocked) == sha256_of(files)


def test_a_damaged_record_is_replaced(tmp_path, files):
    from omni_cli.runners.digest import files_digest

    store = tmp_path / "store"
    files_digest(files, store)
    (record,) = store.iterdir()
    record.write_text("{not json")
    assert files_digest(files, store) == sha256_of(files)
    record.write_text('{"files": [], "sha256": "0"}')  # another file set's record under this name
    assert files_digest(files, store) == sha256_of(files)


def test_the_voice_cache_names_the_codec_from_the_store(tmp_path, monkeypatch):
    """omni_cli/voices.py keys cached codes by the codec identity, remembered under the cache root's
    codec-identities/: a second family object (a second run) reads no codec file to name it."""
    from omni_cli.runners.family import ModelFamily
    from omni_cli.voices import codec_key

    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path / "cache"))
    codec = tmp_path / "codec.bin"
    codec.write_bytes(b"weights")

    class Family:  # the two members of the contract that codec_key uses
        codec_files = lambda self: [codec]  # noqa: E731
        codec_identity = ModelFamily.codec_identity

    first = codec_key(Family())
    assert first == sha256_of([codec])[:32]
    assert list((tmp_path / "cache" / "codec-identities").iterdir())
    _no_reads(monkeypatch)
    assert codec_key(Family()) == first
