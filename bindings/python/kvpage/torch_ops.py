# SPDX-License-Identifier: Apache-2.0
"""kvpage's cache write and attention as torch custom operators.

The operators (torch >= 2.4, ``torch.library.custom_op``) work under
``torch.compile(fullgraph=True)``, ``torch.fx`` tracing and CUDA-graph
capture; each has a fake implementation that checks dtypes, devices and
shapes without touching data::

    kvpage::cache_write(SymInt handle, SymInt layer, Tensor key, Tensor value,
                        Tensor slot_mapping, Tensor(a5!) token) -> ()
    kvpage::decode(SymInt handle, SymInt layer, Tensor q, Tensor block_table,
                   Tensor seq_lens, Tensor(a5!) out, Tensor(a6!)? lse,
                   SymInt query_len=1, SymInt sliding_window=0, float sm_scale=0.0,
                   float logits_soft_cap=0.0, Tensor? alibi_slopes=None,
                   Tensor? token=None) -> ()
    kvpage::attend(SymInt handle, SymInt layer, Tensor q, Tensor query_starts,
                   Tensor block_table, Tensor seq_lens, Tensor(a6!) out,
                   Tensor(a7!)? lse, SymInt sliding_window=0, float sm_scale=0.0,
                   float logits_soft_cap=0.0, Tensor? alibi_slopes=None,
                   Tensor? token=None) -> ()

The cache memory belongs to libkvpage, not to a tensor, so the operators
name caches and decoders by an integer handle (``register``). Each cache
has a token, a one-element tensor on its device: ``cache_write`` declares
it mutated (so no graph pass drops the write) and the attention operators
read it (so a graph orders them after the writes before them). The
operators run on torch's current CUDA stream (capture works as for any
torch op); the arguments are those of ``Cache.write``, ``Decoder.decode``
and ``Decoder.attend``. Called directly, the attention operators take
``lse`` positionally (None for none).

``write``, ``decode`` and ``attend`` below call the operators with the
handle's token (``decode`` and ``attend`` allocate ``out`` when it is
None). Register caches and decoders before compiling: the wrappers read the
registry, which dynamo guards, so registering later recompiles.

    from kvpage import torch_ops
    c = torch_ops.register(cache)             # an int
    d = torch_ops.register(cache.decoder(32, 64, 8192))

    @torch.compile(fullgraph=True)
    def step(q, k, v, slots, block_table, seq_lens):
        torch_ops.write(c, 0, k, v, slots)
        return torch_ops.decode(d, 0, q, block_table, seq_lens)

Without torch >= 2.4 the module imports, ``available`` is False and every
function raises ImportError saying why.
"""

import itertools
import re
import threading
from typing import Any, Dict, Optional, Union

from ._cache import Cache, Decoder
from ._lib import DType, invalid

MIN_TORCH = (2, 4)

torch = None
available = False
unavailable_reason = None
_import_error = None

try:
    import torch
except Exception as e:  # missing or broken
    torch = None
    unavailable_reason = "torch is not importable (%s: %s)" % (type(e).__name__, e)
    _import_error = e


def _version(text):
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


if torch is not None:
    if (_version(getattr(torch, "__version__", "")) < MIN_TORCH
            or not hasattr(getattr(torch, "library", None), "custom_op")):
        unavailable_reason = ("kvpage.torch_ops needs torch >= %d.%d (torch.library.custom_op); "
                              "found torch %s" % (MIN_TORCH + (torch.__version__,)))
    else:
        available = True

Tensor = torch.Tensor if available else Any  # for annotations

__all__ = ["available", "unavailable_reason", "register", "unregister", "lookup", "token",
           "write", "decode", "attend", "MIN_TORCH"]


def _require():
    if not available:
        err = ImportError(unavailable_reason)
        if _import_error is not None:
            raise err from _import_error
        raise err


# ---------------------------------------------------------------------------
# Handle registry: int -> Cache or Decoder
# ---------------------------------------------------------------------------

_lock = threading.Lock()
_ids = itertools.count(1)
_objects = {}    # handle -> Cache or Decoder
_by_object = {}  # id(object) -> handle
# Read by traced code (plain dicts of constants and tensors, which dynamo
# guards cheaply): handle -> the cache's token; decoder handle -> the
# geometry of its output.
_tokens: Dict[int, Any] = {}
_out_geometry: Dict[int, Any] = {}

_TORCH_DTYPES = {}
if available:
    _TORCH_DTYPES = {DType.FP32: torch.float32, DType.FP16: torch.float16,
                     DType.BF16: torch.bfloat16}


