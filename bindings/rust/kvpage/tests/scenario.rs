// SPDX-License-Identifier: Apache-2.0
//! The binding end to end on the CPU backend: sequences (create, append,
//! fork with copy-on-write, truncate, free), writes, block tables and
//! decodes, checked against a float64 attention computed here.
//!
//! Inputs are fresh random numbers on every run; the seed is printed in
//! every failure and `KVPAGE_TEST_SEED=<n>` replays one. Outputs are
//! poisoned with NaN before each call.
//!
//! Tolerances:
//! - FP16 cache written from FP16 (or FP16-representable FP32) inputs holds
//!   the inputs exactly, and the CPU backend computes in double and rounds
//!   once to the output type, so the only error is that last rounding:
//!   |out - ref| <= 2^-20 |ref| + 1e-6 for FP32 outputs (half an ulp is
//!   2^-24; the slack covers a different summation order), 2^-10 |ref| +
//!   1e-6 for FP16 outputs (half an ulp is 2^-11). LSE (FP32): 1e-5 relative.
//! - INT8 cache: against float64 attention over the cache *as stored*
//!   (dequantized through `Cache::layout`), the same FP32 tolerance; against
//!   attention over the original inputs, a bound computed from the data:
//!   each INT8 element is off by at most half a step, step = FP16(amax/127)
//!   rounded up (<= amax/127 * (1 + 2^-10)); a logit moves by at most
//!   dl = sm_scale * sum|q| * max K error, which moves the softmax weights by
//!   at most 2 dl in l1 norm, so |out - ref| <= max V error + 2 dl max|v|.
use std::time::{SystemTime, UNIX_EPOCH};

use kvpage::{
    AttendArgs, Cache, CacheConfig, DType, DecodeArgs, DecodeConfig, Element, ErrorCode, SeqId,
    WriteArgs, F16,
};

// ---------------------------------------------------------------------------
// Random numbers (splitmix64 + Box-Muller), seeded afresh unless replayed
// ---------------------------------------------------------------------------

struct Rng {
    seed: u64,
    state: u64,
}

impl Rng {
    fn new() -> Rng {
        let seed = match std::env::var("KVPAGE_TEST_SEED") {
            Ok(s) => s.parse().expect("KVPAGE_TEST_SEED must be an integer"),
            Err(_) => {
                let t = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64;
                let local = 0u8;
                t ^ (std::process::id() as u64).rotate_left(32) ^ (&local as *const u8 as u64)
            }
        };
        Rng { seed, state: seed }
    }
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }
    fn normal(&mut self) -> f32 {
        let mut u = self.uniform();
        while u <= 0.0 {
            u = self.uniform();
        }
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()) as f32
    }
    fn normals(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal()).collect()
    }
    /// Values exactly representable in FP16 (so an FP16 cache holds them).
    fn halves(&mut self, n: usize) -> Vec<F16> {
        (0..n).map(|_| F16::from_f32(self.normal())).collect()
    }
}

// ---------------------------------------------------------------------------
// The float64 reference
// ---------------------------------------------------------------------------

const LAYERS: usize = 2;
const BLOCK: i32 = 16;
const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
const D: usize = 64;
const DENSE: usize = KV_HEADS * D;

/// What a sequence holds in one layer: K and V per token, `[t][kv_head][d]`.
#[derive(Clone, Default)]
struct SeqKv {
    k: Vec<f64>,
    v: Vec<f64>,
}

impl SeqKv {
    fn len(&self) -> usize {
        self.k.len() / DENSE
    }
    fn push<T: Element>(&mut self, k: &[T], v: &[T]) {
        self.k.extend(k.iter().map(|x| x.to_f32() as f64));
        self.v.extend(v.iter().map(|x| x.to_f32() as f64));
    }
    fn truncate(&mut self, len: usize) {
        self.k.truncate(len * DENSE);
        self.v.truncate(len * DENSE);
    }
}

/// New sequences of `lens` tokens, random FP16 K and V written to layer 0,
/// and their models.
fn fill_fp16(cache: &Cache, rng: &mut Rng, lens: &[usize]) -> (Vec<SeqId>, Vec<SeqKv>) {
    let mut seqs = Vec::new();
    let mut models = Vec::new();
    for &n in lens {
        let s = cache.create_seq().unwrap();
        let slots = cache.append(s, n).unwrap();
        let (k, v) = (rng.halves(n * DENSE), rng.halves(n * DENSE));
        cache.write(&WriteArgs::new(0, &k, &v, &slots)).unwrap();
        let mut m = SeqKv::default();
        m.push(&k, &v);
        models.push(m);
        seqs.push(s);
    }
    (seqs, models)
}

#[derive(Clone, Copy, Default)]
struct Options {
    sm_scale: f64, // 0 = 1/sqrt(D)
    soft_cap: f64,
    window: usize,
    alibi: bool,
}

fn alibi_slopes() -> Vec<f32> {
    (0..Q_HEADS).map(|h| 2f32.powi(-(h as i32 + 1))).collect()
}

