# SPDX-License-Identifier: Apache-2.0
"""Tests of the ctypes binding against the CPU backend, standard library only.

Run: KVPAGE_LIBRARY=/path/to/libkvpage.so python3 -m unittest discover -s bindings/python/tests
(ctest does this with the library of the build). Every test draws fresh
random inputs (seed in the failure message; KVPAGE_TEST_SEED replays it),
poisons outputs before a call and compares with float64 references.
"""

import array
import ctypes
import gc
import math
import os
import struct
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kvpage  # noqa: E402
from kvpage import _lib  # noqa: E402
import pyref  # noqa: E402

D = kvpage.DType


class LoadingTest(unittest.TestCase):
    def test_version_abi_build_info(self):
        v = kvpage.version()
        self.assertRegex(v, r"^\d+\.\d+\.\d+$")
        self.assertEqual(kvpage.abi_version()[0], kvpage.ABI_MAJOR)
        self.assertGreaterEqual(kvpage.abi_version()[1], 0)
        info = kvpage.build_info()
        self.assertEqual(info["version"], v)
        self.assertIn("cpu", info["backends"].split(","))
        self.assertIn("int4", info["kv_dtypes"])

    def test_struct_sizes_are_the_first_released_ones(self):
        # First released sizes, except where a later minor appended a field.
        grown = {_lib.CacheConfig: 72, _lib.DecodeConfig: 56, _lib.Api: 376}
        for struct_type, size in _lib.FIRST_RELEASED_SIZES.items():
            self.assertEqual(ctypes.sizeof(struct_type), grown.get(struct_type, size),
                             struct_type.__name__)
        # The offsets capi/struct_io.h pins.
        self.assertEqual(_lib.CacheConfig.allocator.offset, 56)
        self.assertEqual(_lib.CacheConfig.checked.offset, 64)
        self.assertEqual(_lib.LayerLayout.v_scale_bytes.offset, 168)
        self.assertEqual(_lib.WriteArgs.slot_mapping.offset, 56)
        self.assertEqual(_lib.DecodeConfig.workspace_bytes.offset, 40)
        self.assertEqual(_lib.DecodeConfig.precise.offset, 48)
        self.assertEqual(_lib.DecodeArgs.lse.offset, 104)
        for field, off in (("version_string", 16), ("error_code", 40), ("cache_create", 96),
                           ("seq_create", 144), ("cache_write", 216),
                           ("cache_copy_blocks", 248), ("decoder_create", 280), ("decode", 304),
                           ("attend_args_init", 312), ("attend", 320), ("cache_pack", 344),
                           ("cache_check_signature", 368)):
            self.assertEqual(getattr(_lib.Api, field).offset, off, field)
        self.assertEqual(_lib.PackArgs.buffer.offset, 32)
        self.assertEqual(_lib.PackArgs.signature.offset, 48)

    def test_library_from_environment(self):
        path = os.environ.get("KVPAGE_LIBRARY")
        if not path:
            self.skipTest("KVPAGE_LIBRARY is not set")
        self.assertEqual(kvpage.library().path, path)
        self.assertEqual(_lib.candidate_paths(), [path])

    def test_bad_path_is_an_error_not_a_fallback(self):
        old = os.environ.get("KVPAGE_LIBRARY")
        os.environ["KVPAGE_LIBRARY"] = "/nonexistent/libkvpage.so"
        try:
            with self.assertRaises(kvpage.LibraryError) as cm:
                kvpage.Library()
            self.assertIn("/nonexistent/libkvpage.so", str(cm.exception))
        finally:
            if old is None:
                del os.environ["KVPAGE_LIBRARY"]
            else:
                os.environ["KVPAGE_LIBRARY"] = old

    def test_abi_major_is_checked(self):
        with self.assertRaises(kvpage.LibraryError) as cm:
            kvpage.Library(kvpage.library().path, abi_major=kvpage.ABI_MAJOR + 1)
        self.assertIn("ABI major %d" % (kvpage.ABI_MAJOR + 1), str(cm.exception))
        lib = kvpage.Library(kvpage.library().path)
        self.assertEqual(lib.abi[0], kvpage.ABI_MAJOR)

    def test_device_count(self):
        self.assertEqual(kvpage.device_count("cpu"), 1)
        self.assertGreaterEqual(kvpage.device_count("cuda"), 0)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            kvpage.library().device_count(7)
        self.assertIn("device_kind = 7", cm.exception.message)

    def test_error_codes_and_names(self):
        lib = kvpage.library()
        for code in kvpage.ErrorCode:
            self.assertEqual(lib.error_code_name(code), code.name)
        self.assertEqual(lib.error_code_name(12345), "UNKNOWN")
        e = kvpage.error_from_code(12345, "later code")
        self.assertIs(type(e), kvpage.KvpError)
        self.assertEqual((e.code, e.code_name, e.message), (12345, "UNKNOWN", "later code"))
        self.assertIsInstance(kvpage.error_from_code(2, "x"), kvpage.OutOfBlocksError)
        self.assertIsInstance(kvpage.error_from_code(3, "x"), MemoryError)
        self.assertIsInstance(kvpage.error_from_code(1, "x"), ValueError)


