//! The transport against what a peer (or a stranger on a node's port) may
//! send it, and what it leaves behind: registrations whose address cannot be
//! an address, ADD_NODE replies from anyone but the scheduler, the socket
//! files of `DMLC_LOCAL`. In-process clusters on 127.0.0.1 with free ports;
//! every wait is bounded.

use mxkv::dist::config::Config;
use mxkv::dist::message::{Command, Control, Node, Role, EMPTY};
use mxkv::dist::postoffice::{control_message, Postoffice, ALL_GROUP};
use mxkv::error::{ErrorKind, Result};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn cfg(role: Role, port: u16, local: bool) -> Config {
    let mut c = Config::local(role, port, 1, 1, T);
    c.local = local;
    c
}

/// A scheduler for 1 worker and 1 server; its thread runs the start-up and
/// final barriers.
fn scheduler(local: bool) -> (Arc<Postoffice>, JoinHandle<Result<()>>) {
    let sched = Postoffice::bind(cfg(Role::Scheduler, 0, local)).unwrap();
    let s = sched.clone();
    let t = std::thread::spawn(move || {
        s.wait_ready()?;
        s.barrier(0, ALL_GROUP)?;
        s.finalize(true)
    });
    (sched, t)
}

/// A DEALER with `identity` (none: no ps<id>) connected to `endpoint`.
fn dealer(endpoint: &str, identity: Option<&str>) -> (zmq::Context, zmq::Socket) {
    let ctx = zmq::Context::new();
    let d = ctx.socket(zmq::DEALER).unwrap();
    d.set_linger(0).unwrap();
    d.set_sndtimeo(5000).unwrap();
    if let Some(id) = identity {
        d.set_identity(id.as_bytes()).unwrap();
    }
    d.connect(endpoint).unwrap();
    (ctx, d)
}

fn node(role: Role, id: i32, host: &str, port: i32) -> Node {
    Node {
        role,
        id,
        hostname: host.into(),
        port,
        is_recovery: false,
        customer_id: 0,
        lane_port: None,
    }
}

fn add_node(nodes: Vec<Node>, timestamp: i32) -> Vec<u8> {
    let mut ctl = Control::new(Command::AddNode);
    ctl.nodes = nodes;
    control_message(EMPTY, ctl, false, EMPTY, EMPTY, timestamp).encode_meta()
}

/// Waits (at most `T`) until `f` holds.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Starts the worker and the server of `port`'s scheduler; both must start.
fn start_nodes(port: u16, local: bool) -> Vec<Arc<Postoffice>> {
    let starts: Vec<JoinHandle<Result<Arc<Postoffice>>>> = [Role::Worker, Role::Server]
        .into_iter()
        .map(|role| std::thread::spawn(move || Postoffice::start(cfg(role, port, local))))
        .collect();
    starts
        .into_iter()
        .map(|h| h.join().expect("a node's start panicked").unwrap())
        .collect()
}

fn finish(nodes: Vec<Arc<Postoffice>>, sched_thread: JoinHandle<Result<()>>) {
    let ends: Vec<JoinHandle<Result<()>>> = nodes
        .into_iter()
        .map(|po| std::thread::spawn(move || po.finalize(true)))
        .collect();
    for h in ends {
        h.join().unwrap().unwrap();
    }
    sched_thread.join().unwrap().unwrap();
}

/// A registration whose hostname holds a NUL byte (a valid protobuf
/// string), or that has no hostname or no valid port, is dropped with a log
/// line: it takes no slot, and the scheduler's receive thread goes on (a
/// NUL byte made it panic in the `zmq` crate's connect once the cluster was
/// complete; the real nodes then waited out their deadline).
#[test]
fn dist_a_registration_that_is_no_address_is_dropped() {
    let (sched, sched_thread) = scheduler(false);
    let (_ctx, d) = dealer(&format!("tcp://127.0.0.1:{}", sched.port()), None);
    let bad = [
        ("127.0.0.1\0x", 5555),
        ("", 5555),
        ("127.0.0.1", 0),
        ("127.0.0.1", -1),
        ("127.0.0.1", 65536),
    ];
    for (i, (host, port)) in bad.into_iter().enumerate() {
        let before = sched.dropped_messages();
        let meta = add_node(vec![node(Role::Server, EMPTY, host, port)], i as i32);
        d.send(meta, 0).unwrap();
        until(
            &format!("the registration at {host:?}:{port} was dropped"),
            || sched.dropped_messages() > before,
        );
    }
    let nodes = start_nodes(sched.port(), false);
    let hosts: Vec<String> = sched.nodes().into_iter().map(|n| n.hostname).collect();
    assert_eq!(hosts, vec!["127.0.0.1"; 3]);
    finish(nodes, sched_thread);
}

