// SPDX-License-Identifier: Apache-2.0
//! An engine struct that owns a cache and its decoder, run once.
use kvpage::{Cache, CacheConfig, DType, DecodeArgs, DecodeConfig, Decoder, WriteArgs};

struct Engine {
    cache: Cache,
    decoder: Decoder,
}

fn main() -> kvpage::Result<()> {
    let cache = Cache::new(&CacheConfig {
        head_size: 64,
        ..CacheConfig::new(8, 1)
    })?;
    let decoder = cache.decoder(&DecodeConfig {
        q_dtype: DType::Fp32,
        out_dtype: DType::Fp32,
        ..DecodeConfig::new(2, 1, 64)
    })?;
    let mut engine = Engine { cache, decoder };
    let seq = engine.cache.create_seq()?;
    let slots = engine.cache.append(seq, 2)?;
    let kv = vec![0.5f32; 2 * 64];
    engine.cache.write(&WriteArgs::new(0, &kv, &kv, &slots))?;
    let table = engine.cache.block_table(&[seq], 4)?;
    let q = vec![1.0f32; 2 * 64];
    let mut out = vec![f32::NAN; 2 * 64];
    engine
        .decoder
        .decode(&DecodeArgs::new(0, &q, &table), &mut out, None)?;
    assert!(out.iter().all(|&x| x == 0.5), "{:?}", &out[..4]);
    println!("rust consumer: kvpage {}", kvpage::version());
    Ok(())
}
