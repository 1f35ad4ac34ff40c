"""Rewrite a wheel without some of its folders, so that the wheels carried to a bare GPU
machine fit the device tool's 64 MiB (dm_control's wheel is 56 MB, 51 of them locomotion,
the dog's and test assets that the control suite's other domains never load).

    python benchmarks/slim_wheel.py WHEEL PREFIX [PREFIX ...]

The wheel is replaced in place; its RECORD loses the dropped files' lines."""

from __future__ import annotations

import os
import sys
import zipfile


def slim(wheel: str, prefixes: list[str]) -> tuple[int, int]:
    """Drop every member under one of `prefixes`; returns (bytes before, bytes after)."""
    before = os.path.getsize(wheel)
    tmp = wheel + ".tmp"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        dropped = {i.filename for i in src.infolist()
                   if any(i.filename.startswith(p.rstrip("/") + "/") for p in prefixes)}
        for info in src.infolist():
            if info.filename in dropped:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(ln for ln in lines if ln.split(",")[0] not in dropped).encode()
            dst.writestr(info, data)
    os.replace(tmp, wheel)
    return before, os.path.getsize(wheel)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    b, a = slim(sys.argv[1], sys.argv[2:])
    print(f"{sys.argv[1]}: {b / 2**20:.1f} -> {a / 2**20:.1f} MiB")
