# SPDX-License-Identifier: Apache-2.0
"""kvpage.torch_ops: the cache write and the attention calls as torch custom
operators (torch >= 2.4).

Without torch >= 2.4 only the availability test runs: the module imports and
every function raises ImportError. On the CPU backend the operators match
the binding's direct calls bit for bit, trace with torch.fx and compile with
torch.compile(fullgraph=True) without graph breaks (the write kept and ordered
before the attention), and pass torch.library.opcheck. On a GPU a
transformer-shaped decode step (QKV projection, cache write, decode, output
projection) compiled with fullgraph=True and captured in a CUDA graph
matches the eager step. Inputs are fresh random numbers (the seed is in the
failure message; KVPAGE_TEST_SEED replays it).
"""

import inspect
import os
import random
import shutil
import sys
import typing
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import kvpage  # noqa: E402
from kvpage import torch_ops as ops  # noqa: E402

torch = ops.torch if ops.available else None
HAS_CUDA = bool(torch is not None and torch.cuda.is_available()
                and kvpage.device_count("cuda") > 0)
# The binding's checks on the CPU backend, or the operators' fake checks.
BAD_ARGUMENT = (kvpage.InvalidArgumentError, RuntimeError)
OPCHECK_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_static",
                 "test_aot_dispatch_dynamic")
HKV, HQ, HD = 2, 4, 64


def seeded(test):
    seed = int(os.environ.get("KVPAGE_TEST_SEED") or random.SystemRandom().randrange(2 ** 31))
    torch.manual_seed(seed)
    return "seed=%d" % seed


