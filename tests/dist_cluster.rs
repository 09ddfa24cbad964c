//! A whole ps-lite cluster in one process: scheduler, servers and workers as
//! threads on 127.0.0.1 with free ports. Start-up (ids, ranks), barriers,
//! shutdown, and the failures: no scheduler, a lost node, garbage on a port.
//! Every wait is bounded by the configured timeout; tests run one at a time
//! so that the thread check at their end sees only their own threads.

use mxkv::dist::config::Config;
use mxkv::dist::message::{Bytes, Message, Role};
use mxkv::dist::postoffice::{Customer, Postoffice, ALL_GROUP, WORKER_GROUP};
use mxkv::dist::scheduler;
use mxkv::error::{Error, ErrorKind};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn cfg(role: Role, port: u16, w: usize, s: usize, timeout: Duration) -> Config {
    Config::local(role, port, w, s, timeout)
}

/// Threads of this process whose names say they belong to the transport.
fn transport_threads() -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(name) = std::fs::read_to_string(e.path().join("comm")) {
            let name = name.trim().to_string();
            if name.starts_with("ZMQbg") || name.starts_with("mxkv-") {
                v.push(name);
            }
        }
    }
    v
}

/// Threads may take a moment to disappear from /proc after join.
fn assert_no_transport_threads() {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let t = transport_threads();
        if t.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "threads left behind: {t:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_node<T: Send + 'static>(
    c: Config,
    body: impl FnOnce(Arc<Postoffice>) -> T + Send + 'static,
) -> JoinHandle<Result<T, Error>> {
    std::thread::spawn(move || {
        let po = Postoffice::start(c)?;
        Ok(body(po))
    })
}

#[test]
fn dist_cluster_start_barrier_shutdown() {
    let _g = serial();
    for (nw, ns) in [(1, 1), (2, 2), (3, 1)] {
        let t = Duration::from_secs(20);
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0, nw, ns, t)).unwrap();
        let port = sched.port();
        let mut servers = Vec::new();
        for _ in 0..ns {
            servers.push(spawn_node(cfg(Role::Server, port, nw, ns, t), |po| {
                let id = (po.my_id(), po.my_rank());
                (id, po.finalize(true))
            }));
        }
        let mut workers = Vec::new();
        for _ in 0..nw {
            workers.push(spawn_node(cfg(Role::Worker, port, nw, ns, t), |po| {
                let id = (po.my_id(), po.my_rank());
                // several rounds of worker barriers, as kv._barrier() does
                for _ in 0..3 {
                    po.barrier(0, WORKER_GROUP).unwrap();
                }
                assert_eq!(
                    po.group_members(ALL_GROUP).len(),
                    po.num_workers() + po.num_servers() + 1
                );
                assert_eq!(po.nodes().len(), po.num_workers() + po.num_servers() + 1);
                (id, po.finalize(true))
            }));
        }
        let mut wids: Vec<(i32, usize)> = Vec::new();
        for w in workers {
            let (id, fin) = w.join().unwrap().unwrap();
            fin.unwrap();
            wids.push(id);
        }
        let mut sids: Vec<(i32, usize)> = Vec::new();
        for s in servers {
            let (id, fin) = s.join().unwrap().unwrap();
            fin.unwrap();
            sids.push(id);
        }
        sched.join().unwrap();
        wids.sort();
        sids.sort();
        let want_w: Vec<(i32, usize)> = (0..nw).map(|r| (9 + 2 * r as i32, r)).collect();
        let want_s: Vec<(i32, usize)> = (0..ns).map(|r| (8 + 2 * r as i32, r)).collect();
        assert_eq!(wids, want_w);
        assert_eq!(sids, want_s);
        assert_no_transport_threads();
    }
}

