#!/usr/bin/env python3
"""Generates src/entry/table.rs (every CUDA driver entry point) and src/errors.rs (every
CUresult's name and meaning), from the CUDA 13.0 headers.

For each entry point the table says its name as programs ask for it (`cuMemAlloc`), the CUDA
version that introduced this form of it (`3020`), whether it is the per-thread-default-stream
form, and its exported symbol (`cuMemAlloc_v2`): what `cuGetProcAddress` needs. Symbols that
src/ implements (a `#[unsafe(no_mangle)]` `extern "C" fn cu...`) point there; every other one
gets a stub that says on stderr, once, that it is not supported, and returns
CUDA_ERROR_NOT_SUPPORTED.

The headers come from NVIDIA's `nvidia-cuda-runtime` wheel on PyPI (pinned below), or from a
folder given as the first argument. Run it after implementing or removing an entry point:
    python3 client-lib/cuda/gen/entries.py [INCLUDE_DIR]
A unit test (entry::tests) fails when the table is out of date with src/.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile
import zipfile

WHEEL = "nvidia-cuda-runtime==13.0.96"
HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
OUT = os.path.join(SRC, "entry", "table.rs")
ERRORS = os.path.join(SRC, "errors.rs")

# What the driver's cuGetErrorString says for the codes programs print most; the others read
# their name in words.
SHORT = {
    "CUDA_SUCCESS": "no error",
    "CUDA_ERROR_INVALID_VALUE": "invalid argument",
    "CUDA_ERROR_OUT_OF_MEMORY": "out of memory",
    "CUDA_ERROR_NOT_INITIALIZED": "initialization error",
    "CUDA_ERROR_NO_DEVICE": "no CUDA-capable device is detected",
    "CUDA_ERROR_INVALID_DEVICE": "invalid device ordinal",
    "CUDA_ERROR_INVALID_HANDLE": "invalid resource handle",
    "CUDA_ERROR_NOT_FOUND": "named symbol not found",
    "CUDA_ERROR_NOT_READY": "device not ready",
    "CUDA_ERROR_ILLEGAL_ADDRESS": "an illegal memory access was encountered",
    "CUDA_ERROR_LAUNCH_FAILED": "unspecified launch failure",
    "CUDA_ERROR_NOT_SUPPORTED": "operation not supported",
    "CUDA_ERROR_UNKNOWN": "unknown error",
}


def headers(argv):
    if len(argv) > 1:
        d = argv[1]
        return open(os.path.join(d, "cuda.h")).read(), open(os.path.join(d, "cudaTypedefs.h")).read()
    tmp = tempfile.mkdtemp()
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, WHEEL], check=True)
    whl = [f for f in os.listdir(tmp) if f.endswith(".whl")][0]
    with zipfile.ZipFile(os.path.join(tmp, whl)) as z:
        h = z.read("nvidia/cu13/include/cuda.h").decode()
        t = z.read("nvidia/cu13/include/cudaTypedefs.h").decode()
    return h, t


PROFILER = [("cuProfilerInitialize", 4000), ("cuProfilerStart", 4000), ("cuProfilerStop", 4000)]


def entries(h, t):
    # `#define cuMemAlloc cuMemAlloc_v2`: the name a program writes, the symbol it links.
    defines = dict(re.findall(r"#define\s+(cu\w+)\s+(cu\w+)\s*$", h, re.M))
    symbols = set(re.findall(r"CUresult\s+CUDAAPI\s+(cu\w+)\s*\(", h)) | set(defines.values())
    symbols |= {m + "_ptds" for m in re.findall(r"__CUDA_API_PTDS\((cu\w+)\)", h)}
    symbols |= {m + "_ptsz" for m in re.findall(r"__CUDA_API_PTSZ\((cu\w+)\)", h)}
    # `PFN_cuMemAlloc_v3020`: each form of an entry point and the version that introduced it.
    forms = collections.defaultdict(set)
    for base, ver, pt in re.findall(r"PFN_(cu\w+?)_v(\d+)(_ptsz|_ptds)?\)", t):
        forms[(base, pt)].add(int(ver))
    # cudaProfiler.h's entry points, which the runtime wheel does not ship.
    for base, ver in PROFILER:
        symbols.add(base)
        forms[(base, "")].add(ver)
    table = []
    for (base, pt), versions in sorted(forms.items()):
        # The forms' symbols, oldest first: base, base_v2, base_v3 ... (with the suffix).
        found = []
        for s in symbols:
            m = re.fullmatch(re.escape(base) + r"(?:_v(\d+))?" + re.escape(pt), s)
            if m:
                found.append((int(m.group(1) or 1), s))
        found.sort()
        versions = sorted(versions)
        if len(found) != len(versions):
            sys.exit(f"cannot pair {base}{pt}: versions {versions}, symbols {found}")
        table += [(base, v, bool(pt), s) for v, (_, s) in zip(versions, found)]
    return table, sorted(symbols)


EXPORT = re.compile(r'#\[unsafe\(no_mangle\)\]\s*(?:pub\s+)?(?:unsafe\s+)?extern\s+"C"\s+fn\s+(cu\w+)\s*\(')
# The two forms one `stream_forms!` line exports (copy.rs): `cuX / cuX_ptds (`.
FORMS = re.compile(r'^\s*(cu\w+)\s*/\s*(cu\w+)\s*\(', re.M)


def implemented():
    """The entry points src/ exports itself (the generated table aside)."""
    found = set()
    for root, _, files in os.walk(SRC):
        for f in files:
            path = os.path.join(root, f)
            if f.endswith(".rs") and os.path.abspath(path) != os.path.abspath(OUT):
                text = open(path).read()
                found |= set(EXPORT.findall(text))
                for pair in FORMS.findall(text):
                    found |= set(pair)
    return found


def errors(h):
    body = re.search(r"typedef enum cudaError_enum \{(.*?)\} CUresult;", h, re.S).group(1)
    out = []
    for _comment, name, value in re.findall(r"/\*\*(.*?)\*/\s*(CUDA_\w+)\s*=\s*(\d+)", body, re.S):
        words = name.removeprefix("CUDA_ERROR_").removeprefix("CUDA_").lower().replace("_", " ")
        out.append((int(value), name, SHORT.get(name, words)))
    return out


def write_errors(h):
    rows = errors(h)
    out = ["// Generated by client-lib/cuda/gen/entries.py from the CUDA 13.0 headers; do not edit.",
           "",
           "/// Every CUresult: (code, name, what cuGetErrorString says), by code.",
           f"pub static ERRORS: [(i32, &str, &str); {len(rows)}] = ["]
    for code, name, text in sorted(rows):
        out.append(f'    ({code}, "{name}\\0", "{text}\\0"),')
    out.append("];")
    open(ERRORS, "w").write("\n".join(out) + "\n")


def main():
    h, t = headers(sys.argv)
    write_errors(h)
    table, symbols = entries(h, t)
    done = implemented()
    stray = sorted(done - set(symbols))
    if stray:
        sys.exit(f"src/ exports entry points the headers do not have: {stray}")
    stubs = [s for s in symbols if s not in done]
    out = []
    w = out.append
    w("// Generated by client-lib/cuda/gen/entries.py from the CUDA 13.0 headers; do not edit.")
    w("// Every driver entry point: implemented in src/, or a stub that says it is not supported.")
    w("")
    w("use std::ffi::c_void;")
    w("")
    w("use super::Entry;")
    w("")
    w("// Implemented elsewhere in this crate (exported under these names).")
    w("unsafe extern \"C\" {")
    in_table = {e[3] for e in table}
    for s in sorted(done & in_table):
        w(f"    fn {s}();")
    w("}")
    w("")
    w("super::stubs! {")
    for s in stubs:
        w(f"    {s},")
    w("}")
    w("")
    w(f"/// Every form of every entry point, by name, then per-thread form, then version.")
    w(f"pub(super) static ENTRIES: [Entry; {len(table)}] = [")
    for base, v, pt, s in sorted(table, key=lambda e: (e[0], e[2], e[1])):
        w(f'    Entry::new("{base}", {v}, {"true" if pt else "false"}, {s} as *const c_void),')
    w("];")
    w("")
    w(f"/// Every exported symbol ({len(symbols)}).")
    w(f"#[cfg(test)]")
    w(f"pub(super) static SYMBOLS: [&str; {len(symbols)}] = [")
    for s in symbols:
        w(f'    "{s}",')
    w("];")
    w("")
    w(f"/// The symbols src/ implements ({len(done)}); the rest are stubs.")
    w(f"#[cfg(test)]")
    w(f"pub(super) static IMPLEMENTED: [&str; {len(done)}] = [")
    for s in sorted(done):
        w(f'    "{s}",')
    w("];")
    open(OUT, "w").write("\n".join(out) + "\n")
    # Formatted as cargo fmt would, so a rerun without changes leaves no diff.
    subprocess.run(["rustfmt", "--edition", "2024", OUT, ERRORS], check=True)
    print(f"{OUT}: {len(table)} forms, {len(symbols)} symbols, {len(done)} implemented, {len(stubs)} stubs")


if __name__ == "__main__":
    main()
