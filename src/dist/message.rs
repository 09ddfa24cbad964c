//! A ps-lite message in memory: the meta fields with ps-lite's conventions
//! (`kEmpty` for unset ids, heads and timestamps) and the data parts as
//! shared byte buffers.
//!
//! On the wire a message is one ZeroMQ multipart message: the meta
//! (protobuf `ps.PBMeta`, [`super::meta::Meta`]) then one frame per data
//! part (ps-lite `src/zmq_van.h`, `SendMsg`/`RecvMsg`). [`Message::to_meta`]
//! writes the fields exactly as ps-lite's `Van::PackMeta` does, so a message
//! we build is byte-identical to the one a real MXNet 1.9.1 node sends.
#![forbid(unsafe_code)]

use super::meta;
use crate::error::{Error, Result};
pub use prost::bytes::Bytes;

/// ps-lite's `kEmpty` (`INT_MAX`): an unset id, head, app id or timestamp.
pub const EMPTY: i32 = i32::MAX;

/// ps-lite `DataType` codes used by MXNet for the three parts of a KV message.
pub const DT_UINT64: i32 = 8;
/// `char` values (MXNet's `SArray<char>`): ps-lite maps plain `char` to OTHER.
pub const DT_OTHER: i32 = 11;
pub const DT_INT32: i32 = 3;

/// A node's role (`PBNode.role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Server,
    Worker,
    Scheduler,
}

impl Role {
    pub fn code(self) -> i32 {
        match self {
            Role::Server => 0,
            Role::Worker => 1,
            Role::Scheduler => 2,
        }
    }

    pub fn from_code(code: i32) -> Option<Role> {
        match code {
            0 => Some(Role::Server),
            1 => Some(Role::Worker),
            2 => Some(Role::Scheduler),
            _ => None,
        }
    }

    /// `server`, `worker`, `scheduler` (the `DMLC_ROLE` spelling).
    pub fn name(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Worker => "worker",
            Role::Scheduler => "scheduler",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `Control::Command` of ps-lite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Empty,
    Terminate,
    AddNode,
    Barrier,
    Ack,
    Heartbeat,
    /// A code ps-lite does not know; receivers drop such messages.
    Unknown(i32),
}

impl Command {
    pub fn code(self) -> i32 {
        match self {
            Command::Empty => 0,
            Command::Terminate => 1,
            Command::AddNode => 2,
            Command::Barrier => 3,
            Command::Ack => 4,
            Command::Heartbeat => 5,
            Command::Unknown(c) => c,
        }
    }

    pub fn from_code(code: i32) -> Command {
        match code {
            0 => Command::Empty,
            1 => Command::Terminate,
            2 => Command::AddNode,
            3 => Command::Barrier,
            4 => Command::Ack,
            5 => Command::Heartbeat,
            c => Command::Unknown(c),
        }
    }
}

/// A node as listed in ADD_NODE and HEARTBEAT messages (ps-lite `Node`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub role: Role,
    /// [`EMPTY`] until the scheduler assigned one.
    pub id: i32,
    pub hostname: String,
    pub port: i32,
    pub is_recovery: bool,
    pub customer_id: i32,
    /// A libmxkv server's lane port (`PBNode` field 100, ours:
    /// [`super::lane`]); `None` for every other node.
    pub lane_port: Option<u16>,
}

impl Node {
    fn to_pb(&self) -> meta::Node {
        // ps-lite's PackMeta writes all six fields of every node.
        meta::Node {
            role: self.role.code(),
            id: Some(self.id),
            hostname: Some(self.hostname.clone()),
            port: Some(self.port),
            is_recovery: Some(self.is_recovery),
            customer_id: Some(self.customer_id),
            mxkv_lane_port: self.lane_port.map(i32::from),
        }
    }

    fn from_pb(n: &meta::Node) -> Result<Node> {
        let role = Role::from_code(n.role)
            .ok_or_else(|| Error::protocol(format!("node with unknown role {}", n.role)))?;
        Ok(Node {
            role,
            id: n.id.unwrap_or(EMPTY),
            hostname: n.hostname.clone().unwrap_or_default(),
            port: n.port.unwrap_or(0),
            is_recovery: n.is_recovery.unwrap_or(false),
            customer_id: n.customer_id.unwrap_or(0),
            // a port out of range is no lane
            lane_port: n.mxkv_lane_port.and_then(|p| u16::try_from(p).ok()),
        })
    }
}

