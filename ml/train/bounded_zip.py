"""Zip members read with bounded memory (docs/adr/0184): a member's declared (uncompressed) size is
checked against the caller's limit and a compression-ratio cap before a byte is inflated, and the read
stops at the declared size (zipfile never returns more) and must reach it exactly, CRC checked.
"""
from __future__ import annotations

import zipfile
import zlib

MAX_RATIO = 100             # uncompressed / compressed, for a member larger than RATIO_FLOOR
RATIO_FLOOR = 1 << 20       # members up to 1 MiB may compress any amount (small JSON, zero biases)
MAX_MEMBERS = 65_536
CHUNK = 1 << 20


class ZipBoundError(ValueError):
    """A zip file or member over its limits, or not what it declares (the message says which)."""


def checked_members(archive: zipfile.ZipFile, name: str, max_total: int) -> dict[str, zipfile.ZipInfo]:
    """{member name: info} of the files in `archive`, refusing duplicate names, more than MAX_MEMBERS
    files, a compression other than stored or deflated, a ratio over MAX_RATIO and declared sizes
    over `max_total` in all."""
    infos = [info for info in archive.infolist() if not info.is_dir()]
    if len(infos) > MAX_MEMBERS:
        raise ZipBoundError(f"{name}: {len(infos)} files, over the limit of {MAX_MEMBERS}")
    members: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        if info.filename in members:
            raise ZipBoundError(f"{name}: {info.filename} appears twice")
        members[info.filename] = info
        check_info(info, name)
        total += info.file_size
    if total > max_total:
        raise ZipBoundError(f"{name}: its files unpack to {total} bytes, over the limit of {max_total}")
    return members


def check_info(info: zipfile.ZipInfo, name: str) -> None:
    """A member stored or deflated (other methods inflate without a bound per read), within the ratio."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise ZipBoundError(f"{name}: {info.filename} uses compression method {info.compress_type}; only "
                            "stored and deflated files are read")
    if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
        raise ZipBoundError(f"{name}: {info.filename} unpacks {info.compress_size} bytes to {info.file_size}, "
                            f"a ratio over {MAX_RATIO} (a decompression bomb?)")


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, name: str) -> bytearray:
    """The bytes of `info`, refused unread when it declares more than `limit`; read in chunks into a
    buffer of the declared size (the reader stops there), then to its end so that the CRC is checked."""
    if info.file_size > limit:
        raise ZipBoundError(f"{name}: {info.filename} unpacks to {info.file_size} bytes, over the limit of "
                            f"{limit}")
    check_info(info, name)
    data = bytearray(info.file_size)
    filled = 0
    try:
        with archive.open(info) as member:
            while filled < len(data):
                chunk = member.read(min(CHUNK, len(data) - filled))
                if not chunk:
                    break
                data[filled:filled + len(chunk)] = chunk
                filled += len(chunk)
            extra = member.read(1)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, zlib.error) as exc:
        raise ZipBoundError(f"{name}: cannot read {info.filename}: {exc}") from None
    if filled != info.file_size or extra:
        raise ZipBoundError(f"{name}: {info.filename} does not hold the {info.file_size} bytes it declares")
    return data