/// Connecting to an address with a NUL byte is an error, not a panic: a
/// node given such a peer by the scheduler fails its start naming it.
#[test]
fn dist_a_peer_address_with_a_nul_byte_fails_the_start() {
    let ctx = zmq::Context::new();
    let fake = ctx.socket(zmq::ROUTER).unwrap();
    fake.set_linger(0).unwrap();
    fake.set_rcvtimeo(10_000).unwrap();
    fake.bind("tcp://127.0.0.1:*").unwrap();
    let ep = fake.get_last_endpoint().unwrap().unwrap();
    let root: u16 = ep.rsplit(':').next().unwrap().parse().unwrap();
    let server = std::thread::spawn(move || Postoffice::connect(cfg(Role::Server, root, false)));
    // The server's registration names its port.
    let frames = fake.recv_multipart(0).expect("no registration");
    let reg = mxkv::dist::message::Message::decode(&frames[1], Vec::new()).unwrap();
    let me = reg.control.unwrap().nodes.remove(0);
    let (_c, d) = dealer(&format!("tcp://127.0.0.1:{}", me.port), Some("ps1"));
    let nodes = vec![
        node(Role::Server, 8, &me.hostname, me.port),
        node(Role::Worker, 9, "127.0.0.1\0evil", 4242),
        node(Role::Scheduler, 1, "127.0.0.1", i32::from(root)),
    ];
    d.send(add_node(nodes, 0), 0).unwrap();
    let e = match server.join().expect("the server's start panicked") {
        Ok(_) => panic!("a server started with a peer at an address with a NUL byte"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), ErrorKind::PeerLost, "{e}");
    let text = e.to_string();
    assert!(text.contains("worker 0 (id 9)"), "{text}");
    assert!(text.contains("NUL byte"), "{text}");
}

fn ipc_path(port: u16) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/tmp/{port}"))
}

/// With DMLC_LOCAL, every node removes the socket file its ROUTER made
/// (`/tmp/<port>`) when it stops (libzmq leaves it, as real MXNet's nodes
/// do: review probe p11/p12).
#[test]
fn dist_local_nodes_remove_their_socket_files() {
    let (sched, sched_thread) = scheduler(true);
    let nodes = start_nodes(sched.port(), true);
    let mut ports: Vec<u16> = nodes.iter().map(|po| po.port()).collect();
    ports.push(sched.port());
    for &p in &ports {
        assert!(
            ipc_path(p).exists(),
            "no socket file /tmp/{p} while running"
        );
    }
    finish(nodes, sched_thread);
    drop(sched);
    for p in ports {
        assert!(!ipc_path(p).exists(), "/tmp/{p} is left behind");
    }
}

/// A node removes only the file its bind made: one put at the path since
/// (another node's, after libzmq replaced ours) stays.
#[test]
fn dist_local_node_leaves_a_file_it_did_not_make() {
    let po = Postoffice::bind(cfg(Role::Scheduler, 0, true)).unwrap();
    let path = ipc_path(po.port());
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"someone else's").unwrap();
    po.stop();
    drop(po);
    let left = std::fs::read(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(left.unwrap(), b"someone else's");
}

/// A local node whose start fails (no scheduler answers) removes its socket
/// file too.
#[test]
fn dist_local_node_that_fails_to_start_removes_its_socket_file() {
    let free = |_| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (root, port) = (free(0), free(1));
    let mut c = cfg(Role::Worker, root, true);
    c.port = Some(port);
    c.timeout = Duration::from_millis(500);
    let e = match Postoffice::start(c) {
        Ok(_) => panic!("a worker started without a scheduler"),
        Err(e) => e,
    };
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    let path = ipc_path(port);
    let left = path.exists();
    let _ = std::fs::remove_file(&path);
    assert!(!left, "/tmp/{port} is left behind");
}

/// A ROUTER playing the scheduler: a node registers with it.
struct FakeScheduler {
    _ctx: zmq::Context,
    router: zmq::Socket,
    port: u16,
}

impl FakeScheduler {
    fn new() -> FakeScheduler {
        let ctx = zmq::Context::new();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.set_rcvtimeo(10_000).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let ep = router.get_last_endpoint().unwrap().unwrap();
        let port = ep.rsplit(':').next().unwrap().parse().unwrap();
        FakeScheduler {
            _ctx: ctx,
            router,
            port,
        }
    }

