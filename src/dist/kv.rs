//! What the KV server and worker share: the "send this message" trait the
//! transport implements, the key/value/length parts of a KV message, and
//! how an error travels back to a worker.
//!
//! # Error replies
//!
//! ps-lite has no error channel: a real MXNet server that cannot serve a
//! request aborts, and its workers wait forever. Our server answers such a
//! request instead, with an ordinary response (`request = false`, `head`,
//! `timestamp`, `customer_id`, `push`, `pull`, `simple_app` echoed, so the
//! worker's completion tracking counts it) that carries **no data parts** and
//! a `body` of `mxkv-error/<kind>/<text>` (`kind` one of `other`, `usage`,
//! `not-inited`, `timeout`, `peer-lost`, `protocol`). A ps-lite response
//! never has a body otherwise (`KVServer::Response` and
//! `SimpleApp::Response` leave it empty), so nothing else can be mistaken
//! for an error. Our worker turns it into an [`Error`] of that kind for the
//! call that made the request. A real MXNet worker ignores the body: a failed
//! push or command then completes, and a failed pull fails ps-lite's check
//! that a pull response has data (`KVWorker::Process`), so it stops with an
//! error instead of waiting forever; it only sees this when our server
//! refuses something a real server would have died on.
#![forbid(unsafe_code)]

use super::message::{Bytes, Message};
use crate::error::{Error, ErrorKind, Result};

/// Sends one ps-lite message to `msg.recver` (the van fills in the sender).
pub trait Transport: Send + Sync {
    fn send(&self, msg: Message) -> Result<()>;

    /// Sends `msg` with data part `part` (which exists) replaced by a copy
    /// of `src`. A transport that can copy straight into its outgoing frame
    /// overrides this (the van: [`super::van::Van::send_copying`]).
    fn send_copying(&self, mut msg: Message, part: usize, src: &[u8]) -> Result<()> {
        match msg.data.get_mut(part) {
            Some(p) => *p = Bytes::copy_from_slice(src),
            None => {
                return Err(Error::new(format!(
                    "internal: no data part {part} in a message of {} parts",
                    msg.data.len()
                )))
            }
        }
        self.send(msg)
    }

    /// Watches `ready` for a short while without sleeping
    /// ([`super::spin::Watcher::watch`]); a transport whose answers the
    /// waiting thread can read itself does that between two looks.
    fn watch(&self, ready: &mut dyn FnMut() -> bool) -> bool {
        super::spin::watcher().watch(ready)
    }

    /// A thread starts (`true`) or ends (`false`) sleeping until an answer
    /// comes; a transport whose answers the waiting threads read themselves
    /// must then read for it.
    fn sleeping(&self, _asleep: bool) {}
}

/// The node id of server rank `r` (ps-lite: `8 + 2r`).
pub fn server_id(rank: usize) -> i32 {
    8 + 2 * rank as i32
}

/// The node id of worker rank `r` (ps-lite: `9 + 2r`).
pub fn worker_id(rank: usize) -> i32 {
    9 + 2 * rank as i32
}

/// The rank of node id `id` (ps-lite's `IDtoRank`).
pub fn rank_of(id: i32) -> usize {
    ((id - 8) / 2).max(0) as usize
}

/// "worker 1 (id 11)", "server 0 (id 8)" for messages.
pub fn node_name(id: i32) -> String {
    match id {
        1 => "the scheduler (id 1)".to_string(),
        id if id >= 8 && id % 2 == 0 => format!("server {} (id {id})", rank_of(id)),
        id if id >= 9 => format!("worker {} (id {id})", rank_of(id)),
        id => format!("node {id}"),
    }
}

/// The `keys`, `vals` and `lens` parts of a KV message (ps-lite `KVPairs`).
/// `vals` is shared with the message (no copy) and may be unaligned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvPairs {
    pub keys: Vec<u64>,
    pub vals: Bytes,
    pub lens: Vec<i32>,
}

