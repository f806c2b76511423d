# SPDX-License-Identifier: Apache-2.0
"""What the binding accepts as an array, and how it checks it.

An argument that names memory may be:

* a torch.Tensor (when torch is importable): pointer from ``data_ptr()``,
  dtype, shape, strides and device are checked against what the call needs;
* an object with ``__cuda_array_interface__`` (CuPy, Numba, ...): device
  memory of a CUDA cache;
* any object with the buffer protocol (array.array, bytearray, memoryview,
  numpy arrays, ...): host memory of a CPU cache; C-contiguous;
* a list or tuple of ints (or an array.array), for index arrays only (slot
  mappings, sequence lengths, block tables, block pairs): copied into a
  temporary array in the cache's memory space (through torch for a CUDA
  cache) unless it already is a host array of the right type for a CPU cache;
* ``kvpage.Ptr(address, ...)``: a raw address, passed on unchecked.

Element types are short tags: f32, f16, bf16 (16-bit patterns), i32, i64, u8.
"""

import array
import ctypes
import operator
import sys

from ._lib import DType, DeviceKind, invalid

F32, F16, BF16, I32, I64, U8 = "f32", "f16", "bf16", "i32", "i64", "u8"
_ITEMSIZE = {F32: 4, F16: 2, BF16: 2, I32: 4, I64: 8, U8: 1}
DTYPE_TAG = {DType.FP32: F32, DType.FP16: F16, DType.BF16: BF16}
TAG_DTYPE = {F32: DType.FP32, F16: DType.FP16, BF16: DType.BF16}


def torch_module():
    """torch if it is importable, else None (imported only when needed)."""
    t = sys.modules.get("torch")
    if t is not None:
        return t
    try:
        import torch  # noqa: F401
    except Exception:  # pragma: no cover - depends on the machine
        return None
    return sys.modules["torch"]


def _is_tensor(obj):
    t = sys.modules.get("torch")
    return t is not None and isinstance(obj, t.Tensor)


def _torch_tag(dtype):
    t = sys.modules["torch"]
    return {
        t.float32: F32, t.float16: F16, t.bfloat16: BF16, t.int32: I32,
        t.int64: I64, t.uint8: U8,
    }.get(dtype)


def _torch_dtype(tag):
    t = torch_module()
    return {F32: t.float32, F16: t.float16, BF16: t.bfloat16, I32: t.int32,
            I64: t.int64, U8: t.uint8}[tag]


class Ptr(object):
    """A raw address in the cache's memory space, passed to the library as is.

    Nothing about it can be checked: size, dtype and device are the
    caller's responsibility. ``dtype`` (a tag or a kvpage.DType) is used
    where a call infers a dtype from its argument; ``nbytes`` where a size is
    needed (a decoder's workspace).
    """

    def __init__(self, address, dtype=None, nbytes=None):
        self.address = int(address)
        if isinstance(dtype, DType):
            dtype = DTYPE_TAG.get(dtype)
        self.dtype = dtype
        self.nbytes = nbytes

    def __repr__(self):
        return "Ptr(0x%x, dtype=%r, nbytes=%r)" % (self.address, self.dtype, self.nbytes)


class Arg(object):
    """An adapted argument: address, element tag, shape/strides in elements."""

    __slots__ = ("ptr", "tag", "shape", "strides", "device", "keep", "checked", "obj")

    def __init__(self, ptr, tag, shape, strides, device, keep, checked=True, obj=None):
        self.ptr = ptr
        self.tag = tag
        self.shape = tuple(shape) if shape is not None else None
        self.strides = tuple(strides) if strides is not None else None
        self.device = device  # ("cpu", 0) / ("cuda", ordinal or None)
        self.keep = keep  # whatever must stay alive during the call
        self.checked = checked  # False for Ptr: nothing to check
        self.obj = obj

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n


_BUFFER_TAGS = {
    ("f", 4): F32, ("d", 8): None, ("e", 2): F16, ("i", 4): I32, ("l", 4): I32,
    ("l", 8): I64, ("q", 8): I64, ("I", 4): None, ("B", 1): U8, ("b", 1): None,
    ("c", 1): U8, ("H", 2): "raw16", ("h", 2): "raw16",
}


