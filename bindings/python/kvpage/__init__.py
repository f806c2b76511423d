# SPDX-License-Identifier: Apache-2.0
"""kvpage: paged KV cache and decode attention, through libkvpage's C ABI.

Pure ctypes, standard library only; torch tensors are accepted where torch
is installed (``data_ptr()``, dtype and device checked, torch's current
CUDA stream used by default), and so are objects with
``__cuda_array_interface__``, ``__array_interface__`` (numpy) or
``__dlpack__``, and plain buffers (array.array, memoryview).

    import kvpage, torch
    cache = kvpage.Cache(num_blocks=1024, num_kv_heads=8, head_size=128,
                         k_dtype="int8", v_dtype="int8", device="cuda")
    seq = cache.create_sequence()
    slots = torch.tensor(seq.append(17), device="cuda")
    cache.write(0, k, v, slots)                 # k, v: [17, 8, 128] bf16 on cuda
    dec = cache.decoder(num_query_heads=32, max_num_seqs=64, max_context_len=8192)
    table, lens = cache.export_block_table([seq])
    out = dec(q, torch.tensor(table, device="cuda").view(1, -1),
              torch.tensor(lens, device="cuda"))

The library is found through KVPAGE_LIBRARY, else next to this package
(where a wheel puts it, with the shared libraries it needs), else the system
loader; its ABI is checked through kvp_get_api.
"""

from ._lib import (ABI_MAJOR, ABI_MINOR, FORMAT_SIGNATURE_BYTES, DType, DeviceKind, ErrorCode,
                   KvpError, InvalidArgumentError, OutOfBlocksError, OutOfMemoryError,
                   UnsupportedError, DeviceError, InternalError, LibraryError, Library,
                   library, error_from_code)
from ._arrays import Ptr
from ._cache import (Cache, Sequence, Decoder, TorchAllocator, as_dtype, parse_device,
                     version, abi_version, build_info, device_count)

__all__ = [
    "ABI_MAJOR", "ABI_MINOR", "FORMAT_SIGNATURE_BYTES", "DType", "DeviceKind", "ErrorCode",
    "KvpError",
    "InvalidArgumentError", "OutOfBlocksError", "OutOfMemoryError", "UnsupportedError",
    "DeviceError", "InternalError", "LibraryError", "Library", "library", "error_from_code",
    "Ptr", "Cache", "Sequence", "Decoder", "TorchAllocator", "as_dtype", "parse_device",
    "version", "abi_version", "build_info", "device_count",
]

__version__ = "0.1.0"
