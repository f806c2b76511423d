// SPDX-License-Identifier: Apache-2.0
//! An engine that owns its cache and its decoders in one struct: decoders
//! hold a handle of the cache, borrow nothing, and keep the C cache alive
//! until the last of them is dropped.
use kvpage::{Cache, CacheConfig, DType, DecodeArgs, DecodeConfig, Decoder, SeqId, WriteArgs, F16};

const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4;
const D: usize = 64;

/// Decoders first, the cache last: any field order works, since the C cache
/// goes with the last handle.
struct Engine {
    decoders: Vec<Decoder>,
    cache: Cache,
    seq: SeqId,
}

impl Engine {
    /// Built and returned by value: impossible while a decoder borrowed its
    /// cache.
    fn new(num_decoders: usize) -> kvpage::Result<Engine> {
        let cache = Cache::new(&CacheConfig {
            head_size: D as i32,
            k_dtype: DType::Fp16,
            v_dtype: DType::Fp16,
            ..CacheConfig::new(16, KV_HEADS as i32)
        })?;
        let config = DecodeConfig {
            q_dtype: DType::Fp32,
            out_dtype: DType::Fp32,
            ..DecodeConfig::new(Q_HEADS as i32, 1, 64)
        };
        let decoders = (0..num_decoders)
            .map(|_| cache.decoder(&config))
            .collect::<kvpage::Result<Vec<_>>>()?;
        let seq = cache.create_seq()?;
        let n = 5;
        let slots = cache.append(seq, n)?;
        let k: Vec<F16> = (0..n * KV_HEADS * D)
            .map(|i| F16::from_f32((i as f32 * 0.37).sin()))
            .collect();
        let v: Vec<F16> = (0..n * KV_HEADS * D)
            .map(|i| F16::from_f32((i as f32 * 0.11).cos()))
            .collect();
        cache.write(&WriteArgs::new(0, &k, &v, &slots))?;
        Ok(Engine {
            decoders,
            cache,
            seq,
        })
    }
}

/// One decode of a fixed query with `decoder`.
fn step(decoder: &mut Decoder, seq: SeqId) -> Vec<f32> {
    let table = decoder.cache().block_table(&[seq], 4).unwrap();
    let q: Vec<f32> = (0..Q_HEADS * D).map(|i| (i as f32 * 0.05).cos()).collect();
    let mut out = vec![f32::NAN; Q_HEADS * D];
    decoder
        .decode(&DecodeArgs::new(0, &q, &table), &mut out, None)
        .unwrap();
    assert!(out.iter().all(|x| x.is_finite() && x.abs() <= 1.01));
    out
}

#[test]
fn engine_owns_cache_and_decoders() {
    let mut engine = Engine::new(3).unwrap();
    for d in &engine.decoders {
        assert!(Cache::ptr_eq(d.cache(), &engine.cache));
    }
    let seq = engine.seq;
    let first = step(&mut engine.decoders[0], seq);
    for d in &mut engine.decoders[1..] {
        assert_eq!(step(d, seq), first);
    }

    // The engine moves to another thread (Cache: Send + Sync, Decoder: Send)
    // and comes back.
    let mut engine = std::thread::spawn(move || {
        let out = step(&mut engine.decoders[2], seq);
        (engine, out)
    })
    .join()
    .map(|(engine, out)| {
        assert_eq!(out, first);
        engine
    })
    .unwrap();

    // Dropping the engine's own cache handle first leaves the C cache to the
    // decoders, which still decode it; the last one destroys it after its
    // own C decoder.
    let Engine {
        mut decoders,
        cache,
        seq,
    } = engine;
    drop(cache);
    assert_eq!(step(&mut decoders[1], seq), first);
    let mut last = decoders.pop().unwrap();
    drop(decoders);
    assert_eq!(step(&mut last, seq), first);
    assert_eq!(last.cache().seq_len(seq).unwrap(), 5);
    drop(last);

    // A cloned handle is the same cache.
    engine = Engine::new(1).unwrap();
    let other = engine.cache.clone();
    assert!(Cache::ptr_eq(&other, &engine.cache));
    let before = other.num_free_blocks().unwrap();
    let s = engine.cache.create_seq().unwrap();
    engine.cache.append(s, 17).unwrap();
    assert_eq!(other.num_free_blocks().unwrap(), before - 2);
    drop(engine);
    other.free_seq(s).unwrap();
    assert_eq!(other.num_free_blocks().unwrap(), before);
}
