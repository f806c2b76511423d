# SPDX-License-Identifier: Apache-2.0
"""Arrays from other libraries, on the CPU backend: objects with
__array_interface__ (numpy, or a minimal stand-in), __cuda_array_interface__
(a stand-in: its pointer reaches the device check) and __dlpack__ (capsules
built here with ctypes, both DLPack layouts, and numpy's). Each decode or
write through them must give the bits the same data gives as array.array.
"""

import array
import ctypes
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kvpage  # noqa: E402
from kvpage import _arrays as A  # noqa: E402
import pyref  # noqa: E402

try:
    import numpy as np
except Exception:  # numpy missing: the numpy tests skip
    np = None

H, HQ, D, BS = 2, 4, 64, 16

_CTYPE = {"<f4": ctypes.c_float, "<i4": ctypes.c_int32, "<i8": ctypes.c_int64,
          "<u2": ctypes.c_uint16, "<f8": ctypes.c_double}


class HostArray(object):
    """Host memory seen only through __array_interface__ (no buffer protocol)."""

    def __init__(self, values, typestr, shape, strides=None, readonly=False, nelems=None):
        n = nelems if nelems is not None else len(values)
        self.buf = (_CTYPE[typestr] * n)(*values)
        self.typestr = typestr
        self.shape = tuple(shape)
        self.strides = strides
        self.readonly = readonly

    @property
    def __array_interface__(self):
        return {"version": 3, "typestr": self.typestr, "shape": self.shape,
                "strides": self.strides, "data": (ctypes.addressof(self.buf), self.readonly)}

    def values(self):
        return list(self.buf)


class HostView(object):
    """__array_interface__ at an offset into a HostArray's memory."""

    def __init__(self, base, byte_offset, typestr, shape, strides=None, readonly=False):
        self.base, self.byte_offset = base, byte_offset
        self.typestr, self.shape, self.strides, self.readonly = typestr, shape, strides, readonly

    @property
    def __array_interface__(self):
        return {"version": 3, "typestr": self.typestr, "shape": self.shape,
                "strides": self.strides,
                "data": (ctypes.addressof(self.base.buf) + self.byte_offset, self.readonly)}


class FakeCudaArray(object):
    """A __cuda_array_interface__ naming an address nothing reads here."""

    def __init__(self, ptr, typestr, shape):
        self.__cuda_array_interface__ = {"version": 3, "typestr": typestr, "shape": shape,
                                         "strides": None, "data": (ptr, False), "stream": None}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_NAME_LEGACY, _NAME_VERSIONED = b"dltensor", b"dltensor_versioned"
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                 ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_DL_CODES = {"<f4": (2, 32), "<i4": (0, 32), "<i8": (0, 64), "<u2": (1, 16), "<f8": (2, 64)}


class DLPackArray(object):
    """A DLPack producer over host memory: a capsule without destructor (the
    memory is this object's), legacy by default, DLPack 1.0 ("versioned",
    with flags) when ``versioned``."""

    def __init__(self, values, typestr, shape, strides=None, versioned=False, flags=0,
                 device=(1, 0), nelems=None, byte_offset=0):
        n = nelems if nelems is not None else len(values)
        self.buf = (_CTYPE[typestr] * n)(*values)
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*strides) if strides else None
        code, bits = _DL_CODES[typestr]
        t = _DLTensor(ctypes.addressof(self.buf) - byte_offset, _DLDevice(*device), len(shape),
                      _DLDataType(code, bits, 1), self.shape, self.strides, byte_offset)
        if versioned:
            self.managed = _DLManagedTensorVersioned(1, 0, None, None, flags, t)
        else:
            self.managed = _DLManagedTensor(t, None, None)
        self.versioned = versioned
        self.capsules = []
        self.calls = []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        if not self.versioned and "max_version" in kw:
            raise TypeError("unexpected keyword argument 'max_version'")
        name = _NAME_VERSIONED if self.versioned else _NAME_LEGACY
        c = _capsule_new(ctypes.addressof(self.managed), name, None)
        self.capsules.append(c)
        return c

    def __dlpack_device__(self):
        return (self.managed.dl_tensor.device.device_type, self.managed.dl_tensor.device.device_id)

    def values(self):
        return list(self.buf)