/// The control part of a message (`PBControl`); absent for data messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Control {
    pub cmd: Command,
    pub nodes: Vec<Node>,
    /// Written only for [`Command::Barrier`]. In a barrier release from a real
    /// scheduler this is uninitialised memory; do not rely on it there.
    pub barrier_group: i32,
    /// Written only for [`Command::Ack`].
    pub msg_sig: u64,
}

impl Control {
    pub fn new(cmd: Command) -> Control {
        Control {
            cmd,
            nodes: Vec::new(),
            barrier_group: 0,
            msg_sig: 0,
        }
    }
}

/// One ps-lite message. `sender`/`recver` are not on the wire: the receiver
/// derives `sender` from the peer's ZeroMQ identity (`ps<id>`) and sets
/// `recver` to its own id; a sender sets `recver` to choose the peer.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Command of a data or SimpleApp message; [`EMPTY`] for control messages.
    pub head: i32,
    /// SimpleApp text (e.g. a pickled optimizer); empty = not written.
    pub body: Vec<u8>,
    pub control: Option<Control>,
    pub request: bool,
    pub push: bool,
    pub pull: bool,
    pub simple_app: bool,
    /// [`EMPTY`] = not written.
    pub app_id: i32,
    /// [`EMPTY`] = not written.
    pub timestamp: i32,
    /// Always written ([`EMPTY`] on ADD_NODE/HEARTBEAT/ACK).
    pub customer_id: i32,
    pub priority: i32,
    /// ps-lite `DataType` per data part; when empty and there are data
    /// parts, MXNet's `[UINT64, OTHER, INT32]` (first `data.len()`) is written.
    pub data_type: Vec<i32>,
    pub sender: i32,
    pub recver: i32,
    /// The data parts: for KV messages `[keys (u64 LE), vals, lens (i32 LE)]`
    /// or `[keys, vals]`. Received parts share the ZeroMQ frame's memory
    /// (no copy); make no alignment assumption when reading them.
    pub data: Vec<Bytes>,
}

impl Default for Message {
    fn default() -> Self {
        Message {
            head: EMPTY,
            body: Vec::new(),
            control: None,
            request: false,
            push: false,
            pull: false,
            simple_app: false,
            app_id: EMPTY,
            timestamp: EMPTY,
            customer_id: EMPTY,
            priority: 0,
            data_type: Vec::new(),
            sender: EMPTY,
            recver: EMPTY,
            data: Vec::new(),
        }
    }
}

impl Message {
    /// A control message with `cmd` (head, app id, timestamp and customer id unset).
    pub fn control(control: Control) -> Message {
        Message {
            control: Some(control),
            ..Message::default()
        }
    }

    /// The command, [`Command::Empty`] for data and SimpleApp messages.
    pub fn cmd(&self) -> Command {
        self.control.as_ref().map_or(Command::Empty, |c| c.cmd)
    }

    /// The wire meta, written as ps-lite's `Van::PackMeta` writes it.
    pub fn to_meta(&self) -> meta::Meta {
        let control = self
            .control
            .as_ref()
            .filter(|c| c.cmd != Command::Empty)
            .map(|c| meta::Control {
                cmd: c.cmd.code(),
                node: c.nodes.iter().map(Node::to_pb).collect(),
                barrier_group: (c.cmd == Command::Barrier).then_some(c.barrier_group),
                msg_sig: (c.cmd == Command::Ack).then_some(c.msg_sig),
            });
        let data_type = if self.data.is_empty() {
            Vec::new()
        } else if self.data_type.is_empty() {
            [DT_UINT64, DT_OTHER, DT_INT32]
                .iter()
                .copied()
                .chain(std::iter::repeat(DT_OTHER))
                .take(self.data.len())
                .collect()
        } else {
            self.data_type.clone()
        };
        meta::Meta {
            head: Some(self.head),
            body: (!self.body.is_empty()).then(|| self.body.clone()),
            control,
            request: Some(self.request),
            push: Some(self.push),
            simple_app: Some(self.simple_app),
            app_id: (self.app_id != EMPTY).then_some(self.app_id),
            timestamp: (self.timestamp != EMPTY).then_some(self.timestamp),
            data_type,
            customer_id: Some(self.customer_id),
            data_size: None,
            pull: Some(self.pull),
            priority: Some(self.priority),
        }
    }

