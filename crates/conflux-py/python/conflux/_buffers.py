"""Turning Python objects into the (address, count, dtype) triples ``conflux._native`` takes.

The native module trusts these addresses (like ctypes does), so only this module makes them,
and every caller keeps the object alive until the operation is over: the caller's frame for a
blocking call, the completion callback (``Keep``) for an asynchronous one.
"""

import ctypes

from .errors import InvalidArgument

# numpy's typestr (without byte order) and the buffer protocol's format characters, to ours.
# Booleans travel as uint8; the reduce ops that make sense on them are mapped in ``bool_op``.
_NUMPY = {"f4": "f32", "f8": "f64", "f2": "f16", "i1": "i8", "u1": "u8", "i2": "i16", "i4": "i32",
          "i8": "i64", "b1": "bool"}
_FORMAT = {("f", 4): "f32", ("d", 8): "f64", ("e", 2): "f16", ("b", 1): "i8", ("B", 1): "u8",
           ("c", 1): "u8", ("h", 2): "i16", ("i", 4): "i32", ("l", 4): "i32", ("l", 8): "i64",
           ("q", 8): "i64", ("?", 1): "bool"}


SIZES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i8": 1, "u8": 1, "i16": 2, "i32": 4, "i64": 8,
         "bool": 1}


def native_dtype(dtype):
    """Our dtype name for a triple: booleans are uint8 on the wire."""
    return "u8" if dtype == "bool" else dtype


def bool_op(op):
    """The uint8 op that computes `op` on 0/1 bytes (sum and max are or, prod and min are and)."""
    table = {"sum": "max", "max": "max", "bor": "max", "prod": "min", "min": "min", "band": "min",
             "bxor": "bxor"}
    if op not in table:
        raise InvalidArgument(f"reduce op {op} is not defined on bool")
    return table[op]


class Buf:
    """A described buffer: its triple, and the object that must stay alive while it is used."""

    __slots__ = ("addr", "count", "dtype", "owner")

    def __init__(self, addr, count, dtype, owner):
        self.addr, self.count, self.dtype, self.owner = addr, count, dtype, owner

    def triple(self):
        return self.addr, self.count, native_dtype(self.dtype)


def describe(obj, writable=True):
    """The Buf of a C-contiguous numpy array or buffer-protocol object."""
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None and ai.get("strides") is None and not hasattr(obj, "data_ptr"):
        addr, readonly = ai["data"]
        if writable and readonly:
            raise InvalidArgument("the array is read-only")
        dtype = _NUMPY.get(ai["typestr"][1:])
        if dtype is None:
            raise InvalidArgument(f"unsupported array dtype {ai['typestr']}")
        count = 1
        for d in ai["shape"]:
            count *= d
        return Buf(addr, count, dtype, obj)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgument(f"{type(obj).__name__} is neither an array nor a buffer") from None
    if not mv.c_contiguous:
        raise InvalidArgument("the buffer is not C-contiguous")
    dtype = _FORMAT.get((mv.format.lstrip("@=<"), mv.itemsize))
    if dtype is None:
        raise InvalidArgument(f"unsupported buffer format {mv.format!r}")
    if mv.nbytes == 0:
        return Buf(0, 0, dtype, mv)
    if mv.readonly:
        if writable:
            raise InvalidArgument("the buffer is read-only")
        # ctypes only maps writable buffers; a read-only source is sent from a copy.
        mv = memoryview(bytearray(mv)).cast(mv.format)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
    return Buf(addr, mv.nbytes // mv.itemsize, dtype, mv)


def scratch(count, dtype):
    """A zeroed, aligned buffer of `count` elements, as a Buf owning itself."""
    mem = (ctypes.c_char * max(1, count * SIZES[dtype]))()
    return Buf(ctypes.addressof(mem), count, dtype, mem)


def copy(dst, dst_at, src, src_at, count):
    """Copies `count` elements between two Bufs of one dtype, at element offsets."""
    size = SIZES[dst.dtype]
    ctypes.memmove(dst.addr + dst_at * size, src.addr + src_at * size, count * size)


class Keep:
    """The completion callback of an asynchronous call: holds the objects the operation uses
    until it is over, then runs `then` (if any) with the GIL."""

    __slots__ = ("objs", "then")

    def __init__(self, *objs, then=None):
        self.objs = objs
        self.then = then

    def __call__(self):
        then, self.objs, self.then = self.then, None, None
        if then is not None:
            then()