def f16_exact(i):
    """Values FP16 holds exactly, so a FP16 cache stores them as they are."""
    return ((i * 37) % 29 - 14) / 16.0


class Scene(object):
    """A FP16 cache holding one sequence of 20 tokens; its decoder; the
    arrays of one decode and of one attend, as array.array."""

    def __init__(self):
        self.cache = kvpage.Cache(num_blocks=8, num_kv_heads=H, head_size=D, block_size=BS,
                                  dtype="fp16")
        self.seq = self.cache.create_sequence()
        self.n = 20
        self.slots = self.seq.append(self.n)
        self.k = array.array("f", [f16_exact(i) for i in range(self.n * H * D)])
        self.v = array.array("f", [f16_exact(i + 5) for i in range(self.n * H * D)])
        self.cache.write(0, self.k, self.v, self.slots)
        self.dec = self.cache.decoder(HQ, 2, 64, 4, q_dtype="fp32", out_dtype="fp32")
        table, lens = self.cache.export_block_table([self.seq], 2)
        self.table_flat, self.lens = list(table), lens
        self.table = [self.table_flat]  # one row of 2 blocks
        self.q = array.array("f", [f16_exact(i + 11) / 4 for i in range(3 * HQ * D)])

    def decode_ref(self):
        out = pyref.poisoned(HQ * D, kvpage.DType.FP32)
        self.dec(self.q[:HQ * D], self.table, self.lens, out=out)
        return list(out)

    def attend_ref(self):
        out = pyref.poisoned(3 * HQ * D, kvpage.DType.FP32)
        self.dec.attend(self.q, [0, 3], self.table, self.lens, out=out)
        return list(out)

    def close(self):
        self.cache.close()


def poison(n):
    return [float("nan")] * n


