# SPDX-License-Identifier: Apache-2.0
"""Decoder.attend (kvp_attend, ABI 1.3) on the CPU backend, standard library only.

A ragged batch (5, 0 and 2 query tokens at contexts 9, 4 and 2) against the
binding's own decode: row i of a sequence's chunk of n tokens must equal,
bit for bit, decode's row i with query_len = n on that sequence alone (the
CPU backend computes both in double and rounds once). Inputs are fresh
random numbers (seed in the failure message; KVPAGE_TEST_SEED replays it).
"""

import array
import ctypes
import math
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kvpage  # noqa: E402
from kvpage import _lib  # noqa: E402
import pyref  # noqa: E402

D = kvpage.DType
HKV, HQ, HD = 2, 4, 64
ROW = HQ * HD


class AttendTest(unittest.TestCase):
    CONTEXTS = [9, 4, 2]
    CHUNKS = [5, 0, 2]

    def setUp(self):
        self.r = pyref.rng(self)
        self.msg = "seed=%d" % self._seed
        self.cache = kvpage.Cache(num_blocks=8, num_kv_heads=HKV, head_size=HD, block_size=8,
                                  num_layers=2, k_dtype="fp16", v_dtype="int8")
        self.addCleanup(self.cache.close)
        seqs = [self.cache.create_sequence() for _ in self.CONTEXTS]
        slots = []
        for s, n in zip(seqs, self.CONTEXTS):
            slots.extend(s.append(n))
        n = len(slots) * HKV * HD
        for layer in range(2):
            self.cache.write(layer, array.array("f", pyref.gaussians(self.r, n)),
                             array.array("f", pyref.gaussians(self.r, n)), slots)
        self.width = 2
        self.table, self.lens = self.cache.export_block_table(seqs, self.width)
        self.starts = [0]
        for n in self.CHUNKS:
            self.starts.append(self.starts[-1] + n)
        self.tokens = self.starts[-1]

    def decoder(self, **kw):
        return self.cache.decoder(HQ, len(self.CONTEXTS), 16, max_query_len=max(self.CHUNKS),
                                  q_dtype="fp32", out_dtype="fp32", **kw)

    def check_against_decode(self, dec, **opts):
        q = array.array("f", pyref.gaussians(self.r, self.tokens * ROW))
        # Two rows past the last token: attend must leave them alone.
        out = pyref.poisoned((self.tokens + 2) * ROW, D.FP32)
        lse = array.array("f", [float("nan")] * ((self.tokens + 2) * HQ))
        res = dec.attend(q, self.starts, self.table, self.lens, out=out, lse=lse,
                         block_table_width=self.width, **opts)
        self.assertIs(res, out)
        for t in range(self.tokens, self.tokens + 2):
            self.assertTrue(all(math.isnan(x) for x in out[t * ROW:(t + 1) * ROW]), self.msg)
            self.assertTrue(all(math.isnan(x) for x in lse[t * HQ:(t + 1) * HQ]), self.msg)
        for s, n in enumerate(self.CHUNKS):
            if n == 0:
                continue
            a, b = self.starts[s], self.starts[s + 1]
            ref = pyref.poisoned(n * ROW, D.FP32)
            ref_lse = array.array("f", [float("nan")] * (n * HQ))
            dec.decode(q[a * ROW:b * ROW], self.table[s * self.width:(s + 1) * self.width],
                       [self.lens[s]], out=ref, lse=ref_lse, query_len=n,
                       block_table_width=self.width, **opts)
            what = "%s: sequence %d (%d tokens at context %d)" % (self.msg, s, n, self.lens[s])
            self.assertTrue(all(math.isfinite(x) for x in ref), what)
            self.assertEqual(out[a * ROW:b * ROW].tobytes(), ref.tobytes(), what + " out")
            self.assertEqual(lse[a * HQ:b * HQ].tobytes(), ref_lse.tobytes(), what + " lse")
        return q, out

    def test_ragged_batch_equals_decode_per_sequence(self):
        dec = self.decoder()
        self.assertEqual(dec.max_query_tokens, len(self.CONTEXTS) * max(self.CHUNKS))
        q, out = self.check_against_decode(dec)
        # And kvp_decode's definition in float64, over the cache as stored.
        K, V = pyref.dequantize(self.cache, 0)
        for s, n in enumerate(self.CHUNKS):
            a, b = self.starts[s], self.starts[s + 1]
            want, _ = pyref.attention(
                list(q[a * ROW:b * ROW]), list(self.table[s * self.width:(s + 1) * self.width]),
                self.width, [self.lens[s]], K, V, num_q_heads=HQ, num_kv_heads=HKV,
                head_size=HD, block_size=8, query_len=n)
            for i, (g, e) in enumerate(zip(out[a * ROW:b * ROW], want)):
                self.assertLessEqual(abs(g - e), 2.0 ** -22 * abs(e) + 1e-7,
                                     "%s: sequence %d element %d" % (self.msg, s, i))

    def test_options_layer_and_output_allocation(self):
        dec = self.decoder()
        slopes = [self.r.uniform(0.01, 0.5) for _ in range(HQ)]
        self.check_against_decode(dec, layer=1, sliding_window=3, sm_scale=0.1,
                                  logits_soft_cap=4.0, alibi_slopes=slopes)
        # out=None: one row per token, from query_starts; a nested table.
        q = array.array("f", pyref.gaussians(self.r, self.tokens * ROW))
        rows = [list(self.table[s * self.width:(s + 1) * self.width]) for s in range(3)]
        out = dec.attend(q, self.starts, rows, list(self.lens))
        self.assertEqual(len(out), self.tokens * ROW)
        self.assertTrue(all(math.isfinite(x) for x in out), self.msg)
        # No sequences: a no-op that succeeds.
        dec.attend(array.array("f"), [0], [], [], block_table_width=1)

    def test_bad_query_starts_is_an_error_naming_it(self):
        dec = self.decoder()
        q = array.array("f", [0.5] * (self.tokens * ROW))
        out = array.array("f", [0.0] * (self.tokens * ROW))
        for starts in ([0, 5, 3, 7], [1, 5, 5, 7]):
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                dec.attend(q, starts, self.table, self.lens, out=out,
                           block_table_width=self.width)
            self.assertIn("query_starts", cm.exception.message)
        # More query tokens than a sequence's context holds.
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            dec.attend(q, [0, 1, 6, 7], self.table, self.lens, out=out,
                       block_table_width=self.width)
        self.assertIn("query_starts", cm.exception.message)
        # The binding's own checks: too few boundaries, too few rows.
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            dec.attend(q, [0, 5, 5], self.table, self.lens, out=out, block_table_width=self.width)
        self.assertIn("query_starts has 3 elements", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            dec.attend(q[:ROW * 6], self.starts, self.table, self.lens, out=out,
                       block_table_width=self.width)
        self.assertIn("query_starts[3] = 7", cm.exception.message)

    def test_max_query_tokens(self):
        cfg = self.cache._decode_config(HQ, 3, 16, 2, D.FP32, D.FP32)
        self.assertEqual(cfg.max_query_tokens, 0)  # kvp_decode_config_init's default
        self.assertEqual(self.cache._decode_config(HQ, 3, 16, 2, D.FP32, D.FP32,
                                                   max_query_tokens=9).max_query_tokens, 9)
        q = array.array("f", pyref.gaussians(self.r, self.tokens * ROW))
        out = array.array("f", [0.0] * (self.tokens * ROW))
        # The default is max_num_seqs * max_query_len = 6 < 7 tokens.
        small = self.cache.decoder(HQ, 3, 16, max_query_len=2, q_dtype="fp32", out_dtype="fp32")
        self.assertEqual(small.max_query_tokens, 6)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            small.attend(q, self.starts, self.table, self.lens, out=out,
                         block_table_width=self.width)
        self.assertIn("max_query_tokens = 6", cm.exception.message)
        # Set explicitly, it is the capacity whatever max_query_len is.
        dec = self.cache.decoder(HQ, 3, 16, max_query_len=2, q_dtype="fp32", out_dtype="fp32",
                                 max_query_tokens=self.tokens)
        self.assertEqual(dec.max_query_tokens, self.tokens)
        dec.attend(q, self.starts, self.table, self.lens, out=out, block_table_width=self.width)
        self.assertTrue(all(math.isfinite(x) for x in out), self.msg)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.cache.decoder(HQ, 3, 16, max_query_tokens=-1)
        self.assertIn("max_query_tokens = -1", cm.exception.message)

    def test_struct_and_table(self):
        self.assertEqual(ctypes.sizeof(_lib.AttendArgs), _lib.FIRST_RELEASED_SIZES[_lib.AttendArgs])
        self.assertEqual(_lib.AttendArgs.query_starts.offset, 32)
        self.assertEqual(_lib.AttendArgs.lse.offset, 112)
        self.assertEqual(_lib.DecodeConfig.max_query_tokens.offset, 52)
        lib = kvpage.library()
        self.assertGreaterEqual(lib.abi, (1, 3))
        self.assertTrue(lib.has("attend"))
        args = _lib.AttendArgs()
        lib.api.attend_args_init(ctypes.byref(args))
        self.assertEqual(args.struct_size, ctypes.sizeof(_lib.AttendArgs))
        self.assertEqual((args.num_seqs, args.sm_scale, args.reserved0, args.reserved1),
                         (0, 0.0, 0, 0))

    def test_a_table_of_abi_1_0_has_no_attend(self):
        lib = kvpage.library()
        size = _lib.FIRST_RELEASED_SIZES[_lib.Api]
        head = ctypes.string_at(ctypes.addressof(lib.api), size)
        short = _lib.Api.from_buffer_copy(head + bytes(ctypes.sizeof(_lib.Api) - size))
        short.struct_size = size
        old = kvpage.Library(lib.path)
        old.api = short
        self.assertTrue(old.has("decode"))
        self.assertFalse(old.has("attend_args_init") or old.has("attend"))
        dec = self.decoder()
        dec._lib = old
        with self.assertRaises(kvpage.UnsupportedError) as cm:
            dec.attend(array.array("f", [0.0] * ROW), [0, 1, 1, 1], self.table, self.lens,
                       block_table_width=self.width)
        self.assertIn("kvp_attend needs ABI 1.3", cm.exception.message)


if __name__ == "__main__":
    unittest.main()
