# SPDX-License-Identifier: Apache-2.0
"""What the binding accepts as an array, and how it checks it.

An argument that names memory may be:

* a torch.Tensor (when torch is importable): pointer from ``data_ptr()``,
  dtype, shape, strides and device are checked against what the call needs;
* an object with ``__cuda_array_interface__`` (CuPy, Numba, ...): device
  memory of a CUDA cache;
* an object with ``__array_interface__`` (numpy, ...): host memory, strides
  checked as for a tensor;
* an object with ``__dlpack__`` (DLPack: JAX, CuPy, numpy, ...): CPU or CUDA
  memory, read from the capsule through ctypes (the capsule is borrowed for
  the call, never consumed: its producer frees it);
* any other object with the buffer protocol (array.array, bytearray,
  memoryview, ...): host memory of a CPU cache; C-contiguous;
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
from typing import Any, Optional, Tuple, Union

from ._lib import DType, DeviceKind, invalid

F32, F16, BF16, I32, I64, U8 = "f32", "f16", "bf16", "i32", "i64", "u8"
_ITEMSIZE = {F32: 4, F16: 2, BF16: 2, I32: 4, I64: 8, U8: 1}
DTYPE_TAG = {DType.FP32: F32, DType.FP16: F16, DType.BF16: BF16}
TAG_DTYPE = {F32: DType.FP32, F16: DType.FP16, BF16: DType.BF16}

# Annotation aliases of the public API. Any where torch types belong, so that
# type-checking needs no torch.
ArrayLike = Any
"""Memory: a torch.Tensor, an object with __cuda_array_interface__,
__array_interface__ or __dlpack__, a buffer (array.array, memoryview), or a Ptr."""
IndexArrayLike = Any
"""An index array: an ArrayLike of int32/int64, or a (nested) list of ints."""
DTypeLike = Union[DType, int, str, Any]
"""A kvpage.DType, its number, a name ("bf16", "int8", ...) or a torch dtype."""
DeviceLike = Union[str, DeviceKind, Tuple[int, int], Any]
""""cpu", "cuda", "cuda:N", a DeviceKind, (kind, ordinal) or a torch.device."""
StreamLike = Any
"""None (torch's current stream), a cudaStream_t as int, or an object with
.cuda_stream (torch.cuda.Stream), .ptr (CuPy) or .handle."""


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

    address: int
    dtype: Optional[str]
    nbytes: Optional[int]

    def __init__(self, address: int, dtype: Optional[Union[str, DType]] = None,
                 nbytes: Optional[int] = None) -> None:
        self.address = int(address)
        if isinstance(dtype, DType):
            dtype = DTYPE_TAG.get(dtype)
        self.dtype = dtype
        self.nbytes = nbytes

    def __repr__(self) -> str:
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
                      "with __cuda_array_interface__, __array_interface__ or __dlpack__, "
                      "a buffer such as array.array, or kvpage.Ptr)"
                      % (name, type(obj).__name__))
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


def _dense_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


# Array-interface typestrs ('<f4', '|u1', ...) kvpage takes; 16-bit integers
# are 16-bit patterns (FP16/BF16 named by the call), as for buffers.
_TYPESTR_TAGS = {"f4": F32, "f2": F16, "i4": I32, "i8": I64, "u1": U8, "u2": "raw16",
                 "i2": "raw16"}


def _typestr_tag(typestr):
    if not isinstance(typestr, str) or len(typestr) < 3:
        return None
    order = typestr[0]
    if order == ">" or (order == "=" and sys.byteorder != "little"):
        return None  # big-endian data
    if order == "|" and typestr[2:] != "1":
        return None
    return _TYPESTR_TAGS.get(typestr[1:])


def _byte_strides(strides, item, name):
    """Element strides from byte strides (non-negative multiples of item)."""
    out = []
    for s in strides:
        s = int(s)
        if s < 0 or s % item:
            raise invalid("%s: strides %r (bytes) are not non-negative multiples of the "
                          "element size %d" % (name, list(strides), item))
        out.append(s // item)
    return tuple(out)


def _interface_arg(obj, iface, name, writable, device, what):
    """An Arg from an __array_interface__ / __cuda_array_interface__ dict, or
    None where the dict names no pointer (data in the object's buffer)."""
    try:
        typestr = iface["typestr"]
        shape = tuple(int(d) for d in iface["shape"])
        data = iface.get("data")
    except (KeyError, TypeError, ValueError) as e:
        raise invalid("%s: malformed %s (%s)" % (name, what, e))
    tag = _typestr_tag(typestr)
    if tag is None:
        raise invalid("%s: %s typestr %r is not one kvpage takes (float32 '<f4', "
                      "float16 '<f2', 16-bit patterns '<u2', int32 '<i4', int64 '<i8', "
                      "bytes '|u1')" % (name, what, typestr))
    if iface.get("mask") is not None:
        raise invalid("%s: masked arrays are not supported" % name)
    if not isinstance(data, tuple) or len(data) != 2:
        return None
    ptr, readonly = data
    if writable and readonly:
        raise invalid("%s is read-only" % name)
    item = 2 if tag == "raw16" else _ITEMSIZE[tag]
    shape = shape or (1,)
    if iface.get("strides") is None:
        strides = _dense_strides(shape)
    else:
        strides = _byte_strides(iface["strides"], item, name) or (1,)
    return Arg(int(ptr or 0), tag, shape, strides, device, [obj], obj=obj)


def _cai_arg(obj, name, writable=False):
    a = _interface_arg(obj, obj.__cuda_array_interface__, name, writable, ("cuda", None),
                       "__cuda_array_interface__")
    if a is None:
        raise invalid("%s: __cuda_array_interface__ without a data pointer" % name)
    return a


def _array_interface_arg(obj, name, writable=False):
    a = _interface_arg(obj, obj.__array_interface__, name, writable, ("cpu", 0),
                       "__array_interface__")
    return a if a is not None else _buffer_arg(obj, name, writable)


# DLPack (dlpack.h): the structs of a capsule's DLManagedTensor[Versioned].


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_FLAG_READ_ONLY = 1
# (type code, bits) -> tag; codes: 0 int, 1 uint, 2 float, 4 bfloat.
_DL_TAGS = {(2, 32): F32, (2, 16): F16, (4, 16): BF16, (0, 32): I32, (0, 64): I64,
            (1, 8): U8, (0, 16): "raw16", (1, 16): "raw16"}

_capsule_api = None


def _capsule_functions():
    """PyCapsule_IsValid / PyCapsule_GetPointer as private ctypes functions
    (None where the interpreter has no C API to reach, e.g. PyPy)."""
    global _capsule_api
    if _capsule_api is None:
        try:
            api = ctypes.pythonapi
            is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
                ("PyCapsule_IsValid", api))
            get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
                ("PyCapsule_GetPointer", api))
            _capsule_api = (is_valid, get_pointer)
        except (AttributeError, OSError):
            _capsule_api = ()
    return _capsule_api or None


