//! The one error type of the safe layers. Its `Display` is the message that
//! `MXGetLastError` shows after the C layer prefixes the function name.
#![forbid(unsafe_code)]

use std::fmt;

/// An error from the store or an array operation. The text keeps MXNet's
/// wording where MXNet has one, so users and tests recognise it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

impl Error {
    pub fn new(msg: impl Into<String>) -> Self {
        Error(msg.into())
    }

    pub fn message(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `bail!("fmt", args…)` returns `Err(Error::new(format!(…)))`.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::new(format!($($arg)*)))
    };
}

/// `ensure!(cond, "fmt", args…)` bails when `cond` is false.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            $crate::bail!($($arg)*);
        }
    };
}
