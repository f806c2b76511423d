# SPDX-License-Identifier: Apache-2.0
"""Pythonic objects over the C API: Cache, Sequence, Decoder."""

import array
import ctypes
import sys
import threading
import weakref
from typing import (Any, Dict, Iterable, List, Literal, NamedTuple, Optional, Protocol, Tuple,
                    Union)

from . import _arrays as A
from ._arrays import ArrayLike, DeviceLike, DTypeLike, IndexArrayLike, StreamLike
from ._lib import (AttendArgs, CacheConfig, CacheInfo, DecodeArgs, DecodeConfig, DeviceKind, DType,
                   LayerLayout, PackArgs, WriteArgs, WriteStats, Allocator, ALLOC_FN, FREE_FN,
                   FORMAT_SIGNATURE_BYTES, OutOfMemoryError, invalid, library)

# ---------------------------------------------------------------------------
# Small value types
# ---------------------------------------------------------------------------

class CacheInfoTuple(NamedTuple):
    """kvp_cache_info (dtypes and device kind as their numbers)."""

    device_kind: int
    device_ordinal: int
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    k_dtype: int
    v_dtype: int
    has_key_smoothing: int
    bytes_per_token_per_layer: int
    total_bytes: int


class WriteStatsTuple(NamedTuple):
    """kvp_write_stats: values written as non-finite, and saturated."""

    non_finite: int
    saturated: int


class LayerLayoutTuple(NamedTuple):
    """kvp_layer_layout: pointers as ints (0 for none), strides in bytes.
    One field per LayerLayout field but struct_size (a test checks it)."""

    k_data: int
    v_data: int
    k_scales: int
    v_scales: int
    k_block_stride: int
    k_head_stride: int
    k_chunk_stride: int
    k_x: int
    k_chunks: int
    v_block_stride: int
    v_head_stride: int
    v_channel_stride: int
    k_bits: int
    v_bits: int
    k_scale_block_stride: int
    k_scale_head_stride: int
    v_scale_block_stride: int
    v_scale_head_stride: int
    k_scale_entry_bytes: int
    v_scale_entry_bytes: int
    k_data_bytes: int
    v_data_bytes: int
    k_scale_bytes: int
    v_scale_bytes: int


# The names the results print under (as before: CacheInfo(...), ...).
for _cls, _name in ((CacheInfoTuple, "CacheInfo"), (WriteStatsTuple, "WriteStats"),
                    (LayerLayoutTuple, "LayerLayout")):
    _cls.__name__ = _cls.__qualname__ = _name
del _cls, _name

_DTYPE_NAMES = {
    "fp32": DType.FP32, "float32": DType.FP32, "f32": DType.FP32,
    "fp16": DType.FP16, "float16": DType.FP16, "half": DType.FP16, "f16": DType.FP16,
    "bf16": DType.BF16, "bfloat16": DType.BF16,
    "fp8": DType.FP8_E4M3, "fp8_e4m3": DType.FP8_E4M3, "float8_e4m3fn": DType.FP8_E4M3,
    "e4m3": DType.FP8_E4M3,
    "int8": DType.INT8, "i8": DType.INT8,
    "int4": DType.INT4, "i4": DType.INT4,
}


def as_dtype(d: DTypeLike, name: str = "dtype") -> DType:
    """A kvpage.DType from a DType, an int, a name ("bf16", "fp8", "int4", ...)
    or a torch dtype (float32, float16, bfloat16, float8_e4m3fn, int8)."""
    if isinstance(d, DType):
        return d
    if isinstance(d, int) and not isinstance(d, bool):
        try:
            return DType(d)
        except ValueError:
            raise invalid("%s = %d is not a kvp_dtype_t" % (name, d))
    if isinstance(d, str):
        key = d.lower().replace("torch.", "")
        if key in _DTYPE_NAMES:
            return _DTYPE_NAMES[key]
        raise invalid("%s = %r: expected one of %s" % (name, d, ", ".join(sorted(_DTYPE_NAMES))))
    t = sys.modules.get("torch")
    if t is not None and isinstance(d, t.dtype):
        return as_dtype(str(d), name)
    raise invalid("%s = %r is not a dtype" % (name, d))


def parse_device(device: DeviceLike) -> Tuple[DeviceKind, int]:
    """(DeviceKind, ordinal) from "cpu", "cuda", "cuda:N", a torch.device, a
    DeviceKind or a (kind, ordinal) pair."""
    if isinstance(device, tuple) and len(device) == 2:
        return DeviceKind(device[0]), int(device[1])
    if isinstance(device, DeviceKind):
        return device, 0
    s = str(device).lower()
    if s == "cpu":
        return DeviceKind.CPU, 0
    if s == "cuda":
        return DeviceKind.CUDA, 0
    if s.startswith("cuda:"):
        try:
            return DeviceKind.CUDA, int(s[5:])
        except ValueError:
            pass
    raise invalid("device = %r: expected 'cpu', 'cuda' or 'cuda:N'" % (device,))


def version() -> str:
    """The package version of the loaded library ("0.1.0")."""
    return library().version()


def abi_version() -> Tuple[int, int]:
    """(major, minor) ABI of the loaded library's function table."""
    return library().abi


def build_info() -> Dict[str, str]:
    """What the loaded library holds, as a dict (kvp_build_info's key=value pairs)."""
    out = {}
    for part in library().build_info().split(";"):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def device_count(kind: Union[str, DeviceKind, int] = "cuda") -> int:
    """Devices of a kind this build can use (0 CUDA devices is not an error)."""
    if isinstance(kind, str):
        kind = parse_device(kind)[0]
    return library().device_count(DeviceKind(kind))


# ---------------------------------------------------------------------------
# Handles
# ---------------------------------------------------------------------------


def _destroy_cache(api, handle, keep):
    api.cache_destroy(handle)
    del keep[:]


def _destroy_decoder(api, handle, keep):
    api.decoder_destroy(handle)
    del keep[:]


class _AllocatorBridge(object):
    """ctypes callbacks around a Python allocator (kept alive with the cache)."""

    def __init__(self, allocator):
        self.allocator = allocator
        self.error = None

        def alloc(user_data, nbytes, alignment, kind, ordinal):
            try:
                p = allocator.alloc(int(nbytes), int(alignment), int(kind), int(ordinal))
                p = int(p or 0)
                if p and p % max(int(alignment), 1):
                    raise ValueError("allocator returned 0x%x, not %d-byte aligned"
                                     % (p, alignment))
                return p or None
            except BaseException as e:  # never let an exception into C
                self.error = e
                return None

        def free(user_data, ptr, nbytes, kind, ordinal):
            try:
                allocator.free(int(ptr or 0), int(nbytes), int(kind), int(ordinal))
            except BaseException as e:
                self.error = e

        self._alloc = ALLOC_FN(alloc)
        self._free = FREE_FN(free)
        self.struct = Allocator()
        library().api.allocator_init(ctypes.byref(self.struct))
        self.struct.alloc = self._alloc
        self.struct.free = self._free