/// out `[s][h][d]` and lse `[s][h]` for one query token per sequence, as
/// `kvp_decode` defines them.
fn reference(q: &[f64], seqs: &[&SeqKv], o: Options) -> (Vec<f64>, Vec<f64>) {
    let scale = if o.sm_scale != 0.0 {
        o.sm_scale
    } else {
        1.0 / (D as f64).sqrt()
    };
    let slopes = alibi_slopes();
    let group = Q_HEADS / KV_HEADS;
    let mut out = vec![0.0; seqs.len() * Q_HEADS * D];
    let mut lse = vec![f64::NEG_INFINITY; seqs.len() * Q_HEADS];
    for (s, kv) in seqs.iter().enumerate() {
        let len = kv.len();
        if len == 0 {
            continue;
        }
        let pos = len - 1;
        for h in 0..Q_HEADS {
            let kvh = h / group;
            let row = s * Q_HEADS + h;
            let qv = &q[row * D..(row + 1) * D];
            let mut logits = Vec::new();
            for j in 0..len {
                if o.window > 0 && j + o.window <= pos {
                    continue;
                }
                let k = &kv.k[j * DENSE + kvh * D..j * DENSE + (kvh + 1) * D];
                let mut l = scale * qv.iter().zip(k).map(|(a, b)| a * b).sum::<f64>();
                if o.soft_cap > 0.0 {
                    l = o.soft_cap * (l / o.soft_cap).tanh();
                }
                if o.alibi {
                    l += slopes[h] as f64 * (j as f64 - pos as f64);
                }
                logits.push((j, l));
            }
            let m = logits
                .iter()
                .map(|&(_, l)| l)
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = logits.iter().map(|&(_, l)| (l - m).exp()).sum();
            for &(j, l) in &logits {
                let w = (l - m).exp() / sum;
                for d in 0..D {
                    out[row * D + d] += w * kv.v[j * DENSE + kvh * D + d];
                }
            }
            lse[row] = m + sum.ln();
        }
    }
    (out, lse)
}

/// Every element within `abs + rel * |ref|`; NaN (poison left) fails.
fn expect_close<T: Element>(what: &str, seed: u64, got: &[T], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len(), "{}", what);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let g = g.to_f32() as f64;
        let err = (g - w).abs();
        assert!(
            err <= abs + rel * w.abs(),
            "{} (seed {}): element {} is {}, reference {} (|err| {:e} > {:e} + {:e}|ref|)",
            what,
            seed,
            i,
            g,
            w,
            err,
            abs,
            rel
        );
    }
}

fn poisoned<T: Element>(n: usize) -> Vec<T> {
    vec![T::from_f32(f32::NAN); n]
}

// ---------------------------------------------------------------------------
// Write + decode + fork + free on an FP16 cache
// ---------------------------------------------------------------------------

