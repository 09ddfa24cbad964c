//! The ps-lite environment: variables given to `MXInitPSEnv` first, then the
//! process environment. Drives the node role queries and dist store creation.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

type Vars = Option<HashMap<String, String>>;

/// A std lock: its guard may be dropped in a forked child ([`hold_for_fork`]).
static VARS: RwLock<Vars> = RwLock::new(None);

fn read() -> RwLockReadGuard<'static, Vars> {
    VARS.read().unwrap_or_else(PoisonError::into_inner)
}

/// The variables' lock, held exclusively: see [`hold_for_fork`].
pub struct ForkHold {
    _held: RwLockWriteGuard<'static, Vars>,
}

/// Waits until no other thread reads or records variables and keeps them
/// out until the hold is dropped (the C API's `pthread_atfork` handlers: a
/// forked child must not find the lock held by a thread of the parent).
pub fn hold_for_fork() -> ForkHold {
    ForkHold {
        _held: VARS.write().unwrap_or_else(PoisonError::into_inner),
    }
}

/// The variables a distributed store needs.
pub const CLUSTER_VARS: [&str; 5] = [
    "DMLC_ROLE",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_PS_ROOT_URI",
    "DMLC_PS_ROOT_PORT",
];

/// Records variables (`MXInitPSEnv`); later values replace earlier ones.
pub fn set_vars(vars: impl IntoIterator<Item = (String, String)>) {
    let mut g = VARS.write().unwrap_or_else(PoisonError::into_inner);
    g.get_or_insert_with(HashMap::new).extend(vars);
}

pub fn get(name: &str) -> Option<String> {
    if let Some(v) = read().as_ref().and_then(|m| m.get(name)) {
        return Some(v.clone());
    }
    // bytes that are not UTF-8 count as set (kept as U+FFFD), as in MXNet
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// `DMLC_ROLE`, defaulting to `worker`.
pub fn role() -> String {
    get("DMLC_ROLE").unwrap_or_else(|| "worker".to_string())
}

pub fn missing_cluster_vars() -> Vec<&'static str> {
    CLUSTER_VARS
        .iter()
        .copied()
        .filter(|v| get(v).is_none())
        .collect()
}