class AllocatorLike(Protocol):
    """What ``Cache(allocator=)`` takes: alloc returns an address aligned to
    ``alignment`` (0 or None: out of memory); free releases one."""

    def alloc(self, __nbytes: int, __alignment: int, __device_kind: int,
              __device_ordinal: int) -> Optional[int]: ...

    def free(self, __ptr: int, __nbytes: int, __device_kind: int,
             __device_ordinal: int) -> None: ...


class TorchAllocator(object):
    """Cache memory from torch's caching allocator (counted in torch's memory
    statistics): each allocation is a uint8 tensor kept until freed."""

    def __init__(self) -> None:
        self._blocks: Dict[int, Any] = {}
        self._lock = threading.Lock()

    def alloc(self, nbytes: int, alignment: int, device_kind: int, device_ordinal: int) -> int:
        t = A.torch_module()
        dev = "cpu" if device_kind == DeviceKind.CPU else "cuda:%d" % device_ordinal
        buf = t.empty(nbytes + alignment, dtype=t.uint8, device=dev)
        base = buf.data_ptr()
        ptr = (base + alignment - 1) // alignment * alignment
        with self._lock:
            self._blocks[ptr] = buf
        return ptr

    def free(self, ptr: int, nbytes: int, device_kind: int, device_ordinal: int) -> None:
        with self._lock:
            self._blocks.pop(ptr, None)

    def tensor(self, ptr: int) -> Any:
        """The tensor backing the allocation at ptr (None if it is not one)."""
        return self._blocks.get(ptr)


