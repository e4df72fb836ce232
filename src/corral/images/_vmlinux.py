"""The uncompressed kernel (``vmlinux``, an ELF file) inside an x86 ``bzImage``.

Firecracker boots an uncompressed ELF kernel on x86_64; Debian ships only
the compressed ``vmlinuz``. Its boot protocol header says where the
compressed payload lies (``payload_offset`` and ``payload_length`` at
0x248 and 0x24c, counted from the protected-mode code, which starts after
``setup_sects + 1`` sectors of 512 bytes); the payload's magic says how it
is compressed. gzip, xz, lzma and bzip2 are decompressed with the standard
library; lz4 (Debian 12's kernels) and zstd with the ``lz4``/``zstd``
programs (apt ``lz4``, ``zstd``). The kernel build appends the uncompressed
size (4 bytes) to every payload; it is dropped before decompressing.
"""

from __future__ import annotations

import struct
import subprocess

__all__ = ["VmlinuxError", "extract_vmlinux"]


class VmlinuxError(Exception):
    """The file is not a bzImage this code can unpack (the message says why)."""


#: magic -> compression
_MAGICS: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x5d\x00\x00", "lzma"),
    (b"BZh", "bzip2"),
    (b"\x02\x21\x4c\x18", "lz4"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)


def _payload(image: bytes) -> bytes:
    if len(image) < 0x250 or image[0x202:0x206] != b"HdrS":
        raise VmlinuxError("not a bzImage (no 'HdrS' boot protocol header)")
    (version,) = struct.unpack_from("<H", image, 0x206)
    if version < 0x208:
        raise VmlinuxError(f"boot protocol {version:#x} has no payload fields (needs 2.08)")
    setup_sects = image[0x1F1] or 4
    offset, length = struct.unpack_from("<II", image, 0x248)
    start = (setup_sects + 1) * 512 + offset
    if length < 8 or start + length > len(image):
        raise VmlinuxError("the payload fields point outside the file")
    return image[start : start + length]


def _decompress(kind: str, data: bytes) -> bytes:
    if kind == "gzip":
        import zlib

        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
    if kind in ("xz", "lzma"):
        import lzma

        fmt = lzma.FORMAT_XZ if kind == "xz" else lzma.FORMAT_ALONE
        return lzma.LZMADecompressor(format=fmt).decompress(data)
    if kind == "bzip2":
        import bz2

        return bz2.BZ2Decompressor().decompress(data)
    program = "lz4" if kind == "lz4" else "zstd"
    try:
        result = subprocess.run(
            [program, "-d", "-c"], input=data, capture_output=True, check=False, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VmlinuxError(
            f"the kernel is {kind}-compressed and {program} could not run ({exc}); "
            f"install it (apt-get install {program})"
        ) from None
    if not result.stdout:
        raise VmlinuxError(f"{program} -d failed: {result.stderr.decode(errors='replace')[:300]}")
    return result.stdout


def extract_vmlinux(bzimage: str, out: str) -> None:
    """Write the ELF kernel inside *bzimage* to *out*.

    Raises:
        VmlinuxError: not a bzImage, an unknown compression, or the payload
            is not an x86_64 ELF file once decompressed.
    """
    with open(bzimage, "rb") as f:
        payload = _payload(f.read())
    kind = next((k for magic, k in _MAGICS if payload.startswith(magic)), None)
    if kind is None:
        raise VmlinuxError(f"unknown compression of the kernel payload (magic {payload[:4].hex()})")
    elf = _decompress(kind, payload[:-4])  # the build appends the uncompressed size
    # ELF, 64-bit, little endian; e_machine 62 = x86_64
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1 or elf[18:20] != b"\x3e\x00":
        raise VmlinuxError(f"the {kind} payload is not an x86_64 ELF kernel")
    with open(out, "wb") as f:
        f.write(elf)