def small_cache(r, **kw):
    args = dict(num_blocks=r.randint(12, 20), num_kv_heads=2, head_size=64,
                block_size=r.choice([8, 16]))
    args.update(kw)
    return kvpage.Cache(**args)


class ErrorTest(unittest.TestCase):
    def test_invalid_config_raises_with_code_and_message(self):
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            kvpage.Cache(num_blocks=0, num_kv_heads=2)
        e = cm.exception
        self.assertEqual(e.code, kvpage.ErrorCode.INVALID_ARGUMENT)
        self.assertEqual(e.code_name, "INVALID_ARGUMENT")
        self.assertIn("num_blocks", e.message)
        self.assertIsInstance(e, ValueError)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            kvpage.Cache(num_blocks=4, num_kv_heads=2, head_size=100)
        self.assertIn("100", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError):
            kvpage.Cache(num_blocks=4, num_kv_heads=2, k_dtype="int3")
        with self.assertRaises(kvpage.InvalidArgumentError):
            kvpage.Cache(num_blocks=4, num_kv_heads=2, device="tpu")

    def test_out_of_blocks_changes_nothing(self):
        r = pyref.rng(self)
        with kvpage.Cache(num_blocks=3, num_kv_heads=1, head_size=64, block_size=16) as c:
            s = c.create_sequence()
            first = r.randint(1, 16)
            s.append(first)
            free = c.num_free_blocks
            with self.assertRaises(kvpage.OutOfBlocksError) as cm:
                s.append(3 * 16)
            self.assertEqual(cm.exception.code, kvpage.ErrorCode.OUT_OF_BLOCKS)
            self.assertEqual(c.num_free_blocks, free)
            self.assertEqual(len(s), first)

    def test_stale_sequence_id(self):
        with kvpage.Cache(num_blocks=4, num_kv_heads=1, head_size=64) as c:
            s = c.create_sequence()
            s.free()
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                s.append(1)
            self.assertIn(str(s.id), cm.exception.message)
            with self.assertRaises(kvpage.KvpError):
                c.seq_length(s.id)

    def test_closed_handles(self):
        c = kvpage.Cache(num_blocks=4, num_kv_heads=1, head_size=64)
        d = c.decoder(2, 1, 16, q_dtype="fp32", out_dtype="fp32")
        c.close()
        c.close()  # idempotent
        self.assertTrue(c.closed)
        self.assertTrue(d.closed)  # decoders never outlive their cache
        with self.assertRaises(kvpage.InvalidArgumentError):
            c.create_sequence()
        with self.assertRaises(kvpage.InvalidArgumentError):
            d(array.array("f", [1.0] * 128), [0], [1], block_table_width=1)