    /// The serialised meta frame.
    pub fn encode_meta(&self) -> Vec<u8> {
        self.to_meta().to_bytes()
    }

    /// Builds a message from a wire meta and its data parts, with ps-lite's
    /// `UnpackMeta` defaults: absent app id, timestamp and node id are
    /// [`EMPTY`], absent head and customer id 0.
    pub fn from_meta(pb: &meta::Meta, data: Vec<Bytes>) -> Result<Message> {
        let control = match &pb.control {
            None => None,
            Some(c) => Some(Control {
                cmd: Command::from_code(c.cmd),
                nodes: c.node.iter().map(Node::from_pb).collect::<Result<_>>()?,
                barrier_group: c.barrier_group.unwrap_or(0),
                msg_sig: c.msg_sig.unwrap_or(0),
            }),
        };
        Ok(Message {
            head: pb.head.unwrap_or(0),
            body: pb.body.clone().unwrap_or_default(),
            control,
            request: pb.request.unwrap_or(false),
            push: pb.push.unwrap_or(false),
            pull: pb.pull.unwrap_or(false),
            simple_app: pb.simple_app.unwrap_or(false),
            app_id: pb.app_id.unwrap_or(EMPTY),
            timestamp: pb.timestamp.unwrap_or(EMPTY),
            customer_id: pb.customer_id.unwrap_or(0),
            priority: pb.priority.unwrap_or(0),
            data_type: pb.data_type.clone(),
            sender: EMPTY,
            recver: EMPTY,
            data,
        })
    }

    /// Parses a meta frame (and takes the data parts as they are).
    pub fn decode(meta_bytes: &[u8], data: Vec<Bytes>) -> Result<Message> {
        let pb = meta::Meta::from_bytes(meta_bytes)
            .map_err(|e| Error::protocol(format!("malformed ps-lite meta: {e}")))?;
        Message::from_meta(&pb, data)
    }

    /// Total bytes of the data parts.
    pub fn data_len(&self) -> usize {
        self.data.iter().map(|d| d.len()).sum()
    }
}

/// The ZeroMQ identity of a DEALER whose node id is `id`: `ps<id>`.
pub fn identity_of(id: i32) -> String {
    format!("ps{id}")
}

/// The node id a ROUTER derives from a peer identity, as ps-lite's
/// `ZMQVan::GetNodeID` does: `ps` followed by decimal digits up to the end,
/// anything else (libzmq's auto identities included) is [`EMPTY`].
pub fn sender_of_identity(identity: &[u8]) -> i32 {
    let Some(digits) = identity.strip_prefix(b"ps") else {
        return EMPTY;
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return EMPTY;
    }
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<i32>().ok())
        .unwrap_or(EMPTY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_request_bytes_as_a_real_worker_sends_them() {
        // A push request captured from a real MXNet 1.9.1 worker (23 bytes).
        let wire = [
            0x08, 0x00, 0x20, 0x01, 0x28, 0x01, 0x30, 0x00, 0x38, 0x00, 0x40, 0x01, 0x4a, 0x03,
            0x08, 0x0b, 0x03, 0x50, 0x00, 0x60, 0x00, 0x68, 0x00,
        ];
        let m = Message {
            head: 0,
            request: true,
            push: true,
            app_id: 0,
            timestamp: 1,
            customer_id: 0,
            data: vec![Bytes::new(), Bytes::new(), Bytes::new()],
            ..Message::default()
        };
        assert_eq!(m.encode_meta(), wire);
        let back = Message::decode(&wire, m.data.clone()).unwrap();
        assert_eq!(back.encode_meta(), wire);
        assert_eq!(back.timestamp, 1);
        assert!(back.push && back.request && !back.pull);
    }

    #[test]
    fn identities() {
        assert_eq!(sender_of_identity(b"ps9"), 9);
        assert_eq!(sender_of_identity(identity_of(1234).as_bytes()), 1234);
        assert_eq!(sender_of_identity(b"ps"), EMPTY);
        assert_eq!(sender_of_identity(b"ps9x"), EMPTY);
        assert_eq!(sender_of_identity(b"\x00\x6b\x8b\x45\x67"), EMPTY);
        assert_eq!(sender_of_identity(b"ps99999999999"), EMPTY);
    }

    #[test]
    fn garbage_meta_is_a_protocol_error() {
        let e = Message::decode(&[0xff, 0xff, 0xff], Vec::new()).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Protocol);
    }
}