    /// The node that registered.
    fn registration(&self) -> Node {
        let frames = self.router.recv_multipart(0).expect("no registration");
        let reg = mxkv::dist::message::Message::decode(&frames[1], Vec::new()).unwrap();
        reg.control.unwrap().nodes.remove(0)
    }
}

/// An ADD_NODE reply is taken from the scheduler only (identity ps1): one
/// from a peer without an id or with another id is dropped with a log line,
/// and the node waits on for the scheduler's (it took the stranger's ids,
/// connected to the peers it named and passed the barriers it released:
/// review probe p17).
#[test]
fn dist_add_node_reply_only_from_the_scheduler() {
    let fake = FakeScheduler::new();
    let po = Postoffice::bind(cfg(Role::Server, fake.port, false)).unwrap();
    let me = fake.registration();
    let endpoint = format!("tcp://127.0.0.1:{}", me.port);
    let reply = |sched_port: u16| {
        add_node(
            vec![
                node(Role::Server, 8, &me.hostname, me.port),
                node(Role::Worker, 9, "127.0.0.1", 4242),
                node(Role::Scheduler, 1, "127.0.0.1", i32::from(sched_port)),
            ],
            0,
        )
    };
    let stranger = FakeScheduler::new();
    for identity in [None, Some("ps9"), Some("ps8")] {
        let before = po.dropped_messages();
        let (_c, d) = dealer(&endpoint, identity);
        d.send(reply(stranger.port), 0).unwrap();
        until(&format!("the reply from {identity:?} was dropped"), || {
            po.dropped_messages() > before || !po.nodes().is_empty()
        });
        assert!(po.nodes().is_empty(), "a reply from {identity:?} was taken");
        assert_eq!(po.my_id(), EMPTY);
    }
    let (_c, d) = dealer(&endpoint, Some("ps1"));
    d.send(reply(fake.port), 0).unwrap();
    po.wait_ready().unwrap();
    assert_eq!(po.my_id(), 8);
    // A lost-peer notice that says nothing (a heartbeat with a body that
    // is not "<node id> <reason>") is dropped with a log line (it was
    // ignored without one).
    let before = po.dropped_messages();
    let meta = mxkv::dist::message::Message {
        body: b"nonsense".to_vec(),
        ..control_message(
            EMPTY,
            Control::new(Command::Heartbeat),
            false,
            EMPTY,
            EMPTY,
            1,
        )
    }
    .encode_meta();
    d.send(meta, 0).unwrap();
    until("the notice was dropped", || po.dropped_messages() > before);
    assert!(po.lost_peers().is_empty());
    po.stop();
}

/// Registrations the scheduler does not take (a second one from the same
/// address, one past the number of nodes of a role, one once the cluster is
/// complete) are dropped like every other message it drops: counted, and
/// their log lines rate-limited (each printed a line of its own, so a peer
/// sending them without end filled the log without end).
#[test]
fn dist_registrations_not_taken_are_counted_drops() {
    let sched = Postoffice::bind(cfg(Role::Scheduler, 0, false)).unwrap();
    let (_ctx, d) = dealer(&format!("tcp://127.0.0.1:{}", sched.port()), None);
    let register = |port: i32, timestamp: i32| {
        let before = sched.dropped_messages();
        let meta = add_node(
            vec![node(Role::Worker, EMPTY, "127.0.0.1", port)],
            timestamp,
        );
        d.send(meta, 0).unwrap();
        before
    };
    // the first is taken (the one worker's slot): the scheduler connects to
    // no one until every node registered
    register(4242, 0);
    for (port, ts) in [(4242, 1), (4343, 2)] {
        let before = register(port, ts);
        until(
            &format!("the registration at port {port} was dropped"),
            || sched.dropped_messages() > before,
        );
    }
    assert_eq!(sched.dropped_messages(), 2);
    sched.stop();

    let (sched, sched_thread) = scheduler(false);
    let nodes = start_nodes(sched.port(), false);
    let (_ctx, d) = dealer(&format!("tcp://127.0.0.1:{}", sched.port()), None);
    let before = sched.dropped_messages();
    let meta = add_node(vec![node(Role::Server, EMPTY, "127.0.0.1", 4444)], 0);
    d.send(meta, 0).unwrap();
    until("the registration after the start was dropped", || {
        sched.dropped_messages() > before
    });
    finish(nodes, sched_thread);
}