def _dlpack_arg(obj, name, writable=False):
    """An Arg over the DLTensor of obj.__dlpack__(): the capsule is kept alive
    for the call and left unconsumed, so its producer releases it."""
    funcs = _capsule_functions()
    if funcs is None:
        t = torch_module()
        if t is None:
            raise invalid("%s: DLPack needs CPython's C API or torch" % name)
        return _tensor_arg(t.from_dlpack(obj), name)
    is_valid, get_pointer = funcs
    try:
        try:
            capsule = obj.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer of DLPack < 1.0: no max_version
            capsule = obj.__dlpack__()
    except BufferError as e:
        raise invalid("%s: __dlpack__ failed: %s" % (name, e))
    readonly = False
    if is_valid(capsule, b"dltensor_versioned"):
        m = _DLManagedTensorVersioned.from_address(get_pointer(capsule, b"dltensor_versioned"))
        if m.version.major != 1:
            raise invalid("%s: DLPack version %d.%d is not 1.x"
                          % (name, m.version.major, m.version.minor))
        readonly = bool(m.flags & _DL_FLAG_READ_ONLY)
        t = m.dl_tensor
    elif is_valid(capsule, b"dltensor"):
        t = _DLManagedTensor.from_address(get_pointer(capsule, b"dltensor")).dl_tensor
    else:
        raise invalid("%s: __dlpack__() returned %s, not an unused DLPack capsule"
                      % (name, type(capsule).__name__))
    if writable and readonly:
        raise invalid("%s is read-only (DLPack flag)" % name)
    dtype = t.dtype
    if dtype.lanes != 1:
        raise invalid("%s: DLPack dtype with %d lanes" % (name, dtype.lanes))
    tag = _DL_TAGS.get((dtype.code, dtype.bits))
    if tag is None:
        raise invalid("%s: DLPack dtype (code %d, %d bits) is not one kvpage takes (float32, "
                      "float16, bfloat16, int32, int64, uint8, 16-bit patterns)"
                      % (name, dtype.code, dtype.bits))
    dev = t.device
    if dev.device_type in (_DL_CPU, _DL_CUDA_HOST):
        device = ("cpu", 0)
    elif dev.device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        device = ("cuda", int(dev.device_id))
    else:
        raise invalid("%s: DLPack device type %d is neither CPU nor CUDA"
                      % (name, dev.device_type))
    ndim = int(t.ndim)
    if ndim < 0 or (ndim and not t.shape):
        raise invalid("%s: malformed DLTensor (ndim %d)" % (name, ndim))
    shape = tuple(int(t.shape[i]) for i in range(ndim))
    if t.strides and ndim:
        strides = tuple(int(t.strides[i]) for i in range(ndim))
        if any(s < 0 for s in strides):
            raise invalid("%s: negative strides %r are not supported" % (name, list(strides)))
    else:
        strides = _dense_strides(shape)
    ptr = (t.data or 0) + int(t.byte_offset)
    return Arg(ptr, tag, shape or (1,), strides or (1,), device, [obj, capsule], obj=obj)


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
    """An Arg for obj (tensor, CUDA or host array interface, DLPack, buffer or
    Ptr); no checks yet. Read-only memory is refused where ``writable``."""
    if isinstance(obj, Arg):
        return obj
    if isinstance(obj, Ptr):
        return Arg(obj.address, obj.dtype, None, None, None, [obj], checked=False, obj=obj)
    if _is_tensor(obj):
        return _tensor_arg(obj, name)
    if hasattr(obj, "__cuda_array_interface__"):
        return _cai_arg(obj, name, writable)
    if hasattr(obj, "__array_interface__"):
        return _array_interface_arg(obj, name, writable)
    if hasattr(obj, "__dlpack__"):
        return _dlpack_arg(obj, name, writable)
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
            where = kind if ordinal is None else "%s:%s" % (kind, ordinal)
            raise invalid("%s is device memory (%s), but the cache is a CPU cache"
                          % (name, where))
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
    a numpy array when it is one (uint16 bit patterns for BF16), else host
    memory (array.array('f') for FP32, array.array('H') of 16-bit patterns for
    FP16 and BF16)."""
    if _is_tensor(template):
        t = torch_module()
        return t.empty(shape, dtype=_torch_dtype(tag), device=template.device)
    np = sys.modules.get("numpy")
    if np is not None and isinstance(template, np.ndarray) and cache.device_kind == DeviceKind.CPU:
        return np.empty(shape, dtype={F32: "float32", F16: "float16", BF16: "uint16"}[tag])
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