#[test]
fn dist_cluster_ranks_follow_port_order() {
    let _g = serial();
    // ps-lite's order on one host: ascending port. Pin ports so the order is
    // known: take free ports, then give the higher one to the first worker.
    let free = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (mut p1, mut p2) = (free(), free());
    while p1 == p2 {
        p2 = free();
    }
    if p1 < p2 {
        std::mem::swap(&mut p1, &mut p2);
    }
    let t = Duration::from_secs(20);
    let sched = scheduler::spawn(cfg(Role::Scheduler, 0, 2, 1, t)).unwrap();
    let port = sched.port();
    let server = spawn_node(cfg(Role::Server, port, 2, 1, t), |po| po.finalize(true));
    let mut handles = Vec::new();
    for p in [p1, p2] {
        let mut c = cfg(Role::Worker, port, 2, 1, t);
        c.port = Some(p);
        handles.push((p, spawn_node(c, |po| (po.my_rank(), po.finalize(true)))));
    }
    let mut got = Vec::new();
    for (p, h) in handles {
        let (rank, fin) = h.join().unwrap().unwrap();
        fin.unwrap();
        got.push((p, rank));
    }
    server.join().unwrap().unwrap().unwrap();
    sched.join().unwrap();
    // p1 > p2: the worker on p1 is rank 1.
    assert_eq!(got, vec![(p1, 1), (p2, 0)]);
    assert_no_transport_threads();
}

#[test]
fn dist_cluster_missing_scheduler_times_out() {
    let _g = serial();
    // A port with nothing listening (bound, then closed).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t0 = Instant::now();
    let e = match Postoffice::start(cfg(Role::Worker, port, 1, 1, Duration::from_millis(500))) {
        Ok(_) => panic!("a worker started without a scheduler"),
        Err(e) => e,
    };
    let took = t0.elapsed();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.message().contains("scheduler"), "{e}");
    assert!(e.message().contains(&format!("127.0.0.1:{port}")), "{e}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(took >= Duration::from_millis(500), "took {took:?}");
    assert_no_transport_threads();
}

#[test]
fn dist_cluster_scheduler_names_who_did_not_register() {
    let _g = serial();
    let t = Duration::from_secs(2);
    let sched = scheduler::spawn(cfg(Role::Scheduler, 0, 2, 1, t)).unwrap();
    let port = sched.port();
    // one of two workers and the server come; the second worker never does
    let server = spawn_node(cfg(Role::Server, port, 2, 1, t), |_| ());
    let worker = spawn_node(cfg(Role::Worker, port, 2, 1, t), |_| ());
    let e = sched.join().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.message().contains("1 of 2 workers"), "{e}");
    assert!(e.message().contains("1 of 1 servers"), "{e}");
    for h in [server, worker] {
        let e = h.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    }
    assert_no_transport_threads();
}