class Cache(object):
    """A paged KV cache (kvp_cache): ``num_layers`` layers sharing one block
    table, on the CPU or one CUDA device.

    Use it as a context manager or call ``close()``; a cache that is garbage
    collected is released too. Decoders created from a cache are closed with
    it (a decoder must not outlive its cache).

    ``checked=True`` turns on checked mode (kvp_cache_config.checked): CUDA
    kernels validate the block ids, lengths, slots and copy pairs they read
    from device memory, skip bad ones, and the next write/decode/copy raises
    the first as InvalidArgumentError."""

    device_kind: DeviceKind
    device_ordinal: int
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    k_dtype: DType
    v_dtype: DType

    def __init__(self, num_blocks: int, num_kv_heads: int, head_size: int = 128, *,
                 block_size: int = 16, num_layers: int = 1, dtype: Optional[DTypeLike] = None,
                 k_dtype: Optional[DTypeLike] = None, v_dtype: Optional[DTypeLike] = None,
                 device: DeviceLike = "cpu", key_smoothing: Optional[Any] = None,
                 allocator: Optional[AllocatorLike] = None, checked: bool = False) -> None:
        lib = library()
        self._lib = lib
        api = lib.api
        kind, ordinal = parse_device(device)
        cfg = CacheConfig()
        api.cache_config_init(ctypes.byref(cfg))
        cfg.device_kind = int(kind)
        cfg.device_ordinal = ordinal
        cfg.num_layers = _i32(num_layers, "num_layers")
        cfg.num_blocks = _i32(num_blocks, "num_blocks")
        cfg.block_size = _i32(block_size, "block_size")
        cfg.num_kv_heads = _i32(num_kv_heads, "num_kv_heads")
        cfg.head_size = _i32(head_size, "head_size")
        k_dtype = k_dtype if k_dtype is not None else (dtype if dtype is not None else DType.BF16)
        v_dtype = v_dtype if v_dtype is not None else (dtype if dtype is not None else DType.BF16)
        cfg.k_dtype = int(as_dtype(k_dtype, "k_dtype"))
        cfg.v_dtype = int(as_dtype(v_dtype, "v_dtype"))
        cfg.checked = 1 if checked else 0
        keep: List[Any] = []
        if key_smoothing is not None:
            vals = _floats(key_smoothing, "key_smoothing")
            want = max(num_kv_heads, 0) * max(head_size, 0)
            if len(vals) != want:
                raise invalid("key_smoothing has %d values, expected num_kv_heads * head_size = %d"
                              % (len(vals), want))
            buf = (ctypes.c_float * len(vals))(*vals)
            keep.append(buf)
            cfg.key_smoothing = ctypes.cast(buf, ctypes.POINTER(ctypes.c_float))
        bridge = None
        if allocator is not None:
            bridge = _AllocatorBridge(allocator)
            keep.append(bridge)
            cfg.allocator = ctypes.pointer(bridge.struct)
        handle = ctypes.c_void_p()
        err = api.cache_create(ctypes.byref(cfg), ctypes.byref(handle))
        if err:
            try:
                lib.check(err)
            except OutOfMemoryError as e:
                if bridge is not None and bridge.error is not None:
                    raise e from bridge.error
                raise
        self._handle = handle.value
        self._allocator = allocator
        self._bridge = bridge
        self._decoders: "weakref.WeakSet[Decoder]" = weakref.WeakSet()
        # Only the key smoothing copy is released at once; the allocator
        # bridge must live until destroy has freed the memory.
        self._finalizer = weakref.finalize(self, _destroy_cache, api, self._handle,
                                           [bridge] if bridge else [])
        info = self.info
        self.device_kind = DeviceKind(info.device_kind)
        self.device_ordinal = info.device_ordinal
        self.num_layers = info.num_layers
        self.num_blocks = info.num_blocks
        self.block_size = info.block_size
        self.num_kv_heads = info.num_kv_heads
        self.head_size = info.head_size
        self.k_dtype = DType(info.k_dtype)
        self.v_dtype = DType(info.v_dtype)

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Releases the cache (and closes its decoders); idempotent."""
        if self._handle is None:
            return
        for d in list(self._decoders):
            d.close()
        self._finalizer()
        self._handle = None
        if self._bridge is not None and self._bridge.error is not None:
            e, self._bridge.error = self._bridge.error, None
            raise RuntimeError("the cache's allocator failed to free memory") from e

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: Any) -> "Literal[False]":
        self.close()
        return False

    def _h(self):
        if self._handle is None:
            raise invalid("the cache is closed")
        return self._handle

    @property
    def handle(self) -> int:
        """The kvp_cache* as an int (for engines that call the C API too)."""
        return self._h()

    @property
    def device(self) -> str:
        return "cpu" if self.device_kind == DeviceKind.CPU else "cuda:%d" % self.device_ordinal

    def __repr__(self) -> str:
        if self.closed:
            return "<kvpage.Cache closed>"
        return ("<kvpage.Cache %s layers=%d blocks=%d block_size=%d kv_heads=%d head_size=%d "
                "k=%s v=%s>" % (self.device, self.num_layers, self.num_blocks, self.block_size,
                                self.num_kv_heads, self.head_size, self.k_dtype.name,
                                self.v_dtype.name))

    # -- geometry ------------------------------------------------------------

    @property
    def info(self) -> CacheInfoTuple:
        """kvp_cache_info as a namedtuple."""
        i = CacheInfo()
        self._lib.api.cache_info_init(ctypes.byref(i))
        self._lib.check(self._lib.api.cache_get_info(self._h(), ctypes.byref(i)))
        return CacheInfoTuple(*[getattr(i, f) for f in CacheInfoTuple._fields])

    @property
    def bytes_per_token_per_layer(self) -> int:
        return self.info.bytes_per_token_per_layer

    def layout(self, layer: int = 0) -> LayerLayoutTuple:
        """kvp_layer_layout of one layer (pointers as ints, strides in bytes)."""
        l = LayerLayout()
        self._lib.api.layer_layout_init(ctypes.byref(l))
        self._lib.check(self._lib.api.cache_get_layout(self._h(), int(layer), ctypes.byref(l)))
        return LayerLayoutTuple(*[getattr(l, f) or 0 for f in LayerLayoutTuple._fields])

    def layer_buffers(self, layer: int = 0) -> Dict[str, memoryview]:
        """Host memory of one layer of a CPU cache as memoryviews of bytes:
        {'k_data', 'v_data', 'k_scales', 'v_scales'} (scales absent for
        16-bit dtypes). Valid while the cache is open."""
        if self.device_kind != DeviceKind.CPU:
            raise invalid("layer_buffers: the cache is on %s; use layer_tensors" % self.device)
        l = self.layout(layer)
        out = {}
        for name, size in (("k_data", l.k_data_bytes), ("v_data", l.v_data_bytes),
                           ("k_scales", l.k_scale_bytes), ("v_scales", l.v_scale_bytes)):
            ptr = getattr(l, name)
            if ptr and size:
                out[name] = memoryview((ctypes.c_uint8 * size).from_address(ptr)).cast("B")
        return out

    def layer_tensors(self, layer: int = 0) -> Dict[str, Any]:
        """One layer's memory as torch uint8 tensors viewing the cache (CPU or
        CUDA, no copy): {'k_data', 'v_data', 'k_scales', 'v_scales'}. Valid
        while the cache is open."""
        t = A.torch_module()
        if t is None:
            raise invalid("layer_tensors needs torch")
        l = self.layout(layer)
        out = {}
        for name, size in (("k_data", l.k_data_bytes), ("v_data", l.v_data_bytes),
                           ("k_scales", l.k_scale_bytes), ("v_scales", l.v_scale_bytes)):
            ptr = getattr(l, name)
            if not ptr or not size:
                continue
            if self.device_kind == DeviceKind.CPU:
                buf = (ctypes.c_uint8 * size).from_address(ptr)
                out[name] = t.frombuffer(buf, dtype=t.uint8)
            else:
                out[name] = t.as_tensor(_CudaMemory(ptr, size), device=self.device)
        return out

    # -- sequences -----------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        n = ctypes.c_int32()
        self._lib.check(self._lib.api.cache_num_free_blocks(self._h(), ctypes.byref(n)))
        return n.value

    def create_sequence(self) -> "Sequence":
        """A new empty Sequence (its id is assigned by the cache, never reused)."""
        sid = ctypes.c_int64()
        self._lib.check(self._lib.api.seq_create(self._h(), ctypes.byref(sid)))
        return Sequence(self, sid.value)

    def sequence(self, seq_id: int) -> "Sequence":
        """A Sequence object for an existing id (no call is made)."""
        return Sequence(self, int(seq_id))

    def fork(self, parent: Union["Sequence", int]) -> "Sequence":
        """A new sequence sharing every block of ``parent`` (prefix sharing)."""
        sid = ctypes.c_int64()
        self._lib.check(self._lib.api.seq_fork(self._h(), _sid(parent), ctypes.byref(sid)))
        return Sequence(self, sid.value)

    def append(self, seq: Union["Sequence", int], num_tokens: int = 1, *,
               slots: Optional[ArrayLike] = None, stream: StreamLike = None) -> ArrayLike:
        """Appends tokens to a sequence; returns their slots (array('q') of
        block * block_size + offset, or ``slots`` when given: a writable
        host int64 buffer or CPU tensor of num_tokens elements)."""
        n = _i32(num_tokens, "num_tokens")
        if slots is None:
            out = array.array("q", bytes(8 * max(n, 0)))
        else:
            out = slots
        a = A.adapt(out, "slots", writable=True)
        A.check_tag(a, "slots", (A.I64,))
        if a.checked:
            if a.device[0] != "cpu":
                raise invalid("slots must be host memory")
            A.vector(a, "slots", n)
        st = A.stream_handle(stream, self)
        self._lib.check(self._lib.api.seq_append(self._h(), _sid(seq), n, a.ptr or None, st))
        return out

    def truncate(self, seq: Union["Sequence", int], length: int) -> None:
        self._lib.check(self._lib.api.seq_truncate(self._h(), _sid(seq), _i32(length, "length")))

    def free(self, seq: Union["Sequence", int]) -> None:
        self._lib.check(self._lib.api.seq_free(self._h(), _sid(seq)))

    def seq_length(self, seq: Union["Sequence", int]) -> int:
        n = ctypes.c_int32()
        self._lib.check(self._lib.api.seq_length(self._h(), _sid(seq), ctypes.byref(n)))
        return n.value

    def export_block_table(self, seqs: Iterable[Union["Sequence", int]],
                           max_blocks_per_seq: Optional[int] = None, *,
                           out: Optional[ArrayLike] = None, seq_lens: Optional[ArrayLike] = None,
                           row_stride: Optional[int] = None) -> Tuple[ArrayLike, ArrayLike]:
        """The dense block table of a batch (vLLM's layout) in host memory.

        Returns (table, seq_lens). By default table is an array('i') of
        len(seqs) * max_blocks_per_seq (row-major; entries past a sequence's
        blocks are 0) and seq_lens an array('i'); pass ``out`` / ``seq_lens``
        (int32 host buffers or CPU tensors) to fill your own, e.g.
        torch.empty((B, W), dtype=torch.int32, pin_memory=True).
        max_blocks_per_seq defaults to the longest sequence's block count."""
        ids = [_sid(s) for s in seqs]
        ids_arr = (ctypes.c_int64 * max(len(ids), 1))(*ids)
        if max_blocks_per_seq is None:
            longest = max([self.seq_length(s) for s in ids] or [0])
            max_blocks_per_seq = max(1, -(-longest // self.block_size))
        w = _i32(max_blocks_per_seq, "max_blocks_per_seq")
        if out is None:
            stride = w if row_stride is None else int(row_stride)
            table = array.array("i", bytes(4 * len(ids) * max(stride, 0)))
        else:
            table = out
        t = A.adapt(table, "out", writable=True)
        A.check_tag(t, "out", (A.I32,))
        if t.checked:
            if t.device[0] != "cpu":
                raise invalid("out must be host memory (export_block_table writes on the host)")
            if len(t.shape) == 2:
                if t.strides[1] != 1 and t.shape[1] > 1:
                    raise invalid("out: rows must be contiguous")
                stride = t.strides[0] if row_stride is None else int(row_stride)
                if t.shape[0] != len(ids) or t.shape[1] < w:
                    raise invalid("out has shape %s, expected [%d, >= %d]" %
                                  (list(t.shape), len(ids), w))
            else:
                stride = w if row_stride is None else int(row_stride)
                if len(ids) and t.numel < (len(ids) - 1) * stride + w:
                    raise invalid("out has %d elements, too few for %d rows of stride %d" %
                                  (t.numel, len(ids), stride))
        else:
            stride = w if row_stride is None else int(row_stride)
        lens = array.array("i", bytes(4 * len(ids))) if seq_lens is None else seq_lens
        la = A.adapt(lens, "seq_lens", writable=True)
        A.check_tag(la, "seq_lens", (A.I32,))
        if la.checked:
            if la.device[0] != "cpu":
                raise invalid("seq_lens must be host memory")
            A.vector(la, "seq_lens", len(ids))
        self._lib.check(self._lib.api.cache_export_block_table(
            self._h(), ids_arr, len(ids), w, stride, t.ptr or None, la.ptr or None))
        return table, lens

    # -- writes ----------------------------------------------------------------

    def write(self, layer: int, key: ArrayLike, value: ArrayLike, slot_mapping: IndexArrayLike,
              *, input_dtype: Optional[DTypeLike] = None, stream: StreamLike = None) -> None:
        """Quantizes and scatters tokens into the cache (kvp_cache_write).

        key, value: [num_tokens, num_kv_heads, head_size] or [num_tokens,
        num_kv_heads * head_size] (FP32, FP16 or BF16; rows may be strided,
        e.g. a slice of a fused QKV tensor); plain buffers are flat.
        slot_mapping: int64 [num_tokens] in the cache's memory space (-1
        skips a token; a list is copied there). CUDA: runs on ``stream``
        (default: torch's current stream)."""
        h = self._h()
        slots = A.index_array(slot_mapping, "slot_mapping", A.I64, self)
        n = A.vector(slots, "slot_mapping")
        row = self.num_kv_heads * self.head_size
        k = A.adapt(key, "key")
        v = A.adapt(value, "value")
        want = as_dtype(input_dtype, "input_dtype") if input_dtype is not None else None
        kd = A.resolve_float(k, "key", want)
        vd = A.resolve_float(v, "value", kd)
        if n is None:
            raise invalid("slot_mapping: a Ptr needs a tensor or buffer key to count tokens")
        A.check_device(k, "key", self)
        A.check_device(v, "value", self)
        _, ks = A.token_rows(k, "key", row, n)
        _, vs = A.token_rows(v, "value", row, n)
        w = WriteArgs()
        self._lib.api.write_args_init(ctypes.byref(w))
        w.layer = _i32(layer, "layer")
        w.num_tokens = _i32(n, "num_tokens")
        w.input_dtype = int(vd)
        w.key = k.ptr or None
        w.value = v.ptr or None
        w.key_token_stride = ks if ks != row else 0
        w.value_token_stride = vs if vs != row else 0
        w.slot_mapping = slots.ptr or None
        st = A.stream_handle(stream, self)
        self._lib.check(self._lib.api.cache_write(h, ctypes.byref(w), st))

    def write_stats(self) -> WriteStatsTuple:
        """(non_finite, saturated) counted by the writes since creation or the
        last reset (reading synchronizes with the cache's device)."""
        s = WriteStats()
        self._lib.api.write_stats_init(ctypes.byref(s))
        self._lib.check(self._lib.api.cache_get_write_stats(self._h(), ctypes.byref(s)))
        return WriteStatsTuple(s.non_finite, s.saturated)

    def reset_write_stats(self) -> None:
        self._lib.check(self._lib.api.cache_reset_write_stats(self._h()))

    # -- block copies --------------------------------------------------------

    def copy_blocks(self, pairs: IndexArrayLike, *, stream: StreamLike = None) -> None:
        """Copies block pairs[i][0] to pairs[i][1] in every layer, data and
        scales (int32 [n, 2] in the cache's memory space, or a list)."""
        p = A.index_array(pairs, "pairs", A.I32, self)
        n = A.vector(p, "pairs")
        if n % 2:
            raise invalid("pairs has %d elements, expected an even number" % n)
        st = A.stream_handle(stream, self)
        self._lib.check(self._lib.api.cache_copy_blocks(self._h(), p.ptr or None, n // 2, st))

    def transfer_blocks(self, src: "Cache", pairs: IndexArrayLike, *,
                        stream: StreamLike = None) -> None:
        """Copies block pairs[i][0] of cache ``src`` to block pairs[i][1] of
        this cache (same geometry; e.g. GPU cache <-> CPU swap space).
        ``pairs`` is host memory (a list, or an int32 host buffer/tensor)."""
        if not isinstance(src, Cache):
            raise invalid("src must be a kvpage.Cache")
        if isinstance(pairs, (list, tuple)):
            flat = A._flatten_ints(pairs, "pairs")
            p = A.adapt(array.array("i", flat), "pairs")
        else:
            p = A.adapt(pairs, "pairs")
            A.check_tag(p, "pairs", (A.I32,))
            if p.checked and p.device[0] != "cpu":
                raise invalid("pairs must be host memory for transfer_blocks")
        n = A.vector(p, "pairs")
        if n % 2:
            raise invalid("pairs has %d elements, expected an even number" % n)
        dev = self if self.device_kind == DeviceKind.CUDA else src
        st = A.stream_handle(stream, dev)
        self._lib.check(self._lib.api.cache_transfer_blocks(self._h(), src._h(), p.ptr or None,
                                                            n // 2, st))

    # -- moving blocks to another process: pack and unpack (ABI 1.4) ----------

    def pack_size(self, num_blocks: int, num_layers: int = 0) -> int:
        """Bytes of a packed buffer of num_blocks blocks of num_layers layers
        (0 = every layer): kvp_cache_pack_size."""
        self._lib.require("cache_pack_size", 4)
        n = ctypes.c_uint64()
        self._lib.check(self._lib.api.cache_pack_size(
            self._h(), _i32(num_blocks, "num_blocks"), _i32(num_layers, "num_layers"),
            ctypes.byref(n)))
        return n.value

    def format_signature(self) -> bytes:
        """This cache's format signature (FORMAT_SIGNATURE_BYTES bytes): what a
        peer checks before it unpacks this cache's blocks."""
        self._lib.require("cache_format_signature", 4)
        buf = (ctypes.c_uint8 * FORMAT_SIGNATURE_BYTES)()
        self._lib.check(self._lib.api.cache_format_signature(self._h(), buf,
                                                             FORMAT_SIGNATURE_BYTES))
        return bytes(buf)

    def check_signature(self, signature: bytes) -> None:
        """Raises InvalidArgumentError, naming the first field that differs,
        unless ``signature`` (a peer's format_signature()) is this cache's
        format."""
        self._lib.require("cache_check_signature", 4)
        sig = bytes(signature)
        buf = (ctypes.c_uint8 * max(len(sig), 1)).from_buffer_copy(sig or b"\0")
        self._lib.check(self._lib.api.cache_check_signature(self._h(), buf, len(sig)))

    def _pack_args(self, block_ids, buffer, first_layer, num_layers, signature, writable):
        ids = A.index_array(block_ids, "block_ids", A.I32, self)
        n = A.vector(ids, "block_ids")
        if n is None:
            raise invalid("block_ids: a Ptr needs num_blocks; pass an index array")
        b = A.adapt(buffer, "buffer", writable)
        A.check_device(b, "buffer", self)
        if b.checked:
            nbytes = A.vector(b, "buffer") * A._ITEMSIZE.get(b.tag, 2)  # raw16: 2
        else:
            nbytes = b.obj.nbytes if b.obj.nbytes is not None else self.pack_size(n, 0)
        a = PackArgs()
        self._lib.api.pack_args_init(ctypes.byref(a))
        a.block_ids = ids.ptr or None
        a.num_blocks = _i32(n, "num_blocks")
        a.first_layer = _i32(first_layer, "first_layer")
        a.num_layers = _i32(num_layers, "num_layers")
        a.buffer = b.ptr or None
        a.buffer_bytes = nbytes
        keep = [ids, b]
        if signature is not None:
            sig = bytes(signature)
            if len(sig) != FORMAT_SIGNATURE_BYTES:
                raise invalid("signature has %d bytes, expected FORMAT_SIGNATURE_BYTES = %d"
                              % (len(sig), FORMAT_SIGNATURE_BYTES))
            sbuf = (ctypes.c_uint8 * FORMAT_SIGNATURE_BYTES).from_buffer_copy(sig)
            keep.append(sbuf)
            a.signature = ctypes.addressof(sbuf)
        return a, keep

    def pack(self, block_ids: IndexArrayLike, buffer: Optional[ArrayLike] = None, *,
             first_layer: int = 0, num_layers: int = 0, signature: Optional[bytes] = None,
             stream: StreamLike = None) -> Any:
        """Copies blocks block_ids of layers first_layer .. (num_layers of
        them, 0 = through the last) into one contiguous buffer:
        kvp_cache_pack, layout in docs/FORMATS.md ("Packed blocks").

        block_ids: int32 in the cache's memory space (a list is copied
            there); they may repeat.
        buffer: writable memory in the cache's memory space, 16-byte aligned,
            of at least pack_size(len(block_ids), layers) bytes (a torch
            uint8 tensor, a numpy array, a buffer). None: a new one (a
            memoryview of bytes for a CPU cache, a torch uint8 tensor for a
            CUDA cache).
        signature: a peer's format_signature() to check first (optional).
        Returns the buffer."""
        self._lib.require("cache_pack", 4)
        h = self._h()
        ids = A.index_array(block_ids, "block_ids", A.I32, self)
        if buffer is None:
            n = A.vector(ids, "block_ids")
            if n is None:
                raise invalid("block_ids: a Ptr needs a buffer; pass an index array")
            # Bad layer arguments get a buffer of one layer and the library's message.
            layers = num_layers if num_layers != 0 else self.num_layers - first_layer
            buffer = self._new_buffer(self.pack_size(n, min(max(layers, 1), self.num_layers)))
        a, keep = self._pack_args(ids, buffer, first_layer, num_layers, signature, True)
        st = A.stream_handle(stream, self)
        self._lib.check(self._lib.api.cache_pack(h, ctypes.byref(a), st))
        del keep
        return buffer

    def unpack(self, block_ids: IndexArrayLike, buffer: ArrayLike, *, first_layer: int = 0,
               num_layers: int = 0, signature: Optional[bytes] = None,
               stream: StreamLike = None) -> None:
        """Copies a buffer packed by a cache of the same format into blocks
        block_ids (distinct) of layers first_layer .. (num_layers of them,
        0 = through the last): kvp_cache_unpack. Arguments as pack()."""
        self._lib.require("cache_unpack", 4)
        h = self._h()
        a, keep = self._pack_args(block_ids, buffer, first_layer, num_layers, signature, False)
        st = A.stream_handle(stream, self)
        self._lib.check(self._lib.api.cache_unpack(h, ctypes.byref(a), st))
        del keep

    def _new_buffer(self, nbytes: int) -> Any:
        """nbytes of 16-byte aligned memory in the cache's memory space."""
        if self.device_kind == DeviceKind.CPU:
            raw = (ctypes.c_uint8 * (nbytes + 16))()
            off = (-ctypes.addressof(raw)) % 16
            return memoryview(raw).cast("B")[off:off + nbytes]
        t = A.torch_module()
        if t is None:
            raise invalid("buffer: pass device memory for a CUDA cache (or install torch)")
        return t.empty(nbytes, dtype=t.uint8, device="cuda:%d" % self.device_ordinal)

    # -- decode ---------------------------------------------------------------

    def _decode_config(self, num_query_heads, max_num_seqs, max_context_len, max_query_len,
                       q_dtype, out_dtype, precise=False, max_query_tokens=0):
        c = DecodeConfig()
        self._lib.api.decode_config_init(ctypes.byref(c))
        c.num_query_heads = _i32(num_query_heads, "num_query_heads")
        c.max_num_seqs = _i32(max_num_seqs, "max_num_seqs")
        c.max_context_len = _i32(max_context_len, "max_context_len")
        c.max_query_len = _i32(max_query_len, "max_query_len")
        c.q_dtype = int(as_dtype(q_dtype, "q_dtype"))
        c.out_dtype = int(as_dtype(out_dtype, "out_dtype"))
        c.precise = 1 if precise else 0
        c.max_query_tokens = _i32(max_query_tokens, "max_query_tokens")
        return c

    def decode_workspace_size(self, num_query_heads: int, max_num_seqs: int,
                              max_context_len: int, max_query_len: int = 1,
                              q_dtype: DTypeLike = DType.BF16, out_dtype: DTypeLike = DType.BF16,
                              precise: bool = False, max_query_tokens: int = 0) -> int:
        """Bytes of the workspace a decoder of these capacities needs."""
        c = self._decode_config(num_query_heads, max_num_seqs, max_context_len, max_query_len,
                                q_dtype, out_dtype, precise, max_query_tokens)
        n = ctypes.c_uint64()
        self._lib.check(self._lib.api.decode_workspace_size(self._h(), ctypes.byref(c),
                                                            ctypes.byref(n)))
        return n.value

    def decoder(self, num_query_heads: int, max_num_seqs: int, max_context_len: int,
                max_query_len: int = 1, *, q_dtype: DTypeLike = DType.BF16,
                out_dtype: DTypeLike = DType.BF16, workspace: Optional[ArrayLike] = None,
                precise: bool = False, max_query_tokens: int = 0) -> "Decoder":
        """A Decoder whose capacities fix the launch shape (graph-stable).
        ``precise=True``: precise mode (kvp_decode_config.precise), see Decoder.
        ``max_query_tokens``: query tokens of one ``attend`` call, all
        sequences together (0 = max_num_seqs * max_query_len)."""
        return Decoder(self, num_query_heads, max_num_seqs, max_context_len, max_query_len,
                       q_dtype=q_dtype, out_dtype=out_dtype, workspace=workspace,
                       precise=precise, max_query_tokens=max_query_tokens)


class _CudaMemory(object):
    """__cuda_array_interface__ over raw device bytes (for torch.as_tensor)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (int(nbytes),), "typestr": "|u1", "data": (int(ptr), False),
            "version": 2, "strides": None,
        }


class Sequence(object):
    """A sequence of a cache (an id). Methods call the cache's kvp_seq_*.
    As a context manager it frees the sequence on exit."""

    __slots__ = ("cache", "id")

    cache: Cache
    id: int

    def __init__(self, cache: Cache, seq_id: int) -> None:
        self.cache = cache
        self.id = int(seq_id)

    def __int__(self) -> int:
        return self.id

    __index__ = __int__

    def __repr__(self) -> str:
        return "<kvpage.Sequence %d>" % self.id

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and other.cache is self.cache and other.id == self.id

    def __hash__(self) -> int:
        return hash((id(self.cache), self.id))

    def append(self, num_tokens: int = 1, *, slots: Optional[ArrayLike] = None,
               stream: StreamLike = None) -> ArrayLike:
        """Appends tokens; returns their slots (see Cache.append)."""
        return self.cache.append(self, num_tokens, slots=slots, stream=stream)

    def fork(self) -> "Sequence":
        return self.cache.fork(self)

    def truncate(self, length: int) -> None:
        self.cache.truncate(self, length)

    def free(self) -> None:
        self.cache.free(self)

    @property
    def length(self) -> int:
        return self.cache.seq_length(self)

    def __len__(self) -> int:
        return self.length

    def __enter__(self) -> "Sequence":
        return self

    def __exit__(self, *exc: Any) -> "Literal[False]":
        if not self.cache.closed:
            self.free()
        return False


class Decoder(object):
    """Decode attention over a cache (kvp_decoder). Call it, or ``decode()``;
    ``attend()`` runs a batch of query chunks of varying lengths (kvp_attend).

    ``precise=True`` turns on precise mode (kvp_decode_config.precise): every
    decode of the decoder computes in FP32 from end to end, queries
    included, so that the LSE is accurate to FP32 rounding (for merging
    partial results by their LSE). On CUDA it runs the CUDA-core kernel,
    slower for GQA groups and quantized caches; the CPU backend is precise
    either way."""

    cache: Cache
    num_query_heads: int
    max_num_seqs: int
    max_context_len: int
    max_query_len: int
    q_dtype: DType
    out_dtype: DType
    precise: bool
    max_query_tokens: int
    workspace: Optional[ArrayLike]

    def __init__(self, cache: Cache, num_query_heads: int, max_num_seqs: int,
                 max_context_len: int, max_query_len: int = 1, *,
                 q_dtype: DTypeLike = DType.BF16, out_dtype: DTypeLike = DType.BF16,
                 workspace: Optional[ArrayLike] = None, precise: bool = False,
                 max_query_tokens: int = 0) -> None:
        lib = cache._lib
        c = cache._decode_config(num_query_heads, max_num_seqs, max_context_len, max_query_len,
                                 q_dtype, out_dtype, precise, max_query_tokens)
        keep = []
        if workspace is not None:
            w = A.adapt(workspace, "workspace", writable=True)
            A.check_device(w, "workspace", cache)
            if w.checked:
                nbytes = w.numel * A._ITEMSIZE.get(w.tag, 2)
            else:
                nbytes = getattr(workspace, "nbytes", None)
                if nbytes is None:
                    raise invalid("workspace: a Ptr workspace needs .nbytes set")
            c.workspace = w.ptr or None
            c.workspace_bytes = int(nbytes)
            keep.append(w)
        handle = ctypes.c_void_p()
        lib.check(lib.api.decoder_create(cache._h(), ctypes.byref(c), ctypes.byref(handle)))
        self._lib = lib
        self._handle = handle.value
        self.cache = cache
        self.num_query_heads = c.num_query_heads
        self.max_num_seqs = c.max_num_seqs
        self.max_context_len = c.max_context_len
        self.max_query_len = c.max_query_len
        self.q_dtype = DType(c.q_dtype)
        self.out_dtype = DType(c.out_dtype)
        self.precise = bool(c.precise)
        # The capacity of attend(): 0 stands for max_num_seqs * max_query_len.
        self.max_query_tokens = c.max_query_tokens or c.max_num_seqs * c.max_query_len
        self.workspace = workspace
        # The finalizer holds the cache: a decoder never outlives it.
        self._finalizer = weakref.finalize(self, _destroy_decoder, lib.api, self._handle,
                                           [cache, keep])
        cache._decoders.add(self)

    def close(self) -> None:
        """Releases the decoder; idempotent."""
        if self._handle is None:
            return
        self._finalizer()
        self._handle = None

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> "Decoder":
        return self

    def __exit__(self, *exc: Any) -> "Literal[False]":
        self.close()
        return False

    def _h(self):
        if self._handle is None:
            raise invalid("the decoder is closed")
        return self._handle

    def __repr__(self) -> str:
        return ("<kvpage.Decoder q_heads=%d max_seqs=%d max_context=%d q=%s out=%s%s>"
                % (self.num_query_heads, self.max_num_seqs, self.max_context_len,
                   self.q_dtype.name, self.out_dtype.name, " closed" if self.closed else ""))

    def decode(self, q: ArrayLike, block_table: IndexArrayLike, seq_lens: IndexArrayLike, *,
               out: Optional[ArrayLike] = None, layer: int = 0, query_len: int = 1,
               num_seqs: Optional[int] = None, block_table_width: Optional[int] = None,
               sliding_window: int = 0, sm_scale: float = 0.0, logits_soft_cap: float = 0.0,
               alibi_slopes: Optional[Union[ArrayLike, List[float]]] = None,
               lse: Optional[ArrayLike] = None, stream: StreamLike = None) -> ArrayLike:
        """Decode attention (kvp_decode); returns ``out``.

        q, out: [num_seqs * query_len, num_query_heads, head_size] (or
            [num_seqs, query_len, H, D], or [tokens, H * D]; rows may be
            strided) in q_dtype / out_dtype. out=None allocates one like q.
        block_table: int32 [num_seqs, width] (rows may be padded/strided);
            a flat buffer needs block_table_width.
        seq_lens: int32 [num_seqs]; num_seqs defaults to its length.
        lse: optional float32 [num_seqs * query_len * num_query_heads].
        alibi_slopes: optional float32 [num_query_heads].
        Everything is in the cache's memory space (device memory for CUDA;
        lists are copied there). CUDA: launches on ``stream`` (default:
        torch's current stream) without synchronizing."""
        cache = self.cache
        h = self._h()
        cache._h()
        lens, num_seqs = _seq_lens(seq_lens, num_seqs, cache)
        table, width, tstride = _block_table(block_table, block_table_width, num_seqs, cache)
        tokens = num_seqs * int(query_len)
        row = self.num_query_heads * cache.head_size
        qa = A.adapt(q, "q")
        A.resolve_float(qa, "q", self.q_dtype)
        A.check_device(qa, "q", cache)
        _, qs = A.token_rows(qa, "q", row, tokens)
        if out is None:
            if not qa.checked:
                raise invalid("out is needed when q is a Ptr")
            shape = (tokens, self.num_query_heads, cache.head_size)
            out = A.new_like(q, shape, A.DTYPE_TAG[self.out_dtype], cache)
        oa = A.adapt(out, "out", writable=True)
        A.resolve_float(oa, "out", self.out_dtype)
        A.check_device(oa, "out", cache)
        _, os_ = A.token_rows(oa, "out", row, tokens)
        args = DecodeArgs()
        self._lib.api.decode_args_init(ctypes.byref(args))
        args.query_len = _i32(query_len, "query_len")
        keep = self._fill_shared(args, layer, num_seqs, sliding_window, sm_scale,
                                 logits_soft_cap, qa, qs, table, width, tstride, lens, oa, os_,
                                 alibi_slopes)
        if lse is not None:
            la = self._lse(lse)
            A.vector(la, "lse", tokens * self.num_query_heads)
            args.lse = la.ptr or None
            keep.append(la)
        st = A.stream_handle(stream, cache)
        self._lib.check(self._lib.api.decode(h, ctypes.byref(args), st))
        return out

    __call__ = decode

    def attend(self, q: ArrayLike, query_starts: IndexArrayLike, block_table: IndexArrayLike,
               seq_lens: IndexArrayLike, *, out: Optional[ArrayLike] = None, layer: int = 0,
               num_seqs: Optional[int] = None, block_table_width: Optional[int] = None,
               sliding_window: int = 0, sm_scale: float = 0.0, logits_soft_cap: float = 0.0,
               alibi_slopes: Optional[Union[ArrayLike, List[float]]] = None,
               lse: Optional[ArrayLike] = None, stream: StreamLike = None) -> ArrayLike:
        """Attention over query chunks of varying lengths (kvp_attend); returns
        ``out``.

        Sequence s owns query tokens query_starts[s] .. query_starts[s+1] - 1:
        the last n_s = query_starts[s+1] - query_starts[s] tokens of its
        context of seq_lens[s] tokens (already written), each attending
        causally as decode's query token at that position does.

        q, out: [tokens, num_query_heads, head_size] (or [tokens, H * D]; rows
            may be strided) in q_dtype / out_dtype, row t for token t.
            out=None allocates one of query_starts[num_seqs] rows (of q's rows
            when query_starts is not host memory).
        query_starts: int32 [num_seqs + 1], 0 first, non-decreasing, the last
            at most the decoder's max_query_tokens.
        block_table, seq_lens, num_seqs, alibi_slopes, stream: as decode().
        lse: optional float32 [tokens * num_query_heads].
        Everything is in the cache's memory space (lists are copied there)."""
        cache = self.cache
        h = self._h()
        cache._h()
        self._lib.require("attend", 3)
        lens, num_seqs = _seq_lens(seq_lens, num_seqs, cache)
        starts = A.index_array(query_starts, "query_starts", A.I32, cache)
        n_starts = A.vector(starts, "query_starts")
        if n_starts is not None and num_seqs > 0 and n_starts < num_seqs + 1:
            raise invalid("query_starts has %d elements, needs num_seqs + 1 = %d"
                          % (n_starts, num_seqs + 1))
        # The token count, where query_starts is host memory the binding may read.
        tokens = None
        if num_seqs == 0:
            tokens = 0
        elif starts.checked and starts.device is not None and starts.device[0] == "cpu":
            tokens = ctypes.c_int32.from_address(starts.ptr + 4 * num_seqs).value
        table, width, tstride = _block_table(block_table, block_table_width, num_seqs, cache)
        row = self.num_query_heads * cache.head_size
        qa = A.adapt(q, "q")
        A.resolve_float(qa, "q", self.q_dtype)
        A.check_device(qa, "q", cache)
        q_rows, qs = A.token_rows(qa, "q", row)
        _check_rows("q", q_rows, tokens, num_seqs)
        if out is None:
            if not qa.checked:
                raise invalid("out is needed when q is a Ptr")
            n = tokens if tokens is not None else q_rows
            out = A.new_like(q, (max(n, 0), self.num_query_heads, cache.head_size),
                             A.DTYPE_TAG[self.out_dtype], cache)
        oa = A.adapt(out, "out", writable=True)
        A.resolve_float(oa, "out", self.out_dtype)
        A.check_device(oa, "out", cache)
        o_rows, os_ = A.token_rows(oa, "out", row)
        _check_rows("out", o_rows, tokens, num_seqs)
        args = AttendArgs()
        self._lib.api.attend_args_init(ctypes.byref(args))
        args.query_starts = starts.ptr or None
        keep = self._fill_shared(args, layer, num_seqs, sliding_window, sm_scale,
                                 logits_soft_cap, qa, qs, table, width, tstride, lens, oa, os_,
                                 alibi_slopes)
        keep.append(starts)
        if lse is not None:
            la = self._lse(lse)
            n_lse = A.vector(la, "lse")
            if n_lse is not None and tokens is not None and n_lse < tokens * self.num_query_heads:
                raise invalid("lse has %d elements, needs query_starts[num_seqs] * "
                              "num_query_heads = %d" % (n_lse, tokens * self.num_query_heads))
            args.lse = la.ptr or None
            keep.append(la)
        st = A.stream_handle(stream, cache)
        self._lib.check(self._lib.api.attend(h, ctypes.byref(args), st))
        return out

    def _fill_shared(self, args, layer, num_seqs, sliding_window, sm_scale, logits_soft_cap,
                     qa, qs, table, width, tstride, lens, oa, os_, alibi_slopes):
        """The fields DecodeArgs and AttendArgs share; returns the adapted
        arrays the call must keep alive."""
        row = self.num_query_heads * self.cache.head_size
        args.layer = _i32(layer, "layer")
        args.num_seqs = num_seqs
        args.sliding_window = _i32(sliding_window, "sliding_window")
        args.sm_scale = float(sm_scale)
        args.logits_soft_cap = float(logits_soft_cap)
        args.q = qa.ptr or None
        args.q_token_stride = qs if qs != row else 0
        args.block_table = table.ptr or None
        args.block_table_stride = tstride if tstride != width else 0
        args.block_table_width = _i32(width, "block_table_width")
        args.seq_lens = lens.ptr or None
        keep = [qa, oa, table, lens]
        al = self._alibi(alibi_slopes)
        if al is not None:
            args.alibi_slopes = al.ptr or None
            keep.append(al)
        args.out = oa.ptr or None
        args.out_token_stride = os_ if os_ != row else 0
        return keep

    def _lse(self, lse):
        la = A.adapt(lse, "lse", writable=True)
        A.check_tag(la, "lse", (A.F32,))
        A.check_device(la, "lse", self.cache)
        return la

    def _alibi(self, alibi_slopes):
        if alibi_slopes is None:
            return None
        if isinstance(alibi_slopes, (list, tuple)):
            alibi_slopes = _float_array(alibi_slopes, self.cache)
        al = A.adapt(alibi_slopes, "alibi_slopes")
        A.check_tag(al, "alibi_slopes", (A.F32,))
        A.check_device(al, "alibi_slopes", self.cache)
        A.vector(al, "alibi_slopes", self.num_query_heads)
        return al


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _i32(v, name):
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise invalid("%s = %r is not an integer" % (name, v))
    if isinstance(v, float) and iv != v:
        raise invalid("%s = %r is not an integer" % (name, v))
    if not -2 ** 31 <= iv < 2 ** 31:
        raise invalid("%s = %d does not fit in int32" % (name, iv))
    return iv


def _seq_lens(seq_lens, num_seqs, cache) -> Tuple[A.Arg, int]:
    """seq_lens as an int32 array, and num_seqs (default: its length)."""
    lens = A.index_array(seq_lens, "seq_lens", A.I32, cache)
    n_lens = A.vector(lens, "seq_lens")
    if num_seqs is None:
        if n_lens is None:
            raise invalid("num_seqs is needed when seq_lens is a Ptr")
        num_seqs = n_lens
    elif n_lens is not None and n_lens < num_seqs:
        raise invalid("seq_lens has %d elements, fewer than num_seqs = %d" % (n_lens, num_seqs))
    return lens, _i32(num_seqs, "num_seqs")


def _block_table(block_table, block_table_width, num_seqs, cache):
    """The block table as an int32 array, its width and its row stride."""
    table = A.index_array(block_table, "block_table", A.I32, cache)
    if table.checked:
        if len(table.shape) == 2:
            rows, width = table.shape
            if table.strides[1] != 1 and width > 1:
                raise invalid("block_table: rows must be contiguous (stride 1 along a row)")
            tstride = table.strides[0] if rows > 1 else width
            if block_table_width is not None:
                if block_table_width > width:
                    raise invalid("block_table_width = %d exceeds the table's %d columns"
                                  % (block_table_width, width))
                width = block_table_width
            if rows < num_seqs:
                raise invalid("block_table has %d rows, fewer than num_seqs = %d"
                              % (rows, num_seqs))
        else:
            if block_table_width is None:
                raise invalid("block_table is flat: pass block_table_width")
            width = int(block_table_width)
            tstride = width
            total = A.vector(table, "block_table")
            if total < num_seqs * width:
                raise invalid("block_table has %d elements, fewer than num_seqs * width = %d"
                              % (total, num_seqs * width))
    else:
        if block_table_width is None:
            raise invalid("block_table is a Ptr: pass block_table_width")
        width, tstride = int(block_table_width), 0
    return table, width, tstride


def _check_rows(name, rows, tokens, num_seqs):
    """An attend() operand must hold query_starts[num_seqs] token rows."""
    if rows is not None and tokens is not None and rows < tokens:
        raise invalid("%s has %d token rows, fewer than query_starts[%d] = %d"
                      % (name, rows, num_seqs, tokens))


def _sid(seq):
    if isinstance(seq, Sequence):
        return seq.id
    try:
        return int(seq)
    except (TypeError, ValueError):
        raise invalid("sequence %r is not a Sequence or an id" % (seq,))


def _floats(v, name):
    t = sys.modules.get("torch")
    if t is not None and isinstance(v, t.Tensor):
        return [float(x) for x in v.detach().to("cpu", t.float64).reshape(-1).tolist()]
    try:
        return [float(x) for x in _iter_flat(v)]
    except (TypeError, ValueError):
        raise invalid("%s must be a sequence of floats" % name)


def _iter_flat(v):
    if isinstance(v, (list, tuple)):
        for x in v:
            for y in _iter_flat(x):
                yield y
    elif isinstance(v, (int, float)):
        yield v
    else:
        mv = memoryview(v)
        for x in mv.cast("B").cast(mv.format) if mv.ndim != 1 else mv:
            yield x


def _float_array(vals, cache):
    vals = [float(x) for x in vals]
    if cache.device_kind == DeviceKind.CPU:
        return array.array("f", vals)
    t = A.torch_module()
    if t is None:
        raise invalid("a list needs torch to reach a CUDA cache; pass a device tensor")
    return t.tensor(vals, dtype=t.float32, device=cache.device)
