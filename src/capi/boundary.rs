//! The panic and error boundary: `api_call` runs an entry point's body,
//! catches panics, stores the error text per thread and returns 0 or -1.

use crate::error::Error;
use std::cell::RefCell;
use std::ffi::CString;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: String) {
    let c = CString::new(msg.replace('\0', "\\0")).expect("NULs were replaced");
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `body` for the entry point `name`: 0 on success; on error or panic,
/// `-1` with `"{name}: {message}"` kept for `MXGetLastError`.
pub(crate) fn api_call(name: &'static str, body: impl FnOnce() -> Result<(), Error>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_last_error(format!("{name}: {e}"));
            -1
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            set_last_error(format!("{name}: internal error (panic: {what})"));
            -1
        }
    }
}

/// `const char *MXGetLastError();` — the message of the last failing call on
/// this thread (`""` if none). Valid until the next failing call on the same
/// thread; not cleared by successful calls.
#[no_mangle]
pub extern "C" fn MXGetLastError() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
