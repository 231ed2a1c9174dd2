"""A minimal safetensors writer and reader (the format, not the library).

File = u64 little-endian header length N, N bytes of JSON header (padded with spaces to a multiple
of 8), then the tensor bytes. The header maps each name to {"dtype", "shape", "data_offsets":
[begin, end]} with offsets relative to the first byte after the header; "__metadata__" holds
{"format": "pt"}. The writer lays tensors out contiguously in header order.
"""

import json
import struct

import numpy as np

# dtype string -> numpy dtype of the stored element (little-endian)
DTYPES = {
    "BF16": np.dtype("<u2"),
    "F32": np.dtype("<f4"),
    "F8_E4M3": np.dtype("u1"),
    "F8_E8M0": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "I64": np.dtype("<i8"),
}


class Tensor:
    """One stored tensor: safetensors dtype string, shape, and an array of the matching storage dtype."""

    __slots__ = ("name", "dtype", "shape", "data")

    def __init__(self, name, dtype, data):
        want = DTYPES[dtype]
        data = np.asarray(data)
        if data.dtype.itemsize != want.itemsize or data.dtype.kind not in "uif":
            raise ValueError(f"{name}: {data.dtype} does not store {dtype}")
        self.name = name
        self.dtype = dtype
        self.shape = list(data.shape)
        self.data = np.ascontiguousarray(data).view(want)  # same width: a bit-preserving view

    @property
    def nbytes(self):
        return self.data.nbytes


def write(path, tensors):
    """Writes tensors (a list of Tensor, in the order given) to path."""
    header = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in tensors:
        if t.name in header:
            raise ValueError(f"duplicate tensor {t.name}")
        header[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for t in tensors:
            f.write(memoryview(t.data.reshape(-1)).cast("B"))
    return off


def read(path):
    """Returns (header dict without __metadata__, metadata, {name: numpy array}) for path."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", None)
    base = 8 + n
    arrays = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        dt = DTYPES[h["dtype"]]
        count = int(np.prod(h["shape"], dtype=np.int64))
        if e - b != count * dt.itemsize:
            raise ValueError(f"{path}: {name}: offsets do not match shape")
        arrays[name] = np.frombuffer(buf, dtype=dt, count=count, offset=base + b).reshape(h["shape"])
    return header, meta, arrays
