#!/usr/bin/env python3
"""Refreshes client-lib/nvml/symbols.txt: every NVML entry point the shim exports.

Names are only ever added, never dropped: a name a newer nvml.h no longer declares is still
exported by the drivers that had it, and a program built against those calls it. Give it any
number of files:
  - an `nvml.h` (NVIDIA's, from the CUDA toolkit or NVIDIA/go-nvml's gen/nvml/nvml.h): every
    function it declares (`DECLDIR nvml...(`), the unversioned ones of its
    NVML_NO_UNVERSIONED_FUNC_DEFS block included;
  - a `pynvml.py` (the nvidia-ml-py wheel): every name it looks up, which may run ahead of
    the header;
and it rewrites symbols.txt (its comment lines kept as they are, the names sorted) and says
which names it added. Then update the comment's list of sources, and build: build.rs makes
one trampoline per name.

    python3 client-lib/nvml/gen/symbols.py /path/to/nvml.h /path/to/pynvml.py
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LIST = os.path.join(HERE, "..", "symbols.txt")


def header_names(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return set(re.findall(r"DECLDIR\s*(?:char\s*\*\s*)?(nvml\w+)\s*\(", text))


def pynvml_names(text):
    return set(re.findall(r'_nvmlGetFunctionPointer\(\s*"(nvml\w+)"', text))


def main(paths):
    comments, names = [], set()
    with open(LIST) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("#") or not line.strip():
                if not names:
                    comments.append(line)
            else:
                names.add(line.strip())
    added = set()
    for path in paths:
        with open(path, errors="replace") as f:
            text = f.read()
        found = pynvml_names(text) if path.endswith(".py") else header_names(text)
        if not found:
            sys.exit(f"{path}: no NVML function found in it")
        added |= found - names
    with open(LIST, "w") as f:
        for line in comments:
            f.write(line + "\n")
        for name in sorted(names | added):
            f.write(name + "\n")
    print(f"{len(names | added)} names, {len(added)} added: {' '.join(sorted(added))}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