class SequenceTest(unittest.TestCase):
    def test_append_fork_truncate_free(self):
        r = pyref.rng(self)
        msg = "seed=%d" % self._seed
        bs = r.choice([8, 16, 32])
        with kvpage.Cache(num_blocks=16, num_kv_heads=1, head_size=64, block_size=bs) as c:
            total = c.num_free_blocks
            self.assertEqual(total, 16)
            a = c.create_sequence()
            n = r.randint(1, 2) * bs + r.randint(1, bs - 1)  # last block partly filled
            slots = a.append(n)
            self.assertEqual(len(slots), n)
            self.assertEqual(a.length, n)
            table, lens = c.export_block_table([a])
            self.assertEqual(list(lens), [n])
            nblk = -(-n // bs)
            self.assertEqual(len(table), nblk)
            for t, slot in enumerate(slots):
                self.assertEqual(slot, table[t // bs] * bs + t % bs, msg)
            self.assertEqual(c.num_free_blocks, total - nblk)
            # Fork shares everything; the first append copies the shared last block.
            b = a.fork()
            self.assertEqual(len(b), n)
            self.assertEqual(c.num_free_blocks, total - nblk)
            bslot = b.append(1)[0]
            tb, _ = c.export_block_table([a, b], nblk)
            self.assertEqual(list(tb[:nblk - 1]), list(tb[nblk:2 * nblk - 1]), msg)
            self.assertNotEqual(tb[nblk - 1], tb[2 * nblk - 1], msg)
            self.assertEqual(bslot // bs, tb[2 * nblk - 1])
            self.assertEqual(c.num_free_blocks, total - nblk - 1)
            # Truncate releases the blocks past the new length.
            a.truncate(1)
            self.assertEqual(len(a), 1)
            # Row stride and a caller's table.
            out = array.array("i", [-7] * (2 * (nblk + 3)))
            t2, l2 = c.export_block_table([a, b], nblk, out=out, row_stride=nblk + 3)
            self.assertIs(t2, out)
            self.assertEqual(list(l2), [1, n + 1])
            self.assertEqual(out[nblk + 3:nblk + 3 + nblk], tb[nblk:2 * nblk])
            self.assertEqual(out[nblk:nblk + 3], array.array("i", [-7] * 3))  # padding untouched
            with b:
                pass  # frees b
            a.free()
            self.assertEqual(c.num_free_blocks, total)

    def test_table_too_narrow(self):
        with kvpage.Cache(num_blocks=8, num_kv_heads=1, head_size=64, block_size=8) as c:
            s = c.create_sequence()
            s.append(20)
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                c.export_block_table([s], 2)
            self.assertIn("max_blocks_per_seq", cm.exception.message)

    def test_sequence_operations_from_threads(self):
        with kvpage.Cache(num_blocks=64, num_kv_heads=1, head_size=64, block_size=8) as c:
            errors = []

            def work(seed):
                import random
                r = random.Random(seed)
                try:
                    for _ in range(40):
                        s = c.create_sequence()
                        s.append(r.randint(1, 20))
                        f = s.fork()
                        f.append(r.randint(1, 5))
                        f.free()
                        s.free()
                except Exception as e:  # pragma: no cover - reported below
                    errors.append(e)
            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertEqual(c.num_free_blocks, 64)


# Per-element bound of |stored - input| (FORMATS.md, "Error bounds"), from
# the token-head vector x the element belongs to.
def element_bound(dtype, v, vec):
    amax = max(abs(a) for a in vec)
    if dtype == D.BF16:
        return 2.0 ** -8 * abs(v)
    if dtype == D.FP16:
        return 2.0 ** -11 * abs(v) + 2.0 ** -25
    if dtype == D.INT8:
        return 0.5 * amax / 127 * 1.002 + 1e-7
    if dtype == D.FP8_E4M3:
        return 2.0 ** -4 * abs(v) + 2.0 ** -10 * amax / 448 * 1.002 + 1e-7
    lo, hi = min(vec), max(vec)
    return 0.5 * (hi - lo) / 15 * 1.002 + 2.0 ** -10 * (abs(lo) + abs(hi)) + 1e-7


class WriteDecodeTest(unittest.TestCase):
    """Write random K/V through the binding, read the cache back through the
    public layout, decode, and compare with float64 attention."""

    def run_case(self, k_dtype, v_dtype, input_dtype, q_dtype, out_dtype, *, query_len=1,
                 smoothing=False, alibi=False, window=0, soft_cap=0.0, sm_scale=0.0, pad_row=False,
                 precise=False):
        r = pyref.rng(self)
        msg = "seed=%d" % self._seed
        HKV, HD = 2, 64
        HQ = HKV * r.choice([1, 2, 4])
        bs = r.choice([8, 16])
        lam = None
        if smoothing:
            lam = [pyref.f32(math.exp(r.uniform(-1.5, 1.5))) for _ in range(HKV * HD)]
        cache = kvpage.Cache(num_blocks=14, num_kv_heads=HKV, head_size=HD, block_size=bs,
                             num_layers=2, k_dtype=k_dtype, v_dtype=v_dtype, key_smoothing=lam)
        self.addCleanup(cache.close)
        layer = r.randint(0, 1)
        lens = [r.randint(query_len, 3 * bs + 5) for _ in range(3)]
        if pad_row:
            lens.append(0)
        seqs = [cache.create_sequence() for _ in lens]
        slot_list = []
        for s, n in zip(seqs, lens):
            slot_list.extend(s.append(n))
        ntok = len(slot_list)
        row = HKV * HD
        kvals = pyref.gaussians(r, ntok * row, 1.5)
        vvals = pyref.gaussians(r, ntok * row)
        kbuf, kx = pyref.encode(kvals, input_dtype)
        vbuf, vx = pyref.encode(vvals, input_dtype)
        slots = array.array("q", slot_list)
        cache.write(layer, kbuf, vbuf, slots,
                    input_dtype=input_dtype if input_dtype != D.FP32 else None)
        self.assertEqual(cache.write_stats(), (0, 0))
        # Stored values within the format's bound of the inputs.
        K, V = pyref.dequantize(cache, layer)
        for t, slot in enumerate(slot_list):
            b, o = divmod(slot, bs)
            for h in range(HKV):
                kin = kx[t * row + h * HD:t * row + (h + 1) * HD]
                if lam is not None:
                    kin = [pyref.f32(a / l) for a, l in zip(kin, lam[h * HD:(h + 1) * HD])]
                vin = vx[t * row + h * HD:t * row + (h + 1) * HD]
                for d in range(HD):
                    self.assertLessEqual(abs(K[(b, h, o)][d] - kin[d]),
                                         element_bound(k_dtype, kin[d], kin), msg)
                    self.assertLessEqual(abs(V[(b, h, o)][d] - vin[d]),
                                         element_bound(v_dtype, vin[d], vin), msg)
        # Decode.
        W = max(1, max(-(-n // bs) for n in lens))
        table, tlens = cache.export_block_table(seqs, W)
        self.assertEqual(list(tlens), lens)
        dec = cache.decoder(HQ, len(lens), 3 * bs + 8, max_query_len=query_len,
                            q_dtype=q_dtype, out_dtype=out_dtype, precise=precise)
        self.assertEqual(dec.precise, precise)
        nq = len(lens) * query_len * HQ * HD
        qbuf, qx = pyref.encode(pyref.gaussians(r, nq), q_dtype)
        out = pyref.poisoned(nq, out_dtype)
        lse = array.array("f", [float("nan")] * (len(lens) * query_len * HQ))
        slopes = [r.uniform(0.01, 0.5) for _ in range(HQ)] if alibi else None
        res = dec(qbuf, table, tlens, out=out, layer=layer, query_len=query_len,
                  block_table_width=W, sliding_window=window, logits_soft_cap=soft_cap,
                  sm_scale=sm_scale, alibi_slopes=slopes, lse=lse)
        self.assertIs(res, out)
        got = pyref.decode_output(out, out_dtype)
        ref, ref_lse = pyref.attention(
            qx, list(table), W, lens, K, V, num_q_heads=HQ, num_kv_heads=HKV, head_size=HD,
            block_size=bs, query_len=query_len, sm_scale=sm_scale, key_smoothing=lam,
            logits_soft_cap=soft_cap,
            alibi_slopes=[pyref.f32(x) for x in slopes] if slopes else None,
            sliding_window=window)
        # The CPU backend computes in double and rounds once: every element
        # within half an ulp of the output dtype (plus float64 noise).
        ulp = {D.FP32: 2.0 ** -24, D.FP16: 2.0 ** -11, D.BF16: 2.0 ** -8}[out_dtype]
        for i, (g, e) in enumerate(zip(got, ref)):
            self.assertTrue(math.isfinite(g), "%s: out[%d] not written" % (msg, i))
            self.assertLessEqual(abs(g - e), ulp * abs(e) + 1e-9 + (6e-8 if out_dtype == D.FP16 else 0),
                                 "%s: out[%d] = %r, reference %r" % (msg, i, g, e))
        for i, (g, e) in enumerate(zip(lse, ref_lse)):
            if e == float("-inf"):
                self.assertEqual(g, float("-inf"), msg)
            else:
                self.assertLessEqual(abs(g - e), 2.0 ** -22 * abs(e) + 1e-6, "%s lse[%d]" % (msg, i))
        if pad_row:
            base = (len(lens) - 1) * query_len * HQ * HD
            self.assertEqual(got[base:], [0.0] * (query_len * HQ * HD))
        return cache

    def test_bf16_cache_fp32_io(self):
        self.run_case(D.BF16, D.BF16, D.FP32, D.FP32, D.FP32)

    def test_fp16_cache_fp16_io(self):
        self.run_case(D.FP16, D.FP16, D.FP16, D.FP16, D.FP16)

    def test_fp8_cache_bf16_io(self):
        self.run_case(D.FP8_E4M3, D.FP8_E4M3, D.BF16, D.BF16, D.BF16)

    def test_int8_cache(self):
        self.run_case(D.INT8, D.INT8, D.BF16, D.FP32, D.FP32)

    def test_int4_cache(self):
        self.run_case(D.INT4, D.INT4, D.FP32, D.FP32, D.BF16)

    def test_mixed_k_int8_v_int4_with_padding_row(self):
        self.run_case(D.INT8, D.INT4, D.FP16, D.FP32, D.FP32, pad_row=True)

    def test_options_alibi_window_softcap_scale(self):
        self.run_case(D.INT8, D.FP8_E4M3, D.FP32, D.FP32, D.FP32, alibi=True, window=7,
                      soft_cap=5.0, sm_scale=0.2)

    def test_speculative_query_len_and_key_smoothing(self):
        self.run_case(D.INT4, D.INT8, D.BF16, D.FP32, D.FP32, query_len=3, smoothing=True)

    def test_precise_decoder(self):
        self.run_case(D.INT8, D.FP16, D.FP16, D.BF16, D.FP32, query_len=2, precise=True)

    def test_padding_slots_are_skipped_and_stats_counted(self):
        r = pyref.rng(self)
        with kvpage.Cache(num_blocks=2, num_kv_heads=1, head_size=64, block_size=8,
                          k_dtype="fp16", v_dtype="int8") as c:
            vals = pyref.gaussians(r, 3 * 64)
            vals[5] = float("nan")             # token 0: one non-finite K value
            vals[2 * 64 + 1] = 1e30            # token 2: beyond FP16's range
            k = array.array("f", vals)
            v = array.array("f", pyref.gaussians(r, 3 * 64))
            c.write(0, k, v, [3, -1, 9])       # the middle token is padding
            K, V = pyref.dequantize(c)
            self.assertEqual(K[(0, 0, 3)][5], 0.0)
            self.assertEqual(K[(1, 0, 1)][1], 65504.0)
            self.assertAlmostEqual(K[(0, 0, 3)][0], vals[0], delta=abs(vals[0]) * 2 ** -10)
            for slot in range(16):
                if slot not in (3, 9):
                    b, o = divmod(slot, 8)
                    self.assertEqual(K[(b, 0, o)], [0.0] * 64)
                    self.assertEqual(V[(b, 0, o)], [0.0] * 64)
            self.assertEqual(c.write_stats(), (1, 1))
            c.reset_write_stats()
            self.assertEqual(c.write_stats(), (0, 0))

    def test_index_arrays_of_another_type_are_converted(self):
        r = pyref.rng(self)
        with kvpage.Cache(num_blocks=2, num_kv_heads=1, head_size=64, block_size=8,
                          dtype="fp16") as c:
            vals = pyref.gaussians(r, 2 * 64)
            k = array.array("f", vals)
            c.write(0, k, k, array.array("i", [11, 4]))  # int32 slots: copied to int64
            K, _ = pyref.dequantize(c)
            self.assertAlmostEqual(K[(1, 0, 3)][7], vals[7], delta=abs(vals[7]) * 2 ** -10)
            self.assertAlmostEqual(K[(0, 0, 4)][9], vals[64 + 9], delta=abs(vals[73]) * 2 ** -10)

    def test_read_only_and_raw_buffers(self):
        r = pyref.rng(self)
        with kvpage.Cache(num_blocks=2, num_kv_heads=1, head_size=64, block_size=8,
                          dtype="bf16") as c:
            vals = pyref.gaussians(r, 2 * 64)
            kb = struct.pack("<128H", *[pyref.bf16_bits(x) for x in vals])  # bytes: read-only
            vb = memoryview(bytearray(kb)).cast("H")
            c.write(0, kb, vb, array.array("q", [0, 15]), input_dtype="bf16")
            K, V = pyref.dequantize(c)
            for d in range(64):
                self.assertEqual(K[(0, 0, 0)][d], pyref.bf16_value(pyref.bf16_bits(vals[d])))
                self.assertEqual(V[(1, 0, 7)][d], pyref.bf16_value(pyref.bf16_bits(vals[64 + d])))
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                c.write(0, kb, vb, [0, 15])  # 16-bit patterns need input_dtype
            self.assertIn("explicit dtype", cm.exception.message)


class ArgumentCheckTest(unittest.TestCase):
    def setUp(self):
        self.cache = kvpage.Cache(num_blocks=4, num_kv_heads=2, head_size=64, block_size=16,
                                  k_dtype="int8", v_dtype="int8")
        self.addCleanup(self.cache.close)
        self.dec = self.cache.decoder(4, 2, 64, q_dtype="fp32", out_dtype="fp32")

    def test_write_shapes_and_dtypes(self):
        c = self.cache
        k = array.array("f", [0.5] * (3 * 128))
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            c.write(0, k, k, [0, 1])  # 3 tokens of data, 2 slots
        self.assertIn("key", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError):
            c.write(0, k, array.array("d", [0.5] * (3 * 128)), [0, 1, 2])
        with self.assertRaises(kvpage.InvalidArgumentError):
            c.write(0, k, k, array.array("f", [0, 1, 2]))  # slots must be int64
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            c.write(5, k, k, [0, 1, 2])  # layer out of range: the library says so
        self.assertIn("layer", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError):
            c.write(0, k, k, [0, 1, 999])  # slot past the cache

    def test_decode_arguments(self):
        q = array.array("f", [0.1] * (2 * 4 * 64))
        table = array.array("i", [0, 1, 2, 3])
        lens = array.array("i", [5, 7])
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.dec(q, table, lens)  # a flat table needs its width
        self.assertIn("block_table_width", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError):
            self.dec(array.array("f", [0.1] * 100), table, lens, block_table_width=2)
        with self.assertRaises(kvpage.InvalidArgumentError):
            self.dec(array.array("H", [0x3C00] * (2 * 4 * 64)), table, lens,
                     block_table_width=2)  # 16-bit q for an FP32 decoder
        with self.assertRaises(kvpage.InvalidArgumentError):
            self.dec(q, table, array.array("f", [5, 7]), block_table_width=2)
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.dec(q, table, [5, 70], block_table_width=2)  # longer than the table holds
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            self.dec(q, table, [5, 6.5], block_table_width=2)
        self.assertIn("not an integer", cm.exception.message)
        with self.assertRaises(kvpage.InvalidArgumentError):
            self.dec(q, table, lens, block_table_width=2, out=bytes(2 * 4 * 64 * 4))
        with self.assertRaises(kvpage.InvalidArgumentError):
            self.dec(q, table, lens, block_table_width=2, query_len=2)  # max_query_len is 1
        with self.assertRaises(kvpage.InvalidArgumentError):
            self.dec(q, table, lens, block_table_width=2, alibi_slopes=[0.1, 0.2])
        with self.assertRaises(kvpage.InvalidArgumentError):
            self.dec(object(), table, lens, block_table_width=2)
        # A 2-D table given as nested lists: width and num_seqs from its shape.
        out = self.dec(q, [[0, 1], [2, 3]], [5, 7])
        self.assertEqual(len(out), 2 * 4 * 64)
        self.assertTrue(all(math.isfinite(x) for x in out))

    def test_dtype_and_device_spellings(self):
        self.assertEqual(kvpage.as_dtype("bf16"), D.BF16)
        self.assertEqual(kvpage.as_dtype("FP8"), D.FP8_E4M3)
        self.assertEqual(kvpage.as_dtype(5), D.INT4)
        self.assertEqual(kvpage.parse_device("cuda:3"), (kvpage.DeviceKind.CUDA, 3))
        self.assertEqual(kvpage.parse_device("cpu"), (kvpage.DeviceKind.CPU, 0))
        with self.assertRaises(kvpage.InvalidArgumentError):
            kvpage.as_dtype(17)


class PreciseModeTest(unittest.TestCase):
    """kvp_decode_config.precise (ABI 1.2) through Cache.decoder(precise=)."""

    def test_value_reaches_the_library(self):
        with kvpage.Cache(num_blocks=4, num_kv_heads=1, head_size=64) as c:
            self.assertFalse(c.decoder(2, 1, 32).precise)  # the library's default: off
            dec = c.decoder(2, 1, 32, q_dtype="fp32", out_dtype="fp32", precise=True)
            self.assertTrue(dec.precise)
            self.assertEqual(c.decode_workspace_size(2, 1, 32, precise=True), 0)
            # The library refuses 2 and names the field: the struct carries it.
            cfg = c._decode_config(2, 1, 32, 1, D.FP32, D.FP32, True)
            self.assertEqual(cfg.precise, 1)
            cfg.precise = 2
            lib = kvpage.library()
            handle = ctypes.c_void_p()
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                lib.check(lib.api.decoder_create(c._h(), ctypes.byref(cfg), ctypes.byref(handle)))
            self.assertIn("config->precise = 2", cm.exception.message)
            self.assertIsNone(handle.value)

    def test_precise_decoder_gives_the_default_bits_on_cpu(self):
        # The CPU backend is precise either way.
        r = pyref.rng(self)
        msg = "seed=%d" % self._seed
        for dtype in (D.FP16, D.INT8, D.INT4):
            with kvpage.Cache(num_blocks=8, num_kv_heads=2, head_size=64, dtype=dtype) as c:
                lens = [21, 6, 1]
                seqs = [c.create_sequence() for _ in lens]
                slots = []
                for s, n in zip(seqs, lens):
                    slots.extend(s.append(n))
                k = array.array("f", pyref.gaussians(r, len(slots) * 128))
                v = array.array("f", pyref.gaussians(r, len(slots) * 128))
                c.write(0, k, v, slots)
                table, tlens = c.export_block_table(seqs, 2)
                q = array.array("f", pyref.gaussians(r, len(lens) * 4 * 64))
                outs = []
                for precise in (False, True):
                    dec = c.decoder(4, len(lens), 32, q_dtype="fp32", out_dtype="fp32",
                                    precise=precise)
                    out = pyref.poisoned(len(q), D.FP32)
                    lse = array.array("f", [float("nan")] * (len(lens) * 4))
                    dec(q, table, tlens, out=out, block_table_width=2, lse=lse)
                    outs.append((out.tobytes(), lse.tobytes()))
                self.assertEqual(outs[1][0], outs[0][0], "%s %s out" % (msg, dtype.name))
                self.assertEqual(outs[1][1], outs[0][1], "%s %s lse" % (msg, dtype.name))
                self.assertTrue(all(math.isfinite(x) for x in array.array("f", outs[1][0])))


class BlockCopyTest(unittest.TestCase):
    def fill(self, r, cache):
        n = cache.num_blocks * cache.block_size
        row = cache.num_kv_heads * cache.head_size
        for layer in range(cache.num_layers):
            cache.write(layer, array.array("f", pyref.gaussians(r, n * row)),
                        array.array("f", pyref.gaussians(r, n * row)), list(range(n)))

    def block_bytes(self, cache, layer, b):
        L = cache.layout(layer)
        m = cache.layer_buffers(layer)
        out = []
        for name, bstride in (("k_data", L.k_block_stride), ("v_data", L.v_block_stride),
                              ("k_scales", L.k_scale_block_stride),
                              ("v_scales", L.v_scale_block_stride)):
            if name in m:
                out.append(bytes(m[name][b * bstride:(b + 1) * bstride]))
        return out

    def test_copy_blocks(self):
        r = pyref.rng(self)
        with kvpage.Cache(num_blocks=6, num_kv_heads=2, head_size=64, block_size=8, num_layers=2,
                          k_dtype="int4", v_dtype="fp8") as c:
            self.fill(r, c)
            before = [[self.block_bytes(c, l, b) for b in range(6)] for l in range(2)]
            c.copy_blocks([[0, 4], [2, 5]])
            for l in range(2):
                self.assertEqual(self.block_bytes(c, l, 4), before[l][0])
                self.assertEqual(self.block_bytes(c, l, 5), before[l][2])
                for b in range(4):
                    self.assertEqual(self.block_bytes(c, l, b), before[l][b])
                self.assertNotEqual(before[l][0], before[l][2])

    def test_transfer_blocks(self):
        r = pyref.rng(self)
        geo = dict(num_blocks=5, num_kv_heads=1, head_size=128, block_size=16, num_layers=2,
                   k_dtype="int8", v_dtype="int4")
        with kvpage.Cache(**geo) as src, kvpage.Cache(**geo) as dst:
            self.fill(r, src)
            dst.transfer_blocks(src, [(1, 0), (3, 4)])
            for l in range(2):
                self.assertEqual(self.block_bytes(dst, l, 0), self.block_bytes(src, l, 1))
                self.assertEqual(self.block_bytes(dst, l, 4), self.block_bytes(src, l, 3))
            with kvpage.Cache(**dict(geo, head_size=64)) as other:
                with self.assertRaises(kvpage.InvalidArgumentError):
                    other.transfer_blocks(src, [(0, 0)])


class AllocatorTest(unittest.TestCase):
    class HostAllocator(object):
        def __init__(self):
            self.live = {}
            self.calls = []

        def alloc(self, nbytes, alignment, kind, ordinal):
            self.calls.append(("alloc", nbytes, alignment, kind, ordinal))
            buf = ctypes.create_string_buffer(nbytes + alignment)
            ptr = (ctypes.addressof(buf) + alignment - 1) // alignment * alignment
            self.live[ptr] = (buf, nbytes)
            return ptr

        def free(self, ptr, nbytes, kind, ordinal):
            self.calls.append(("free", ptr, nbytes))
            buf, n = self.live.pop(ptr)
            assert n == nbytes

    def test_engine_allocator_owns_the_memory(self):
        r = pyref.rng(self)
        a = self.HostAllocator()
        c = kvpage.Cache(num_blocks=4, num_kv_heads=1, head_size=64, block_size=8,
                         k_dtype="int8", v_dtype="int8", allocator=a)
        self.assertEqual(len(a.live), 1)
        (ptr, (buf, nbytes)), = a.live.items()
        self.assertGreaterEqual(nbytes, c.info.total_bytes)
        L = c.layout(0)
        self.assertTrue(ptr <= L.k_data < ptr + nbytes)
        c.write(0, array.array("f", pyref.gaussians(r, 64)), array.array("f", pyref.gaussians(r, 64)),
                [5])
        K, _ = pyref.dequantize(c)
        self.assertNotEqual(K[(0, 0, 5)], [0.0] * 64)
        c.close()
        self.assertEqual(a.live, {})
        self.assertEqual(a.calls[-1], ("free", ptr, nbytes))

    def test_failing_allocator_is_out_of_memory(self):
        class Refuses(object):
            def alloc(self, *a):
                return 0

            def free(self, *a):
                raise AssertionError("nothing to free")

        with self.assertRaises(kvpage.OutOfMemoryError) as cm:
            kvpage.Cache(num_blocks=4, num_kv_heads=1, head_size=64, allocator=Refuses())
        self.assertEqual(cm.exception.code, kvpage.ErrorCode.OUT_OF_MEMORY)

        class Raises(object):
            def alloc(self, *a):
                raise RuntimeError("pool exhausted")

            def free(self, *a):
                pass

        with self.assertRaises(kvpage.OutOfMemoryError) as cm:
            kvpage.Cache(num_blocks=4, num_kv_heads=1, head_size=64, allocator=Raises())
        self.assertIsInstance(cm.exception.__cause__, RuntimeError)
        self.assertIn("pool exhausted", str(cm.exception.__cause__))


class LifetimeTest(unittest.TestCase):
    def test_decoder_keeps_cache_alive_and_gc_releases(self):
        r = pyref.rng(self)
        c = kvpage.Cache(num_blocks=2, num_kv_heads=1, head_size=64, block_size=8, dtype="bf16")
        c.write(0, array.array("f", pyref.gaussians(r, 64)), array.array("f", pyref.gaussians(r, 64)),
                [0])
        d = c.decoder(1, 1, 8, q_dtype="fp32", out_dtype="fp32")
        del c
        gc.collect()
        out = d(array.array("f", pyref.gaussians(r, 64)), [0], [1], block_table_width=1)
        self.assertTrue(all(math.isfinite(x) for x in out))
        self.assertTrue(any(x != 0 for x in out))
        d.close()
        for _ in range(20):  # caches dropped without close() are released by GC
            kvpage.Cache(num_blocks=2, num_kv_heads=1, head_size=64).decoder(1, 1, 8)
        gc.collect()

    def test_caller_owned_workspace(self):
        with kvpage.Cache(num_blocks=2, num_kv_heads=1, head_size=64) as c:
            need = c.decode_workspace_size(1, 4, 64)
            self.assertGreaterEqual(need, 0)
            buf = ctypes.create_string_buffer(need + 512)
            addr = (ctypes.addressof(buf) + 255) // 256 * 256
            d = c.decoder(1, 4, 64, workspace=kvpage.Ptr(addr, nbytes=need + 256))
            self.assertFalse(d.closed)
            d.close()
            if need > 0:
                with self.assertRaises(kvpage.InvalidArgumentError):
                    c.decoder(1, 4, 64, workspace=kvpage.Ptr(addr, nbytes=need - 1))


if __name__ == "__main__":
    unittest.main()
