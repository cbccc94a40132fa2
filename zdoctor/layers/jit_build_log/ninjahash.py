"""The command hashes ninja writes into ``.ninja_log``, computed as ninja computes them.

ninja 1.12 and older hash a build edge's command with MurmurHash64A (seed 0xDECAFBADDECAFBAD; src/build_log.cc
of v1.10.0 - v1.12.1); ninja 1.13 with rapidhash (src/third_party/rapidhash/rapidhash.h, upstream commit
4a6b2570, the default fast and unrolled variant; src/build_log.cc of v1.13.0 - v1.13.2). A log line's hash
that equals one of them for the command build.ninja now gives says which ninja wrote it, and that the
command did not change since.
"""

from __future__ import annotations

M64 = (1 << 64) - 1
_MURMUR_SEED = 0xDECAFBADDECAFBAD
_MURMUR_M = 0xC6A4A7935BD1E995
_RAPID_SEED = 0xBDD89AA982704029
_RAPID_SECRET = (0x2D358DCCAA6C78A5, 0x8BB84B93962EACC9, 0x4B33A62ED433D4A3)


def murmur64a(data: bytes) -> int:
    """ninja's MurmurHash64A of ``data``."""
    m, r = _MURMUR_M, 47
    h = (_MURMUR_SEED ^ (len(data) * m)) & M64
    full = len(data) - len(data) % 8
    for i in range(0, full, 8):
        k = int.from_bytes(data[i:i + 8], "little")
        k = (k * m) & M64
        k ^= k >> r
        k = (k * m) & M64
        h ^= k
        h = (h * m) & M64
    tail = data[full:]
    if tail:
        for i in range(len(tail) - 1, -1, -1):
            h ^= tail[i] << (8 * i)
        h = (h * m) & M64
    h ^= h >> r
    h = (h * m) & M64
    h ^= h >> r
    return h


def _mum(a: int, b: int) -> tuple[int, int]:
    r = a * b
    return r & M64, (r >> 64) & M64


def _mix(a: int, b: int) -> int:
    lo, hi = _mum(a, b)
    return lo ^ hi


def _r64(p: bytes, i: int) -> int:
    return int.from_bytes(p[i:i + 8], "little")


def _r32(p: bytes, i: int) -> int:
    return int.from_bytes(p[i:i + 4], "little")


def rapidhash(data: bytes) -> int:
    """ninja 1.13's rapidhash of ``data``."""
    s = _RAPID_SECRET
    n = len(data)
    seed = _RAPID_SEED ^ _mix(_RAPID_SEED ^ s[0], s[1]) ^ n
    if n <= 16:
        if n >= 4:
            last = n - 4
            a = (_r32(data, 0) << 32) | _r32(data, last)
            delta = (n & 24) >> (n >> 3)
            b = (_r32(data, delta) << 32) | _r32(data, last - delta)
        elif n > 0:
            a, b = (data[0] << 56) | (data[n >> 1] << 32) | data[n - 1], 0
        else:
            a = b = 0
    else:
        i, p = n, 0
        if i > 48:
            see1 = see2 = seed
            while i >= 96:
                seed = _mix(_r64(data, p) ^ s[0], _r64(data, p + 8) ^ seed)
                see1 = _mix(_r64(data, p + 16) ^ s[1], _r64(data, p + 24) ^ see1)
                see2 = _mix(_r64(data, p + 32) ^ s[2], _r64(data, p + 40) ^ see2)
                seed = _mix(_r64(data, p + 48) ^ s[0], _r64(data, p + 56) ^ seed)
                see1 = _mix(_r64(data, p + 64) ^ s[1], _r64(data, p + 72) ^ see1)
                see2 = _mix(_r64(data, p + 80) ^ s[2], _r64(data, p + 88) ^ see2)
                p += 96
                i -= 96
            if i >= 48:
                seed = _mix(_r64(data, p) ^ s[0], _r64(data, p + 8) ^ seed)
                see1 = _mix(_r64(data, p + 16) ^ s[1], _r64(data, p + 24) ^ see1)
                see2 = _mix(_r64(data, p + 32) ^ s[2], _r64(data, p + 40) ^ see2)
                p += 48
                i -= 48
            seed ^= see1 ^ see2
        if i > 16:
            seed = _mix(_r64(data, p) ^ s[2], _r64(data, p + 8) ^ seed ^ s[1])
            if i > 32:
                seed = _mix(_r64(data, p + 16) ^ s[2], _r64(data, p + 24) ^ seed)
        a, b = _r64(data, p + i - 16), _r64(data, p + i - 8)
    a ^= s[1]
    b ^= seed
    a, b = _mum(a, b)
    return _mix(a ^ s[0] ^ n, b ^ s[1])


def which_hash(logged: str, command: str) -> str | None:
    """``"murmur"`` or ``"rapidhash"`` when the log's hex hash ``logged`` is that hash of ``command``; None
    when it is neither (the command changed, or the line is not a command hash)."""
    try:
        value = int(logged, 16)
    except ValueError:
        return None
    data = command.encode("utf-8", "surrogateescape")
    if murmur64a(data) == value:
        return "murmur"
    if rapidhash(data) == value:
        return "rapidhash"
    return None
