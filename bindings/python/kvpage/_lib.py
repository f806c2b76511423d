# SPDX-License-Identifier: Apache-2.0
"""Loading libkvpage and the C ABI mirrored in ctypes.

The binding resolves one symbol, ``kvp_get_api``, and calls everything
through the function table it returns (include/kvpage/kvpage.h, "Function
table for dlopen users"). The ctypes structures below mirror the header's
structs field by field (fields appended in a later ABI minor say so);
tests/abi/check_bindings.py checks them, the table's prototypes, the enums
and FIRST_RELEASED_SIZES against the header.
"""

import ctypes
import ctypes.util
import enum
import os
import threading
from typing import Dict, List, Optional, Tuple, Type, Union

ABI_MAJOR = 1
ABI_MINOR = 4
# Bytes of a format signature (KVP_FORMAT_SIGNATURE_BYTES, Cache.format_signature).
FORMAT_SIGNATURE_BYTES = 64

# ---------------------------------------------------------------------------
# Enums (stable numbers: kvpage.h)
# ---------------------------------------------------------------------------


class DType(enum.IntEnum):
    """kvp_dtype_t: cache dtypes and input/query/output dtypes."""

    FP32 = 0
    FP16 = 1
    BF16 = 2
    FP8_E4M3 = 3
    INT8 = 4
    INT4 = 5


class DeviceKind(enum.IntEnum):
    """kvp_device_kind_t."""

    CPU = 0
    CUDA = 1


class ErrorCode(enum.IntEnum):
    """kvp_error_code_t: never renumbered, only appended."""

    OK = 0
    INVALID_ARGUMENT = 1
    OUT_OF_BLOCKS = 2
    OUT_OF_MEMORY = 3
    UNSUPPORTED = 4
    DEVICE = 5
    INTERNAL = 6


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class KvpError(Exception):
    """An error reported by kvpage (or by the binding's own argument checks).

    ``code`` is the stable kvp_error_code_t number (an ``ErrorCode`` where
    this binding knows it), ``code_name`` its name and ``message`` the
    library's message, which names the bad argument and its value.
    """

    code: Union[ErrorCode, int]
    code_name: str
    message: str

    def __init__(self, code: int, message: str) -> None:
        code = int(code)
        try:
            code = ErrorCode(code)
            name = code.name
        except ValueError:
            name = "UNKNOWN"
        self.code = code
        self.code_name = name
        self.message = message
        super().__init__("%s: %s" % (name, message))

    def __reduce__(self):
        return (error_from_code, (int(self.code), self.message))


class InvalidArgumentError(KvpError, ValueError):
    """KVP_ERR_INVALID_ARGUMENT: a NULL, out-of-range or inconsistent arg."""


class OutOfBlocksError(KvpError):
    """KVP_ERR_OUT_OF_BLOCKS: the cache has too few free blocks."""


class OutOfMemoryError(KvpError, MemoryError):
    """KVP_ERR_OUT_OF_MEMORY: a host or device allocation failed."""


class UnsupportedError(KvpError):
    """KVP_ERR_UNSUPPORTED: a valid request this build cannot serve."""


class DeviceError(KvpError, RuntimeError):
    """KVP_ERR_DEVICE: the CUDA runtime reported an error."""


class InternalError(KvpError, RuntimeError):
    """KVP_ERR_INTERNAL: a bug in kvpage."""


class LibraryError(OSError):
    """libkvpage could not be loaded, or does not provide this ABI."""


_ERROR_CLASSES: Dict[int, Type[KvpError]] = {
    ErrorCode.INVALID_ARGUMENT: InvalidArgumentError,
    ErrorCode.OUT_OF_BLOCKS: OutOfBlocksError,
    ErrorCode.OUT_OF_MEMORY: OutOfMemoryError,
    ErrorCode.UNSUPPORTED: UnsupportedError,
    ErrorCode.DEVICE: DeviceError,
    ErrorCode.INTERNAL: InternalError,
}


def error_from_code(code: int, message: str) -> KvpError:
    """The exception object for an error code (KvpError for unknown codes)."""
    return _ERROR_CLASSES.get(int(code), KvpError)(code, message)


def invalid(message: str) -> InvalidArgumentError:
    """An InvalidArgumentError raised by the binding's own checks."""
    return InvalidArgumentError(ErrorCode.INVALID_ARGUMENT, message)


