# First bytes of the probed functions in the real libcuda (what the uprobe replaces).
import struct, sys
path = sys.argv[1]
data = open(path, "rb").read()
shoff, = struct.unpack_from("<Q", data, 0x28); shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3a)
secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
dynsym = next(s for s in secs if s[1] == 11); dynstr = secs[dynsym[6]]
for i in range(dynsym[5] // 24):
    name_off, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", data, dynsym[4] + i * 24)
    end = data.index(b"\0", dynstr[4] + name_off); name = data[dynstr[4] + name_off:end].decode()
    if name in ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuMemAlloc_v2", "cuMemFree_v2"):
        sec = secs[shndx]; off = value - sec[3] + sec[4]
        print(name, hex(value), data[off:off + 12].hex(" "))
