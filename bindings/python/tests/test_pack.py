# SPDX-License-Identifier: Apache-2.0
"""Cache.pack / Cache.unpack and the format signature (ABI 1.4) on the CPU
backend, standard library only.

A sequence written into one cache is packed layer by layer, unpacked into a
cache of another size at the blocks that cache's own sequence got, and
packed again there: the bytes come back the same, and both caches decode it
to the same bits. A cache of another format refuses the buffer through its
signature, naming the field. Inputs are fresh random numbers (seed in the
failure message; KVPAGE_TEST_SEED replays it).
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
from kvpage import _lib  # noqa: E402
import pyref  # noqa: E402

HKV, HQ, HD, BS, LAYERS = 2, 4, 64, 8, 3


def make_cache(num_blocks, k_dtype="int8", v_dtype="int4"):
    return kvpage.Cache(num_blocks=num_blocks, num_kv_heads=HKV, head_size=HD, block_size=BS,
                        num_layers=LAYERS, k_dtype=k_dtype, v_dtype=v_dtype)


class PackTest(unittest.TestCase):
    def setUp(self):
        self.r = pyref.rng(self)
        self.msg = "seed=%d" % self._seed
        self.src = make_cache(16)
        self.dst = make_cache(24)
        self.addCleanup(self.src.close)
        self.addCleanup(self.dst.close)
        self.length = 3 * BS + 5
        seq = self.src.create_sequence()
        slots = seq.append(self.length)
        n = self.length * HKV * HD
        for layer in range(LAYERS):
            self.src.write(layer, array.array("f", pyref.gaussians(self.r, n, 2.0)),
                           array.array("f", pyref.gaussians(self.r, n)), slots)
        self.width = 4
        self.src_table, _ = self.src.export_block_table([seq], self.width)
        # The receiver holds another sequence first: its block ids differ.
        self.dst.create_sequence().append(2 * BS)
        moved = self.dst.create_sequence()
        moved.append(self.length)
        self.dst_table, _ = self.dst.export_block_table([moved], self.width)

    def test_round_trip_layer_by_layer(self):
        src_ids, dst_ids = list(self.src_table), list(self.dst_table)
        self.assertNotEqual(src_ids, dst_ids)
        layer_bytes = self.src.pack_size(len(src_ids), 1)
        self.assertEqual(self.src.pack_size(len(src_ids)), LAYERS * layer_bytes)
        whole = self.src.pack(src_ids, signature=self.dst.format_signature())
        self.assertEqual(len(whole), LAYERS * layer_bytes)
        for layer in range(LAYERS):
            part = self.src.pack(src_ids, first_layer=layer, num_layers=1)
            whole_part = whole[layer * layer_bytes:(layer + 1) * layer_bytes]
            self.assertEqual(bytes(part), bytes(whole_part), self.msg)
            self.dst.unpack(dst_ids, part, first_layer=layer, num_layers=1,
                            signature=self.src.format_signature())
        again = self.dst.pack(dst_ids)
        self.assertEqual(bytes(again), bytes(whole), self.msg)
        # Into a caller's buffer (a 16-byte aligned memoryview from a first pack).
        buf = self.dst.pack(dst_ids)
        self.assertIs(self.src.pack(src_ids[:2], buf, num_layers=1), buf)
        two = self.src.pack(src_ids[:2], num_layers=1)
        self.assertEqual(bytes(buf[:len(two)]), bytes(two), self.msg)

        q = array.array("f", pyref.gaussians(self.r, HQ * HD))
        for layer in range(LAYERS):
            outs = []
            for cache, table in ((self.src, self.src_table), (self.dst, self.dst_table)):
                with cache.decoder(HQ, 1, self.width * BS, q_dtype="fp32",
                                   out_dtype="fp32") as dec:
                    outs.append(dec.decode(q, table, [self.length], layer=layer,
                                           block_table_width=self.width).tobytes())
            self.assertEqual(outs[0], outs[1], "%s: layer %d" % (self.msg, layer))

    def test_signatures(self):
        sig = self.src.format_signature()
        self.assertEqual(len(sig), kvpage.FORMAT_SIGNATURE_BYTES)
        self.assertEqual(sig[:4], b"KVPS")
        self.assertEqual(sig, self.dst.format_signature())  # the pool size is not in it
        self.dst.check_signature(sig)
        with make_cache(16, k_dtype="fp8") as other:
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                self.dst.check_signature(other.format_signature())
            self.assertIn("k_dtype is FP8 (3) in the signature, INT8 (4) in this cache",
                          cm.exception.message)
            buf = self.src.pack(list(self.src_table))
            before = self.dst.pack(list(self.dst_table))
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                self.dst.unpack(list(self.dst_table), buf, signature=other.format_signature())
            self.assertIn("k_dtype", cm.exception.message)
            self.assertEqual(bytes(self.dst.pack(list(self.dst_table))), bytes(before))
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.dst.check_signature(sig[:10])
        self.assertIn("signature_bytes = 10", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError):
            self.dst.unpack([0], self.src.pack([0]), signature=sig[:10])

    def test_bad_arguments(self):
        buf = self.src.pack([0, 1])
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.dst.unpack([3, 3], buf)
        self.assertIn("block_ids[1] = 3", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.src.pack([0, 16])
        self.assertIn("block_ids[1] = 16", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.dst.unpack([0, 1, 2], buf)  # three blocks, a buffer of two
        self.assertIn("buffer_bytes", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.src.pack([0], first_layer=LAYERS)
        self.assertIn("first_layer", cm.exception.message)

    def test_an_older_library_is_refused(self):
        lib = kvpage.library()
        size = _lib.Api.attend.offset + _lib.Api.attend.size  # an ABI 1.3 table
        head = ctypes.string_at(ctypes.addressof(lib.api), size)
        short = _lib.Api.from_buffer_copy(head + bytes(ctypes.sizeof(_lib.Api) - size))
        short.struct_size = size
        old = kvpage.Library(lib.path)
        old.api = short
        self.src._lib = old
        try:
            with self.assertRaises(kvpage.UnsupportedError) as cm:
                self.src.pack([0])
            self.assertIn("kvp_cache_pack needs ABI 1.4", cm.exception.message)
        finally:
            self.src._lib = lib


if __name__ == "__main__":
    unittest.main()