def register(obj: Union[Cache, Decoder]) -> int:
    """The int handle of a kvpage.Cache or Decoder (the same handle each time).

    Registering a decoder registers its cache too. The registry holds the
    object until ``unregister``."""
    _require()
    if not isinstance(obj, (Cache, Decoder)):
        raise TypeError("register: expected a kvpage.Cache or kvpage.Decoder, got %s"
                        % type(obj).__name__)
    if obj.closed:
        raise invalid("register: the %s is closed" % type(obj).__name__.lower())
    cache_handle = register(obj.cache) if isinstance(obj, Decoder) else None
    with _lock:
        h = _by_object.get(id(obj))
        if h is not None:
            return h
        h = next(_ids)
        if cache_handle is None:
            tok = torch.zeros(1, dtype=torch.int32, device=obj.device)
        else:
            tok = _tokens[cache_handle]
            _out_geometry[h] = (obj.num_query_heads, obj.cache.head_size,
                                _TORCH_DTYPES[obj.out_dtype])
        _objects[h] = obj
        _by_object[id(obj)] = h
        _tokens[h] = tok
        return h


def unregister(handle: Union[int, Cache, Decoder]) -> None:
    """Forgets a handle (an int, or the registered object). A cache's
    decoders keep their own handles."""
    _require()
    with _lock:
        if not isinstance(handle, int):
            handle = _by_object.get(id(handle))
        obj = _objects.pop(handle, None)
        if obj is None:
            return
        _by_object.pop(id(obj), None)
        _tokens.pop(handle, None)
        _out_geometry.pop(handle, None)


def lookup(handle: int) -> Union[Cache, Decoder]:
    """The Cache or Decoder of a handle."""
    obj = _objects.get(handle)
    if obj is None:
        raise invalid("kvpage handle %r is not registered (kvpage.torch_ops.register)"
                      % (handle,))
    return obj


def token(handle: int) -> Tensor:
    """The token of the cache of a handle: cache_write mutates it and the
    attention operators read it."""
    _require()
    lookup(handle)
    return _tokens[handle]


def _cache_of(handle):
    obj = lookup(handle)
    return obj.cache if isinstance(obj, Decoder) else obj


def _decoder_of(handle):
    obj = lookup(handle)
    if not isinstance(obj, Decoder):
        raise invalid("kvpage handle %d names a cache; attention needs a decoder's handle"
                      % handle)
    return obj


def _stream(t):
    """torch's current stream on t's device (None for host memory)."""
    if t.device.type == "cuda":
        return torch.cuda.current_stream(t.device).cuda_stream
    return None


# ---------------------------------------------------------------------------
# Fake-implementation checks: metadata only, symbolic sizes allowed
# ---------------------------------------------------------------------------


def _static(name, cond, what):
    if not cond:
        raise invalid("%s: %s" % (name, what))


def _same(name, a, b, what):
    """a == b, sizes that may be symbolic."""
    if isinstance(a, int) and isinstance(b, int):
        _static(name, a == b, "%s (%d != %d)" % (what, a, b))
    else:
        torch._check(a == b, lambda: "%s: %s" % (name, what))


def _registered(handle):
    # A symbolic handle, or one registered in another process, is not checked.
    return _objects.get(handle) if isinstance(handle, int) else None


def _check_devices(name, ref, *tensors):
    """Every tensor on the device of ref = (label, tensor)."""
    for label, t in tensors:
        if t is not None:
            _static(name, t.device == ref[1].device,
                    "%s is on %s, %s on %s" % (label, t.device, ref[0], ref[1].device))


def _check_index(name, label, t, dtype, dim=None):
    _static(name, t.dtype == dtype, "%s must be %s, got %s" % (label, dtype, t.dtype))
    if dim is not None:
        _static(name, t.dim() == dim, "%s must have %d dimensions, got %d"
                % (label, dim, t.dim()))


def _check_float(name, label, t, want=None):
    floats = (torch.float32, torch.float16, torch.bfloat16)
    _static(name, t.dtype in floats, "%s must be float32, float16 or bfloat16, got %s"
            % (label, t.dtype))
    if want is not None:
        _static(name, t.dtype == want, "%s must be %s (the decoder's), got %s"
                % (label, want, t.dtype))


def _fake_write(handle, layer, key, value, slot_mapping, token):
    name = "kvpage::cache_write"
    _check_float(name, "key", key)
    _static(name, value.dtype == key.dtype, "value is %s, key %s" % (value.dtype, key.dtype))
    _check_index(name, "slot_mapping", slot_mapping, torch.int64, 1)
    _check_devices(name, ("key", key), ("value", value), ("slot_mapping", slot_mapping),
                   ("token", token))
    obj = _registered(handle)
    if obj is not None:
        cache = obj.cache if isinstance(obj, Decoder) else obj
        row = cache.num_kv_heads * cache.head_size
        n = slot_mapping.shape[0]
        _same(name, key.numel(), n * row, "key holds slot_mapping.shape[0] rows of "
              "num_kv_heads * head_size = %d elements" % row)
        _same(name, value.numel(), n * row, "value holds slot_mapping.shape[0] rows of "
              "num_kv_heads * head_size = %d elements" % row)