#[test]
fn write_decode_fork_free_fp16() {
    let mut rng = Rng::new();
    let seed = rng.seed;
    let num_blocks = 12;
    let cache = Cache::new(&CacheConfig {
        num_layers: LAYERS as i32,
        block_size: BLOCK,
        head_size: D as i32,
        k_dtype: DType::Fp16,
        v_dtype: DType::Fp16,
        ..CacheConfig::new(num_blocks, KV_HEADS as i32)
    })
    .unwrap();
    let info = *cache.info();
    assert_eq!(
        (
            info.num_layers,
            info.num_blocks,
            info.block_size,
            info.num_kv_heads,
            info.head_size
        ),
        (2, 12, 16, 2, 64)
    );
    assert_eq!((info.k_dtype, info.v_dtype), (DType::Fp16, DType::Fp16));
    assert_eq!(info.bytes_per_token_per_layer, (2 * DENSE * 2) as i64);
    assert_eq!(cache.num_free_blocks().unwrap(), num_blocks);

    // Sequence A: 13 + 7 tokens, so that the second append crosses a block.
    let a = cache.create_seq().unwrap();
    let mut slots_a = cache.append(a, 13).unwrap();
    slots_a.extend(cache.append(a, 7).unwrap());
    assert_eq!(cache.seq_len(a).unwrap(), 20);
    assert_eq!(cache.num_free_blocks().unwrap(), num_blocks - 2);
    for (t, &s) in slots_a.iter().enumerate() {
        assert!(s >= 0 && s < (num_blocks * BLOCK) as i64, "slot {}", s);
        assert_eq!(
            s % BLOCK as i64,
            (t % BLOCK as usize) as i64,
            "slot of token {}",
            t
        );
        assert_eq!(s / BLOCK as i64, slots_a[t / 16 * 16] / BLOCK as i64);
    }

    // Layer 0 from FP16 inputs with a padding token (-1, NaN values that must
    // be skipped); layer 1 from FP32 inputs at a padded token stride whose
    // gaps hold NaN (which must not be read).
    let mut model_a = vec![SeqKv::default(); LAYERS];
    {
        let (k, v) = (rng.halves(20 * DENSE), rng.halves(20 * DENSE));
        let mut kw = k[..7 * DENSE].to_vec();
        let mut vw = v[..7 * DENSE].to_vec();
        kw.extend(vec![F16::from_f32(f32::NAN); DENSE]);
        vw.extend(vec![F16::from_f32(f32::NAN); DENSE]);
        kw.extend_from_slice(&k[7 * DENSE..]);
        vw.extend_from_slice(&v[7 * DENSE..]);
        let mut sm: Vec<i64> = slots_a[..7].to_vec();
        sm.push(-1);
        sm.extend_from_slice(&slots_a[7..]);
        cache.write(&WriteArgs::new(0, &kw, &vw, &sm)).unwrap();
        model_a[0].push(&k, &v);
    }
    {
        let stride = DENSE + 8;
        let (k, v) = (rng.halves(20 * DENSE), rng.halves(20 * DENSE));
        let mut kw = vec![f32::NAN; 20 * stride];
        let mut vw = vec![f32::NAN; 20 * stride];
        for t in 0..20 {
            for i in 0..DENSE {
                kw[t * stride + i] = k[t * DENSE + i].to_f32();
                vw[t * stride + i] = v[t * DENSE + i].to_f32();
            }
        }
        let mut args = WriteArgs::new(1, &kw[..19 * stride + DENSE], &vw, &slots_a);
        args.key_token_stride = stride;
        args.value_token_stride = stride;
        cache.write(&args).unwrap();
        model_a[1].push(&k, &v);
    }
    assert_eq!(
        cache.write_stats().unwrap().non_finite,
        0,
        "a skipped or padding value was read"
    );

    // Fork: B shares A's two blocks; B's first append copies the shared,
    // partly filled last block (copy-on-write), A's then writes in place.
    let b = cache.fork_seq(a).unwrap();
    assert_ne!(a, b);
    assert_eq!(cache.seq_len(b).unwrap(), 20);
    assert_eq!(cache.num_free_blocks().unwrap(), num_blocks - 2);
    let slots_b = cache.append(b, 3).unwrap();
    assert_eq!(
        cache.num_free_blocks().unwrap(),
        num_blocks - 3,
        "copy-on-write takes a block"
    );
    let slots_a2 = cache.append(a, 2).unwrap();
    assert_eq!(
        cache.num_free_blocks().unwrap(),
        num_blocks - 3,
        "A's block is private again"
    );
    assert_eq!(slots_a2, vec![slots_a[19] + 1, slots_a[19] + 2]);
    assert_ne!(slots_b[0] / BLOCK as i64, slots_a[19] / BLOCK as i64);
    assert_eq!(slots_b[0] % BLOCK as i64, 4);

    let mut model_b = model_a.clone();
    for layer in 0..LAYERS {
        let (k, v) = (rng.halves(3 * DENSE), rng.halves(3 * DENSE));
        cache
            .write(&WriteArgs::new(layer as i32, &k, &v, &slots_b))
            .unwrap();
        model_b[layer].push(&k, &v);
        let (k, v) = (rng.halves(2 * DENSE), rng.halves(2 * DENSE));
        cache
            .write(&WriteArgs::new(layer as i32, &k, &v, &slots_a2))
            .unwrap();
        model_a[layer].push(&k, &v);
    }

    // The block table of the batch [A, B].
    let width = 4;
    let table = cache.block_table(&[a, b], width).unwrap();
    assert_eq!(table.seq_lens, vec![22, 23]);
    assert_eq!(table.table.len(), 8);
    assert_eq!(table.table[0] as i64, slots_a[0] / BLOCK as i64);
    assert_eq!(table.table[4], table.table[0], "B shares A's first block");
    assert_ne!(
        table.table[5], table.table[1],
        "B's second block is its copy"
    );
    assert_eq!(table.table[5] as i64, slots_b[0] / BLOCK as i64);
    assert_eq!(&table.table[2..4], &[0, 0]);
    assert_eq!(&table.table[6..8], &[0, 0]);

    // Decode both layers: FP32 q/out with LSE, then FP16 q/out with options.
    let mut dec32 = cache
        .decoder(&DecodeConfig {
            q_dtype: DType::Fp32,
            out_dtype: DType::Fp32,
            ..DecodeConfig::new(Q_HEADS as i32, 4, 64)
        })
        .unwrap();
    let mut dec16 = cache
        .decoder(&DecodeConfig {
            q_dtype: DType::Fp16,
            out_dtype: DType::Fp16,
            ..DecodeConfig::new(Q_HEADS as i32, 4, 64)
        })
        .unwrap();
    assert_eq!(cache.decode_workspace_size(dec32.config()).unwrap(), 0);
    for layer in 0..LAYERS {
        let seqs = [&model_a[layer], &model_b[layer]];
        let q = rng.normals(2 * Q_HEADS * D);
        let q64: Vec<f64> = q.iter().map(|&x| x as f64).collect();
        let mut out = poisoned::<f32>(2 * Q_HEADS * D);
        let mut lse = vec![f32::NAN; 2 * Q_HEADS];
        dec32
            .decode(
                &DecodeArgs::new(layer as i32, &q, &table),
                &mut out,
                Some(&mut lse),
            )
            .unwrap();
        let (want, want_lse) = reference(&q64, &seqs, Options::default());
        let what = format!("layer {} FP32 decode", layer);
        expect_close(&what, seed, &out, &want, 2f64.powi(-20), 1e-6);
        let lse_tol: Vec<f64> = want_lse.iter().map(|x| (1.0 + x.abs()) * 1e-5).collect();
        for (i, (&g, &w)) in lse.iter().zip(&want_lse).enumerate() {
            assert!(
                (g as f64 - w).abs() <= lse_tol[i],
                "{}: lse {} = {}, ref {} (seed {})",
                what,
                i,
                g,
                w,
                seed
            );
        }

        let q16 = rng.halves(2 * Q_HEADS * D);
        let q64: Vec<f64> = q16.iter().map(|x| x.to_f32() as f64).collect();
        let slopes = alibi_slopes();
        // sm_scale and the cap as the library sees them (FP32).
        let opts = Options {
            sm_scale: 0.1f32 as f64,
            soft_cap: 5.0,
            window: 9,
            alibi: true,
        };
        let mut args = DecodeArgs::new(layer as i32, &q16, &table);
        args.sm_scale = opts.sm_scale as f32;
        args.logits_soft_cap = opts.soft_cap as f32;
        args.sliding_window = opts.window as i32;
        args.alibi_slopes = Some(&slopes);
        let mut out16 = poisoned::<F16>(2 * Q_HEADS * D);
        dec16.decode(&args, &mut out16, None).unwrap();
        let (want, _) = reference(&q64, &seqs, opts);
        expect_close(
            &format!("layer {} FP16 decode with options", layer),
            seed,
            &out16,
            &want,
            2f64.powi(-10),
            1e-6,
        );
    }

    // Truncate B into its copied block, then decode B alone from a table
    // exported into a caller buffer with a row stride.
    cache.truncate(b, 18).unwrap();
    assert_eq!(cache.num_free_blocks().unwrap(), num_blocks - 3);
    for m in model_b.iter_mut() {
        m.truncate(18);
    }
    let mut tb = vec![-7i32; 6];
    let mut lens = vec![-7i32; 1];
    cache
        .export_block_table(&[b], 3, 6, &mut tb, Some(&mut lens))
        .unwrap();
    assert_eq!(lens, vec![18]);
    assert_eq!(&tb[3..], &[-7, -7, -7], "wrote past max_blocks_per_seq");
    let q = rng.normals(Q_HEADS * D);
    let q64: Vec<f64> = q.iter().map(|&x| x as f64).collect();
    let mut out = poisoned::<f32>(Q_HEADS * D);
    let args = DecodeArgs {
        layer: 1,
        q: &q,
        q_token_stride: 0,
        query_len: 1,
        block_table: &tb[..3],
        block_table_width: 3,
        block_table_stride: 0,
        seq_lens: &lens,
        sliding_window: 0,
        sm_scale: 0.0,
        logits_soft_cap: 0.0,
        alibi_slopes: None,
    };
    dec32.decode(&args, &mut out, None).unwrap();
    let (want, _) = reference(&q64, &[&model_b[1]], Options::default());
    expect_close("B after truncate", seed, &out, &want, 2f64.powi(-20), 1e-6);

    // Free: A's private block goes back, then B's two.
    drop(dec32);
    drop(dec16);
    cache.free_seq(a).unwrap();
    assert_eq!(cache.num_free_blocks().unwrap(), num_blocks - 2);
    cache.free_seq(b).unwrap();
    assert_eq!(cache.num_free_blocks().unwrap(), num_blocks);

    // A freed id is an error naming it, never another sequence.
    let e = cache.seq_len(a).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(
        e.message().contains("seq_id") && e.message().contains(&a.raw().to_string()),
        "{}",
        e
    );
}