impl KvPairs {
    /// Reads the data parts of a message: none, `[keys, vals]` or
    /// `[keys, vals, lens]` with one len per key (`KVServer::Process`).
    pub fn from_parts(data: &[Bytes]) -> Result<KvPairs> {
        match data.len() {
            0 => return Ok(KvPairs::default()),
            2 | 3 => {}
            n => {
                return Err(Error::protocol(format!(
                    "a KV message has 0, 2 or 3 data parts, not {n}"
                )))
            }
        }
        let keys = read_u64s(&data[0])?;
        let lens = match data.get(2) {
            Some(l) => read_i32s(l)?,
            None => Vec::new(),
        };
        if !lens.is_empty() || data.len() == 3 {
            ensure_protocol(
                lens.len() == keys.len(),
                format!(
                    "{} lens for {} keys in a KV message",
                    lens.len(),
                    keys.len()
                ),
            )?;
        }
        Ok(KvPairs {
            keys,
            vals: data[1].clone(),
            lens,
        })
    }

    /// The data parts to send: `[keys, vals]`, plus `lens` when there are
    /// any; nothing when there are no keys (`KVServer::Response`).
    pub fn into_parts(self) -> Vec<Bytes> {
        if self.keys.is_empty() {
            return Vec::new();
        }
        let mut parts = vec![u64_bytes(&self.keys), self.vals];
        if !self.lens.is_empty() {
            parts.push(i32_bytes(&self.lens));
        }
        parts
    }
}

fn ensure_protocol(ok: bool, msg: String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::protocol(msg))
    }
}

