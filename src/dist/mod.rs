//! The distributed KVStore's transport, shaped like ps-lite (the parameter
//! server library MXNet 1.9.1 links): wire meta ([`meta`]), messages
//! ([`message`]), and, above them, the van, postoffice and scheduler.
//! Safe Rust only.
#![forbid(unsafe_code)]

pub mod config;
pub mod message;
pub mod meta;
pub mod postoffice;
pub mod scheduler;
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

/// How long a thread that expects a message soon watches for it (yielding
/// the CPU to any thread that wants it) before it sleeps: a worker waiting for
/// a reply, and a van's receive thread after a message. A reply comes within
/// tens of microseconds, and a sleeping thread is woken much later than one
/// that watches (on a VM an idle CPU must be woken first): a 1-element push +
/// pull takes less than half the time. Each wait costs at most this much CPU.
pub(crate) const SPIN: std::time::Duration = std::time::Duration::from_micros(250);