// ---------------------------------------------------------------------------
// INT8: the cache as stored, and the original inputs
// ---------------------------------------------------------------------------

/// Layer `layer` of a CPU cache with FP16/BF16/INT8 K and V, dequantized
/// through the public layout: `[block][kv_head][token][d]`.
fn dequantize(cache: &Cache, layer: i32) -> (Vec<f64>, Vec<f64>) {
    let info = cache.info();
    let l = cache.layout(layer).unwrap();
    let (nb, hkv, bs, d) = (
        info.num_blocks as usize,
        info.num_kv_heads as usize,
        info.block_size as usize,
        info.head_size as usize,
    );
    let mut k = vec![0.0; nb * hkv * bs * d];
    let mut v = vec![0.0; nb * hkv * bs * d];
    // SAFETY: the offsets below follow the header's addressing formulas and
    // stay within the layer's k/v data and scale regions; nothing writes the
    // cache meanwhile.
    let byte =
        |p: *mut std::ffi::c_void, off: i64| unsafe { *(p as *const u8).offset(off as isize) };
    let half =
        |p: *mut std::ffi::c_void, off: i64| u16::from_le_bytes([byte(p, off), byte(p, off + 1)]);
    let elem = |dtype: DType, bits: u16, scale: f64| -> f64 {
        match dtype {
            DType::Fp16 => F16::from_bits(bits).to_f32() as f64,
            DType::Bf16 => kvpage::Bf16::from_bits(bits).to_f32() as f64,
            DType::Int8 => (bits as u8 as i8) as f64 * scale,
            other => panic!("dequantize: {:?} not handled here", other),
        }
    };
    for b in 0..nb as i64 {
        for h in 0..hkv as i64 {
            for t in 0..bs as i64 {
                let ks = if l.k_scales.is_null() {
                    0.0
                } else {
                    F16::from_bits(half(
                        l.k_scales,
                        b * l.k_scale_block_stride
                            + h * l.k_scale_head_stride
                            + t * l.k_scale_entry_bytes as i64,
                    ))
                    .to_f32() as f64
                };
                let vs = if l.v_scales.is_null() {
                    0.0
                } else {
                    F16::from_bits(half(
                        l.v_scales,
                        b * l.v_scale_block_stride
                            + h * l.v_scale_head_stride
                            + t * l.v_scale_entry_bytes as i64,
                    ))
                    .to_f32() as f64
                };
                for c in 0..d as i64 {
                    let kbit = (c % l.k_x as i64) * l.k_bits as i64;
                    let koff = b * l.k_block_stride
                        + h * l.k_head_stride
                        + (c / l.k_x as i64) * l.k_chunk_stride
                        + t * 16
                        + kbit / 8;
                    let voff = b * l.v_block_stride
                        + h * l.v_head_stride
                        + c * l.v_channel_stride
                        + t * l.v_bits as i64 / 8;
                    let kc = if l.k_bits == 16 {
                        half(l.k_data, koff)
                    } else {
                        byte(l.k_data, koff) as u16
                    };
                    let vc = if l.v_bits == 16 {
                        half(l.v_data, voff)
                    } else {
                        byte(l.v_data, voff) as u16
                    };
                    let i = (((b as usize * hkv + h as usize) * bs + t as usize) * d) + c as usize;
                    k[i] = elem(info.k_dtype, kc, ks);
                    v[i] = elem(info.v_dtype, vc, vs);
                }
            }
        }
    }
    (k, v)
}

