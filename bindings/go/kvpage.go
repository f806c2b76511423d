// SPDX-License-Identifier: Apache-2.0

// Package kvpage is the Go binding of kvpage: a paged KV cache (BF16/FP16,
// or FP8/INT8/INT4 with per-token-per-head scales), its sequences and block
// tables, the quantizing write and decode attention, over the stable C ABI
// of libkvpage.so.
//
// Handles ([Cache], [Decoder]) are released by Close; a finalizer releases
// one that was dropped without Close, as a safety net only (Close clears
// it). Errors are returned as *[Error] values carrying the library's stable
// [ErrorCode] and its message, which names the bad argument and its value;
// errors.Is(err, kvpage.CodeOutOfBlocks) tests the code. The C library
// returns its errors as objects, never through thread-local state, so no
// runtime.LockOSThread is needed.
//
// Concurrency: every method of a [Cache] may be called from several
// goroutines at once (the header serializes sequence operations and lets
// writes and decodes run from several threads); on the CPU backend, do not
// write blocks another goroutine decodes at the same moment. A [Decoder]
// serializes its own Decode calls (the header forbids concurrent decodes
// on one decoder); use one decoder per goroutine for parallel decodes.
//
// Host memory is passed as Go slices, checked for length before each call;
// element slices are []float32, []Float16 or []BFloat16. Caches on a CUDA
// device take device pointers (uintptr) through the *Raw methods, where the
// caller answers for their validity.
//
// Building: cgo takes its flags from pkg-config (#cgo pkg-config: kvpage;
// PKG_CONFIG_PATH=<prefix>/lib/pkgconfig after cmake --install). The Libs
// of the installed kvpage.pc carry -Wl,-rpath,<libdir>, so programs load
// libkvpage.so.1 without LD_LIBRARY_PATH; a kvpage.pc built with
// KVPAGE_PKGCONFIG_RPATH=OFF leaves that to the loader's paths or
// CGO_LDFLAGS="$(pkg-config --variable=rpath kvpage)".
//
// License: Apache-2.0 (SPDX-License-Identifier: Apache-2.0), the license of
// the kvpage project; its text is the LICENSE file at the root of the
// repository.
package kvpage

/*
#cgo pkg-config: kvpage
#include "kvpage_go.h"
*/
import "C"

import (
	"fmt"
	"math"
)

// ErrorCode is the stable code of an [Error] (kvp_error_code_t, never
// renumbered). It implements error, so that errors.Is(err, code) tests an
// error's code.
type ErrorCode int32

// The codes of the C API.
const (
	CodeInvalidArgument ErrorCode = 1 // a NULL, out-of-range or inconsistent argument
	CodeOutOfBlocks     ErrorCode = 2 // the cache has too few free blocks
	CodeOutOfMemory     ErrorCode = 3 // host or device allocation failed
	CodeUnsupported     ErrorCode = 4 // a valid request this build cannot serve
	CodeDevice          ErrorCode = 5 // the CUDA runtime reported an error
	CodeInternal        ErrorCode = 6 // a bug in kvpage
)

// String is the library's name of the code ("INVALID_ARGUMENT", ...).
func (c ErrorCode) String() string {
	return C.GoString(C.kvp_error_code_name(C.int32_t(c)))
}

// Error makes a code usable as errors.Is target.
func (c ErrorCode) Error() string { return "kvpage: " + c.String() }

// Error is a failed call: the library's code and its message. Checks the
// binding makes before calling the library (slice lengths, element types,
// closed handles) report [CodeInvalidArgument] the same way.
type Error struct {
	Code    ErrorCode
	Message string
}

func (e *Error) Error() string { return "kvpage: " + e.Code.String() + ": " + e.Message }

// Is reports whether target is e's code (errors.Is(err, kvpage.CodeOutOfBlocks)).
func (e *Error) Is(target error) bool {
	c, ok := target.(ErrorCode)
	return ok && c == e.Code
}