def _fake_attention(name, handle, q, block_table, seq_lens, out, lse, alibi_slopes, token,
                    tokens):
    """Checks shared by decode and attend; tokens is the row count when known."""
    _check_index(name, "block_table", block_table, torch.int32, 2)
    _check_index(name, "seq_lens", seq_lens, torch.int32, 1)
    _check_devices(name, ("q", q), ("block_table", block_table), ("seq_lens", seq_lens),
                   ("out", out), ("lse", lse), ("alibi_slopes", alibi_slopes),
                   ("token", token))
    if lse is not None:
        _static(name, lse.dtype == torch.float32, "lse must be float32, got %s" % lse.dtype)
    if alibi_slopes is not None:
        _static(name, alibi_slopes.dtype == torch.float32,
                "alibi_slopes must be float32, got %s" % alibi_slopes.dtype)
    dec = _registered(handle)
    if not isinstance(dec, Decoder):
        _check_float(name, "q", q)
        _check_float(name, "out", out)
        return
    _check_float(name, "q", q, _TORCH_DTYPES.get(dec.q_dtype))
    _check_float(name, "out", out, _TORCH_DTYPES.get(dec.out_dtype))
    heads = dec.num_query_heads
    row = heads * dec.cache.head_size
    if tokens is None:  # attend: rows come from query_starts, on the device
        torch._check(q.numel() % row == 0, lambda: "%s: q holds rows of num_query_heads * "
                     "head_size = %d elements" % (name, row))
        torch._check(out.numel() % row == 0, lambda: "%s: out holds rows of "
                     "num_query_heads * head_size = %d elements" % (name, row))
        if lse is not None:
            torch._check(lse.numel() % heads == 0, lambda: "%s: lse holds num_query_heads "
                         "values per token" % name)
        return
    _same(name, q.numel(), tokens * row, "q holds num_seqs * query_len rows of "
          "num_query_heads * head_size = %d elements" % row)
    _same(name, out.numel(), tokens * row, "out holds num_seqs * query_len rows of "
          "num_query_heads * head_size = %d elements" % row)
    if lse is not None:
        _same(name, lse.numel(), tokens * heads, "lse holds num_seqs * query_len * "
              "num_query_heads values")
    if alibi_slopes is not None:
        _same(name, alibi_slopes.numel(), heads, "alibi_slopes holds num_query_heads values")


# ---------------------------------------------------------------------------
# The operators
# ---------------------------------------------------------------------------

OPS: Dict[str, Any] = {}  # name -> torch.library CustomOpDef


def _define():
    from typing import Optional

    Tensor = torch.Tensor

    def cache_write(handle: int, layer: int, key: Tensor, value: Tensor,
                    slot_mapping: Tensor, token: Tensor) -> None:
        _cache_of(handle).write(layer, key, value, slot_mapping, stream=_stream(key))

    # lse has no default (pass None): torch drops trailing default arguments
    # before its version-counter bump looks mutated arguments up by position.
    def decode(handle: int, layer: int, q: Tensor, block_table: Tensor, seq_lens: Tensor,
               out: Tensor, lse: Optional[Tensor], query_len: int = 1,
               sliding_window: int = 0, sm_scale: float = 0.0, logits_soft_cap: float = 0.0,
               alibi_slopes: Optional[Tensor] = None,
               token: Optional[Tensor] = None) -> None:
        _decoder_of(handle).decode(q, block_table, seq_lens, out=out, layer=layer,
                                   query_len=query_len, sliding_window=sliding_window,
                                   sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                                   alibi_slopes=alibi_slopes, lse=lse, stream=_stream(q))

    def attend(handle: int, layer: int, q: Tensor, query_starts: Tensor, block_table: Tensor,
               seq_lens: Tensor, out: Tensor, lse: Optional[Tensor],
               sliding_window: int = 0, sm_scale: float = 0.0, logits_soft_cap: float = 0.0,
               alibi_slopes: Optional[Tensor] = None,
               token: Optional[Tensor] = None) -> None:
        _decoder_of(handle).attend(q, query_starts, block_table, seq_lens, out=out,
                                   layer=layer, sliding_window=sliding_window,
                                   sm_scale=sm_scale, logits_soft_cap=logits_soft_cap,
                                   alibi_slopes=alibi_slopes, lse=lse, stream=_stream(q))

    def fake_decode(handle, layer, q, block_table, seq_lens, out, lse, query_len=1,
                    sliding_window=0, sm_scale=0.0, logits_soft_cap=0.0, alibi_slopes=None,
                    token=None):
        _fake_attention("kvpage::decode", handle, q, block_table, seq_lens, out, lse,
                        alibi_slopes, token, seq_lens.shape[0] * query_len)

    def fake_attend(handle, layer, q, query_starts, block_table, seq_lens, out, lse,
                    sliding_window=0, sm_scale=0.0, logits_soft_cap=0.0, alibi_slopes=None,
                    token=None):
        name = "kvpage::attend"
        _check_index(name, "query_starts", query_starts, torch.int32, 1)
        _check_devices(name, ("q", q), ("query_starts", query_starts))
        _fake_attention(name, handle, q, block_table, seq_lens, out, lse, alibi_slopes, token,
                        None)

    custom_op = torch.library.custom_op
    ops = {
        "cache_write": custom_op("kvpage::cache_write", cache_write, mutates_args=("token",)),
        "decode": custom_op("kvpage::decode", decode, mutates_args=("out", "lse")),
        "attend": custom_op("kvpage::attend", attend, mutates_args=("out", "lse")),
    }
    ops["cache_write"].register_fake(_fake_write)
    ops["decode"].register_fake(fake_decode)
    ops["attend"].register_fake(fake_attend)
    return ops


