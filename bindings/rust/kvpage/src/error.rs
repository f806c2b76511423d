// SPDX-License-Identifier: Apache-2.0
use std::ffi::CStr;
use std::fmt;

use kvpage_sys as sys;

/// The stable code of an [`Error`] (`kvp_error_code_t`: never renumbered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A null, out-of-range or inconsistent argument.
    InvalidArgument,
    /// The cache has too few free blocks; nothing was changed.
    OutOfBlocks,
    /// A host or device allocation failed.
    OutOfMemory,
    /// A valid request this build cannot serve.
    Unsupported,
    /// The CUDA runtime reported an error.
    Device,
    /// A bug in kvpage.
    Internal,
    /// A code appended to the C API after this binding was written.
    Other(i32),
}

impl ErrorCode {
    /// The code for a raw `kvp_error_code_t` value.
    pub fn from_raw(code: i32) -> ErrorCode {
        match code {
            sys::KVP_ERR_INVALID_ARGUMENT => ErrorCode::InvalidArgument,
            sys::KVP_ERR_OUT_OF_BLOCKS => ErrorCode::OutOfBlocks,
            sys::KVP_ERR_OUT_OF_MEMORY => ErrorCode::OutOfMemory,
            sys::KVP_ERR_UNSUPPORTED => ErrorCode::Unsupported,
            sys::KVP_ERR_DEVICE => ErrorCode::Device,
            sys::KVP_ERR_INTERNAL => ErrorCode::Internal,
            other => ErrorCode::Other(other),
        }
    }

    /// The raw `kvp_error_code_t` value.
    pub fn raw(self) -> i32 {
        match self {
            ErrorCode::InvalidArgument => sys::KVP_ERR_INVALID_ARGUMENT,
            ErrorCode::OutOfBlocks => sys::KVP_ERR_OUT_OF_BLOCKS,
            ErrorCode::OutOfMemory => sys::KVP_ERR_OUT_OF_MEMORY,
            ErrorCode::Unsupported => sys::KVP_ERR_UNSUPPORTED,
            ErrorCode::Device => sys::KVP_ERR_DEVICE,
            ErrorCode::Internal => sys::KVP_ERR_INTERNAL,
            ErrorCode::Other(c) => c,
        }
    }

    /// The library's name of the code: `"INVALID_ARGUMENT"`, ... (`"UNKNOWN"`
    /// for codes the loaded library does not know).
    pub fn name(self) -> &'static str {
        // SAFETY: kvp_error_code_name returns a static NUL-terminated string
        // for any input.
        unsafe { static_str(sys::kvp_error_code_name(self.raw())) }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: the library's stable code and its message, which names
/// the bad argument and its value. Checks the binding makes before calling
/// the library (slice lengths, element types) report
/// [`ErrorCode::InvalidArgument`] the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

impl Error {
    /// The error's code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The message, e.g. `"seq_id 7 does not exist"`.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn new(code: ErrorCode, message: String) -> Error {
        Error { code, message }
    }

    pub(crate) fn invalid_argument(message: String) -> Error {
        Error::new(ErrorCode::InvalidArgument, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for Error {}

/// `Result<T, kvpage::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// Takes ownership of what a C call returned: `Ok` for null, else the
/// error's code and message (copied) with the error object freed.
pub(crate) fn check(raw: *mut sys::kvp_error) -> Result<()> {
    if raw.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null kvp_error* returned by the library is a live error
    // object owned by us; its message is valid until kvp_error_free.
    unsafe {
        let code = ErrorCode::from_raw(sys::kvp_error_code(raw));
        let message = CStr::from_ptr(sys::kvp_error_message(raw))
            .to_string_lossy()
            .into_owned();
        sys::kvp_error_free(raw);
        Err(Error::new(code, message))
    }
}

/// A static string returned by the library.
///
/// # Safety
/// `p` must be a NUL-terminated string that lives as long as the process.
pub(crate) unsafe fn static_str(p: *const std::os::raw::c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    CStr::from_ptr(p).to_str().unwrap_or("")
}
