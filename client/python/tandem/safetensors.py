"""The safetensors format, in the standard library only: what tandem.weights
(checkpoints out, no torch) and tandem.export (archives and data files,
with torch) share.

A file is an 8-byte little-endian header length, a JSON object padded with
spaces to a multiple of 8 bytes, and the data: for each tensor, its dtype
("F32", "I64", ...), shape and [begin, end) data_offsets; "__metadata__"
maps strings to strings.
"""

import json
import struct

# dtype -> bytes per element.
DTYPE_SIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2,
    "U8": 1, "BOOL": 1,
}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def header_bytes(entries, metadata=None):
    """(the 8-byte length and the padded JSON header, the data's length) for
    entries [(name, dtype, shape, nbytes)] laid out in order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, offset


def parse_header(head, size, source, error):
    """Checks a file's header: ``head`` is at least its first 8 + header
    length bytes (or all there is), ``size`` the file's length. Returns
    ({name: {dtype, shape, data_offsets}} in file order, metadata, the data's
    start). Raises ``error`` (an exception class) naming ``source`` when the
    header length runs past the file, the JSON is not an object, a dtype is
    unknown, a shape's byte size does not match its offsets, or the offsets
    do not tile the data exactly."""
    if len(head) < 8:
        raise error("%s is not a safetensors file (%d bytes)" %
                    (source, size))
    (n,) = struct.unpack("<Q", bytes(head[:8]))
    if n > size - 8 or len(head) < 8 + n:
        raise error("%s is truncated or not safetensors (header of %d "
                    "bytes in a %d-byte file)" % (source, n, size))
    try:
        header = json.loads(bytes(head[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise error("%s: the safetensors header is not JSON (%s)" %
                    (source, e)) from None
    if not isinstance(header, dict):
        raise error("%s: the safetensors header is not a JSON object" %
                    source)
    metadata = header.pop("__metadata__", {}) or {}
    data_len = size - 8 - n
    spans = []
    for name, e in header.items():
        ok = (isinstance(e, dict) and e.get("dtype") in DTYPE_SIZES and
              isinstance(e.get("shape"), list) and
              all(isinstance(d, int) and d >= 0 for d in e["shape"]) and
              isinstance(e.get("data_offsets"), list) and
              len(e["data_offsets"]) == 2 and
              all(isinstance(o, int) for o in e["data_offsets"]))
        if not ok:
            raise error("%s: bad safetensors entry %r: %r" % (source, name, e))
        begin, end = e["data_offsets"]
        want = numel(e["shape"]) * DTYPE_SIZES[e["dtype"]]
        if not 0 <= begin <= end <= data_len or end - begin != want:
            raise error(
                "%s: tensor %r has data_offsets %r for %d bytes of %s %r "
                "(data is %d bytes)" % (source, name, e["data_offsets"], want,
                                        e["dtype"], e["shape"], data_len))
        spans.append((begin, end, name))
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            raise error("%s: tensor %r starts at %d, expected %d (offsets "
                        "overlap or leave a gap)" % (source, name, begin, pos))
        pos = end
    if pos != data_len:
        raise error("%s: %d data bytes but the tensors cover %d" %
                    (source, data_len, pos))
    return header, metadata, 8 + n