// takeError converts what a C call returned: nil for success, else the
// error's code and message with the C object freed.
func takeError(e *C.kvp_error) error {
	if e == nil {
		return nil
	}
	err := &Error{Code: ErrorCode(C.kvp_error_code(e)), Message: C.GoString(C.kvp_error_message(e))}
	C.kvp_error_free(e)
	return err
}

func invalidArg(format string, args ...any) error {
	return &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// toInt32 checks that n fits the C API's int32.
func toInt32(n int, what string) (C.int32_t, error) {
	if n < math.MinInt32 || n > math.MaxInt32 {
		return 0, invalidArg("%s = %d does not fit in int32", what, n)
	}
	return C.int32_t(n), nil
}

// Version is the package version of the loaded library, e.g. "0.1.0".
func Version() string { return C.GoString(C.kvp_version_string()) }

// ABIVersion is the ABI version of the loaded library.
func ABIVersion() (major, minor uint32) {
	var ma, mi C.uint32_t
	C.kvp_abi_version(&ma, &mi)
	return uint32(ma), uint32(mi)
}

// BuildInfo says what the loaded library holds (backends, CUDA
// architectures, dtypes, head and block sizes): "key=value" pairs
// separated by "; ".
func BuildInfo() string { return C.GoString(C.kvp_build_info()) }

// CUDADeviceCount is the number of CUDA devices this build can use (0
// without a CUDA backend or a GPU; that is not an error).
func CUDADeviceCount() (int, error) {
	var n C.int32_t
	if err := takeError(C.kvp_device_count(C.KVP_DEVICE_CUDA, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// DType is an element type of inputs, queries and outputs (FP32, FP16,
// BF16) or of the cache (FP16, BF16, FP8E4M3, INT8, INT4).
type DType int32

// The element types of the C API.
const (
	FP32    DType = 0 // inputs, queries and outputs only
	FP16    DType = 1 // IEEE half
	BF16    DType = 2 // bfloat16
	FP8E4M3 DType = 3 // cache only: symmetric, FP16 scale per token-head
	INT8    DType = 4 // cache only: symmetric, FP16 scale per token-head
	INT4    DType = 5 // cache only: asymmetric, FP16 scale + min
)

func (d DType) String() string {
	switch d {
	case FP32:
		return "FP32"
	case FP16:
		return "FP16"
	case BF16:
		return "BF16"
	case FP8E4M3:
		return "FP8_E4M3"
	case INT8:
		return "INT8"
	case INT4:
		return "INT4"
	}
	return fmt.Sprintf("DType(%d)", int32(d))
}

// DeviceKind says where a cache lives.
type DeviceKind int32

// The device kinds of the C API.
const (
	CPU  DeviceKind = 0
	CUDA DeviceKind = 1
)

func (k DeviceKind) String() string {
	switch k {
	case CPU:
		return "CPU"
	case CUDA:
		return "CUDA"
	}
	return fmt.Sprintf("DeviceKind(%d)", int32(k))
}

// The constants above are the header's values: an index other than 0 into
// a one-element array does not compile.
func _() {
	var x [1]struct{}
	_ = x[CodeInvalidArgument-C.KVP_ERR_INVALID_ARGUMENT]
	_ = x[CodeOutOfBlocks-C.KVP_ERR_OUT_OF_BLOCKS]
	_ = x[CodeOutOfMemory-C.KVP_ERR_OUT_OF_MEMORY]
	_ = x[CodeUnsupported-C.KVP_ERR_UNSUPPORTED]
	_ = x[CodeDevice-C.KVP_ERR_DEVICE]
	_ = x[CodeInternal-C.KVP_ERR_INTERNAL]
	_ = x[FP32-C.KVP_DTYPE_FP32]
	_ = x[FP16-C.KVP_DTYPE_FP16]
	_ = x[BF16-C.KVP_DTYPE_BF16]
	_ = x[FP8E4M3-C.KVP_DTYPE_FP8_E4M3]
	_ = x[INT8-C.KVP_DTYPE_INT8]
	_ = x[INT4-C.KVP_DTYPE_INT4]
	_ = x[CPU-C.KVP_DEVICE_CPU]
	_ = x[CUDA-C.KVP_DEVICE_CUDA]
}