class ArrayInterfaceTest(unittest.TestCase):
    def setUp(self):
        self.s = Scene()

    def tearDown(self):
        self.s.close()

    def test_decode_and_attend_match_buffers(self):
        s = self.s
        q = HostArray(s.q[:HQ * D], "<f4", (1, HQ, D), readonly=True)  # inputs may be read-only
        out = HostArray(poison(HQ * D), "<f4", (1, HQ, D))
        table = HostArray(s.table_flat, "<i4", (1, 2))
        lens = HostArray(s.lens, "<i4", (1,))
        self.assertIs(s.dec(q, table, lens, out=out), out)
        self.assertEqual(out.values(), s.decode_ref())
        q3 = HostArray(s.q, "<f4", (3, HQ * D))
        out3 = HostArray(poison(3 * HQ * D), "<f4", (3, HQ, D))
        starts = HostArray([0, 3], "<i4", (2,))
        s.dec.attend(q3, starts, table, lens, out=out3)
        self.assertEqual(out3.values(), s.attend_ref())

    def test_strided_rows_and_index_arrays_write_the_same_bytes(self):
        s = self.s
        # K and V as slices of one fused [tokens, 3, H * D] array: rows strided.
        row = H * D
        fused = []
        for t in range(s.n):
            fused += [0.0] * row + list(s.k[t * row:(t + 1) * row])
            fused += list(s.v[t * row:(t + 1) * row])
        base = HostArray(fused, "<f4", (len(fused),))
        strides = (3 * row * 4, D * 4, 4)
        k = HostView(base, row * 4, "<f4", (s.n, H, D), strides, readonly=True)
        v = HostView(base, 2 * row * 4, "<f4", (s.n, H, D), strides, readonly=True)
        with kvpage.Cache(num_blocks=8, num_kv_heads=H, head_size=D, block_size=BS,
                          dtype="fp16") as c2:
            seq = c2.create_sequence()
            slots = HostArray(seq.append(s.n), "<i8", (s.n,))
            c2.write(0, k, v, slots)
            for name in ("k_data", "v_data"):
                self.assertEqual(bytes(c2.layer_buffers(0)[name]),
                                 bytes(s.cache.layer_buffers(0)[name]))

    def test_refusals(self):
        s = self.s
        q = HostArray(s.q[:HQ * D], "<f4", (1, HQ, D))
        ro = HostArray(poison(HQ * D), "<f4", (1, HQ, D), readonly=True)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            s.dec(q, s.table, s.lens, out=ro)
        self.assertIn("read-only", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            s.dec(HostArray(list(s.q[:HQ * D]), "<f8", (1, HQ, D)), s.table, s.lens)
        self.assertIn("'<f8'", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError):
            A.adapt(type("BigEndian", (), {"__array_interface__": {
                "typestr": ">f4", "shape": (4,), "data": (8, False), "version": 3}})(), "q")
        neg = HostArray(s.q[:HQ * D], "<f4", (HQ, D), strides=(-D * 4, 4))
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            A.adapt(neg, "q")
        self.assertIn("strides", cm.exception.message)


class CudaArrayInterfaceTest(unittest.TestCase):
    def test_pointer_passes_through_to_the_device_check(self):
        fake = FakeCudaArray(0xDEAD0000, "<f4", (1, HQ, D))
        a = A.adapt(fake, "q")
        self.assertEqual(a.ptr, 0xDEAD0000)
        self.assertEqual(a.device, ("cuda", None))
        self.assertEqual((a.shape, a.strides, a.tag), ((1, HQ, D), (HQ * D, D, 1), A.F32))
        s = Scene()
        try:
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                s.dec(fake, s.table, s.lens, out=array.array("f", bytes(4 * HQ * D)))
            self.assertIn("device memory", cm.exception.message)
            self.assertIn("CPU cache", cm.exception.message)
            kv = FakeCudaArray(0xDEAD0000, "<f4", (s.n, H, D))
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                s.cache.write(0, kv, kv, s.slots)
            self.assertIn("CPU cache", cm.exception.message)
            with self.assertRaises(kvpage.InvalidArgumentError):
                s.cache.copy_blocks(FakeCudaArray(0xDEAD0000, "<i4", (1, 2)))
        finally:
            s.close()
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            A.adapt(FakeCudaArray(0xDEAD0000, "<f8", (4,)), "q")
        self.assertIn("typestr", cm.exception.message)


class DLPackTest(unittest.TestCase):
    def setUp(self):
        self.s = Scene()

    def tearDown(self):
        self.s.close()

    def test_legacy_and_versioned_capsules(self):
        s = self.s
        for versioned in (False, True):
            q = DLPackArray(s.q[:HQ * D], "<f4", (1, HQ, D), versioned=versioned)
            out = DLPackArray(poison(HQ * D), "<f4", (1, HQ, D), versioned=versioned)
            table = DLPackArray(s.table_flat, "<i4", (1, 2), versioned=versioned)
            lens = DLPackArray(s.lens, "<i4", (1,), versioned=versioned)
            self.assertIs(s.dec(q, table, lens, out=out), out)
            self.assertEqual(out.values(), s.decode_ref(), "versioned=%s" % versioned)
            # max_version asked first; a legacy producer is asked again without it.
            self.assertEqual(q.calls[0], {"max_version": (1, 0)})
            self.assertEqual(q.calls[-1], {"max_version": (1, 0)} if versioned else {})
            # The capsule is borrowed, never consumed (renamed "used_dltensor").
            name = _NAME_VERSIONED if versioned else _NAME_LEGACY
            self.assertTrue(all(_capsule_is_valid(c, name) for c in q.capsules))

    def test_strides_offset_and_attend(self):
        s = self.s
        row = HQ * D
        # q rows strided (every other row of a [6, row] buffer), byte_offset used.
        vals = []
        for t in range(3):
            vals += list(s.q[t * row:(t + 1) * row]) + [7.0] * row
        q = DLPackArray(vals, "<f4", (3, HQ, D), strides=(2 * row, D, 1), byte_offset=64)
        out = DLPackArray(poison(3 * row), "<f4", (3, HQ * D))
        s.dec.attend(q, DLPackArray([0, 3], "<i4", (2,)), s.table, s.lens, out=out)
        self.assertEqual(out.values(), s.attend_ref())

    def test_refusals(self):
        s = self.s
        ro = DLPackArray(poison(HQ * D), "<f4", (1, HQ, D), versioned=True, flags=1)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            s.dec(s.q[:HQ * D], s.table, s.lens, out=ro)
        self.assertIn("read-only", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            A.adapt(DLPackArray([1.0] * 4, "<f8", (4,)), "q")
        self.assertIn("DLPack dtype", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            A.adapt(DLPackArray([1.0] * 4, "<f4", (4,), device=(10, 0)), "q")  # ROCm
        self.assertIn("device type 10", cm.exception.message)
        # CUDA memory: its address and ordinal pass through to the device check.
        cu = DLPackArray(s.q[:HQ * D], "<f4", (1, HQ, D), device=(2, 1))
        a = A.adapt(cu, "q")
        self.assertEqual(a.device, ("cuda", 1))
        self.assertEqual(a.ptr, ctypes.addressof(cu.buf))
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            s.dec(cu, s.table, s.lens)
        self.assertIn("cuda:1", cm.exception.message)
        self.assertIn("CPU cache", cm.exception.message)

        class NotACapsule(object):
            def __dlpack__(self, **kw):
                return object()
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            A.adapt(NotACapsule(), "q")
        self.assertIn("DLPack capsule", cm.exception.message)


@unittest.skipIf(np is None, "numpy is not installed")
class NumpyTest(unittest.TestCase):
    def setUp(self):
        self.s = Scene()

    def tearDown(self):
        self.s.close()

    def test_decode_attend_and_strided_write(self):
        s = self.s
        q = np.array(s.q[:HQ * D], dtype=np.float32).reshape(1, HQ, D)
        table = np.array(s.table_flat, dtype=np.int32).reshape(1, 2)
        lens = np.array(s.lens, dtype=np.int32)
        out = s.dec(q, table, lens)  # out=None: a numpy array like q
        self.assertIsInstance(out, np.ndarray)
        self.assertEqual(out.dtype, np.float32)
        self.assertEqual(out.reshape(-1).tolist(), s.decode_ref())
        q.setflags(write=False)  # read-only input: passed as is
        out2 = np.full((1, HQ * D), np.nan, dtype=np.float32)
        s.dec(q, table, lens, out=out2)
        self.assertEqual(out2.reshape(-1).tolist(), s.decode_ref())
        out3 = s.dec.attend(np.array(s.q, dtype=np.float32).reshape(3, HQ, D),
                            np.array([0, 3], dtype=np.int32), table, lens)
        self.assertEqual(out3.reshape(-1).tolist(), s.attend_ref())
        # K and V as column slices of a fused QKV array: rows strided.
        k = np.array(s.k, dtype=np.float32).reshape(s.n, H * D)
        v = np.array(s.v, dtype=np.float32).reshape(s.n, H * D)
        fused = np.concatenate([np.zeros_like(k), k, v], axis=1)
        with kvpage.Cache(num_blocks=8, num_kv_heads=H, head_size=D, block_size=BS,
                          dtype="fp16") as c2:
            seq = c2.create_sequence()
            slots = np.array(seq.append(s.n), dtype=np.int64)
            c2.write(0, fused[:, H * D:2 * H * D], fused[:, 2 * H * D:], slots)
            for name in ("k_data", "v_data"):
                self.assertEqual(bytes(c2.layer_buffers(0)[name]),
                                 bytes(s.cache.layer_buffers(0)[name]))
        with self.assertRaises(kvpage.InvalidArgumentError):
            s.dec(q, table, lens, out=np.zeros((1, HQ, D), dtype=np.float64))

    def test_numpy_through_dlpack(self):
        if not hasattr(np.ndarray, "__dlpack__"):
            self.skipTest("numpy without DLPack")
        s = self.s

        class OnlyDLPack(object):
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, **kw):
                return self.a.__dlpack__(**kw)

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        q = OnlyDLPack(np.array(s.q[:HQ * D], dtype=np.float32).reshape(1, HQ, D))
        out = np.full((1, HQ, D), np.nan, dtype=np.float32)
        s.dec(q, OnlyDLPack(np.array(s.table_flat, dtype=np.int32).reshape(1, 2)),
              OnlyDLPack(np.array(s.lens, dtype=np.int32)), out=OnlyDLPack(out))
        self.assertEqual(out.reshape(-1).tolist(), s.decode_ref())


if __name__ == "__main__":
    unittest.main()