if available:
    try:
        OPS = _define()
    except Exception as e:  # surfaced on use, with the cause
        available = False
        unavailable_reason = ("kvpage.torch_ops could not register its operators with torch %s "
                              "(%s: %s)" % (torch.__version__, type(e).__name__, e))
        _import_error = e


# ---------------------------------------------------------------------------
# Thin wrappers over torch.ops.kvpage.* (traceable)
# ---------------------------------------------------------------------------


def _token_of(handle, tok):
    if tok is not None:
        return tok
    if handle not in _tokens:
        raise invalid("kvpage handle %r is not registered (kvpage.torch_ops.register)"
                      % (handle,))
    return _tokens[handle]


def write(handle: int, layer: int, key: Tensor, value: Tensor, slot_mapping: Tensor, *,
          token: Optional[Tensor] = None) -> None:
    """torch.ops.kvpage.cache_write: Cache.write of the handle's cache.
    ``token`` defaults to the cache's (``token(handle)``)."""
    _require()
    torch.ops.kvpage.cache_write.default(handle, layer, key, value, slot_mapping,
                                         _token_of(handle, token))


def decode(handle: int, layer: int, q: Tensor, block_table: Tensor, seq_lens: Tensor,
           out: Optional[Tensor] = None, lse: Optional[Tensor] = None, *, query_len: int = 1,
           sliding_window: int = 0, sm_scale: float = 0.0, logits_soft_cap: float = 0.0,
           alibi_slopes: Optional[Tensor] = None, token: Optional[Tensor] = None) -> Tensor:
    """torch.ops.kvpage.decode: Decoder.decode of a decoder's handle; returns
    ``out`` (allocated [rows of q, num_query_heads, head_size] when None).
    block_table: int32 [num_seqs, width]; seq_lens: int32 [num_seqs]."""
    _require()
    tok = _token_of(handle, token)
    if out is None:
        out = _new_out(handle, q)
    torch.ops.kvpage.decode.default(handle, layer, q, block_table, seq_lens, out, lse,
                                    query_len, sliding_window, float(sm_scale),
                                    float(logits_soft_cap), alibi_slopes, tok)
    return out


def attend(handle: int, layer: int, q: Tensor, query_starts: Tensor, block_table: Tensor,
           seq_lens: Tensor, out: Optional[Tensor] = None, lse: Optional[Tensor] = None, *,
           sliding_window: int = 0, sm_scale: float = 0.0, logits_soft_cap: float = 0.0,
           alibi_slopes: Optional[Tensor] = None, token: Optional[Tensor] = None) -> Tensor:
    """torch.ops.kvpage.attend: Decoder.attend of a decoder's handle; returns
    ``out`` (allocated with as many rows as q when None)."""
    _require()
    tok = _token_of(handle, token)
    if out is None:
        out = _new_out(handle, q)
    torch.ops.kvpage.attend.default(handle, layer, q, query_starts, block_table, seq_lens,
                                    out, lse, sliding_window, float(sm_scale),
                                    float(logits_soft_cap), alibi_slopes, tok)
    return out


def _new_out(handle, q):
    if handle not in _out_geometry:
        raise invalid("kvpage handle %r is not a registered decoder" % (handle,))
    heads, head_size, dtype = _out_geometry[handle]
    return q.new_empty((q.numel() // (heads * head_size), heads, head_size), dtype=dtype)
