//! ps-lite's wire schema (`src/meta.proto` of ps-lite 34fd45c, the commit
//! MXNet 1.9.1 pins), written by hand for prost: proto2, package `ps`.
//!
//! Every optional field is an `Option`, so a decoded meta re-encodes to the
//! same bytes: an absent field stays absent, a field written with its default
//! value (ps-lite writes `request = false` explicitly) stays written. Fields
//! go out in tag order, negative `int32` values as 10-byte varints, exactly as
//! protobuf-lite writes them.
//!
//! These are the bytes on the wire; [`super::message::Message`] is the
//! in-memory form with ps-lite's `kEmpty` conventions.
#![forbid(unsafe_code)]

use prost::Message as _;

/// `ps.PBNode`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    /// 0 server, 1 worker, 2 scheduler.
    #[prost(int32, required, tag = "1")]
    pub role: i32,
    #[prost(int32, optional, tag = "2")]
    pub id: Option<i32>,
    #[prost(string, optional, tag = "3")]
    pub hostname: Option<String>,
    #[prost(int32, optional, tag = "4")]
    pub port: Option<i32>,
    #[prost(bool, optional, tag = "5")]
    pub is_recovery: Option<bool>,
    #[prost(int32, optional, tag = "10")]
    pub customer_id: Option<i32>,
    /// Ours, not ps-lite's: a libmxkv server's lane port ([`super::lane`]).
    /// ps-lite skips the field; a real MXNet scheduler drops it when it
    /// passes the node on, so its clusters have no lanes.
    #[prost(int32, optional, tag = "100")]
    pub mxkv_lane_port: Option<i32>,
}

/// `ps.PBControl`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Control {
    /// 0 EMPTY, 1 TERMINATE, 2 ADD_NODE, 3 BARRIER, 4 ACK, 5 HEARTBEAT.
    #[prost(int32, required, tag = "1")]
    pub cmd: i32,
    #[prost(message, repeated, tag = "2")]
    pub node: Vec<Node>,
    #[prost(int32, optional, tag = "3")]
    pub barrier_group: Option<i32>,
    #[prost(uint64, optional, tag = "4")]
    pub msg_sig: Option<u64>,
}

/// `ps.PBMeta`, the first frame of every ps-lite message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Meta {
    #[prost(int32, optional, tag = "1")]
    pub head: Option<i32>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub body: Option<Vec<u8>>,
    #[prost(message, optional, tag = "3")]
    pub control: Option<Control>,
    #[prost(bool, optional, tag = "4")]
    pub request: Option<bool>,
    #[prost(bool, optional, tag = "5")]
    pub push: Option<bool>,
    #[prost(bool, optional, tag = "6")]
    pub simple_app: Option<bool>,
    #[prost(int32, optional, tag = "7")]
    pub app_id: Option<i32>,
    #[prost(int32, optional, tag = "8")]
    pub timestamp: Option<i32>,
    #[prost(int32, repeated, packed = "true", tag = "9")]
    pub data_type: Vec<i32>,
    #[prost(int32, optional, tag = "10")]
    pub customer_id: Option<i32>,
    #[prost(int32, optional, tag = "11")]
    pub data_size: Option<i32>,
    #[prost(bool, optional, tag = "12")]
    pub pull: Option<bool>,
    #[prost(int32, optional, tag = "13")]
    pub priority: Option<i32>,
}

impl Meta {
    /// Serialises to protobuf bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }

    /// Parses protobuf bytes; unknown fields are skipped, missing required
    /// fields (`role`, `cmd`) are an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<Meta, prost::DecodeError> {
        Meta::decode(bytes)
    }
}
