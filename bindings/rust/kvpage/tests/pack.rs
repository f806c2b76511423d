// SPDX-License-Identifier: Apache-2.0
//! Cache::pack / Cache::unpack and the format signature (ABI 1.4) on the CPU
//! backend: a sequence packed layer by layer, unpacked into a cache of
//! another size at the blocks its own sequence got, packs back to the same
//! bytes and decodes to the same bits; a cache of another format refuses the
//! buffer through its signature. Fresh random inputs (the seed is in every
//! failure message).
use kvpage::{
    Cache, CacheConfig, DType, DecodeArgs, DecodeConfig, ErrorCode, PackArgs, PackBuffer, WriteArgs,
};

const HEADS: i32 = 2;
const D: i32 = 64;
const BS: i32 = 8;
const LAYERS: i32 = 3;

/// A small xorshift generator seeded from the clock.
struct Rng(u64);
impl Rng {
    fn new() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        Rng(t | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn normal(&mut self) -> f32 {
        // Sum of uniforms: close enough to Gaussian for cache contents.
        (0..4)
            .map(|_| (self.next() >> 11) as f32 / (1u64 << 53) as f32)
            .sum::<f32>()
            * 1.7
            - 3.4
    }
}

fn cache(num_blocks: i32, k_dtype: DType) -> Cache {
    Cache::new(&CacheConfig {
        num_layers: LAYERS,
        block_size: BS,
        head_size: D,
        k_dtype,
        v_dtype: DType::Int4,
        ..CacheConfig::new(num_blocks, HEADS)
    })
    .expect("cache")
}

#[test]
fn round_trip_layer_by_layer_and_signatures() {
    let mut rng = Rng::new();
    let seed = rng.0;
    let src = cache(16, DType::Int8);
    let dst = cache(24, DType::Int8);
    let len = 3 * BS as usize + 5;
    let seq = src.create_seq().unwrap();
    let slots = src.append(seq, len).unwrap();
    for layer in 0..LAYERS {
        let n = len * (HEADS * D) as usize;
        let k: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let v: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        src.write(&WriteArgs::new(layer, &k, &v, &slots)).unwrap();
    }
    let other = dst.create_seq().unwrap();
    dst.append(other, 2 * BS as usize).unwrap(); // the receiver's ids differ
    let moved = dst.create_seq().unwrap();
    dst.append(moved, len).unwrap();
    let width = 4;
    let from = src.block_table(&[seq], width).unwrap();
    let to = dst.block_table(&[moved], width).unwrap();
    assert_ne!(from.table, to.table);

    let src_sig = src.format_signature().unwrap();
    dst.check_signature(&src_sig).unwrap();
    let layer_bytes = src.pack_size(from.table.len(), 1).unwrap() as usize;
    let mut whole = PackBuffer::new(src.pack_size(from.table.len(), 0).unwrap() as usize);
    src.pack(&PackArgs::new(&from.table), whole.as_mut_slice())
        .unwrap();
    let mut part = PackBuffer::new(layer_bytes);
    for layer in 0..LAYERS {
        let args = |ids| PackArgs {
            first_layer: layer,
            num_layers: 1,
            signature: Some(&src_sig),
            ..PackArgs::new(ids)
        };
        src.pack(&args(&from.table), part.as_mut_slice()).unwrap();
        let l = layer as usize;
        assert_eq!(
            part.as_slice(),
            &whole.as_slice()[l * layer_bytes..(l + 1) * layer_bytes],
            "seed {seed}"
        );
        dst.unpack(&args(&to.table), part.as_slice()).unwrap();
    }
    let mut again = PackBuffer::new(whole.as_slice().len());
    dst.pack(&PackArgs::new(&to.table), again.as_mut_slice())
        .unwrap();
    assert_eq!(again.as_slice(), whole.as_slice(), "seed {seed}");

    let config = DecodeConfig {
        q_dtype: DType::Fp32,
        out_dtype: DType::Fp32,
        ..DecodeConfig::new(2 * HEADS, 1, width * BS)
    };
    let q: Vec<f32> = (0..(2 * HEADS * D) as usize)
        .map(|_| rng.normal())
        .collect();
    for layer in 0..LAYERS {
        let mut outs = Vec::new();
        for (c, table) in [(&src, &from), (&dst, &to)] {
            let mut dec = c.decoder(&config).unwrap();
            let mut out = vec![f32::NAN; q.len()];
            dec.decode(&DecodeArgs::new(layer, &q, table), &mut out, None)
                .unwrap();
            outs.push(out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>());
        }
        assert_eq!(outs[0], outs[1], "seed {seed}: layer {layer}");
    }

    // Another format: refused before anything moves, naming the field.
    let fp8 = cache(16, DType::Fp8E4M3);
    let err = dst
        .check_signature(&fp8.format_signature().unwrap())
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(
        err.message()
            .contains("k_dtype is FP8 (3) in the signature, INT8 (4)"),
        "{}",
        err
    );
    let fp8_sig = fp8.format_signature().unwrap();
    let refused = PackArgs {
        signature: Some(&fp8_sig),
        ..PackArgs::new(&to.table)
    };
    assert!(dst.unpack(&refused, whole.as_slice()).is_err());
    dst.pack(&PackArgs::new(&to.table), again.as_mut_slice())
        .unwrap();
    assert_eq!(
        again.as_slice(),
        whole.as_slice(),
        "a refused unpack changed the cache"
    );
}

#[test]
fn bad_arguments_are_refused() {
    let src = cache(8, DType::Bf16);
    let mut buf = PackBuffer::new(src.pack_size(2, 0).unwrap() as usize);
    let err = src
        .unpack(&PackArgs::new(&[3, 3]), buf.as_slice())
        .unwrap_err();
    assert!(err.message().contains("block_ids[1] = 3"), "{}", err);
    let err = src
        .pack(&PackArgs::new(&[0, 8]), buf.as_mut_slice())
        .unwrap_err();
    assert!(err.message().contains("block_ids[1] = 8"), "{}", err);
    let err = src
        .pack(&PackArgs::new(&[0, 1, 2]), buf.as_mut_slice())
        .unwrap_err();
    assert!(err.message().contains("buffer_bytes"), "{}", err);
    let err = src
        .pack(&PackArgs::new(&[0]), &mut buf.as_mut_slice()[1..])
        .unwrap_err();
    assert!(err.message().contains("aligned"), "{}", err);
    let err = src
        .check_signature(&src.format_signature().unwrap()[..10])
        .unwrap_err();
    assert!(err.message().contains("signature_bytes = 10"), "{}", err);
    let err = src.check_signature(&[0u8; 64]).unwrap_err();
    assert!(err.message().contains("magic"), "{}", err);
    assert!(src.pack_size(1, LAYERS + 1).is_err());
}
