# SPDX-License-Identifier: Apache-2.0
"""Tests of the binding with torch tensors: CPU tensors against the CPU
backend, and CUDA tensors against the CUDA backend. Skipped where torch (or
a GPU and a CUDA build of libkvpage) is missing.

Every test draws fresh random inputs (torch's RNG seeded from the OS; the
seed is in the failure message), poisons outputs with NaN before a call and
compares with float64 references.
"""

import os
import random
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kvpage  # noqa: E402
import pyref  # noqa: E402

try:
    import torch
except Exception:  # torch missing or broken: the tests below skip
    torch = None

if torch is not None:
    from kvpage import reference as R

D = kvpage.DType
HAS_CUDA = bool(torch is not None and torch.cuda.is_available()
                and kvpage.device_count("cuda") > 0)

DTYPES = [("bf16", "bf16"), ("fp16", "fp16"), ("fp8", "fp8"), ("int8", "int8"),
          ("int4", "int4"), ("int8", "int4")]


def seeded(test):
    seed = int(os.environ.get("KVPAGE_TEST_SEED") or random.SystemRandom().randrange(2 ** 31))
    test.seed = seed
    torch.manual_seed(seed)
    return "seed=%d" % seed


def make_batch(cache, lens, shuffle=True):
    """Block table (int32 [B, W]) and slot mapping (int64) of a batch with
    the given lengths, blocks drawn at random from the cache (an engine's
    own block manager)."""
    bs = cache.block_size
    W = max(1, max(-(-n // bs) for n in lens))
    need = sum(-(-n // bs) for n in lens)
    perm = torch.randperm(cache.num_blocks)[:need] if shuffle else torch.arange(need)
    table = torch.zeros(len(lens), W, dtype=torch.int32)
    slots = []
    k = 0
    for s, n in enumerate(lens):
        nb = -(-n // bs)
        table[s, :nb] = perm[k:k + nb].to(torch.int32)
        k += nb
        t = torch.arange(n)
        slots.append(table[s, t // bs].to(torch.int64) * bs + t % bs)
    return table, torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)


@unittest.skipIf(torch is None, "torch is not installed")
class TorchCpuTest(unittest.TestCase):
    def test_dequantize_matches_pure_python_reader(self):
        msg = seeded(self)
        for kd, vd in DTYPES:
            with kvpage.Cache(num_blocks=5, num_kv_heads=2, head_size=64, block_size=8,
                              k_dtype=kd, v_dtype=vd) as c:
                n = 5 * 8
                k = torch.randn(n, 2, 64) * 2
                v = torch.randn(n, 2, 64)
                c.write(0, k, v, torch.randperm(n))
                K, V = R.dequantize(c)
                Kp, Vp = pyref.dequantize(c)
                for (b, h, t), row in Kp.items():
                    self.assertEqual(K[b, h, t].tolist(), row, "%s %s K %s" % (msg, kd, (b, h, t)))
                    self.assertEqual(V[b, h, t].tolist(), Vp[(b, h, t)], "%s %s V" % (msg, vd))
                # Selected blocks, in the order asked.
                Ks, _ = R.dequantize(c, blocks=torch.tensor([3, 1]))
                self.assertTrue(torch.equal(Ks, K[[3, 1]]))

    def test_torch_reference_matches_cpu_backend(self):
        # The torch float64 reference (used by the GPU tests and benches)
        # against the CPU backend, which computes in double: options included.
        msg = seeded(self)
        lam = torch.exp(torch.empty(2 * 64).uniform_(-1, 1)).float()
        with kvpage.Cache(num_blocks=16, num_kv_heads=2, head_size=64, block_size=16,
                          k_dtype="int8", v_dtype="int4", key_smoothing=lam) as c:
            lens = [5, 33, 0, 47]
            table, slots = make_batch(c, lens)
            c.write(0, torch.randn(len(slots), 2, 64), torch.randn(len(slots), 2, 64), slots)
            dec = c.decoder(8, 4, 64, max_query_len=2, q_dtype="fp32", out_dtype="fp32")
            q = torch.randn(4 * 2, 8, 64)
            out = torch.full((4 * 2, 8, 64), float("nan"))
            lse = torch.full((4 * 2 * 8,), float("nan"))
            slopes = torch.rand(8) * 0.3
            lens_t = torch.tensor(lens, dtype=torch.int32)
            # sm_scale is a float in the ABI: the reference takes its float32 value.
            kw = dict(query_len=2, sliding_window=20, logits_soft_cap=4.0,
                      sm_scale=float(torch.tensor(0.15, dtype=torch.float32)))
            dec(q, table, lens_t, out=out, lse=lse, alibi_slopes=slopes, **kw)
            ref, ref_lse = R.decode_reference(c, 0, q, table, lens_t, key_smoothing=lam.view(2, 64),
                                              alibi_slopes=slopes, return_lse=True, **kw)
            self.assertLess(R.rel_l2(out, ref), 1e-6, msg)
            fin = torch.isfinite(ref_lse.reshape(-1))
            self.assertTrue(torch.equal(fin, torch.isfinite(lse)), msg)
            self.assertLess((lse[fin].double() - ref_lse.reshape(-1)[fin]).abs().max().item(), 1e-4)

    def test_strided_tensors_fused_qkv_and_padded_table(self):
        msg = seeded(self)
        with kvpage.Cache(num_blocks=12, num_kv_heads=2, head_size=128, block_size=16,
                          k_dtype="fp8", v_dtype="fp8") as c:
            lens = [17, 40, 3]
            table, slots = make_batch(c, lens)
            n = len(slots)
            # K and V as slices of a fused [n, q + k + v] projection.
            qkv = torch.randn(n, (4 + 2 + 2) * 128, dtype=torch.bfloat16)
            k = qkv[:, 4 * 128:6 * 128].view(n, 2, 128)
            v = qkv[:, 6 * 128:].view(n, 2, 128)
            self.assertFalse(k.is_contiguous())
            c.write(0, k, v, slots)
            K, V = R.dequantize(c)
            got_k = K.permute(0, 2, 1, 3).reshape(-1, 2, 128)[slots]  # slot order: [n, 2, 128]
            self.assertLess(R.rel_l2(got_k, k.double()), 0.06, msg)
            # A table padded to a wider row stride, q rows strided too.
            wide = torch.full((3, table.shape[1] + 5), 7, dtype=torch.int32)
            wide[:, :table.shape[1]] = table
            qbig = torch.randn(3, 2, 4 * 128, dtype=torch.bfloat16)
            q = qbig[:, 0].view(3, 4, 128)
            dec = c.decoder(4, 3, 64)
            out = torch.full((3, 4, 128), float("nan"), dtype=torch.bfloat16)
            dec(q, wide[:, :table.shape[1]], torch.tensor(lens, dtype=torch.int32), out=out)
            ref = R.decode_reference(c, 0, q, table, lens)
            self.assertLess(R.rel_l2(out, ref), 4e-3, msg)

    def test_readme_pattern_host_tables_into_tensors(self):
        # The README's example, on the CPU backend: slots from Sequence.append,
        # a block table exported into torch tensors.
        msg = seeded(self)
        with kvpage.Cache(num_blocks=64, num_kv_heads=2, head_size=128, dtype="int8") as cache:
            seqs = [cache.create_sequence() for _ in range(3)]
            for s, n in zip(seqs, (17, 40, 1)):
                slots = torch.tensor(s.append(n))
                k = torch.randn(n, 2, 128, dtype=torch.bfloat16)
                cache.write(0, k, torch.randn_like(k), slots)
            table = torch.full((3, 8), -1, dtype=torch.int32)
            lens = torch.empty(3, dtype=torch.int32)
            cache.export_block_table(seqs, 8, out=table, seq_lens=lens)
            self.assertEqual(lens.tolist(), [17, 40, 1])
            self.assertEqual(table[1, 3:].tolist(), [0] * 5)
            dec = cache.decoder(num_query_heads=8, max_num_seqs=4, max_context_len=256)
            q = torch.randn(3, 8, 128, dtype=torch.bfloat16)
            out = dec(q, table, lens)
            self.assertLess(R.rel_l2(out, R.decode_reference(cache, 0, q, table, lens)), 4e-3, msg)

    def test_tensor_checks(self):
        with kvpage.Cache(num_blocks=4, num_kv_heads=2, head_size=64) as c:
            dec = c.decoder(4, 2, 64)  # BF16 q and out
            table = torch.zeros(2, 4, dtype=torch.int32)
            lens = torch.tensor([3, 4], dtype=torch.int32)
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                dec(torch.randn(2, 4, 64, dtype=torch.float16), table, lens)
            self.assertIn("FP16", cm.exception.message)
            with self.assertRaises(kvpage.InvalidArgumentError):
                dec(torch.randn(2, 4, 64, dtype=torch.bfloat16), table.long(), lens)
            with self.assertRaises(kvpage.InvalidArgumentError):
                dec(torch.randn(2, 64, 4, dtype=torch.bfloat16).transpose(1, 2), table, lens)
            with self.assertRaises(kvpage.InvalidArgumentError):
                dec(torch.randn(3, 4, 64, dtype=torch.bfloat16), table, lens)
            with self.assertRaises(kvpage.InvalidArgumentError):
                c.write(0, torch.randn(2, 2, 64), torch.randn(2, 2, 64), torch.tensor([0, 1]).int())
            out = dec(torch.randn(2, 4, 64, dtype=torch.bfloat16), table, lens)
            self.assertEqual((out.shape, out.dtype), (torch.Size([2, 4, 64]), torch.bfloat16))


@unittest.skipUnless(HAS_CUDA, "needs torch with CUDA and a CUDA build of libkvpage")
class TorchCudaTest(unittest.TestCase):
    def fill(self, cache, lens, dtype=None, outliers=False):
        dtype = dtype or torch.bfloat16
        table, slots = make_batch(cache, lens)
        n = len(slots)
        k = torch.randn(n, cache.num_kv_heads, cache.head_size, device="cuda") * 1.5
        if outliers:
            k[..., :3] *= 20
        v = torch.randn(n, cache.num_kv_heads, cache.head_size, device="cuda")
        for layer in range(cache.num_layers):
            cache.write(layer, k.to(dtype), v.to(dtype), slots.cuda())
        return table.cuda(), slots.cuda(), k.to(dtype), v.to(dtype)

    def test_write_decode_every_dtype(self):
        msg = seeded(self)
        for kd, vd in DTYPES:
            for out_dtype in (torch.bfloat16, torch.float32):
                with kvpage.Cache(num_blocks=512, num_kv_heads=8, head_size=128, block_size=16,
                                  k_dtype=kd, v_dtype=vd, device="cuda", num_layers=2) as c:
                    lens = [random.randint(1, 900) for _ in range(5)] + [0, 1, 16]
                    table, slots, k, v = self.fill(c, lens)
                    dec = c.decoder(32, 8, 1024, out_dtype=out_dtype)
                    q = torch.randn(8, 32, 128, device="cuda", dtype=torch.bfloat16)
                    out = torch.full((8, 32, 128), float("nan"), device="cuda", dtype=out_dtype)
                    lse = torch.full((8 * 32,), float("nan"), device="cuda")
                    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
                    dec(q, table, lens_t, out=out, layer=1, lse=lse)
                    torch.cuda.synchronize()
                    ref, ref_lse = R.decode_reference(c, 1, q, table, lens_t, return_lse=True)
                    err = R.rel_l2(out, ref)
                    tol = 5e-3 if out_dtype == torch.bfloat16 else 2e-3
                    print("  cuda %s/%s out=%s rel-L2 vs dequantized float64: %.2e" %
                          (kd, vd, out_dtype, err))
                    self.assertLess(err, tol, "%s %s/%s out %s" % (msg, kd, vd, out_dtype))
                    fin = torch.isfinite(ref_lse.reshape(-1))
                    self.assertTrue(torch.equal(fin.cpu(), torch.isfinite(lse).cpu()), msg)
                    self.assertLess((lse[fin].double() - ref_lse.reshape(-1)[fin]).abs().max().item(),
                                    1e-3, msg)
                    self.assertTrue(bool((out[5] == 0).all()), "padding row")

    def test_cuda_write_is_byte_identical_to_cpu(self):
        msg = seeded(self)
        for kd, vd in DTYPES:
            geo = dict(num_blocks=24, num_kv_heads=2, head_size=128, block_size=16,
                       k_dtype=kd, v_dtype=vd)
            lam = torch.exp(torch.empty(2 * 128).uniform_(-1, 1))
            with kvpage.Cache(device="cuda", key_smoothing=lam, **geo) as g, \
                    kvpage.Cache(key_smoothing=lam, **geo) as h, \
                    kvpage.Cache(key_smoothing=lam, **geo) as back:
                n = 24 * 16
                k = torch.randn(n, 2, 128, dtype=torch.bfloat16) * 3
                v = torch.randn(n, 2, 128, dtype=torch.bfloat16)
                k[3, 1, 7] = float("nan")
                slots = torch.randperm(n)
                g.write(0, k.cuda(), v.cuda(), slots.cuda())
                h.write(0, k, v, slots)
                back.transfer_blocks(g, [(b, b) for b in range(24)])
                torch.cuda.synchronize()
                for name, buf in h.layer_buffers(0).items():
                    self.assertEqual(bytes(back.layer_buffers(0)[name]), bytes(buf),
                                     "%s %s/%s %s" % (msg, kd, vd, name))
                self.assertEqual(g.write_stats().non_finite, 1)
                self.assertEqual(g.write_stats(), h.write_stats())

    def test_streams_graphs_and_copies(self):
        msg = seeded(self)
        with kvpage.Cache(num_blocks=128, num_kv_heads=2, head_size=128, block_size=16,
                          dtype="int8", device="cuda") as c:
            lens = [300, 7, 511, 64]
            table, slots, k, v = self.fill(c, lens)
            lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
            dec = c.decoder(16, 4, 512)
            q = torch.randn(4, 16, 128, device="cuda", dtype=torch.bfloat16)
            base = dec(q, table, lens_t)
            torch.cuda.synchronize()
            ref = R.decode_reference(c, 0, q, table, lens_t)
            self.assertLess(R.rel_l2(base, ref), 5e-3, msg)
            # torch's current stream is used by default; an explicit one too.
            s = torch.cuda.Stream()
            out2 = torch.full_like(base, float("nan"))
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                out1 = torch.full_like(base, float("nan"))
                dec(q, table, lens_t, out=out1)
            out2.record_stream(s)
            dec(q, table, lens_t, out=out2, stream=s)
            s.synchronize()
            self.assertTrue(torch.equal(out1, base), msg)
            self.assertTrue(torch.equal(out2, base), msg)
            # One CUDA graph serves batches of other lengths (graph-stable launch).
            static_q = q.clone()
            static_lens = lens_t.clone()
            static_out = torch.full_like(base, float("nan"))
            dec(static_q, table, static_lens, out=static_out)  # warm-up outside capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                dec(static_q, table, static_lens, out=static_out)
            new_q = torch.randn_like(q)
            new_lens = torch.tensor([12, 7, 200, 0], dtype=torch.int32, device="cuda")
            static_q.copy_(new_q)
            static_lens.copy_(new_lens)
            static_out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            eager = dec(new_q, table, new_lens)
            torch.cuda.synchronize()
            self.assertTrue(torch.equal(static_out, eager), msg)
            self.assertLess(R.rel_l2(eager, R.decode_reference(c, 0, new_q, table, new_lens)),
                            5e-3, msg)
            # copy_blocks with a device tensor; the copy decodes the same.
            used = table[0, :2].tolist()
            free = sorted(set(range(128)) - set(table.reshape(-1).tolist()))[:2]
            c.copy_blocks(torch.tensor([[used[0], free[0]], [used[1], free[1]]],
                                       dtype=torch.int32, device="cuda"))
            K, V = R.dequantize(c)
            self.assertTrue(torch.equal(K[free], K[used]) and torch.equal(V[free], V[used]))

    def test_device_checks_and_lists(self):
        with kvpage.Cache(num_blocks=8, num_kv_heads=1, head_size=128, device="cuda") as c, \
                kvpage.Cache(num_blocks=8, num_kv_heads=1, head_size=128) as h:
            dec = c.decoder(2, 2, 64)
            q = torch.randn(2, 2, 128, dtype=torch.bfloat16)
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                dec(q, torch.zeros(2, 1, dtype=torch.int32, device="cuda"),
                    torch.ones(2, dtype=torch.int32, device="cuda"))
            self.assertIn("host memory", cm.exception.message)
            with self.assertRaises(kvpage.InvalidArgumentError) as cm:
                h.write(0, q[:, :1].cuda(), q[:, :1].cuda(), [0, 1])
            self.assertIn("CPU cache", cm.exception.message)
            # Lists are copied to the device for a CUDA cache.
            k = torch.randn(3, 1, 128, device="cuda", dtype=torch.bfloat16)
            c.write(0, k, k, [0, 1, 2])
            out = dec(q.cuda(), [[0], [0]], [3, 1])
            torch.cuda.synchronize()
            self.assertTrue(bool(torch.isfinite(out).all()))

    def test_torch_allocator(self):
        before = torch.cuda.memory_allocated()
        a = kvpage.TorchAllocator()
        c = kvpage.Cache(num_blocks=512, num_kv_heads=8, head_size=128, device="cuda",
                         allocator=a)
        self.assertGreaterEqual(torch.cuda.memory_allocated() - before, c.info.total_bytes)
        L = c.layout(0)
        self.assertTrue(any(p <= L.k_data < p + t.numel() for p, t in a._blocks.items()))
        c.close()
        self.assertEqual(torch.cuda.memory_allocated(), before)


if __name__ == "__main__":
    unittest.main()
