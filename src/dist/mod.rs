//! The distributed KVStore's transport, shaped like ps-lite (the parameter
//! server library MXNet 1.9.1 links): wire meta ([`meta`]), messages
//! ([`message`]), and, above them, the van, postoffice and scheduler.
//! Safe Rust only.
#![forbid(unsafe_code)]

pub mod config;
pub mod lane;
mod lanes;
pub mod message;
pub mod meta;
pub mod postoffice;
pub mod scheduler;
mod spin;
pub mod van;

// KV layer (dist-kv): key mapping, server state machine, worker requests.
pub mod keys;
pub mod kv;
#[cfg(test)]
mod kv_cluster_tests;
pub mod kv_node;
#[cfg(test)]
mod kv_vector_tests;
pub mod server;
pub mod store;
pub mod worker;
