"""What the GPU machine lacks and cannot download (it reaches no network): onnxruntime-gpu, and the serving
and test dependencies of gptport that its image does not hold. A call to that machine carries at most
64 MiB and onnxruntime-gpu's wheel is 255 MB, almost all of it CUDA kernels for every GPU architecture
(sm_75 to sm_120), so `pack` keeps the kernels of one architecture (the others' bytes zeroed, their
headers kept: the CUDA driver loads the cubin of the device's architecture only), drops the two libraries
Python does not load (the C API's libonnxruntime.so and the TensorRT provider) and compresses the rest:
about 58 MiB, in two parts (two calls).

Here (where pip reaches PyPI), from the repository's root:

    python -m benchmarks.gpu.support.carry pack [--arch 90] [--part-mib 40]

writes benchmarks/work/gpucarry/call0/, call1/ (benchmarks/work/ is ignored: only what a call names in
`carry` travels), one folder per call to the GPU machine, made in a row (it stays warm 30 s between them):
each call but the last carries its folder and copies it out of the tree (`mkdir -p /tmp/carry && cp
benchmarks/work/gpucarry/call0/* /tmp/carry/`), the last carries its own and runs

    python3 -m benchmarks.gpu.support.carry unpack /tmp/carry benchmarks/work/gpucarry/call1 --target /tmp/site \\
    && PYTHONPATH=/tmp/site python3 -m benchmarks.gpu.static_decode

`--arch 0` keeps every architecture's kernels (about 200 MiB: five calls), should a slimmed library not load.
The CUDA libraries onnxruntime-gpu loads (cuBLAS, cuDNN, cuRAND, cudart for CUDA 13) are the image's: its
PyTorch's nvidia-* packages (static_decode.py puts their folders on LD_LIBRARY_PATH).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import struct
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WORK = ROOT / "benchmarks" / "work" / "gpucarry"  # ignored by git: what travels is named in `carry`
OUT = WORK
# the GPU image's glibc is 2.39: any manylinux tag up to it (pip matches each tag exactly)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
# not in the GPU image's list of packages (/work/.library/device/KINDS.md at the time of writing): serve's
# ASGI stack, llguidance (the scheduler's token masks), jsonschema (a gpu test); pinned to this environment's
EXTRA = ["starlette", "uvicorn", "httptools", "llguidance", "jsonschema", "jsonschema-specifications",
         "referencing", "rpds-py", "typer"]
DROPPED = ("libonnxruntime.so", "libonnxruntime_providers_tensorrt.so")  # the C API, TensorRT: Python loads neither
FATBIN_MAGIC = 0xBA55ED50


def slim_fatbins(data: bytearray, keep_arch: int) -> int:
    """Zero, in an ELF shared library, every cubin of .nv_fatbin whose architecture is not `keep_arch`
    (90: sm_90 and sm_90a); headers and sizes stay. Returns the bytes zeroed."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * entsize) for i in range(count)]
    table = headers[names][4]
    section = next((h for h in headers if data[table + h[0]:data.index(b"\0", table + h[0])] == b".nv_fatbin"), None)
    if section is None:
        return 0
    pos, end, zeroed = section[4], section[4] + section[5], 0
    while pos + 16 <= end:
        magic, _, header, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned
            continue
        entry, stop = pos + header, pos + header + size
        while entry < stop:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            if kind == 2 and arch != keep_arch:  # a cubin (kind 1 is PTX: kept)
                data[entry + entry_header:entry + entry_header + payload] = bytes(payload)
                zeroed += payload
            entry += entry_header + payload
        pos = stop
    return zeroed


def _download(names: list[str], dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *platforms, "-d", str(dest), *names], check=True)
    return sorted(dest.glob("*.whl"))