def _buffer_arg(obj, name, writable):
    try:
        mv = memoryview(obj)
    except TypeError:
        raise invalid("%s: unsupported type %s (expected a torch.Tensor, an object "
                      "with __cuda_array_interface__, a buffer such as array.array, "
                      "or kvpage.Ptr)" % (name, type(obj).__name__))
    if not mv.c_contiguous:
        raise invalid("%s: buffer is not C-contiguous" % name)
    fmt = mv.format.lstrip("@=<")
    tag = _BUFFER_TAGS.get((fmt, mv.itemsize))
    if tag is None:
        raise invalid("%s: buffer format %r (itemsize %d) is not one kvpage takes "
                      "(float32 'f', float16 'e', 16-bit patterns 'H', int32 'i', "
                      "int64 'q', bytes 'B')" % (name, mv.format, mv.itemsize))
    nbytes = mv.nbytes
    keep = [obj, mv]
    if nbytes == 0:
        ptr = 0
    elif mv.readonly:
        if writable:
            raise invalid("%s: buffer is read-only" % name)
        copy = bytearray(mv.tobytes())
        c = (ctypes.c_char * nbytes).from_buffer(copy)
        keep += [copy, c]
        ptr = ctypes.addressof(c)
    else:
        try:
            flat = mv.cast("B")
        except (TypeError, ValueError):  # formats memoryview cannot cast (e.g. 'e' before 3.12)
            flat = obj
        c = (ctypes.c_char * nbytes).from_buffer(flat)
        keep += [flat, c]
        ptr = ctypes.addressof(c)
    shape = mv.shape if mv.ndim > 0 else (1,)
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return Arg(ptr, tag, shape, tuple(reversed(strides)), ("cpu", 0), keep, obj=obj)