def make_batch(cache, lens, device="cpu"):
    """Block table (int32 [B, W]) and slot mapping (int64, every token of
    every sequence) of a batch, blocks drawn at random from the cache."""
    bs = cache.block_size
    W = max(1, max(-(-n // bs) for n in lens))
    perm = torch.randperm(cache.num_blocks)
    table = torch.zeros(len(lens), W, dtype=torch.int32)
    slots, k = [], 0
    for s, n in enumerate(lens):
        nb = -(-n // bs)
        table[s, :nb] = perm[k:k + nb].to(torch.int32)
        k += nb
        t = torch.arange(n)
        slots.append(table[s, t // bs].to(torch.int64) * bs + t % bs)
    return table.to(device), torch.cat(slots).to(device)


def slot_of(table, bs, seq, pos):
    return int(table[seq, pos // bs]) * bs + pos % bs


class AvailabilityTest(unittest.TestCase):
    """Runs everywhere: without torch >= 2.4 the module still imports."""

    def test_available_or_a_clear_error(self):
        if ops.available:
            major, minor = (int(x) for x in ops.torch.__version__.split(".")[:2])
            self.assertGreaterEqual((major, minor), ops.MIN_TORCH)
            self.assertIsNone(ops.unavailable_reason)
            for name in ("cache_write", "decode", "attend"):
                self.assertTrue(hasattr(ops.torch.ops.kvpage, name), name)
            return
        self.assertIn("torch", ops.unavailable_reason)
        calls = [lambda: ops.register(object()), lambda: ops.token(1),
                 lambda: ops.write(1, 0, None, None, None),
                 lambda: ops.decode(1, 0, None, None, None),
                 lambda: ops.attend(1, 0, None, None, None, None)]
        for call in calls:
            with self.assertRaises(ImportError) as cm:
                call()
            self.assertEqual(str(cm.exception), ops.unavailable_reason)
        self.assertEqual(ops.OPS, {})

    def test_public_functions_are_annotated(self):
        for name in ("register", "unregister", "lookup", "token", "write", "decode", "attend"):
            fn = getattr(ops, name)
            sig = inspect.signature(fn)
            for p in sig.parameters.values():
                self.assertIsNot(p.annotation, p.empty, "%s: parameter %s" % (name, p.name))
            self.assertIsNot(sig.return_annotation, sig.empty, "%s: return" % name)
            typing.get_type_hints(fn)  # resolves, with or without torch


@unittest.skipUnless(ops.available, "needs torch >= 2.4: %s" % ops.unavailable_reason)
class TorchOpsCpuTest(unittest.TestCase):
    CONTEXTS = [9, 4, 2]   # attend: context lengths
    CHUNKS = [5, 0, 2]     # and query tokens per sequence

    def setUp(self):
        self.msg = seeded(self)
        torch._dynamo.reset()

    def new_cache(self, **kw):
        geo = dict(num_blocks=16, num_kv_heads=HKV, head_size=HD, block_size=8, num_layers=2,
                   k_dtype="fp16", v_dtype="int8")
        geo.update(kw)
        c = kvpage.Cache(**geo)
        self.addCleanup(c.close)
        return c

    def decoder(self, cache, **kw):
        d = cache.decoder(HQ, len(self.CONTEXTS), 64, max_query_len=max(self.CHUNKS),
                          q_dtype="fp32", out_dtype="fp32", **kw)
        h = ops.register(d)
        self.addCleanup(ops.unregister, h)
        self.addCleanup(ops.unregister, cache)
        return d, h

    def fill(self, cache, lens, layers=(0, 1)):
        table, slots = make_batch(cache, lens)
        for layer in layers:
            k = torch.randn(len(slots), HKV, HD)
            cache.write(layer, k, torch.randn_like(k), slots)
        return table, torch.tensor(lens, dtype=torch.int32)

    def ragged(self):
        """A ragged attend batch: query_starts and q of CHUNKS tokens."""
        starts = [0]
        for n in self.CHUNKS:
            starts.append(starts[-1] + n)
        return (torch.tensor(starts, dtype=torch.int32),
                torch.randn(starts[-1], HQ, HD))

    # -- schemas and registry -------------------------------------------------

    def test_schemas(self):
        want = {
            "cache_write": (["handle", "layer", "key", "value", "slot_mapping", "token"],
                            {"token"}),
            "decode": (["handle", "layer", "q", "block_table", "seq_lens", "out", "lse",
                        "query_len", "sliding_window", "sm_scale", "logits_soft_cap",
                        "alibi_slopes", "token"], {"out", "lse"}),
            "attend": (["handle", "layer", "q", "query_starts", "block_table", "seq_lens",
                        "out", "lse", "sliding_window", "sm_scale", "logits_soft_cap",
                        "alibi_slopes", "token"], {"out", "lse"}),
        }
        for name, (args, mutated) in want.items():
            schema = getattr(torch.ops.kvpage, name).default._schema
            self.assertEqual([a.name for a in schema.arguments], args, str(schema))
            self.assertEqual({a.name for a in schema.arguments
                              if a.alias_info is not None and a.alias_info.is_write},
                             mutated, str(schema))
            self.assertTrue(schema.is_mutable)
            self.assertEqual(len(schema.returns), 0, str(schema))

    def test_registry(self):
        c = self.new_cache()
        d, hd = self.decoder(c)
        hc = ops.register(c)
        self.assertIsInstance(hc, int)
        self.assertNotEqual(hc, hd)
        self.assertEqual(ops.register(c), hc)
        self.assertEqual(ops.register(d), hd)
        self.assertIs(ops.lookup(hc), c)
        self.assertIs(ops.lookup(hd), d)
        self.assertIs(ops.token(hd), ops.token(hc))  # one token per cache
        self.assertEqual(ops.token(hc).device.type, "cpu")
        other = self.new_cache()
        ho = ops.register(other)
        self.assertIsNot(ops.token(ho), ops.token(hc))
        ops.unregister(other)
        with self.assertRaises(kvpage.InvalidArgumentError):
            ops.lookup(ho)
        with self.assertRaises(kvpage.InvalidArgumentError):
            ops.write(ho, 0, torch.zeros(1, HKV, HD), torch.zeros(1, HKV, HD),
                      torch.zeros(1, dtype=torch.int64))
        with self.assertRaises(TypeError):
            ops.register("a cache")
        # Attention needs a decoder's handle.
        table, lens = self.fill(c, [3])
        with self.assertRaises(kvpage.InvalidArgumentError) as cm:
            ops.decode(hc, 0, torch.randn(1, HQ, HD), table, lens,
                       out=torch.empty(1, HQ, HD))
        self.assertIn("decoder", cm.exception.message)
        closed = self.new_cache()
        closed.close()
        with self.assertRaises(kvpage.InvalidArgumentError):
            ops.register(closed)

    # -- the operators against the binding's direct calls ---------------------

    def test_write_matches_binding(self):
        a, b = self.new_cache(), self.new_cache()
        ha = ops.register(a)
        self.addCleanup(ops.unregister, ha)
        table, slots = make_batch(a, [17, 40, 3])
        n = len(slots)
        for layer in (0, 1):
            # K and V as slices of a fused projection: strided rows.
            qkv = torch.randn(n, (HQ + 2 * HKV) * HD, dtype=torch.bfloat16)
            k = qkv[:, HQ * HD:(HQ + HKV) * HD].view(n, HKV, HD)
            v = qkv[:, (HQ + HKV) * HD:].view(n, HKV, HD)
            ops.write(ha, layer, k, v, slots)
            b.write(layer, k, v, slots)
            for name, buf in b.layer_buffers(layer).items():
                self.assertEqual(bytes(a.layer_buffers(layer)[name]), bytes(buf),
                                 "%s layer %d %s" % (self.msg, layer, name))
        self.assertEqual(a.write_stats(), b.write_stats())

    def test_decode_matches_binding(self):
        c = self.new_cache()
        d, hd = self.decoder(c)
        lens = [5, 33, 2]
        table, lens_t = self.fill(c, lens)
        q = torch.randn(3 * 2, HQ, HD)
        opts = dict(query_len=2, sliding_window=20, sm_scale=0.15, logits_soft_cap=4.0,
                    alibi_slopes=torch.rand(HQ) * 0.3)
        for layer in (0, 1):
            want = torch.full((6, HQ, HD), float("nan"))
            want_lse = torch.full((6 * HQ,), float("nan"))
            d.decode(q, table, lens_t, out=want, lse=want_lse, layer=layer, **opts)
            out = torch.full_like(want, float("nan"))
            lse = torch.full_like(want_lse, float("nan"))
            torch.ops.kvpage.decode(hd, layer, q, table, lens_t, out, lse,
                                    opts["query_len"], opts["sliding_window"],
                                    opts["sm_scale"], opts["logits_soft_cap"],
                                    opts["alibi_slopes"], ops.token(hd))
            self.assertTrue(bool(torch.isfinite(want).all()), self.msg)
            self.assertTrue(torch.equal(out, want), "%s layer %d" % (self.msg, layer))
            self.assertTrue(torch.equal(lse, want_lse), "%s layer %d lse" % (self.msg, layer))
            # The wrapper: out allocated [rows of q, HQ, HD] in out_dtype.
            got = ops.decode(hd, layer, q, table, lens_t, **opts)
            self.assertEqual((got.shape, got.dtype), (want.shape, torch.float32))
            self.assertTrue(torch.equal(got, want), self.msg)
        # The binding's own checks still apply (q rows != num_seqs * query_len).
        with self.assertRaises(BAD_ARGUMENT):
            ops.decode(hd, 0, torch.randn(5, HQ, HD), table, lens_t, query_len=2)

    def test_attend_matches_binding(self):
        c = self.new_cache()
        d, hd = self.decoder(c)
        table, lens_t = self.fill(c, self.CONTEXTS)
        starts, q = self.ragged()
        tokens = q.shape[0]
        slopes = torch.rand(HQ) * 0.3
        for opts in ({}, dict(sliding_window=3, sm_scale=0.1, logits_soft_cap=4.0,
                              alibi_slopes=slopes)):
            for layer in (0, 1):
                want = torch.full((tokens, HQ, HD), float("nan"))
                want_lse = torch.full((tokens * HQ,), float("nan"))
                d.attend(q, starts, table, lens_t, out=want, lse=want_lse, layer=layer, **opts)
                out = torch.full_like(want, float("nan"))
                lse = torch.full_like(want_lse, float("nan"))
                res = ops.attend(hd, layer, q, starts, table, lens_t, out, lse, **opts)
                self.assertIs(res, out)
                self.assertTrue(bool(torch.isfinite(want).all()), self.msg)
                what = "%s layer %d %s" % (self.msg, layer, sorted(opts))
                self.assertTrue(torch.equal(out, want), what)
                self.assertTrue(torch.equal(lse, want_lse), what + " lse")

    # -- tracing and compiling --------------------------------------------------

    def step_fn(self, hc, hd):
        """write this step's K/V, then attend over the contexts."""
        def step(q, k, v, slots, starts, table, lens):
            ops.write(hc, 1, k, v, slots)
            return ops.attend(hd, 1, q, starts, table, lens) * 1.0
        return step

    def step_inputs(self, cache):
        """A ragged step: contexts filled up to their last CHUNKS tokens, which
        the step writes, then attends to."""
        table, _ = self.fill(cache, self.CONTEXTS, layers=())
        bs = cache.block_size
        slots, old = [], []
        for s, (n, m) in enumerate(zip(self.CONTEXTS, self.CHUNKS)):
            old += [slot_of(table, bs, s, p) for p in range(n - m)]
            slots += [slot_of(table, bs, s, p) for p in range(n - m, n)]
        k_old = torch.randn(len(old), HKV, HD)
        starts, q = self.ragged()
        k = torch.randn(len(slots), HKV, HD)
        return (torch.tensor(old), k_old, torch.randn_like(k_old)), \
            (q, k, torch.randn_like(k), torch.tensor(slots), starts, table,
             torch.tensor(self.CONTEXTS, dtype=torch.int32))

    def reference(self, prefix, args):
        """The step through the binding alone, on a cache of its own."""
        c = self.new_cache()
        d = c.decoder(HQ, len(self.CONTEXTS), 64, max_query_len=max(self.CHUNKS),
                      q_dtype="fp32", out_dtype="fp32")
        old, k_old, v_old = prefix
        c.write(1, k_old, v_old, old)
        q, k, v, slots, starts, table, lens = args
        c.write(1, k, v, slots)
        return d.attend(q, starts, table, lens, layer=1)

    def fresh_step(self):
        """A cache holding the step's prefix, its handles, the step and its
        inputs, and the binding's result."""
        c = self.new_cache()
        d, hd = self.decoder(c)
        hc = ops.register(c)
        prefix, args = self.step_inputs(c)
        old, k_old, v_old = prefix
        c.write(1, k_old, v_old, old)
        return self.step_fn(hc, hd), args, self.reference(prefix, args)

    def test_fx_symbolic_trace(self):
        step, args, want = self.fresh_step()
        gm = torch.fx.symbolic_trace(step)
        gm.graph.eliminate_dead_code()  # the write returns nothing: it must stay
        gm.recompile()
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        w = torch.ops.kvpage.cache_write.default
        a = torch.ops.kvpage.attend.default
        self.assertIn(w, targets, str(gm.graph))
        self.assertIn(a, targets, str(gm.graph))
        self.assertLess(targets.index(w), targets.index(a))
        got = gm(*args)  # the first call that writes this step's K/V
        self.assertTrue(torch.equal(got, want), self.msg)

    def test_compile_fullgraph_eager_backend(self):
        step, args, want = self.fresh_step()
        graphs = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        got = torch.compile(step, fullgraph=True, backend=backend)(*args)
        self.assertEqual(len(graphs), 1)
        targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
        w = torch.ops.kvpage.cache_write.default
        a = torch.ops.kvpage.attend.default
        self.assertEqual(targets.count(w), 1, str(graphs[0].graph))
        self.assertLess(targets.index(w), targets.index(a), str(graphs[0].graph))
        self.assertTrue(torch.equal(got, want), self.msg)

    def test_compile_fullgraph_aot_eager(self):
        # Through AOTAutograd: functionalization keeps the write (it mutates
        # the token) and runs it before the attention (which reads the token).
        step, args, want = self.fresh_step()
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        self.assertTrue(torch.equal(compiled(*args), want), self.msg)
        self.assertTrue(torch.equal(compiled(*args), want), self.msg)  # cached graph

    def test_functionalized_attend_depends_on_write(self):
        # After functionalization nothing but the token ties the attention to
        # the write: the attention node must have the write among its inputs'
        # ancestors, so that no scheduler can run it first.
        from torch._dynamo.backends.common import aot_autograd
        step, args, want = self.fresh_step()
        graphs = []

        def fw(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        got = torch.compile(step, fullgraph=True, backend=aot_autograd(fw_compiler=fw))(*args)
        self.assertTrue(torch.equal(got, want), self.msg)
        self.assertEqual(len(graphs), 1)
        nodes = list(graphs[0].graph.nodes)

        def calls(op):  # the op itself, or a functionalization wrapper of it
            return [n for n in nodes if n.op == "call_function"
                    and (n.target is op or (n.args and n.args[0] is op))]

        writes = calls(torch.ops.kvpage.cache_write.default)
        attends = calls(torch.ops.kvpage.attend.default)
        self.assertEqual((len(writes), len(attends)), (1, 1), str(graphs[0].graph))
        seen, todo = set(), list(attends[0].all_input_nodes)
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(n.all_input_nodes)
        self.assertIn(writes[0], seen, str(graphs[0].graph))

    @unittest.skipUnless(shutil.which("c++") or shutil.which("g++"),
                         "inductor on the CPU needs a C++ compiler")
    def test_compile_fullgraph_inductor(self):
        step, args, want = self.fresh_step()
        compiled = torch.compile(step, fullgraph=True)
        self.assertTrue(torch.equal(compiled(*args), want), self.msg)
        self.assertTrue(torch.equal(compiled(*args), want), self.msg)

    def test_decode_step_compiled(self):
        if shutil.which("c++") or shutil.which("g++"):
            decode_step(self, "cpu", torch.compile(fullgraph=True))
        else:  # inductor on the CPU needs a C++ compiler
            decode_step(self, "cpu", torch.compile(fullgraph=True, backend="aot_eager"))

    def test_compile_decode_with_out_and_lse(self):
        c = self.new_cache()
        d, hd = self.decoder(c)
        table, lens = self.fill(c, [5, 33, 2])
        q = torch.randn(3, HQ, HD)
        want = torch.empty(3, HQ, HD)
        want_lse = torch.empty(3 * HQ)
        d.decode(q, table, lens, out=want, lse=want_lse, sm_scale=0.2)

        def f(q, table, lens, out, lse):
            ops.decode(hd, 0, q, table, lens, out, lse, sm_scale=0.2)
            return out + 0.0, lse + 0.0

        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            out = torch.full((3, HQ, HD), float("nan"))
            lse = torch.full((3 * HQ,), float("nan"))
            got, got_lse = torch.compile(f, fullgraph=True, backend=backend)(
                q, table, lens, out, lse)
            self.assertTrue(torch.equal(got, want), "%s %s" % (self.msg, backend))
            self.assertTrue(torch.equal(got_lse, want_lse), "%s %s" % (self.msg, backend))
            # The mutation reaches the caller's tensors too.
            self.assertTrue(torch.equal(out, want), "%s %s" % (self.msg, backend))
            self.assertTrue(torch.equal(lse, want_lse), "%s %s" % (self.msg, backend))

    # -- fake implementations ---------------------------------------------------

    def test_opcheck(self):
        c = self.new_cache()
        d, hd = self.decoder(c)
        table, lens = self.fill(c, self.CONTEXTS)
        tok = ops.token(hd)
        k = torch.randn(3, HKV, HD)
        slots = torch.tensor([table[0, 0].item() * 8 + 1, -1, table[2, 0].item() * 8])
        q = torch.randn(3, HQ, HD)
        starts, qa = self.ragged()
        checks = [
            (torch.ops.kvpage.cache_write.default, (hd, 0, k, torch.randn_like(k), slots, tok)),
            (torch.ops.kvpage.decode.default,
             (hd, 0, q, table, lens, torch.empty(3, HQ, HD), torch.empty(3 * HQ), 1, 0, 0.0,
              0.0, None, tok)),
            (torch.ops.kvpage.decode.default,
             (hd, 1, q, table, lens, torch.empty(3, HQ, HD), None, 1, 4, 0.3, 5.0,
              torch.rand(HQ), None)),
            (torch.ops.kvpage.attend.default,
             (hd, 0, qa, starts, table, lens, torch.empty_like(qa), torch.empty(len(qa) * HQ),
              0, 0.0, 0.0, None, tok)),
        ]
        if not hasattr(torch.library, "opcheck"):
            self.skipTest("torch.library.opcheck is missing")
        for op, args in checks:
            result = torch.library.opcheck(op, args, test_utils=OPCHECK_UTILS)
            self.assertEqual(set(result.values()), {"SUCCESS"}, "%s: %s" % (op, result))

    def test_fake_impls_check_metadata_only(self):
        # Meta tensors reach the fake implementations: shapes and dtypes are
        # checked, no data is read, and the library is not called.
        c = self.new_cache()
        d, hd = self.decoder(c)
        m = torch.device("meta")

        def t(*shape, dtype=torch.float32):
            return torch.empty(*shape, dtype=dtype, device=m)

        tok = t(1, dtype=torch.int32)
        table, lens = t(3, 2, dtype=torch.int32), t(3, dtype=torch.int32)
        starts = t(4, dtype=torch.int32)
        good = [
            lambda: torch.ops.kvpage.cache_write(hd, 0, t(5, HKV, HD), t(5, HKV * HD),
                                                 t(5, dtype=torch.int64), tok),
            lambda: torch.ops.kvpage.decode(hd, 0, t(6, HQ, HD), table, lens, t(6, HQ * HD),
                                            t(6 * HQ), 2),
            lambda: torch.ops.kvpage.attend(hd, 0, t(7, HQ, HD), starts, table, lens,
                                            t(9, HQ, HD), t(9 * HQ)),
            # lse None, every option at its default
            lambda: torch.ops.kvpage.decode(hd, 0, t(3, HQ, HD), table, lens, t(3, HQ, HD),
                                            None),
            lambda: torch.ops.kvpage.attend(hd, 0, t(7, HQ, HD), starts, table, lens,
                                            t(7, HQ, HD), None),
        ]
        for call in good:
            self.assertIsNone(call())
        bad = [
            # key rows != slot_mapping; value dtype; slot_mapping int32
            lambda: torch.ops.kvpage.cache_write(hd, 0, t(4, HKV, HD), t(4, HKV, HD),
                                                 t(5, dtype=torch.int64), tok),
            lambda: torch.ops.kvpage.cache_write(hd, 0, t(5, HKV, HD),
                                                 t(5, HKV, HD, dtype=torch.float16),
                                                 t(5, dtype=torch.int64), tok),
            lambda: torch.ops.kvpage.cache_write(hd, 0, t(5, HKV, HD), t(5, HKV, HD),
                                                 t(5, dtype=torch.int32), tok),
            # q dtype (the decoder's is FP32); rows; flat block table; lse size
            lambda: torch.ops.kvpage.decode(hd, 0, t(3, HQ, HD, dtype=torch.bfloat16), table,
                                            lens, t(3, HQ, HD), None),
            lambda: torch.ops.kvpage.decode(hd, 0, t(4, HQ, HD), table, lens, t(4, HQ, HD),
                                            None),
            lambda: torch.ops.kvpage.decode(hd, 0, t(3, HQ, HD), t(6, dtype=torch.int32), lens,
                                            t(3, HQ, HD), None),
            lambda: torch.ops.kvpage.decode(hd, 0, t(3, HQ, HD), table, lens, t(3, HQ, HD),
                                            t(3)),
            # attend: query_starts int64; out not whole rows
            lambda: torch.ops.kvpage.attend(hd, 0, t(7, HQ, HD), t(4, dtype=torch.int64), table,
                                            lens, t(7, HQ, HD), None),
            lambda: torch.ops.kvpage.attend(hd, 0, t(7, HQ, HD), starts, table, lens,
                                            t(7 * HQ * HD + 1), None),
        ]
        for i, call in enumerate(bad):
            with self.assertRaises(BAD_ARGUMENT, msg="bad call %d" % i):
                call()
        # Still metadata only once the cache is gone.
        c.close()
        for call in good:
            self.assertIsNone(call())


def decode_step(test, dev, compile_fn, graph=False):
    """One transformer layer's decode step: QKV projection, the new token's
    K/V written to the cache, decode, output projection; compiled with
    compile_fn (and captured in a CUDA graph when graph is set) against the
    eager step, for two steps."""
    B, hidden, D, heads, kv_heads, bs = 4, 256, 128, 8, 2, 16
    cache = kvpage.Cache(num_blocks=128, num_kv_heads=kv_heads, head_size=D, block_size=bs,
                         dtype="bf16", device=dev)
    test.addCleanup(cache.close)
    dec = cache.decoder(heads, B, 1024)  # BF16 q and out
    hc, hd = ops.register(cache), ops.register(dec)
    test.addCleanup(ops.unregister, hd)
    test.addCleanup(ops.unregister, hc)
    w_qkv = torch.randn(hidden, (heads + 2 * kv_heads) * D, device=dev,
                        dtype=torch.bfloat16) * hidden ** -0.5
    w_o = torch.randn(heads * D, hidden, device=dev, dtype=torch.bfloat16) * (heads * D) ** -0.5

    def step(x, slots, table, lens):
        qkv = x @ w_qkv
        q = qkv[:, :heads * D].view(-1, heads, D)
        k = qkv[:, heads * D:(heads + kv_heads) * D].view(-1, kv_heads, D)
        v = qkv[:, (heads + kv_heads) * D:].view(-1, kv_heads, D)
        ops.write(hc, 0, k, v, slots)
        attn = ops.decode(hd, 0, q, table, lens)
        return attn.view(-1, heads * D) @ w_o

    # Contexts (the last sequence is padding: length 0, slot -1), written
    # but for their last token, which the step writes; room for one more.
    lens = [37, 1, 200, 0]
    host_table, _ = make_batch(cache, [n + 1 for n in lens])
    for s, n in enumerate(lens):
        if n > 1:
            k = torch.randn(n - 1, kv_heads, D, device=dev, dtype=torch.bfloat16)
            cache.write(0, k, torch.randn_like(k),
                        [slot_of(host_table, bs, s, p) for p in range(n - 1)])
    table = host_table.to(dev)

    def inputs(lens):
        slots = [slot_of(host_table, bs, s, n - 1) if n else -1 for s, n in enumerate(lens)]
        return (torch.randn(B, hidden, device=dev, dtype=torch.bfloat16),
                torch.tensor(slots, device=dev), table,
                torch.tensor(lens, dtype=torch.int32, device=dev))

    def close(got, want, what):
        if dev != "cpu":
            torch.cuda.synchronize()
        test.assertTrue(bool(torch.isfinite(got).all()), "%s %s" % (test.msg, what))
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2,
                                   msg=lambda m: "%s %s: %s" % (test.msg, what, m))
        test.assertTrue(bool((got[3] == 0).all()), "%s %s: padding row" % (test.msg, what))

    args = inputs(lens)
    want = step(*args)
    compiled = compile_fn(step)
    close(compiled(*args), want, "compiled")
    run = compiled
    if graph:
        # Capture the compiled step (warmed up on a side stream first).
        static = [a.clone() for a in args]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                compiled(*static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = compiled(*static)

        def run(*new):
            for dst, src in zip(static, new):
                dst.copy_(src)
            g.replay()
            return static_out.clone()
    # The next token, one more each (padding stays padding). The compiled
    # step writes it before the eager one does: a missing or late write
    # shows (sequence 1 then attends to 2 tokens, one of them unwritten).
    lens = [n + 1 if n else 0 for n in lens]
    args = inputs(lens)
    got = run(*args)
    close(got, step(*args), "graph replay" if graph else "second step")


@unittest.skipUnless(HAS_CUDA, "needs torch >= 2.4 with CUDA and a CUDA build of libkvpage")
class TorchOpsCudaTest(unittest.TestCase):
    def setUp(self):
        self.msg = seeded(self)
        torch._dynamo.reset()

    def test_attend_matches_binding(self):
        with kvpage.Cache(num_blocks=64, num_kv_heads=HKV, head_size=128, block_size=16,
                          dtype="int8", device="cuda") as c:
            lens = [300, 7, 64]
            table, slots = make_batch(c, lens, "cuda")
            k = torch.randn(len(slots), HKV, 128, device="cuda", dtype=torch.bfloat16)
            hc = ops.register(c)
            self.addCleanup(ops.unregister, hc)
            ops.write(hc, 0, k, torch.randn_like(k), slots)
            d = c.decoder(8, 3, 512, max_query_len=4)
            hd = ops.register(d)
            self.addCleanup(ops.unregister, hd)
            starts = torch.tensor([0, 4, 5, 7], dtype=torch.int32, device="cuda")
            lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
            q = torch.randn(7, 8, 128, device="cuda", dtype=torch.bfloat16)
            want = d.attend(q, starts, table, lens_t)
            got = ops.attend(hd, 0, q, starts, table, lens_t)
            torch.cuda.synchronize()
            self.assertTrue(torch.equal(got, want), self.msg)
            checks = [
                (torch.ops.kvpage.cache_write.default,
                 (hc, 0, k, torch.randn_like(k), slots, ops.token(hc))),
                (torch.ops.kvpage.attend.default,
                 (hd, 0, q, starts, table, lens_t, torch.empty_like(q),
                  torch.empty(7 * 8, device="cuda"), 0, 0.0, 0.0, None, ops.token(hd))),
                (torch.ops.kvpage.decode.default,
                 (hd, 0, q[:3], table, lens_t, torch.empty_like(q[:3]), None, 1, 0, 0.0, 0.0,
                  None, ops.token(hd))),
            ]
            for op, args in checks:
                result = torch.library.opcheck(op, args, test_utils=OPCHECK_UTILS)
                self.assertEqual(set(result.values()), {"SUCCESS"}, "%s: %s" % (op, result))

    def test_decode_step_compiled_and_graphed(self):
        decode_step(self, "cuda", torch.compile(fullgraph=True), graph=True)


if __name__ == "__main__":
    unittest.main()
