// SPDX-License-Identifier: Apache-2.0
use kvpage_sys as sys;

/// Element types of inputs, queries, outputs (`Fp32`, `Fp16`, `Bf16`) and of
/// the cache (`Fp16`, `Bf16`, `Fp8E4M3`, `Int8`, `Int4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE single precision; inputs, queries and outputs only.
    Fp32,
    /// IEEE half precision.
    Fp16,
    /// bfloat16.
    Bf16,
    /// FP8 E4M3 ("fn", max 448), symmetric, one FP16 scale per token and head.
    Fp8E4M3,
    /// INT8, symmetric, one FP16 scale per token and head.
    Int8,
    /// INT4, asymmetric, FP16 scale and min per token and head.
    Int4,
}

impl DType {
    /// The raw `kvp_dtype_t` value.
    pub fn raw(self) -> i32 {
        match self {
            DType::Fp32 => sys::KVP_DTYPE_FP32,
            DType::Fp16 => sys::KVP_DTYPE_FP16,
            DType::Bf16 => sys::KVP_DTYPE_BF16,
            DType::Fp8E4M3 => sys::KVP_DTYPE_FP8_E4M3,
            DType::Int8 => sys::KVP_DTYPE_INT8,
            DType::Int4 => sys::KVP_DTYPE_INT4,
        }
    }

    /// The dtype of a raw `kvp_dtype_t` value, `None` for one this binding
    /// does not know.
    pub fn from_raw(raw: i32) -> Option<DType> {
        Some(match raw {
            sys::KVP_DTYPE_FP32 => DType::Fp32,
            sys::KVP_DTYPE_FP16 => DType::Fp16,
            sys::KVP_DTYPE_BF16 => DType::Bf16,
            sys::KVP_DTYPE_FP8_E4M3 => DType::Fp8E4M3,
            sys::KVP_DTYPE_INT8 => DType::Int8,
            sys::KVP_DTYPE_INT4 => DType::Int4,
            _ => return None,
        })
    }
}

/// An IEEE half-precision value, stored as its bits (kvpage's FP16).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F16(u16);

/// A bfloat16 value, stored as its bits (kvpage's BF16).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bf16(u16);

impl F16 {
    /// The value with these bits.
    pub const fn from_bits(bits: u16) -> F16 {
        F16(bits)
    }

    /// The bits of the value.
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// `x` rounded to the nearest half-precision value, ties to even;
    /// overflow gives ±Inf, NaN stays NaN.
    pub fn from_f32(x: f32) -> F16 {
        let bits = x.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let exp = ((bits >> 23) & 0xff) as i32;
        let man = bits & 0x7f_ffff;
        if exp == 0xff {
            let nan = if man != 0 {
                0x200 | (man >> 13) as u16
            } else {
                0
            };
            return F16(sign | 0x7c00 | nan);
        }
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return F16(sign | 0x7c00);
        }
        if e <= 0 {
            // Subnormal (or zero): the value in units of 2^-24, rounded.
            if e < -10 {
                return F16(sign);
            }
            let m = man | 0x80_0000;
            let shift = (14 - e) as u32;
            let q = m >> shift;
            let rem = m & ((1 << shift) - 1);
            let half = 1 << (shift - 1);
            let r = if rem > half || (rem == half && q & 1 == 1) {
                q + 1
            } else {
                q
            };
            return F16(sign | r as u16);
        }
        let q = ((e as u32) << 10) | (man >> 13);
        let rem = man & 0x1fff;
        // A carry out of the mantissa steps the exponent, up to Inf: correct.
        let r = if rem > 0x1000 || (rem == 0x1000 && q & 1 == 1) {
            q + 1
        } else {
            q
        };
        F16(sign | r as u16)
    }

    /// The value as `f32` (exact).
    pub fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let man = h & 0x3ff;
        if exp == 0 {
            let v = man as f32 * (1.0 / 16_777_216.0); // man * 2^-24, exact
            return if sign != 0 { -v } else { v };
        }
        if exp == 0x1f {
            return f32::from_bits(sign | 0x7f80_0000 | (man << 13));
        }
        f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
    }
}

impl Bf16 {
    /// The value with these bits.
    pub const fn from_bits(bits: u16) -> Bf16 {
        Bf16(bits)
    }

    /// The bits of the value.
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// `x` rounded to the nearest bfloat16, ties to even; NaN stays NaN.
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) | 0x40) as u16);
        }
        let round = 0x7fff + ((bits >> 16) & 1);
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }

    /// The value as `f32` (exact).
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl From<F16> for f32 {
    fn from(x: F16) -> f32 {
        x.to_f32()
    }
}

impl From<Bf16> for f32 {
    fn from(x: Bf16) -> f32 {
        x.to_f32()
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
}

/// An element type kvpage reads and writes in host memory: `f32`, [`F16`]
/// or [`Bf16`]. Sealed.
pub trait Element: Copy + sealed::Sealed + Send + Sync + 'static {
    /// The dtype of the element.
    const DTYPE: DType;
    /// The value as `f32` (exact for all three).
    fn to_f32(self) -> f32;
    /// `x` rounded to the element type (ties to even).
    fn from_f32(x: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::Fp32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> f32 {
        x
    }
}

impl Element for F16 {
    const DTYPE: DType = DType::Fp16;
    fn to_f32(self) -> f32 {
        F16::to_f32(self)
    }
    fn from_f32(x: f32) -> F16 {
        F16::from_f32(x)
    }
}

impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
    fn to_f32(self) -> f32 {
        Bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Bf16 {
        Bf16::from_f32(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_value() {
        for bits in 0..=u16::MAX {
            let h = F16::from_bits(bits);
            let back = F16::from_f32(h.to_f32());
            if h.to_f32().is_nan() {
                assert!(back.to_f32().is_nan());
            } else {
                assert_eq!(back.to_bits(), bits, "bits {:#06x}", bits);
            }
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to 1 (even).
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0).to_bits(), 0x3c00);
        // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: to 1 + 2^-9.
        assert_eq!(F16::from_f32(1.0 + 3.0 / 2048.0).to_bits(), 0x3c02);
        assert_eq!(F16::from_f32(65504.0).to_bits(), 0x7bff);
        assert_eq!(F16::from_f32(65520.0).to_bits(), 0x7c00); // ties up to Inf
        assert_eq!(F16::from_f32(65519.0).to_bits(), 0x7bff);
        // Smallest subnormal 2^-24, and half of it ties to 0.
        assert_eq!(F16::from_f32(5.960_464_5e-8).to_bits(), 0x0001);
        assert_eq!(F16::from_f32(2.980_232_2e-8).to_bits(), 0x0000);
        assert_eq!(F16::from_f32(-2.0).to_bits(), 0xc000);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(Bf16::from_f32(1.0).to_bits(), 0x3f80);
        assert_eq!(
            Bf16::from_f32(f32::from_bits(0x3f80_8000)).to_bits(),
            0x3f80
        ); // tie -> even
        assert_eq!(
            Bf16::from_f32(f32::from_bits(0x3f81_8000)).to_bits(),
            0x3f82
        ); // tie -> even
        assert_eq!(
            Bf16::from_f32(f32::from_bits(0x3f80_8001)).to_bits(),
            0x3f81
        );
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
        for bits in 0..=u16::MAX {
            let b = Bf16::from_bits(bits);
            if !b.to_f32().is_nan() {
                assert_eq!(Bf16::from_f32(b.to_f32()).to_bits(), bits);
            }
        }
    }
}
