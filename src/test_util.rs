//! Helpers shared by the unit tests of several modules (test builds only).
#![forbid(unsafe_code)]

use crate::dist::config::Config;
use crate::dist::message::Role;
use crate::ndarray::dtype::DType;
use crate::ndarray::{Context, NDArray, Shape};
use std::time::Duration;

/// A 1-D float32 array on `cpu(0)` holding `v`.
pub fn f32s(v: &[f32]) -> NDArray {
    NDArray::from_bytes(
        Shape(vec![v.len() as i64]),
        DType::F32,
        Context::CPU0,
        bytemuck::cast_slice(v),
    )
    .unwrap()
}

/// The values of a dense float32 array.
pub fn values(a: &NDArray) -> Vec<f32> {
    a.read().typed::<f32>().to_vec()
}

/// A node of a cluster of 2 workers and 2 servers on 127.0.0.1 (30 s
/// timeouts) whose arrays of more than 10 elements are split over both
/// servers.
pub fn cluster_cfg(role: Role, port: u16) -> Config {
    let mut c = Config::local(role, port, 2, 2, Duration::from_secs(30));
    c.bigarray_bound = 10;
    c
}
