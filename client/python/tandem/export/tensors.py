"""safetensors of torch tensors: the archive's weights and the tensors data
source's files, on the codec tandem.weights shares (tandem/safetensors.py)."""

import torch

from tandem import safetensors
from tandem.export._common import ArchiveError, ExportError


_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
    torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


_ST_TORCH = {v: k for k, v in _ST_DTYPES.items()}


def _tensor_bytes(t):
    """The raw little-endian bytes of a tensor, row-major."""
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.view(torch.uint8).numpy().tobytes()


def _safetensors_header(named):
    """(header bytes incl. the 8-byte length, total data size) for a list of
    (name, tensor)."""
    entries = []
    for name, t in named:
        if t.dtype not in _ST_DTYPES:
            raise ExportError("%s has dtype %s, which safetensors cannot "
                              "hold" % (name, t.dtype))
        entries.append((name, _ST_DTYPES[t.dtype], list(t.shape),
                        t.numel() * t.element_size()))
    return safetensors.header_bytes(entries)


def write_safetensors(named, f):
    """Writes (name, tensor) pairs as safetensors to the binary file f:
    an 8-byte little-endian header length, a JSON header padded with spaces
    to a multiple of 8, then every tensor's raw little-endian bytes."""
    named = list(named)
    header, _ = _safetensors_header(named)
    f.write(header)
    for _, t in named:
        f.write(_tensor_bytes(t))


def read_safetensors(data, source="safetensors data"):
    """The named tensors of a safetensors file's bytes, as a dict in file
    order. Raises ArchiveError on a malformed file (tandem.safetensors,
    parse_header) or a dtype torch does not have."""
    data = memoryview(data)
    header, _, start = safetensors.parse_header(data, len(data), source,
                                                ArchiveError)
    out = {}
    for name, spec in header.items():
        dtype = _ST_TORCH.get(spec["dtype"])
        if dtype is None:
            raise ArchiveError("%s: tensor %r has dtype %s, which tandem "
                               "cannot load into torch" %
                               (source, name, spec["dtype"]))
        shape = spec["shape"]
        begin, end = spec["data_offsets"]
        if begin == end:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        raw = bytearray(data[start + begin:start + end])
        if dtype == torch.bool:
            t = torch.frombuffer(raw, dtype=torch.uint8).to(torch.bool)
        else:
            t = torch.frombuffer(raw, dtype=dtype)
        out[name] = t.reshape(shape)
    return out
