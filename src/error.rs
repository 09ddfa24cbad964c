//! The one error type of the safe layers. Its `Display` is the message that
//! `MXGetLastError` shows after the C layer prefixes the function name.
#![forbid(unsafe_code)]

use std::fmt;

/// What kind of failure an [`Error`] is, so callers and tests can tell a
/// timeout from misuse without matching the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Not classified (every error made with [`Error::new`]).
    Other,
    /// The caller broke the API's contract (bad argument, wrong state).
    Usage,
    /// A key was used before it was initialised.
    NotInited,
    /// A wait passed its deadline; the text names who did not answer.
    Timeout,
    /// A peer of a distributed store went away (disconnect or missed heartbeats).
    PeerLost,
    /// A peer sent something that does not follow the protocol.
    Protocol,
}

/// An error from the store or an array operation. The text keeps MXNet's
/// wording where MXNet has one, so users and tests recognise it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    msg: String,
}

impl Error {
    /// An error of kind [`ErrorKind::Other`].
    pub fn new(msg: impl Into<String>) -> Self {
        Error::with_kind(ErrorKind::Other, msg)
    }

    pub fn with_kind(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Error {
            kind,
            msg: msg.into(),
        }
    }

    pub fn usage(msg: impl Into<String>) -> Self {
        Error::with_kind(ErrorKind::Usage, msg)
    }

    pub fn not_inited(msg: impl Into<String>) -> Self {
        Error::with_kind(ErrorKind::NotInited, msg)
    }

    pub fn timeout(msg: impl Into<String>) -> Self {
        Error::with_kind(ErrorKind::Timeout, msg)
    }

    pub fn peer_lost(msg: impl Into<String>) -> Self {
        Error::with_kind(ErrorKind::PeerLost, msg)
    }

    pub fn protocol(msg: impl Into<String>) -> Self {
        Error::with_kind(ErrorKind::Protocol, msg)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.msg
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
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