#[test]
fn dist_cluster_lost_worker_fails_the_others() {
    let _g = serial();
    let t = Duration::from_secs(30);
    let sched = scheduler::spawn(cfg(Role::Scheduler, 0, 2, 1, t)).unwrap();
    let port = sched.port();
    let server = spawn_node(cfg(Role::Server, port, 2, 1, t), |po| po.finalize(true));
    let (tx, rx) = std::sync::mpsc::channel::<Arc<Postoffice>>();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let tx = tx.clone();
            spawn_node(cfg(Role::Worker, port, 2, 1, t), move |po| {
                tx.send(po).unwrap();
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap().unwrap();
    }
    let mut pos: Vec<Arc<Postoffice>> = rx.iter().take(2).collect();
    pos.sort_by_key(|p| p.my_rank());
    let dead = pos.pop().unwrap(); // rank 1
    let alive = pos.pop().unwrap(); // rank 0
                                    // rank 1 dies without a word: its sockets close.
    dead.stop();
    drop(dead);
    let t0 = Instant::now();
    // rank 0's worker barrier cannot complete; the scheduler notices the loss,
    // tells the others and fails — well before the 30 s deadline.
    let e = alive.barrier(0, WORKER_GROUP).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PeerLost, "{e}");
    // workers do not connect to workers: the scheduler tells rank 0 who is gone
    assert!(e.message().contains("worker 1 (id 11)"), "{e}");
    assert!(e.message().contains("the scheduler reports"), "{e}");
    let se = sched.join().unwrap_err();
    assert_eq!(se.kind(), ErrorKind::PeerLost, "{se}");
    assert!(se.message().contains("worker 1 (id 11)"), "{se}");
    let sv = server.join().unwrap().unwrap().unwrap_err();
    assert_eq!(sv.kind(), ErrorKind::PeerLost, "{sv}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(alive.finalize(true).is_err());
    drop(alive);
    assert_no_transport_threads();
}

struct Collect(Mutex<Vec<Message>>);

impl Customer for Collect {
    fn on_message(&self, msg: Message) {
        self.0.lock().unwrap().push(msg);
    }
}

#[test]
fn dist_cluster_garbage_is_dropped_and_the_node_lives() {
    let _g = serial();
    let t = Duration::from_secs(20);
    let sched = scheduler::spawn(cfg(Role::Scheduler, 0, 1, 1, t)).unwrap();
    let port = sched.port();
    let (stx, srx) = std::sync::mpsc::channel::<Arc<Postoffice>>();
    let server = spawn_node(cfg(Role::Server, port, 1, 1, t), move |po| {
        stx.send(po.clone()).unwrap();
        po.finalize(true)
    });
    let (wtx, wrx) = std::sync::mpsc::channel::<Arc<Postoffice>>();
    let worker = spawn_node(cfg(Role::Worker, port, 1, 1, t), move |po| {
        wtx.send(po).unwrap();
    });
    worker.join().unwrap().unwrap();
    let w = wrx.recv().unwrap();
    let s = srx.recv().unwrap();
    let inbox = Arc::new(Collect(Mutex::new(Vec::new())));
    s.register_customer(0, 0, inbox.clone());
    let addr = format!("127.0.0.1:{}", s.port());
    // 1. raw TCP garbage and a half-open connection
    {
        use std::io::Write;
        let mut g = std::net::TcpStream::connect(&addr).unwrap();
        g.write_all(b"GET / HTTP/1.0\r\n\r\n\xff\x00garbage")
            .unwrap();
        let _half = std::net::TcpStream::connect(&addr).unwrap();
        // 2. ZMTP peers with well-formed frames that are not ps-lite messages
        let ctx = zmq::Context::new();
        let d = ctx.socket(zmq::DEALER).unwrap();
        d.set_linger(0).unwrap();
        // (an identity already in use, e.g. ps9, is refused by libzmq's ROUTER)
        d.set_identity(b"ps77").unwrap();
        d.connect(&format!("tcp://{addr}")).unwrap();
        d.send(&b"\xff\xff\xff\xff"[..], 0).unwrap(); // not protobuf
        d.send_multipart([&b"\x1a\x02\x08"[..], b"x"], 0).unwrap(); // truncated
        let anon = ctx.socket(zmq::DEALER).unwrap();
        anon.set_linger(0).unwrap();
        anon.connect(&format!("tcp://{addr}")).unwrap();
        // a data message without a ps<id> identity (aborts a real server)
        let m = Message {
            head: 0,
            request: true,
            push: true,
            app_id: 0,
            customer_id: 0,
            timestamp: 0,
            ..Message::default()
        };
        anon.send_multipart([m.encode_meta(), vec![1, 2, 3]], 0)
            .unwrap();
        // the three are dropped, with a log line each
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.dropped_messages() < 3 {
            assert!(
                Instant::now() < deadline,
                "dropped {}",
                s.dropped_messages()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // the real worker's message still arrives and is the only one delivered
        let m = Message {
            head: 7,
            request: true,
            simple_app: true,
            body: b"hello".to_vec(),
            app_id: 0,
            customer_id: 0,
            timestamp: 42,
            recver: s.my_id(),
            data: vec![Bytes::from(vec![1u8, 2, 3]), Bytes::from_static(b"")],
            ..Message::default()
        };
        w.send(m).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while inbox.0.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the message did not arrive");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop((d, anon, ctx));
    }
    assert_eq!(s.dropped_messages(), 3);
    {
        let got = inbox.0.lock().unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        let m = &got[0];
        assert_eq!((m.head, m.timestamp, m.sender, m.recver), (7, 42, 9, 8));
        assert_eq!(m.body, b"hello");
        assert_eq!(&m.data[0][..], &[1, 2, 3]);
        assert!(m.data[1].is_empty());
    }
    // The cluster still works: barrier and clean shutdown.
    w.finalize(true).unwrap();
    server.join().unwrap().unwrap().unwrap();
    sched.join().unwrap();
    drop((w, s));
    assert_no_transport_threads();
}

#[test]
fn dist_cluster_more_sockets_than_one_zmq_context_allows() {
    let _g = serial();
    // libzmq allows 1023 sockets per context by default; the van raises the
    // limit of its one context to 65536, as ps-lite does. 500 peers = 1501
    // sockets (the ROUTER, and a DEALER, its monitor and the monitor's
    // reader per peer); without the raised limit peer 340 fails (EMFILE).
    use mxkv::dist::van::{Flow, Van, VanOptions};
    let van = Van::bind(&VanOptions {
        name: "many".into(),
        host: "127.0.0.1".into(),
        bind_host: "127.0.0.1".into(),
        port: 0,
        exact: false,
        send_timeout: Duration::from_millis(200),
        water_mark: None,
        verbose: 0,
        local: false,
    })
    .unwrap();
    van.set_my_id(9);
    van.start(Box::new(|_, _| Flow::Continue)).unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    for peer in 0..500 {
        van.connect(1000 + peer, "127.0.0.1", i32::from(closed))
            .unwrap_or_else(|e| panic!("peer {peer}: {e}"));
    }
    assert!(van.is_connected(1499));
    // a send to a peer that never accepts ends at the send deadline
    let t0 = Instant::now();
    let mut sent = 0;
    let e = loop {
        let m = Message {
            recver: 1000,
            data: vec![Bytes::from(vec![0u8; 16])],
            ..Message::default()
        };
        match van.send(m) {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 100_000, "never blocked");
    };
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    let t0 = Instant::now();
    van.stop(Duration::from_secs(5));
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    drop(van);
    assert_no_transport_threads();
}

#[test]
fn dist_cluster_heartbeats_and_dead_node_count() {
    let _g = serial();
    // ps-lite's GetNumDeadNode: a worker checks only the scheduler; without
    // heartbeats the scheduler reads dead once `timeout_sec` has passed.
    for heartbeats in [true, false] {
        let t = Duration::from_secs(20);
        let with_hb = |mut c: Config| {
            if heartbeats {
                c.heartbeat_interval = Duration::from_millis(200);
            }
            c
        };
        let sched = scheduler::spawn(with_hb(cfg(Role::Scheduler, 0, 1, 1, t))).unwrap();
        let port = sched.port();
        let server = spawn_node(with_hb(cfg(Role::Server, port, 1, 1, t)), |po| {
            po.finalize(true)
        });
        let worker = spawn_node(with_hb(cfg(Role::Worker, port, 1, 1, t)), |po| {
            let before = po.num_dead_nodes(1, 1);
            // let more than timeout_sec = 1 pass (what the count is about)
            std::thread::sleep(Duration::from_millis(1500));
            let counts = (
                before,
                po.num_dead_nodes(1, 1),
                po.num_dead_nodes(2, 1),
                po.num_dead_nodes(4, 1),
                po.num_dead_nodes(1, 0),
            );
            po.finalize(true).unwrap();
            counts
        });
        let counts = worker.join().unwrap().unwrap();
        server.join().unwrap().unwrap().unwrap();
        sched.join().unwrap();
        let dead_sched = usize::from(!heartbeats);
        assert_eq!(counts, (0, dead_sched, 0, 0, 0), "heartbeats {heartbeats}");
    }
    assert_no_transport_threads();
}

#[test]
fn dist_cluster_ipc_endpoints_with_dmlc_local() {
    let _g = serial();
    // DMLC_LOCAL=1: every node binds ipc:///tmp/<port> (ps-lite's local mode).
    let t = Duration::from_secs(20);
    let local = |role| {
        let mut c = cfg(role, 0, 2, 1, t);
        c.local = true;
        c
    };
    let sched = scheduler::spawn(local(Role::Scheduler)).unwrap();
    let port = sched.port();
    assert!(std::path::Path::new(&format!("/tmp/{port}")).exists());
    let mk = |role| {
        let mut c = local(role);
        c.root_port = port;
        c
    };
    let server = spawn_node(mk(Role::Server), |po| po.finalize(true));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            spawn_node(mk(Role::Worker), |po| {
                po.barrier(0, WORKER_GROUP).unwrap();
                (po.my_id(), po.finalize(true))
            })
        })
        .collect();
    let mut ids: Vec<i32> = workers
        .into_iter()
        .map(|w| {
            let (id, fin) = w.join().unwrap().unwrap();
            fin.unwrap();
            id
        })
        .collect();
    ids.sort();
    assert_eq!(ids, vec![9, 11]);
    server.join().unwrap().unwrap().unwrap();
    sched.join().unwrap();
    assert_no_transport_threads();
}

#[test]
fn dist_cluster_silent_node_is_lost_by_heartbeat_timeout() {
    let _g = serial();
    // The scheduler expects heartbeats (interval 0.2 s, timeout 1 s); the
    // worker, configured without, never sends one while its connection stays
    // up: the scheduler declares it lost and the cluster fails instead of
    // waiting.
    let t = Duration::from_secs(20);
    let hb = |mut c: Config| {
        c.heartbeat_interval = Duration::from_millis(200);
        c.heartbeat_timeout = Duration::from_secs(1);
        c
    };
    let sched = scheduler::spawn(hb(cfg(Role::Scheduler, 0, 1, 1, t))).unwrap();
    let port = sched.port();
    let server = spawn_node(hb(cfg(Role::Server, port, 1, 1, t)), |po| po.finalize(true));
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = spawn_node(cfg(Role::Worker, port, 1, 1, t), move |po| {
        tx.send(po).unwrap();
    });
    worker.join().unwrap().unwrap();
    let w: Arc<Postoffice> = rx.recv().unwrap();
    let t0 = Instant::now();
    let e = sched.join().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PeerLost, "{e}");
    assert!(e.message().contains("worker 0 (id 9)"), "{e}");
    assert!(e.message().contains("heartbeat"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    // the others then lose the scheduler
    let sv = server.join().unwrap().unwrap().unwrap_err();
    assert_eq!(sv.kind(), ErrorKind::PeerLost, "{sv}");
    let we = w.finalize(true).unwrap_err();
    assert_eq!(we.kind(), ErrorKind::PeerLost, "{we}");
    drop(w);
    assert_no_transport_threads();
}

/// Answers every request at once, from the receive thread.
struct Echo(Arc<Postoffice>);

impl Customer for Echo {
    fn on_message(&self, msg: Message) {
        let reply = Message {
            head: msg.head,
            request: false,
            app_id: msg.app_id,
            customer_id: msg.customer_id,
            timestamp: msg.timestamp,
            recver: msg.sender,
            data: msg.data,
            ..Message::default()
        };
        self.0.send(reply).unwrap();
    }
}

/// Hands replies to the waiting thread.
struct Inbox(std::sync::mpsc::Sender<Message>);

impl Customer for Inbox {
    fn on_message(&self, msg: Message) {
        let _ = self.0.send(msg);
    }
}

#[test]
fn dist_cluster_round_trip_latency_and_large_parts() {
    let _g = serial();
    // Messages are handled as they arrive, not on the receive thread's tick:
    // a small request/reply between two nodes takes microseconds, and a
    // 64 MB part arrives whole.
    let t = Duration::from_secs(20);
    let sched = scheduler::spawn(cfg(Role::Scheduler, 0, 1, 1, t)).unwrap();
    let port = sched.port();
    let (stx, srx) = std::sync::mpsc::channel();
    let server = spawn_node(cfg(Role::Server, port, 1, 1, t), move |po| {
        po.register_customer(0, 0, Arc::new(Echo(po.clone())));
        stx.send(()).unwrap();
        po.finalize(true)
    });
    let w = Postoffice::start(cfg(Role::Worker, port, 1, 1, t)).unwrap();
    srx.recv().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    w.register_customer(0, 0, Arc::new(Inbox(tx)));
    let request = |ts: i32, data: Vec<Bytes>| Message {
        head: 0,
        request: true,
        push: true,
        app_id: 0,
        customer_id: 0,
        timestamp: ts,
        recver: 8,
        data,
        ..Message::default()
    };
    let mut times = Vec::new();
    for ts in 0..2000 {
        let t0 = Instant::now();
        w.send(request(
            ts,
            vec![Bytes::from(vec![0u8; 8]), Bytes::from(vec![1u8; 4])],
        ))
        .unwrap();
        let r = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        times.push(t0.elapsed());
        assert_eq!((r.timestamp, r.sender, r.request), (ts, 8, false));
    }
    times.sort();
    let median = times[times.len() / 2];
    eprintln!(
        "round trip: median {median:?}, p90 {:?}",
        times[times.len() * 9 / 10]
    );
    let big: Vec<u8> = (0..64 << 20).map(|i| (i % 251) as u8).collect();
    let t0 = Instant::now();
    w.send(request(
        5000,
        vec![Bytes::from(vec![0u8; 8]), Bytes::from(big)],
    ))
    .unwrap();
    let r = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    eprintln!("64 MB there and back: {:?}", t0.elapsed());
    assert_eq!(r.data[1].len(), 64 << 20);
    assert!(r.data[1]
        .iter()
        .enumerate()
        .all(|(i, b)| *b == (i % 251) as u8));
    w.finalize(true).unwrap();
    server.join().unwrap().unwrap().unwrap();
    sched.join().unwrap();
    drop(w);
    assert_no_transport_threads();
}
