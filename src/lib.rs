//! libmxkv: Apache MXNet 1.9.1's KVStore, reimplemented in Rust and exported
//! through MXNet's C API (`MXKVStore*`, the NDArray functions a binding
//! needs, `MXGetLastError`).
//!
//! Layers: [`capi`] is the only module with `extern "C"`, raw pointers and
//! `unsafe`; [`store`], [`ndarray`], [`registry`], [`psenv`] and [`blockcache`] are safe Rust.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod blockcache;
pub mod dist;
pub mod error;
pub mod factory;
pub mod ndarray;
pub mod psenv;
pub mod random;
pub mod registry;
pub mod store;
#[cfg(test)]
mod test_util;

pub mod capi;
