//! Every ps-lite meta frame captured between real MXNet 1.9.1 processes
//! (tests/vectors/dist) decodes and re-encodes to the same bytes, both as the
//! raw protobuf struct and through `Message`, which writes the fields the way
//! ps-lite's `Van::PackMeta` does.

use mxkv::dist::message::{sender_of_identity, Bytes, Command, Message, Role, EMPTY};
use mxkv::dist::meta::Meta;

struct Captured {
    file: &'static str,
    index: usize,
    identity: String,
    meta: Vec<u8>,
    data: Vec<Vec<u8>>,
}

/// The string value of `"key": "..."` in a line of the capture files (their
/// strings hold no escapes in the fields read here).
fn str_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\": \"");
    let start = line.find(&pat)? + pat.len();
    let end = start + line[start..].find('"')?;
    Some(&line[start..end])
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len() % 2 == 0, "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// `"data_hex": ["..", ".."]` → the parts.
fn data_parts(line: &str) -> Vec<Vec<u8>> {
    let pat = "\"data_hex\": [";
    let start = line.find(pat).expect("data_hex") + pat.len();
    let end = start + line[start..].find(']').expect("data_hex end");
    line[start..end]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| hex(s.trim_matches('"')))
        .collect()
}

fn load() -> Vec<Captured> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/dist");
    let mut out = Vec::new();
    for file in [
        "session_a.jsonl",
        "session_b.jsonl",
        "session_c.jsonl",
        "session_d.jsonl",
        "session_e.jsonl",
        "session_f.jsonl",
    ] {
        let text = std::fs::read_to_string(format!("{dir}/{file}")).expect("vector file");
        for line in text.lines() {
            if str_field(line, "type") != Some("message") {
                continue;
            }
            let index: usize = {
                let pat = "\"index\": ";
                let s = &line[line.find(pat).unwrap() + pat.len()..];
                s[..s.find(',').unwrap()].parse().unwrap()
            };
            out.push(Captured {
                file,
                index,
                identity: str_field(line, "identity").unwrap_or("").to_string(),
                meta: hex(str_field(line, "meta_hex").expect("meta_hex")),
                data: data_parts(line),
            });
        }
    }
    out
}

#[test]
fn dist_vectors_all_339_meta_frames_round_trip() {
    let msgs = load();
    assert_eq!(msgs.len(), 339, "captured ps-lite messages");
    let (mut releases, mut sched_entries) = (0, 0);
    let mut data_msgs = 0;
    for c in &msgs {
        let at = format!("{} #{}", c.file, c.index);
        // Raw protobuf: decode and re-encode.
        let pb = Meta::from_bytes(&c.meta).unwrap_or_else(|e| panic!("{at}: {e}"));
        assert_eq!(pb.to_bytes(), c.meta, "{at}: raw re-encode");
        // Through Message, as ps-lite packs a meta.
        let data: Vec<Bytes> = c.data.iter().cloned().map(Bytes::from).collect();
        let m = Message::decode(&c.meta, data).unwrap_or_else(|e| panic!("{at}: {e}"));
        assert_eq!(m.encode_meta(), c.meta, "{at}: Message re-encode");
        assert_eq!(m.data.len(), c.data.len());
        if !m.data.is_empty() {
            data_msgs += 1;
            assert!(m.control.is_none(), "{at}");
            assert_eq!(
                m.data_type.len(),
                m.data.len(),
                "{at}: one data type per part"
            );
            // A data message always comes from a DEALER with a ps<id> identity.
            assert_ne!(sender_of_identity(c.identity.as_bytes()), EMPTY, "{at}");
        }
        // The two fields the real scheduler leaves uninitialised (they differ
        // run to run; they still round-trip here).
        if let Some(ctl) = &m.control {
            let release = ctl.cmd == Command::Barrier && !m.request;
            let sched_entry = matches!(ctl.cmd, Command::AddNode | Command::Heartbeat)
                && ctl.nodes.iter().any(|n| n.role == Role::Scheduler);
            releases += usize::from(release);
            sched_entries += usize::from(sched_entry);
            if release {
                assert!(
                    ![1, 2, 3, 4, 5, 6, 7].contains(&ctl.barrier_group),
                    "{at}: release group {} looked initialised",
                    ctl.barrier_group
                );
            }
        }
    }
    assert_eq!(data_msgs, 72, "messages with data parts");
    // Uninitialised fields: 54 barrier releases (garbage barrier_group) and
    // 21 ADD_NODE replies / heartbeat answers (the scheduler's customer_id).
    assert_eq!(releases, 54, "barrier releases");
    assert_eq!(sched_entries, 21, "messages listing the scheduler node");
}