#[test]
fn int8_cache_against_stored_and_original_values() {
    let mut rng = Rng::new();
    let seed = rng.seed;
    let cache = Cache::new(&CacheConfig {
        num_layers: 1,
        block_size: BLOCK,
        head_size: D as i32,
        k_dtype: DType::Int8,
        v_dtype: DType::Int8,
        ..CacheConfig::new(8, KV_HEADS as i32)
    })
    .unwrap();
    let lens = [11usize, 29];
    let mut models = Vec::new();
    let mut seqs = Vec::new();
    let mut amax_k = 0f64;
    let mut amax_v = 0f64;
    for (n, &len) in lens.iter().enumerate() {
        let s = cache.create_seq().unwrap();
        let slots = cache.append(s, len).unwrap();
        let mut k = rng.normals(len * DENSE);
        let v = rng.normals(len * DENSE);
        if n == 1 {
            k[5 * DENSE + 3] = f32::NAN; // stored as 0 and counted
        }
        cache.write(&WriteArgs::new(0, &k, &v, &slots)).unwrap();
        for x in &mut k {
            if !x.is_finite() {
                *x = 0.0;
            }
        }
        for t in 0..len {
            for h in 0..KV_HEADS {
                let r = t * DENSE + h * D..t * DENSE + (h + 1) * D;
                amax_k = k[r.clone()]
                    .iter()
                    .fold(amax_k, |m, x| m.max(x.abs() as f64));
                amax_v = v[r].iter().fold(amax_v, |m, x| m.max(x.abs() as f64));
            }
        }
        let mut m = SeqKv::default();
        m.push(&k, &v);
        models.push(m);
        seqs.push(s);
    }
    let stats = cache.write_stats().unwrap();
    assert_eq!((stats.non_finite, stats.saturated), (1, 0));
    cache.reset_write_stats().unwrap();
    assert_eq!(cache.write_stats().unwrap().non_finite, 0);

    let table = cache.block_table(&seqs, 2).unwrap();
    let mut dec = cache
        .decoder(&DecodeConfig {
            q_dtype: DType::Fp32,
            out_dtype: DType::Fp32,
            ..DecodeConfig::new(Q_HEADS as i32, 2, 32)
        })
        .unwrap();
    let q = rng.normals(2 * Q_HEADS * D);
    let q64: Vec<f64> = q.iter().map(|&x| x as f64).collect();
    let mut out = poisoned::<f32>(2 * Q_HEADS * D);
    dec.decode(&DecodeArgs::new(0, &q, &table), &mut out, None)
        .unwrap();

    // 1. Against the cache as stored: the decode itself, tight.
    let (kq, vq) = dequantize(&cache, 0);
    let stored: Vec<SeqKv> = seqs
        .iter()
        .enumerate()
        .map(|(s, _)| {
            let mut m = SeqKv::default();
            for t in 0..lens[s] {
                let blk = table.table[s * 2 + t / BLOCK as usize] as usize;
                for h in 0..KV_HEADS {
                    let at = ((blk * KV_HEADS + h) * BLOCK as usize + t % BLOCK as usize) * D;
                    m.k.extend_from_slice(&kq[at..at + D]);
                    m.v.extend_from_slice(&vq[at..at + D]);
                }
            }
            m
        })
        .collect();
    let (want, _) = reference(&q64, &[&stored[0], &stored[1]], Options::default());
    expect_close(
        "INT8 decode vs stored cache",
        seed,
        &out,
        &want,
        2f64.powi(-20),
        1e-6,
    );
    // The stored values are the inputs up to half a quantization step.
    let k_err = amax_k / 254.0 * (1.0 + 2f64.powi(-10));
    let v_err = amax_v / 254.0 * (1.0 + 2f64.powi(-10));
    for s in 0..2 {
        for (i, (a, b)) in stored[s].k.iter().zip(&models[s].k).enumerate() {
            assert!(
                (a - b).abs() <= k_err,
                "K {} of seq {}: stored {}, input {} (seed {})",
                i,
                s,
                a,
                b,
                seed
            );
        }
        for (i, (a, b)) in stored[s].v.iter().zip(&models[s].v).enumerate() {
            assert!(
                (a - b).abs() <= v_err,
                "V {} of seq {}: stored {}, input {} (seed {})",
                i,
                s,
                a,
                b,
                seed
            );
        }
    }

    // 2. Against the original inputs: the stated bound.
    let (want, _) = reference(&q64, &[&models[0], &models[1]], Options::default());
    let vmax = amax_v;
    for s in 0..2 {
        for h in 0..Q_HEADS {
            let row = s * Q_HEADS + h;
            let sum_q: f64 = q64[row * D..(row + 1) * D].iter().map(|x| x.abs()).sum();
            let dl = sum_q / (D as f64).sqrt() * k_err;
            let tol = v_err + 2.0 * dl * vmax;
            expect_close(
                "INT8 decode vs inputs",
                seed,
                &out[row * D..(row + 1) * D],
                &want[row * D..(row + 1) * D],
                0.0,
                tol,
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Precise mode (kvp_decode_config.precise, ABI 1.2)
// ---------------------------------------------------------------------------

#[test]
fn precise_decoder_decodes_as_the_default_one() {
    let mut rng = Rng::new();
    let seed = rng.seed;
    assert!(
        !DecodeConfig::default().precise,
        "precise mode is off by default"
    );
    for dtype in [DType::Fp16, DType::Int8] {
        let cache = Cache::new(&CacheConfig {
            head_size: D as i32,
            k_dtype: dtype,
            v_dtype: dtype,
            ..CacheConfig::new(8, KV_HEADS as i32)
        })
        .unwrap();
        let (seqs, models) = fill_fp16(&cache, &mut rng, &[21, 6]);
        let table = cache.block_table(&seqs, 2).unwrap();
        let config = DecodeConfig {
            q_dtype: DType::Fp32,
            out_dtype: DType::Fp32,
            ..DecodeConfig::new(Q_HEADS as i32, 2, 32)
        };
        let mut default = cache.decoder(&config).unwrap();
        let mut precise = cache
            .decoder(&DecodeConfig {
                precise: true,
                ..config.clone()
            })
            .unwrap();
        assert!(precise.config().precise && !default.config().precise);

        let q = rng.normals(2 * Q_HEADS * D);
        let (mut out_d, mut lse_d) = (
            poisoned::<f32>(2 * Q_HEADS * D),
            vec![f32::NAN; 2 * Q_HEADS],
        );
        let (mut out_p, mut lse_p) = (
            poisoned::<f32>(2 * Q_HEADS * D),
            vec![f32::NAN; 2 * Q_HEADS],
        );
        let args = DecodeArgs::new(0, &q, &table);
        default.decode(&args, &mut out_d, Some(&mut lse_d)).unwrap();
        precise.decode(&args, &mut out_p, Some(&mut lse_p)).unwrap();
        // The CPU backend is precise either way: the same bits.
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&out_p),
            bits(&out_d),
            "{:?} out (seed {})",
            dtype,
            seed
        );
        assert_eq!(
            bits(&lse_p),
            bits(&lse_d),
            "{:?} lse (seed {})",
            dtype,
            seed
        );
        if dtype == DType::Fp16 {
            let q64: Vec<f64> = q.iter().map(|&x| x as f64).collect();
            let (want, _) = reference(&q64, &[&models[0], &models[1]], Options::default());
            expect_close(
                "precise FP16 decode",
                seed,
                &out_p,
                &want,
                2f64.powi(-20),
                1e-6,
            );
        }
    }

    // The value reaches kvp_decoder_create: the library refuses 2.
    let cache = Cache::new(&CacheConfig {
        head_size: D as i32,
        ..CacheConfig::new(4, KV_HEADS as i32)
    })
    .unwrap();
    let mut raw = std::ptr::null_mut();
    // SAFETY: kvp_decode_config_init fills the whole struct; live cache
    // handle, an out-pointer; the error object is freed here.
    let message = unsafe {
        let mut c = std::mem::MaybeUninit::<kvpage::kvpage_sys::kvp_decode_config>::zeroed();
        kvpage::kvpage_sys::kvp_decode_config_init(c.as_mut_ptr());
        let mut c = c.assume_init();
        assert_eq!(c.precise, 0, "kvp_decode_config_init: precise mode off");
        c.num_query_heads = Q_HEADS as i32;
        c.max_num_seqs = 1;
        c.max_context_len = 32;
        c.precise = 2;
        let e = kvpage::kvpage_sys::kvp_decoder_create(cache.as_raw(), &c, &mut raw);
        assert!(!e.is_null() && raw.is_null());
        assert_eq!(
            ErrorCode::from_raw(kvpage::kvpage_sys::kvp_error_code(e)),
            ErrorCode::InvalidArgument
        );
        let m = std::ffi::CStr::from_ptr(kvpage::kvpage_sys::kvp_error_message(e))
            .to_string_lossy()
            .into_owned();
        kvpage::kvpage_sys::kvp_error_free(e);
        m
    };
    assert!(message.contains("config->precise = 2"), "{}", message);
}

// ---------------------------------------------------------------------------
// Attention over query chunks (kvp_attend, ABI 1.3)
// ---------------------------------------------------------------------------

const CONTEXTS: [usize; 3] = [9, 4, 2];
const CHUNKS: [usize; 3] = [5, 0, 2]; // query tokens per sequence
const QROW: usize = Q_HEADS * D;

/// An FP16 cache holding CONTEXTS, its models and its block table (width 2).
fn ragged_cache(rng: &mut Rng) -> (Cache, Vec<SeqKv>, kvpage::BlockTable) {
    let cache = Cache::new(&CacheConfig {
        block_size: 8,
        head_size: D as i32,
        k_dtype: DType::Fp16,
        v_dtype: DType::Fp16,
        ..CacheConfig::new(8, KV_HEADS as i32)
    })
    .unwrap();
    let (seqs, models) = fill_fp16(&cache, rng, &CONTEXTS);
    let table = cache.block_table(&seqs, 2).unwrap();
    (cache, models, table)
}

fn query_starts() -> Vec<i32> {
    let mut starts = vec![0i32];
    for &n in &CHUNKS {
        starts.push(starts.last().unwrap() + n as i32);
    }
    starts
}

/// Row i of a sequence's chunk of n tokens equals, bit for bit, the decode
/// of that sequence alone with query_len = n (the CPU backend computes both
/// in double and rounds once), and the float64 reference at its position.
#[test]
fn attend_ragged_batch_equals_decode_per_sequence() {
    let mut rng = Rng::new();
    let seed = rng.seed;
    let (cache, models, table) = ragged_cache(&mut rng);
    let starts = query_starts();
    let tokens = *starts.last().unwrap() as usize;
    let config = DecodeConfig {
        q_dtype: DType::Fp32,
        out_dtype: DType::Fp32,
        max_query_len: 5,
        ..DecodeConfig::new(Q_HEADS as i32, 3, 32)
    };
    assert_eq!(config.max_query_tokens, 0);
    assert_eq!(config.query_token_capacity(), 15);
    let mut dec = cache.decoder(&config).unwrap();
    let slopes = alibi_slopes();
    let plain = Options::default();
    let with_options = Options {
        sm_scale: 0.1f32 as f64,
        soft_cap: 4.0,
        window: 3,
        alibi: true,
    };
    for o in [plain, with_options] {
        let q = rng.normals(tokens * QROW);
        let mut args = AttendArgs::new(0, &q, &starts, &table);
        args.sm_scale = o.sm_scale as f32;
        args.logits_soft_cap = o.soft_cap as f32;
        args.sliding_window = o.window as i32;
        args.alibi_slopes = if o.alibi { Some(&slopes) } else { None };
        // Two rows past the last token: attend leaves them alone.
        let mut out = poisoned::<f32>((tokens + 2) * QROW);
        let mut lse = vec![f32::NAN; (tokens + 2) * Q_HEADS];
        dec.attend(&args, &mut out, Some(&mut lse)).unwrap();
        assert!(
            out[tokens * QROW..].iter().all(|x| x.is_nan())
                && lse[tokens * Q_HEADS..].iter().all(|x| x.is_nan()),
            "attend wrote past query_starts[num_seqs] (seed {})",
            seed
        );
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for (s, &n) in CHUNKS.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let (a, b) = (starts[s] as usize, starts[s + 1] as usize);
            let mut one = DecodeArgs::new(0, &q[a * QROW..b * QROW], &table);
            one.query_len = n as i32;
            one.block_table = &table.table[s * 2..s * 2 + 2];
            one.seq_lens = &table.seq_lens[s..s + 1];
            one.sm_scale = args.sm_scale;
            one.logits_soft_cap = args.logits_soft_cap;
            one.sliding_window = args.sliding_window;
            one.alibi_slopes = args.alibi_slopes;
            let mut want = poisoned::<f32>(n * QROW);
            let mut want_lse = vec![f32::NAN; n * Q_HEADS];
            dec.decode(&one, &mut want, Some(&mut want_lse)).unwrap();
            assert!(want.iter().all(|x| x.is_finite()), "seed {}", seed);
            assert_eq!(
                bits(&out[a * QROW..b * QROW]),
                bits(&want),
                "sequence {}: out (seed {})",
                s,
                seed
            );
            assert_eq!(
                bits(&lse[a * Q_HEADS..b * Q_HEADS]),
                bits(&want_lse),
                "sequence {}: lse (seed {})",
                s,
                seed
            );
            // Token i sits at position p = L - n + i: one query token over
            // the first p + 1 tokens.
            for i in 0..n {
                let mut upto = models[s].clone();
                upto.truncate(CONTEXTS[s] - n + i + 1);
                let row = &q[(a + i) * QROW..(a + i + 1) * QROW];
                let q64: Vec<f64> = row.iter().map(|&x| x as f64).collect();
                let (r, _) = reference(&q64, &[&upto], o);
                expect_close(
                    &format!("attend sequence {} token {}", s, i),
                    seed,
                    &out[(a + i) * QROW..(a + i + 1) * QROW],
                    &r,
                    2f64.powi(-20),
                    1e-6,
                );
            }
        }
    }
    // No sequences: a no-op that succeeds.
    let empty = AttendArgs::<f32> {
        seq_lens: &[],
        block_table: &[],
        query_starts: &[0],
        q: &[],
        ..AttendArgs::new(0, &[], &[], &table)
    };
    dec.attend(&empty, &mut [0f32; 0], None).unwrap();
}

#[test]
fn attend_errors_and_max_query_tokens() {
    let mut rng = Rng::new();
    let (cache, _, table) = ragged_cache(&mut rng);
    let starts = query_starts();
    let tokens = *starts.last().unwrap() as usize;
    let q = rng.normals(tokens * QROW);
    let mut out = vec![0f32; tokens * QROW];
    let fp32 = DecodeConfig {
        q_dtype: DType::Fp32,
        out_dtype: DType::Fp32,
        max_query_len: 2,
        ..DecodeConfig::new(Q_HEADS as i32, 3, 32)
    };

    // From the library: bad query_starts, named.
    let mut dec = cache
        .decoder(&DecodeConfig {
            max_query_tokens: tokens as i32,
            ..fp32.clone()
        })
        .unwrap();
    assert_eq!(dec.config().query_token_capacity(), tokens as i64);
    for bad in [[0, 5, 3, 7], [1, 5, 5, 7], [0, 1, 6, 7]] {
        let e = dec
            .attend(&AttendArgs::new(0, &q, &bad, &table), &mut out, None)
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument);
        assert!(e.message().contains("query_starts"), "{:?}: {}", bad, e);
    }
    // From the binding: too few boundaries, too few rows.
    let e = dec
        .attend(
            &AttendArgs::new(0, &q, &starts[..3], &table),
            &mut out,
            None,
        )
        .unwrap_err();
    assert!(e.message().contains("query_starts has 3 elements"), "{}", e);
    let e = dec
        .attend(
            &AttendArgs::new(0, &q, &starts, &table),
            &mut out[..6 * QROW],
            None,
        )
        .unwrap_err();
    assert!(
        e.message().starts_with("out ") && e.message().contains("query_starts[3] = 7"),
        "{}",
        e
    );
    // max_query_tokens set explicitly is the capacity, whatever max_query_len.
    dec.attend(&AttendArgs::new(0, &q, &starts, &table), &mut out, None)
        .unwrap();
    assert!(out.iter().all(|x| x.is_finite()));

    // Its default: max_num_seqs * max_query_len = 6 < 7 tokens.
    let mut small = cache.decoder(&fp32).unwrap();
    assert_eq!(small.config().query_token_capacity(), 6);
    let e = small
        .attend(&AttendArgs::new(0, &q, &starts, &table), &mut out, None)
        .unwrap_err();
    assert!(e.message().contains("max_query_tokens = 6"), "{}", e);
    let e = cache
        .decoder(&DecodeConfig {
            max_query_tokens: -1,
            ..fp32.clone()
        })
        .unwrap_err();
    assert!(e.message().contains("max_query_tokens = -1"), "{}", e);

    // The raw structs as the library initializes them.
    // SAFETY: the init functions fill the whole structs.
    unsafe {
        use kvpage::kvpage_sys as sys;
        let mut c = std::mem::MaybeUninit::<sys::kvp_decode_config>::zeroed();
        sys::kvp_decode_config_init(c.as_mut_ptr());
        let c = c.assume_init();
        assert_eq!(c.struct_size, sys::KVP_DECODE_CONFIG_STRUCT_SIZE_1_3);
        assert_eq!(c.max_query_tokens, 0);
        let mut a = std::mem::MaybeUninit::<sys::kvp_attend_args>::zeroed();
        sys::kvp_attend_args_init(a.as_mut_ptr());
        let a = a.assume_init();
        assert_eq!(a.struct_size, sys::KVP_ATTEND_ARGS_STRUCT_SIZE_1_3);
        assert_eq!((a.num_seqs, a.reserved0, a.reserved1), (0, 0, 0));
        let api = &*sys::kvp_get_api(sys::KVP_ABI_MAJOR);
        assert!(api.struct_size >= sys::KVP_API_STRUCT_SIZE_1_3 && api.abi_minor >= 3);
        assert!(api.attend.is_some() && api.attend_args_init.is_some());
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

#[test]
fn errors_carry_code_and_argument() {
    // From the library.
    let e = Cache::new(&CacheConfig::new(8, 0)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().contains("num_kv_heads"), "{}", e);
    assert!(e.to_string().starts_with("INVALID_ARGUMENT: "), "{}", e);
    let e = Cache::new(&CacheConfig {
        head_size: 72,
        ..CacheConfig::new(8, 1)
    })
    .unwrap_err();
    assert!(e.message().contains("head_size = 72"), "{}", e);

    let cache = Cache::new(&CacheConfig {
        head_size: D as i32,
        ..CacheConfig::new(4, KV_HEADS as i32)
    })
    .unwrap();
    let s = cache.create_seq().unwrap();
    let e = cache.append(s, 1000).unwrap_err();
    assert_eq!(e.code(), ErrorCode::OutOfBlocks);
    assert_eq!(
        cache.seq_len(s).unwrap(),
        0,
        "a failed append changed the sequence"
    );
    assert_eq!(cache.num_free_blocks().unwrap(), 4);
    let e = cache.fork_seq(SeqId::from_raw(12345)).unwrap_err();
    assert!(e.message().contains("12345"), "{}", e);

    // From the binding's own checks, with the same code.
    let slots = cache.append(s, 2).unwrap();
    let k = vec![kvpage::Bf16::from_f32(1.0); DENSE]; // one token, two slots
    let e = cache.write(&WriteArgs::new(0, &k, &k, &slots)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    assert!(e.message().starts_with("key "), "{}", e);
    let e = Cache::new(&CacheConfig {
        key_smoothing: Some(vec![1.0; 3]),
        ..CacheConfig::new(4, 1)
    })
    .unwrap_err();
    assert!(e.message().contains("key_smoothing"), "{}", e);

    let mut dec = cache
        .decoder(&DecodeConfig::new(Q_HEADS as i32, 1, 32))
        .unwrap(); // BF16 q/out
    let table = cache.block_table(&[s], 2).unwrap();
    let q = vec![0f32; Q_HEADS * D];
    let mut out = vec![0f32; Q_HEADS * D];
    let e = dec
        .decode(&DecodeArgs::new(0, &q, &table), &mut out, None)
        .unwrap_err();
    assert!(
        e.message().starts_with("q: ") && e.message().contains("Bf16"),
        "{}",
        e
    );
    let e = cache.decoder(&DecodeConfig::new(3, 1, 32)).unwrap_err();
    assert!(e.message().contains("num_query_heads = 3"), "{}", e);
    // An out-of-range layer reaches the library's check.
    let qb = vec![kvpage::Bf16::default(); Q_HEADS * D];
    let mut ob = vec![kvpage::Bf16::default(); Q_HEADS * D];
    let e = dec
        .decode(&DecodeArgs::new(5, &qb, &table), &mut ob, None)
        .unwrap_err();
    assert!(e.message().contains("layer = 5"), "{}", e);
}

#[test]
fn versions() {
    assert_eq!(kvpage::version(), kvpage::kvpage_sys::KVP_VERSION_STRING);
    assert_eq!(kvpage::abi_version().0, kvpage::kvpage_sys::KVP_ABI_MAJOR);
    assert!(
        kvpage::build_info().contains("backends=cpu"),
        "{}",
        kvpage::build_info()
    );
    assert!(kvpage::cuda_device_count().unwrap() >= 0);
    assert_eq!(ErrorCode::OutOfBlocks.name(), "OUT_OF_BLOCKS");
    assert_eq!(ErrorCode::from_raw(99), ErrorCode::Other(99));
    assert_eq!(ErrorCode::Other(99).name(), "UNKNOWN");
}

// ---------------------------------------------------------------------------
// One cache from several threads (Cache: Sync), one decoder per thread
// ---------------------------------------------------------------------------

#[test]
fn one_cache_from_several_threads() {
    let mut rng = Rng::new();
    let seed = rng.seed;
    let cache = Cache::new(&CacheConfig {
        head_size: D as i32,
        k_dtype: DType::Fp16,
        v_dtype: DType::Fp16,
        ..CacheConfig::new(64, KV_HEADS as i32)
    })
    .unwrap();
    let seeds: Vec<u64> = (0..4).map(|_| rng.next_u64()).collect();
    std::thread::scope(|scope| {
        for &thread_seed in &seeds {
            let cache = &cache;
            scope.spawn(move || {
                let mut rng = Rng {
                    seed,
                    state: thread_seed,
                };
                let mut dec = cache
                    .decoder(&DecodeConfig {
                        q_dtype: DType::Fp32,
                        out_dtype: DType::Fp32,
                        ..DecodeConfig::new(Q_HEADS as i32, 1, 64)
                    })
                    .unwrap();
                for round in 0..10 {
                    let s = cache.create_seq().unwrap();
                    let mut model = SeqKv::default();
                    for _ in 0..3 {
                        let n = 1 + (rng.next_u64() % 9) as usize;
                        let slots = cache.append(s, n).unwrap();
                        let (k, v) = (rng.halves(n * DENSE), rng.halves(n * DENSE));
                        cache.write(&WriteArgs::new(0, &k, &v, &slots)).unwrap();
                        model.push(&k, &v);
                    }
                    let table = cache.block_table(&[s], 4).unwrap();
                    let q = rng.normals(Q_HEADS * D);
                    let q64: Vec<f64> = q.iter().map(|&x| x as f64).collect();
                    let mut out = poisoned::<f32>(Q_HEADS * D);
                    dec.decode(&DecodeArgs::new(0, &q, &table), &mut out, None)
                        .unwrap();
                    let (want, _) = reference(&q64, &[&model], Options::default());
                    expect_close(
                        &format!("thread round {}", round),
                        seed,
                        &out,
                        &want,
                        2f64.powi(-20),
                        1e-6,
                    );
                    cache.free_seq(s).unwrap();
                }
            });
        }
    });
    assert_eq!(cache.num_free_blocks().unwrap(), 64);
}