def _cai_arg(obj, name):
    cai = obj.__cuda_array_interface__
    typestr = cai["typestr"]
    tag = {"<f4": F32, "<f2": F16, "<i4": I32, "<i8": I64, "|u1": U8, "<u2": "raw16",
           "<i2": "raw16"}.get(typestr)
    if tag is None:
        raise invalid("%s: __cuda_array_interface__ typestr %r is not one kvpage takes"
                      % (name, typestr))
    shape = tuple(cai["shape"]) or (1,)
    item = 1 if tag == U8 else (2 if tag in (F16, "raw16") else (8 if tag == I64 else 4))
    if cai.get("strides") is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    else:
        if any(s % item for s in cai["strides"]):
            raise invalid("%s: strides %r are not multiples of the element size"
                          % (name, cai["strides"]))
        strides = tuple(s // item for s in cai["strides"])
    ptr, readonly = cai["data"]
    return Arg(int(ptr or 0), tag, shape, strides, ("cuda", None), [obj], obj=obj)


def _tensor_arg(t, name):
    tag = _torch_tag(t.dtype)
    if tag is None:
        raise invalid("%s: torch dtype %s is not one kvpage takes" % (name, t.dtype))
    dev = t.device
    device = ("cuda", dev.index if dev.index is not None else 0) if dev.type == "cuda" else (dev.type, 0)
    shape = tuple(t.shape) or (1,)
    strides = tuple(t.stride()) or (1,)
    return Arg(int(t.data_ptr()), tag, shape, strides, device, [t], obj=t)


def adapt(obj, name, writable=False):
    """An Arg for obj (tensor, CUDA array, buffer or Ptr); no checks yet."""
    if isinstance(obj, Arg):
        return obj
    if isinstance(obj, Ptr):
        return Arg(obj.address, obj.dtype, None, None, None, [obj], checked=False, obj=obj)
    if _is_tensor(obj):
        return _tensor_arg(obj, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _cai_arg(obj, name)
    return _buffer_arg(obj, name, writable)


def index_array(obj, name, tag, cache, writable=False):
    """An index array (int32/int64): lists/tuples are copied into the cache's
    memory space; other objects are adapted and checked for tag and device."""
    if isinstance(obj, array.array) and obj.typecode in "bBhHiIlLqQ":
        # Passed as is when it already is host int32/int64 for a CPU cache
        # (e.g. the slots Sequence.append returns); copied otherwise.
        want = {I32: 4, I64: 8}[tag]
        if (cache.device_kind == DeviceKind.CPU and obj.itemsize == want
                and obj.typecode in ("i", "l", "q")):
            a = _buffer_arg(obj, name, writable)
            return a
        obj = obj.tolist()
    if isinstance(obj, (list, tuple, range)):
        flat = _flatten_ints(obj, name)
        shape = _nested_shape(obj)
        if cache.device_kind == DeviceKind.CPU:
            arr = array.array("i" if tag == I32 else "q", flat)
            a = _buffer_arg(arr, name, writable)
            a.shape = shape
            a.strides = _dense_strides(shape)
            return a
        t = torch_module()
        if t is None:
            raise invalid("%s: a list needs torch to reach a CUDA cache; pass a tensor "
                          "in device memory" % name)
        tensor = t.tensor(flat, dtype=_torch_dtype(tag),
                          device="cuda:%d" % cache.device_ordinal).reshape(shape)
        return _tensor_arg(tensor, name)
    a = adapt(obj, name, writable)
    check_tag(a, name, (tag,))
    check_device(a, name, cache)
    return a


def _flatten_ints(obj, name):
    out = []

    def rec(x):
        if isinstance(x, (list, tuple, range)):
            for y in x:
                rec(y)
        else:
            try:
                out.append(operator.index(x))  # ints only: 7.5 is an error, not 7
            except (TypeError, ValueError):
                raise invalid("%s: %r is not an integer" % (name, x))
    rec(obj)
    return out


def _nested_shape(obj):
    shape = []
    x = obj
    while isinstance(x, (list, tuple, range)):
        shape.append(len(x))
        if len(x) == 0:
            break
        x = x[0]
    return tuple(shape) or (0,)


def _dense_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def check_tag(a, name, tags):
    """The element type must be one of tags ('raw16' matches F16 and BF16)."""
    if not a.checked:
        if a.tag is not None and a.tag not in tags:
            raise invalid("%s: Ptr dtype %s, expected %s" % (name, a.tag, "/".join(tags)))
        return
    if a.tag in tags:
        return
    if a.tag == "raw16" and (F16 in tags or BF16 in tags):
        return
    raise invalid("%s: element type %s, expected %s" % (name, a.tag, " or ".join(tags)))


def check_device(a, name, cache):
    """The memory must be in the cache's memory space."""
    if not a.checked or a.device is None:
        return
    kind, ordinal = a.device
    if cache.device_kind == DeviceKind.CPU:
        if kind != "cpu":
            raise invalid("%s is on %s:%s, but the cache is a CPU cache" % (name, kind, ordinal))
    else:
        if kind != "cuda":
            raise invalid("%s is in host memory, but the cache is on cuda:%d" %
                          (name, cache.device_ordinal))
        if ordinal is not None and ordinal != cache.device_ordinal:
            raise invalid("%s is on cuda:%d, but the cache is on cuda:%d" %
                          (name, ordinal, cache.device_ordinal))


def resolve_float(a, name, expected=None):
    """The kvp DType of a floating-point argument (F32/F16/BF16).

    ``expected`` (a DType) is what the call needs; raw 16-bit buffers take
    it, and a tensor of another dtype is an error."""
    if a.tag in TAG_DTYPE:
        d = TAG_DTYPE[a.tag]
        if expected is not None and d != expected:
            raise invalid("%s has dtype %s, expected %s" % (name, d.name, DType(expected).name))
        return d
    if a.tag == "raw16":
        if expected is None:
            raise invalid("%s: a buffer of 16-bit patterns needs an explicit dtype "
                          "(FP16 or BF16)" % name)
        if expected not in (DType.FP16, DType.BF16):
            raise invalid("%s: 16-bit buffer, expected %s" % (name, DType(expected).name))
        return DType(expected)
    if a.tag == U8 and a.checked and expected is not None and len(a.shape) == 1:
        # Raw bytes (bytes, bytearray) of an explicitly named dtype.
        size = 4 if expected == DType.FP32 else 2
        if a.shape[0] % size:
            raise invalid("%s: %d bytes is not a whole number of %s elements" %
                          (name, a.shape[0], DType(expected).name))
        a.shape, a.strides, a.tag = (a.shape[0] // size,), (1,), DTYPE_TAG[DType(expected)]
        return DType(expected)
    if a.tag is None and not a.checked:
        if expected is None:
            raise invalid("%s: kvpage.Ptr without dtype" % name)
        return DType(expected)
    if a.tag == U8:
        raise invalid("%s: raw bytes need an explicit dtype (FP32, FP16 or BF16)" % name)
    raise invalid("%s: element type %s is not FP32, FP16 or BF16" % (name, a.tag))


def token_rows(a, name, row_elems, num_rows=None):
    """Interprets a as num_rows rows of row_elems contiguous elements with one
    stride between rows (elements); returns (rows, row_stride).

    Accepted: [rows, ..., inner] with the trailing dims packed (their product
    row_elems) and the leading dims forming one uniform row stride; a flat
    buffer of rows * row_elems elements."""
    if not a.checked:
        return num_rows, 0
    shape, strides = a.shape, a.strides
    # Split the dims into leading (rows) and trailing (row_elems) by product.
    prod, k = 1, len(shape)
    while k > 0 and prod < row_elems:
        k -= 1
        prod *= shape[k]
    if prod != row_elems:
        if len(shape) == 1 and shape[0] % row_elems == 0:
            rows = shape[0] // row_elems
            if num_rows is not None and rows != num_rows:
                raise invalid("%s has %d elements, expected %d x %d" %
                              (name, shape[0], num_rows, row_elems))
            if strides[0] != 1:
                raise invalid("%s is not contiguous" % name)
            return rows, row_elems
        raise invalid("%s has shape %s; its trailing dimensions must hold %d elements "
                      "per row" % (name, list(shape), row_elems))
    # Trailing dims packed.
    expect = 1
    for d in range(len(shape) - 1, k - 1, -1):
        if shape[d] != 1 and strides[d] != expect:
            raise invalid("%s: its last dimensions (shape %s, strides %s) must be contiguous"
                          % (name, list(shape), list(strides)))
        expect *= shape[d]
    lead_shape = shape[:k]
    lead_strides = strides[:k]
    rows = 1
    for s in lead_shape:
        rows *= s
    if rows == 0:
        return 0, row_elems
    # The leading dims must collapse to one stride.
    stride = None
    acc = None
    for d in range(len(lead_shape) - 1, -1, -1):
        if lead_shape[d] == 1:
            continue
        if stride is None:
            stride, acc = lead_strides[d], lead_strides[d] * lead_shape[d]
        else:
            if lead_strides[d] != acc:
                raise invalid("%s: its leading dimensions (shape %s, strides %s) do not "
                              "form one row stride" % (name, list(shape), list(strides)))
            acc = lead_strides[d] * lead_shape[d]
    if stride is None:
        stride = row_elems
    if stride < row_elems:
        raise invalid("%s: row stride %d is smaller than a row (%d elements)" %
                      (name, stride, row_elems))
    if num_rows is not None and rows != num_rows:
        raise invalid("%s has %d rows of %d elements, expected %d" %
                      (name, rows, row_elems, num_rows))
    return rows, stride


def vector(a, name, length=None):
    """A contiguous 1-D run of elements; returns its length."""
    if not a.checked:
        return length
    n = a.numel
    if n > 1:
        # contiguous: the innermost non-1 dim stride 1, the rest packed
        expect = 1
        for s, st in zip(reversed(a.shape), reversed(a.strides)):
            if s != 1 and st != expect:
                raise invalid("%s is not contiguous" % name)
            expect *= s
    if length is not None and n != length:
        raise invalid("%s has %d elements, expected %d" % (name, n, length))
    return n


def stream_handle(stream, cache):
    """The cudaStream_t to pass: None -> torch's current stream on the cache's
    device when torch is loaded (else NULL, the default stream); an int; or
    an object with .cuda_stream (torch) or .ptr (CuPy)."""
    if cache.device_kind == DeviceKind.CPU:
        return None
    if stream is None:
        t = sys.modules.get("torch")
        if t is not None and t.cuda.is_available():
            return t.cuda.current_stream(cache.device_ordinal).cuda_stream or None
        return None
    if isinstance(stream, int):
        return stream or None
    for attr in ("cuda_stream", "ptr", "handle"):
        h = getattr(stream, attr, None)
        if isinstance(h, int):
            return h or None
    raise invalid("stream: %r is not a stream (int, torch.cuda.Stream or an object "
                  "with .ptr)" % (stream,))


def new_like(template, shape, tag, cache):
    """A new output array: a torch tensor when template is one (same device),
    else host memory (array.array('f') for FP32, array.array('H') of 16-bit
    patterns for FP16 and BF16)."""
    if _is_tensor(template):
        t = torch_module()
        return t.empty(shape, dtype=_torch_dtype(tag), device=template.device)
    n = 1
    for s in shape:
        n *= s
    if cache.device_kind != DeviceKind.CPU:
        raise invalid("out: pass an output array in device memory for a CUDA cache")
    if tag == F32:
        return array.array("f", bytes(4 * n))
    if tag in (F16, BF16):
        return array.array("H", bytes(2 * n))
    raise AssertionError(tag)