#[test]
fn dist_vectors_senders_from_identities() {
    let msgs = load();
    let mut anonymous = 0;
    for c in &msgs {
        let sender = sender_of_identity(c.identity.as_bytes());
        if c.identity.is_empty() {
            anonymous += 1;
            assert_eq!(sender, EMPTY);
            // Only registration goes out before a node has its id.
            let m = Message::decode(&c.meta, Vec::new()).unwrap();
            assert_eq!(m.cmd(), Command::AddNode, "{} #{}", c.file, c.index);
        } else {
            assert!([1, 8, 9, 10, 11].contains(&sender), "{}", c.identity);
        }
    }
    // one ADD_NODE per server and worker of the six sessions
    assert_eq!(anonymous, 15);
}

fn node_id(name: &str) -> i32 {
    match name {
        "H" => 1,
        "S0" => 8,
        "S1" => 10,
        "W0" => 9,
        "W1" => 11,
        other => panic!("unknown node {other}"),
    }
}

#[test]
fn dist_vectors_resender_signatures() {
    // Session F ran with PS_RESEND=1: every message after start-up is
    // acknowledged with its signature. Each ACK's msg_sig is the signature
    // (ps-lite Resender::GetKey) of a message captured in that session.
    use mxkv::dist::postoffice::signature;
    use std::collections::HashSet;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/dist/session_f.jsonl"
    ))
    .unwrap();
    let mut sigs = HashSet::new();
    let mut acks = Vec::new();
    for line in text.lines() {
        if str_field(line, "type") != Some("message") {
            continue;
        }
        let mut m =
            Message::decode(&hex(str_field(line, "meta_hex").unwrap()), Vec::new()).unwrap();
        m.sender = sender_of_identity(str_field(line, "identity").unwrap().as_bytes());
        m.recver = node_id(str_field(line, "to").unwrap());
        match m.cmd() {
            Command::Ack => acks.push(m.control.as_ref().unwrap().msg_sig),
            _ if m.timestamp != EMPTY && m.sender != EMPTY => {
                sigs.insert(signature(&m));
            }
            _ => {}
        }
    }
    assert!(acks.len() >= 10, "{} ACKs", acks.len());
    assert!(acks.contains(&0x90100000003), "worker 9's barrier ts 1");
    for a in &acks {
        assert!(sigs.contains(a), "ACK {a:#x} matches no captured message");
    }
}

#[test]
fn dist_vectors_our_control_messages_match_the_captured_bytes() {
    use mxkv::dist::message::{Control, Node};
    use mxkv::dist::postoffice::control_message;
    // Built the way our postoffice builds them, compared with what real nodes
    // sent in session A (fields without uninitialised memory only).
    let node = |role, port| Node {
        role,
        id: EMPTY,
        hostname: "127.0.0.1".into(),
        port,
        is_recovery: false,
        customer_id: 0,
        lane_port: None,
    };
    let mut add = Control::new(Command::AddNode);
    add.nodes.push(node(Role::Server, 9301));
    let m = control_message(1, add, false, EMPTY, EMPTY, 0);
    assert_eq!(
        m.encode_meta(),
        hex("08ffffffff071a1e0802121a080010ffffffff071a093132372e302e302e3120d54828005000200028003000400050ffffffff0760006800")
    );
    let mut barrier = Control::new(Command::Barrier);
    barrier.barrier_group = 7;
    let m = control_message(1, barrier, true, 0, 0, 1);
    assert_eq!(
        m.encode_meta(),
        hex("08ffffffff071a040803180720012800300038004001500060006800")
    );
    // a server's heartbeat (session E, van timestamp 2)
    let mut hb = Control::new(Command::Heartbeat);
    hb.nodes.push(Node {
        id: 8,
        ..node(Role::Server, 9341)
    });
    let m = control_message(1, hb, false, EMPTY, EMPTY, 2);
    assert_eq!(
        m.encode_meta(),
        hex("08ffffffff071a1a08051216080010081a093132372e302e302e3120fd4828005000200028003000400250ffffffff0760006800")
    );
    // the scheduler's own barrier request (van timestamp 4)
    let mut barrier = Control::new(Command::Barrier);
    barrier.barrier_group = 7;
    let m = control_message(1, barrier, true, 0, 0, 4);
    assert_eq!(
        m.encode_meta(),
        hex("08ffffffff071a040803180720012800300038004004500060006800")
    );
}