# ---------------------------------------------------------------------------
# Structs (LP64)
# ---------------------------------------------------------------------------

c_error_p = ctypes.c_void_p  # kvp_error*
c_handle = ctypes.c_void_p  # kvp_cache*, kvp_decoder*

ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                            ctypes.c_size_t, ctypes.c_int32, ctypes.c_int32)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_int32, ctypes.c_int32)


class Allocator(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("user_data", ctypes.c_void_p),
        ("alloc", ALLOC_FN),
        ("free", FREE_FN),
    ]


class CacheConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("device_kind", ctypes.c_int32),
        ("device_ordinal", ctypes.c_int32),
        ("num_layers", ctypes.c_int32),
        ("num_blocks", ctypes.c_int32),
        ("block_size", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("head_size", ctypes.c_int32),
        ("k_dtype", ctypes.c_int32),
        ("v_dtype", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("key_smoothing", ctypes.POINTER(ctypes.c_float)),
        ("allocator", ctypes.POINTER(Allocator)),
        ("checked", ctypes.c_int32),  # ABI 1.1
    ]


class LayerLayout(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("k_data", ctypes.c_void_p),
        ("v_data", ctypes.c_void_p),
        ("k_scales", ctypes.c_void_p),
        ("v_scales", ctypes.c_void_p),
        ("k_block_stride", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("k_chunk_stride", ctypes.c_int64),
        ("k_x", ctypes.c_int32),
        ("k_chunks", ctypes.c_int32),
        ("v_block_stride", ctypes.c_int64),
        ("v_head_stride", ctypes.c_int64),
        ("v_channel_stride", ctypes.c_int64),
        ("k_bits", ctypes.c_int32),
        ("v_bits", ctypes.c_int32),
        ("k_scale_block_stride", ctypes.c_int64),
        ("k_scale_head_stride", ctypes.c_int64),
        ("v_scale_block_stride", ctypes.c_int64),
        ("v_scale_head_stride", ctypes.c_int64),
        ("k_scale_entry_bytes", ctypes.c_int32),
        ("v_scale_entry_bytes", ctypes.c_int32),
        ("k_data_bytes", ctypes.c_int64),
        ("v_data_bytes", ctypes.c_int64),
        ("k_scale_bytes", ctypes.c_int64),
        ("v_scale_bytes", ctypes.c_int64),
    ]


class CacheInfo(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("device_kind", ctypes.c_int32),
        ("device_ordinal", ctypes.c_int32),
        ("num_layers", ctypes.c_int32),
        ("num_blocks", ctypes.c_int32),
        ("block_size", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("head_size", ctypes.c_int32),
        ("k_dtype", ctypes.c_int32),
        ("v_dtype", ctypes.c_int32),
        ("has_key_smoothing", ctypes.c_int32),
        ("bytes_per_token_per_layer", ctypes.c_int64),
        ("total_bytes", ctypes.c_int64),
    ]


class WriteArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("layer", ctypes.c_int32),
        ("num_tokens", ctypes.c_int32),
        ("input_dtype", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("key", ctypes.c_void_p),
        ("value", ctypes.c_void_p),
        ("key_token_stride", ctypes.c_int64),
        ("value_token_stride", ctypes.c_int64),
        ("slot_mapping", ctypes.c_void_p),
    ]


class WriteStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("non_finite", ctypes.c_uint64),
        ("saturated", ctypes.c_uint64),
    ]


class DecodeConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("num_query_heads", ctypes.c_int32),
        ("max_num_seqs", ctypes.c_int32),
        ("max_context_len", ctypes.c_int32),
        ("max_query_len", ctypes.c_int32),
        ("q_dtype", ctypes.c_int32),
        ("out_dtype", ctypes.c_int32),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
        ("precise", ctypes.c_int32),  # ABI 1.2
        ("max_query_tokens", ctypes.c_int32),  # ABI 1.3
    ]


class DecodeArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("layer", ctypes.c_int32),
        ("num_seqs", ctypes.c_int32),
        ("query_len", ctypes.c_int32),
        ("sliding_window", ctypes.c_int32),
        ("sm_scale", ctypes.c_float),
        ("logits_soft_cap", ctypes.c_float),
        ("q", ctypes.c_void_p),
        ("q_token_stride", ctypes.c_int64),
        ("block_table", ctypes.c_void_p),
        ("block_table_stride", ctypes.c_int64),
        ("block_table_width", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("seq_lens", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("out_token_stride", ctypes.c_int64),
        ("lse", ctypes.c_void_p),
    ]


class AttendArgs(ctypes.Structure):
    """kvp_attend_args, first released in ABI 1.3."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("layer", ctypes.c_int32),
        ("num_seqs", ctypes.c_int32),
        ("sliding_window", ctypes.c_int32),
        ("sm_scale", ctypes.c_float),
        ("logits_soft_cap", ctypes.c_float),
        ("reserved0", ctypes.c_int32),
        ("query_starts", ctypes.c_void_p),
        ("q", ctypes.c_void_p),
        ("q_token_stride", ctypes.c_int64),
        ("block_table", ctypes.c_void_p),
        ("block_table_stride", ctypes.c_int64),
        ("block_table_width", ctypes.c_int32),
        ("reserved1", ctypes.c_int32),
        ("seq_lens", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("out_token_stride", ctypes.c_int64),
        ("lse", ctypes.c_void_p),
    ]


class PackArgs(ctypes.Structure):
    """kvp_pack_args, first released in ABI 1.4."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("block_ids", ctypes.c_void_p),
        ("num_blocks", ctypes.c_int32),
        ("first_layer", ctypes.c_int32),
        ("num_layers", ctypes.c_int32),
        ("reserved0", ctypes.c_int32),
        ("buffer", ctypes.c_void_p),
        ("buffer_bytes", ctypes.c_uint64),
        ("signature", ctypes.c_void_p),
    ]


def _fn(restype, *argtypes):
    return ctypes.CFUNCTYPE(restype, *argtypes)


_P = ctypes.POINTER
_i32, _i64, _u32, _vp = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_void_p


class Api(ctypes.Structure):
    """kvp_api: append-only table of function pointers (entries of later
    minors say so; a library's table may end before them, see struct_size)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("abi_major", ctypes.c_uint32),
        ("abi_minor", ctypes.c_uint32),
        ("version_string", _fn(ctypes.c_char_p)),
        ("abi_version", _fn(None, _P(_u32), _P(_u32))),
        ("build_info", _fn(ctypes.c_char_p)),
        ("error_code", _fn(_i32, c_error_p)),
        ("error_message", _fn(ctypes.c_char_p, c_error_p)),
        ("error_free", _fn(None, c_error_p)),
        ("error_code_name", _fn(ctypes.c_char_p, _i32)),
        ("device_count", _fn(c_error_p, _i32, _P(_i32))),
        ("allocator_init", _fn(None, _P(Allocator))),
        ("cache_config_init", _fn(None, _P(CacheConfig))),
        ("cache_create", _fn(c_error_p, _P(CacheConfig), _P(c_handle))),
        ("cache_destroy", _fn(None, c_handle)),
        ("layer_layout_init", _fn(None, _P(LayerLayout))),
        ("cache_get_layout", _fn(c_error_p, c_handle, _i32, _P(LayerLayout))),
        ("cache_info_init", _fn(None, _P(CacheInfo))),
        ("cache_get_info", _fn(c_error_p, c_handle, _P(CacheInfo))),
        ("seq_create", _fn(c_error_p, c_handle, _P(_i64))),
        ("seq_fork", _fn(c_error_p, c_handle, _i64, _P(_i64))),
        ("seq_append", _fn(c_error_p, c_handle, _i64, _i32, _vp, _vp)),
        ("seq_truncate", _fn(c_error_p, c_handle, _i64, _i32)),
        ("seq_free", _fn(c_error_p, c_handle, _i64)),
        ("seq_length", _fn(c_error_p, c_handle, _i64, _P(_i32))),
        ("cache_num_free_blocks", _fn(c_error_p, c_handle, _P(_i32))),
        ("cache_export_block_table",
         _fn(c_error_p, c_handle, _vp, _i32, _i32, _i64, _vp, _vp)),
        ("write_args_init", _fn(None, _P(WriteArgs))),
        ("cache_write", _fn(c_error_p, c_handle, _P(WriteArgs), _vp)),
        ("write_stats_init", _fn(None, _P(WriteStats))),
        ("cache_get_write_stats", _fn(c_error_p, c_handle, _P(WriteStats))),
        ("cache_reset_write_stats", _fn(c_error_p, c_handle)),
        ("cache_copy_blocks", _fn(c_error_p, c_handle, _vp, _i32, _vp)),
        ("cache_transfer_blocks", _fn(c_error_p, c_handle, c_handle, _vp, _i32, _vp)),
        ("decode_config_init", _fn(None, _P(DecodeConfig))),
        ("decode_workspace_size", _fn(c_error_p, c_handle, _P(DecodeConfig), _P(ctypes.c_uint64))),
        ("decoder_create", _fn(c_error_p, c_handle, _P(DecodeConfig), _P(c_handle))),
        ("decoder_destroy", _fn(None, c_handle)),
        ("decode_args_init", _fn(None, _P(DecodeArgs))),
        ("decode", _fn(c_error_p, c_handle, _P(DecodeArgs), _vp)),
        ("attend_args_init", _fn(None, _P(AttendArgs))),  # ABI 1.3
        ("attend", _fn(c_error_p, c_handle, _P(AttendArgs), _vp)),  # ABI 1.3
        ("pack_args_init", _fn(None, _P(PackArgs))),  # ABI 1.4
        ("cache_pack_size", _fn(c_error_p, c_handle, _i32, _i32, _P(ctypes.c_uint64))),  # ABI 1.4
        ("cache_pack", _fn(c_error_p, c_handle, _P(PackArgs), _vp)),  # ABI 1.4
        ("cache_unpack", _fn(c_error_p, c_handle, _P(PackArgs), _vp)),  # ABI 1.4
        ("cache_format_signature", _fn(c_error_p, c_handle, _vp, ctypes.c_size_t)),  # ABI 1.4
        ("cache_check_signature", _fn(c_error_p, c_handle, _vp, ctypes.c_size_t)),  # ABI 1.4
    ]


# First released sizes: the header's KVP_<NAME>_STRUCT_SIZE_<major>_<minor>
# of the version that first released each struct (1.0 but for AttendArgs
# and PackArgs).
FIRST_RELEASED_SIZES = {
    Allocator: 32,
    CacheConfig: 64,
    LayerLayout: 176,
    CacheInfo: 64,
    WriteArgs: 64,
    WriteStats: 24,
    DecodeConfig: 48,
    DecodeArgs: 112,
    AttendArgs: 120,
    PackArgs: 56,
    Api: 312,
}

# ---------------------------------------------------------------------------
# The loaded library
# ---------------------------------------------------------------------------


def _package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


# Written by the wheel build (setup.py) beside the bundled libkvpage.so: the
# file names of the shared libraries it bundles, dependencies first.
BUNDLE_LIST = "_bundled_libs.txt"

_lock = threading.RLock()
_preloaded: List[ctypes.CDLL] = []
_preloaded_dirs: List[str] = []


def bundled_libraries(directory: str) -> List[str]:
    """The libraries listed in ``directory``/_bundled_libs.txt, in load order
    (empty where there is no list: not a wheel's package folder)."""
    try:
        with open(os.path.join(directory, BUNDLE_LIST)) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    names = [n.strip() for n in lines]
    return [os.path.join(directory, n) for n in names if n and not n.startswith("#")]


def preload_bundled(directory: str) -> None:
    """Loads the libraries a wheel bundles beside libkvpage.so, dependencies
    first. libkvpage.so's RUNPATH ($ORIGIN) finds its direct dependencies
    there, but not theirs (RUNPATH is not inherited); the loader reuses an
    object already loaded under the soname it needs, so loading them in
    order resolves every one to the bundled file, never a system copy.
    RTLD_LOCAL: their symbols stay out of the process's global scope."""
    directory = os.path.abspath(directory)
    with _lock:
        if directory in _preloaded_dirs:
            return
        mode = getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2)
        for path in bundled_libraries(directory):
            try:
                _preloaded.append(ctypes.CDLL(path, mode=mode))
            except OSError as e:
                raise LibraryError("cannot load %s, bundled with libkvpage: %s" % (path, e))
        _preloaded_dirs.append(directory)


def candidate_paths() -> List[str]:
    """Where the library is looked for, in order.

    KVPAGE_LIBRARY (when set, it is the only candidate: a wrong path is an
    error, never a silent fallback), else a libkvpage.so[.1] in the package
    folder (a wheel puts it there, with the libraries it needs), else the
    system loader (libkvpage.so.1, then libkvpage.so).
    """
    env = os.environ.get("KVPAGE_LIBRARY")
    if env:
        return [env]
    here = _package_dir()
    local = [os.path.join(here, n) for n in ("libkvpage.so", "libkvpage.so.1")]
    local = [p for p in local if os.path.exists(p)]
    if local:
        return local[:1]
    found = ctypes.util.find_library("kvpage")
    names = ["libkvpage.so.1", "libkvpage.so"]
    if found and found not in names:
        names.insert(0, found)
    return names


class Library(object):
    """One loaded libkvpage and its function table of ABI major ``abi_major``."""

    path: str
    abi: Tuple[int, int]
    api: Api

    def __init__(self, path: Optional[str] = None, abi_major: int = ABI_MAJOR) -> None:
        paths = [path] if path else candidate_paths()
        errors = []
        self._dll = None
        for p in paths:
            try:
                if os.path.dirname(p):
                    # A library with a bundle list beside it (an installed
                    # wheel) loads the bundled libraries first.
                    preload_bundled(os.path.dirname(p))
                self._dll = ctypes.CDLL(p, mode=getattr(os, "RTLD_LOCAL", 0) | os.RTLD_NOW)
                self.path = p
                break
            except OSError as e:
                errors.append("%s: %s" % (p, e))
        if self._dll is None:
            raise LibraryError(
                "cannot load libkvpage (set KVPAGE_LIBRARY to its path); tried: "
                + "; ".join(errors))
        try:
            get_api = self._dll.kvp_get_api
        except AttributeError:
            raise LibraryError("%s does not export kvp_get_api" % self.path)
        get_api.restype = ctypes.c_void_p
        get_api.argtypes = [ctypes.c_uint32]
        addr = get_api(abi_major)
        if not addr:
            raise LibraryError("%s does not provide ABI major %d (kvp_get_api returned NULL)"
                               % (self.path, abi_major))
        table = ctypes.cast(addr, ctypes.POINTER(Api)).contents
        if table.abi_major != abi_major:
            raise LibraryError("%s: kvp_get_api(%d) returned a table of ABI major %d"
                               % (self.path, abi_major, table.abi_major))
        if table.struct_size < FIRST_RELEASED_SIZES[Api]:
            raise LibraryError(
                "%s: function table of %d bytes, smaller than ABI %d.0's (%d bytes)"
                % (self.path, table.struct_size, abi_major, FIRST_RELEASED_SIZES[Api]))
        self.api = table
        self.abi = (int(table.abi_major), int(table.abi_minor))

    def has(self, entry: str) -> bool:
        """Whether the library's table holds ``entry`` (a library of an older
        ABI minor lacks the entries appended after it)."""
        f = getattr(Api, entry)
        return f.offset + f.size <= self.api.struct_size

    def require(self, entry: str, minor: int) -> None:
        """Raises UnsupportedError unless the table holds ``entry`` (ABI 1.minor)."""
        if not self.has(entry):
            raise UnsupportedError(
                ErrorCode.UNSUPPORTED, "kvp_%s needs ABI %d.%d; %s has ABI %d.%d"
                % (entry, ABI_MAJOR, minor, self.path, self.abi[0], self.abi[1]))

    # -- errors --------------------------------------------------------------

    def check(self, err: Optional[int]) -> None:
        """Raises the error object ``err`` (a kvp_error* or None) as an exception."""
        if not err:
            return
        api = self.api
        code = api.error_code(err)
        msg = api.error_message(err)
        msg = msg.decode("utf-8", "replace") if msg else ""
        api.error_free(err)
        raise error_from_code(code, msg)

    # -- versions ------------------------------------------------------------

    def version(self) -> str:
        return self.api.version_string().decode()

    def build_info(self) -> str:
        return self.api.build_info().decode()

    def error_code_name(self, code: int) -> str:
        return self.api.error_code_name(int(code)).decode()

    def device_count(self, kind: int) -> int:
        n = ctypes.c_int32(-1)
        self.check(self.api.device_count(int(kind), ctypes.byref(n)))
        return n.value


_library: Optional[Library] = None


def library() -> Library:
    """The process-wide Library, loaded at first use (see candidate_paths)."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                _library = Library()
    return _library