/// Little-endian `u64`s of a part (any alignment).
pub fn read_u64s(b: &[u8]) -> Result<Vec<u64>> {
    ensure_protocol(
        b.len() % 8 == 0,
        format!("a keys part of {} bytes is not a list of u64", b.len()),
    )?;
    Ok(b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Little-endian `i32`s of a part (any alignment).
pub fn read_i32s(b: &[u8]) -> Result<Vec<i32>> {
    ensure_protocol(
        b.len() % 4 == 0,
        format!("a lens part of {} bytes is not a list of i32", b.len()),
    )?;
    Ok(b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

/// Little-endian `u32`s of a part (any alignment): compressed words.
pub fn read_u32s(b: &[u8]) -> Result<Vec<u32>> {
    ensure_protocol(
        b.len() % 4 == 0,
        format!("a part of {} bytes is not a list of 4-byte words", b.len()),
    )?;
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

/// A copy of `src` in a new buffer for a message. Large copies are split
/// over threads (`kernels::copy_bytes`): the buffer's fresh pages are faulted
/// in by both threads, which is most of the cost here.
pub fn copy_to_vec(src: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; src.len()];
    crate::ndarray::kernels::copy_bytes(src, &mut v);
    v
}

pub fn u64_bytes(v: &[u64]) -> Bytes {
    Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

pub fn i32_bytes(v: &[i32]) -> Bytes {
    Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

/// The prefix of an error reply's body.
pub const ERROR_PREFIX: &[u8] = b"mxkv-error/";

fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Usage => "usage",
        ErrorKind::NotInited => "not-inited",
        ErrorKind::Timeout => "timeout",
        ErrorKind::PeerLost => "peer-lost",
        ErrorKind::Protocol => "protocol",
        _ => "other",
    }
}

fn kind_from_name(name: &str) -> ErrorKind {
    match name {
        "usage" => ErrorKind::Usage,
        "not-inited" => ErrorKind::NotInited,
        "timeout" => ErrorKind::Timeout,
        "peer-lost" => ErrorKind::PeerLost,
        "protocol" => ErrorKind::Protocol,
        _ => ErrorKind::Other,
    }
}

/// The body of an error reply for `err`.
pub fn error_body(err: &Error) -> Vec<u8> {
    let mut b = ERROR_PREFIX.to_vec();
    b.extend_from_slice(kind_name(err.kind()).as_bytes());
    b.push(b'/');
    b.extend_from_slice(err.message().as_bytes());
    b
}

/// The error an error reply carries, `None` for an ordinary response.
pub fn reply_error(msg: &Message) -> Option<Error> {
    let rest = msg.body.strip_prefix(ERROR_PREFIX)?;
    let text = String::from_utf8_lossy(rest);
    let (kind, text) = text.split_once('/').unwrap_or(("other", &text));
    Some(Error::with_kind(kind_from_name(kind), text.to_string()))
}

/// The response to `req` as ps-lite's `KVServer::Response` /
/// `SimpleApp::Response` builds it, without data.
pub fn response_to(req: &Message) -> Message {
    Message {
        head: req.head,
        request: false,
        push: req.push,
        pull: req.pull,
        simple_app: req.simple_app,
        app_id: 0,
        timestamp: req.timestamp,
        customer_id: req.customer_id,
        recver: req.sender,
        ..Message::default()
    }
}

/// An error reply to `req` (see the module documentation).
pub fn error_reply(req: &Message, err: &Error) -> Message {
    let mut m = response_to(req);
    m.body = error_body(err);
    m
}

/// Checks `ok`, else a protocol error (a malformed request).
pub(crate) fn protocol_check(ok: bool, msg: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::protocol(msg()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_round_trip_and_checks() {
        let kv = KvPairs {
            keys: vec![1, 0x8000_0000_0000_0002],
            vals: Bytes::from(vec![1u8, 2, 3, 4, 5, 6]),
            lens: vec![2, 4],
        };
        let parts = kv.clone().into_parts();
        assert_eq!(parts.len(), 3);
        assert_eq!(&parts[0][8..], &0x8000_0000_0000_0002u64.to_le_bytes());
        assert_eq!(KvPairs::from_parts(&parts).unwrap(), kv);
        // a pull request: [keys, empty vals], no lens
        let pull = KvPairs {
            keys: vec![7],
            ..KvPairs::default()
        };
        let parts = pull.clone().into_parts();
        assert_eq!(parts.len(), 2);
        assert!(parts[1].is_empty());
        assert_eq!(KvPairs::from_parts(&parts).unwrap(), pull);
        // malformed
        let e = KvPairs::from_parts(&[Bytes::from(vec![0u8; 7]), Bytes::new()]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Protocol);
        let e = KvPairs::from_parts(&[
            Bytes::from(vec![0u8; 16]),
            Bytes::new(),
            Bytes::from(vec![0u8; 4]),
        ])
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Protocol);
        assert!(KvPairs::from_parts(&[Bytes::new()]).is_err());
        assert_eq!(KvPairs::from_parts(&[]).unwrap(), KvPairs::default());
    }

    #[test]
    fn error_replies() {
        let req = Message {
            head: 5,
            request: true,
            push: true,
            app_id: 0,
            timestamp: 17,
            customer_id: 0,
            sender: 11,
            ..Message::default()
        };
        let ok = response_to(&req);
        assert_eq!(
            (ok.head, ok.request, ok.push, ok.timestamp, ok.recver),
            (5, false, true, 17, 11)
        );
        assert!(reply_error(&ok).is_none());
        let err = error_reply(&req, &Error::not_inited("init 3 first"));
        let back = reply_error(&err).unwrap();
        assert_eq!(back.kind(), ErrorKind::NotInited);
        assert_eq!(back.message(), "init 3 first");
        assert!(err.data.is_empty());
        // the meta of an error reply still says which request it answers
        assert_eq!(err.timestamp, 17);
    }

    #[test]
    fn ids() {
        assert_eq!((server_id(0), server_id(1)), (8, 10));
        assert_eq!((worker_id(0), worker_id(1)), (9, 11));
        assert_eq!(
            (rank_of(8), rank_of(9), rank_of(10), rank_of(11), rank_of(1)),
            (0, 0, 1, 1, 0)
        );
        assert_eq!(node_name(11), "worker 1 (id 11)");
        assert_eq!(node_name(8), "server 0 (id 8)");
    }
}
