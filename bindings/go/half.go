// SPDX-License-Identifier: Apache-2.0

package kvpage

import (
	"math"
	"unsafe"
)

// Float16 is an IEEE half-precision value stored as its bits (kvpage's FP16).
type Float16 uint16

// BFloat16 is a bfloat16 value stored as its bits (kvpage's BF16).
type BFloat16 uint16

// Float16FromFloat32 rounds x to the nearest half-precision value, ties to
// even; overflow gives ±Inf, NaN stays NaN.
func Float16FromFloat32(x float32) Float16 {
	bits := math.Float32bits(x)
	sign := uint16(bits>>16) & 0x8000
	exp := int32(bits>>23) & 0xff
	man := bits & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return Float16(sign | 0x7c00 | 0x200 | uint16(man>>13))
		}
		return Float16(sign | 0x7c00)
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return Float16(sign | 0x7c00)
	}
	if e <= 0 { // subnormal or zero: the value in units of 2^-24, rounded
		if e < -10 {
			return Float16(sign)
		}
		m := man | 0x800000
		shift := uint32(14 - e)
		q := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && q&1 == 1) {
			q++
		}
		return Float16(sign | uint16(q))
	}
	q := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && q&1 == 1) {
		q++ // a carry steps the exponent, up to Inf: correct
	}
	return Float16(sign | uint16(q))
}

// Float32 is the value as float32 (exact).
func (h Float16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch exp {
	case 0:
		v := float32(man) * (1.0 / 16777216.0) // man * 2^-24, exact
		if sign != 0 {
			return -v
		}
		return v
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
}

// BFloat16FromFloat32 rounds x to the nearest bfloat16, ties to even; NaN
// stays NaN.
func BFloat16FromFloat32(x float32) BFloat16 {
	bits := math.Float32bits(x)
	if x != x {
		return BFloat16(bits>>16 | 0x40)
	}
	return BFloat16((bits + 0x7fff + (bits>>16)&1) >> 16)
}

// Float32 is the value as float32 (exact).
func (b BFloat16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// hostData is a slice of one of the element types: its first element's
// address (nil when empty), length and dtype.
func hostData(name string, x any) (unsafe.Pointer, int, DType, error) {
	switch s := x.(type) {
	case []float32:
		if len(s) == 0 {
			return nil, 0, FP32, nil
		}
		return unsafe.Pointer(&s[0]), len(s), FP32, nil
	case []Float16:
		if len(s) == 0 {
			return nil, 0, FP16, nil
		}
		return unsafe.Pointer(&s[0]), len(s), FP16, nil
	case []BFloat16:
		if len(s) == 0 {
			return nil, 0, BF16, nil
		}
		return unsafe.Pointer(&s[0]), len(s), BF16, nil
	}
	return nil, 0, 0, invalidArg("%s is a %T, must be []float32, []kvpage.Float16 or []kvpage.BFloat16", name, x)
}
