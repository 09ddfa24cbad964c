//! The ps-lite environment: variables given to `MXInitPSEnv` first, then the
//! process environment. Drives the node role queries and dist store creation.
#![forbid(unsafe_code)]

use parking_lot::RwLock;
use std::collections::HashMap;

static VARS: RwLock<Option<HashMap<String, String>>> = RwLock::new(None);

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
    let mut g = VARS.write();
    g.get_or_insert_with(HashMap::new).extend(vars);
}

pub fn get(name: &str) -> Option<String> {
    if let Some(v) = VARS.read().as_ref().and_then(|m| m.get(name)) {
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