def _slim_archive(version: str, arch: int) -> bytes:
    """onnxruntime-gpu's package as a .tar.xz of what Python loads, the CUDA kernels of `arch` only (made once
    per version and architecture, kept under benchmarks/work/)."""
    cached = WORK / f"onnxruntime-gpu-{version}-sm{arch}.tar.xz"
    if cached.is_file():
        return cached.read_bytes()
    wheels = _download([f"onnxruntime-gpu=={version}"], WORK / "ort")
    wheel = next(w for w in wheels if f"-{version}-" in w.name)
    buf = io.BytesIO()
    with zipfile.ZipFile(wheel) as z, tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        for info in z.infolist():
            name = Path(info.filename).name
            if info.is_dir() or any(name.startswith(d) for d in DROPPED):
                continue
            data = bytearray(z.read(info))
            if name == "libonnxruntime_providers_cuda.so" and arch:
                print(f"{name}: {slim_fatbins(data, arch) / 2**20:.0f} MiB of other architectures' kernels zeroed")
            member = tarfile.TarInfo(info.filename)
            member.size, member.mode = len(data), 0o755 if name.endswith(".so") or ".so." in name else 0o644
            tar.addfile(member, io.BytesIO(bytes(data)))
    cached.write_bytes(buf.getvalue())
    return buf.getvalue()


def pack(arch: int, part_mib: int) -> None:
    """The archive in parts of `part_mib` MiB, one folder each (call0, call1, ...: one call carries one), the
    wheels and the manifest in the last."""
    version = metadata.version("onnxruntime-gpu")
    extra = _download([f"{n}=={metadata.version(n)}" for n in EXTRA], WORK / "extra")
    blob = _slim_archive(version, arch)
    for old in OUT.glob("call*"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    step = part_mib * 2**20
    parts = [blob[i:i + step] for i in range(0, len(blob), step)]
    for i, part in enumerate(parts):
        (OUT / f"call{i}").mkdir(parents=True)
        (OUT / f"call{i}" / f"ort.tar.xz.{i:03d}").write_bytes(part)
    last = OUT / f"call{len(parts) - 1}"
    for w in extra:
        (last / w.name).write_bytes(w.read_bytes())
    manifest = {"onnxruntime-gpu": version, "arch": arch, "sha256": hashlib.sha256(blob).hexdigest(),
                "parts": len(parts), "wheels": [w.name for w in extra]}
    (last / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for i in range(len(parts)):
        size = sum(f.stat().st_size for f in (OUT / f"call{i}").iterdir())
        print(f"{OUT / f'call{i}'}: {size / 2**20:.1f} MiB")


def unpack(folders: list[Path], target: Path) -> None:
    files = {p.name: p for folder in folders for p in folder.iterdir()}
    manifest = json.loads(files["manifest.json"].read_text())
    names = sorted(n for n in files if n.startswith("ort.tar.xz."))
    if len(names) != manifest["parts"]:
        raise SystemExit(f"{len(names)} parts of onnxruntime-gpu found in {folders}, {manifest['parts']} expected")
    blob = b"".join(files[n].read_bytes() for n in names)
    if hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
        raise SystemExit("onnxruntime-gpu's parts do not add up to the archive packed (sha256 differs)")
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(blob)), mode="r:") as tar:
        tar.extractall(target, filter="data")
    for name in manifest["wheels"]:
        with zipfile.ZipFile(files[name]) as z:
            z.extractall(target)
    print(f"onnxruntime-gpu {manifest['onnxruntime-gpu']} (sm_{manifest['arch']} kernels) and "
          f"{len(manifest['wheels'])} wheels in {target}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pack", help="download, slim and split (here)")
    p.add_argument("--arch", type=int, default=90, help="the CUDA architecture kept (90: H100, H200; 0: all)")
    p.add_argument("--part-mib", type=int, default=40, help="the size of each part of the archive")
    u = sub.add_parser("unpack", help="join and extract (on the GPU machine)")
    u.add_argument("folders", type=Path, nargs="+")
    u.add_argument("--target", type=Path, default=Path("/tmp/site"))
    args = ap.parse_args()
    if args.what == "pack":
        pack(args.arch, args.part_mib)
    else:
        unpack(args.folders, args.target)


if __name__ == "__main__":
    main()
