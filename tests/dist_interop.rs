//! Our transport against real MXNet 1.9.1 processes (the reference venv's
//! `mxnet`), on 127.0.0.1 with free ports, every process under `timeout` and
//! ended by PID:
//! - a real scheduler (`python -c 'import mxnet'` with DMLC_ROLE=scheduler)
//!   with our server and workers joining: ids, start-up barrier, worker
//!   barriers, clean shutdown, the real scheduler exits 0;
//! - our scheduler with real servers and real workers running the captured
//!   worker scripts unchanged (they check every value and exit 1 on a
//!   mismatch), heartbeats included, and with PS_RESEND (where a real
//!   node may abort at exit after its work, a ps-lite flaw documented in
//!   `dist_interop_our_scheduler_real_cluster_resend`);
//! - our scheduler and a worker on the wire that resends on purpose: every
//!   copy acknowledged, none counted twice;
//! - a real server killed with SIGKILL: our worker and scheduler say so.
//!
//! Skipped (with a message) only when the reference venv does not exist;
//! `make test` creates it first.

use mxkv::dist::config::Config;
use mxkv::dist::message::{Bytes, Command as Cmd, Control, Message, Node, Role, EMPTY};
use mxkv::dist::postoffice::{self, Postoffice, WORKER_GROUP};
use mxkv::dist::scheduler;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn python() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: no reference venv at {} (make venv-ref)",
            p.display()
        );
        None
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A process under `timeout`, ended by PID when dropped.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, secs: u32, args: &[&str], env: &[(&str, String)]) -> Proc {
        let log =
            std::env::temp_dir().join(format!("mxkv-interop-{}-{name}.log", std::process::id()));
        let out = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new("timeout");
        cmd.arg("-k").arg("2").arg(secs.to_string()).args(args);
        for k in [
            "DMLC_ROLE",
            "DMLC_PS_ROOT_URI",
            "DMLC_PS_ROOT_PORT",
            "DMLC_NUM_WORKER",
            "DMLC_NUM_SERVER",
            "DMLC_NODE_HOST",
            "DMLC_INTERFACE",
            "PORT",
            "PS_VERBOSE",
            "PS_HEARTBEAT_INTERVAL",
            "PS_HEARTBEAT_TIMEOUT",
            "PS_RESEND",
            "MXNET_KVSTORE_BIGARRAY_BOUND",
        ] {
            cmd.env_remove(k);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// Exit code (-1 for a signal), waiting at most `limit`.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        self.wait_status(limit).map(|s| s.code().unwrap_or(-1))
    }

    /// Exit status, waiting at most `limit`. (`timeout` ends itself with
    /// the signal that ended its child.)
    fn wait_status(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // TERM to `timeout` is passed on to its child; then KILL.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.child.id().to_string())
                .status();
            if self.wait(Duration::from_secs(3)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

fn cluster_env(role: &str, port: u16, nw: usize, ns: usize) -> Vec<(&'static str, String)> {
    vec![
        ("DMLC_ROLE", role.to_string()),
        ("DMLC_PS_ROOT_URI", "127.0.0.1".into()),
        ("DMLC_PS_ROOT_PORT", port.to_string()),
        ("DMLC_NUM_WORKER", nw.to_string()),
        ("DMLC_NUM_SERVER", ns.to_string()),
        ("DMLC_NODE_HOST", "127.0.0.1".into()),
        ("DMLC_INTERFACE", "lo".into()),
    ]
}

#[test]
fn dist_interop_real_scheduler_with_our_server_and_workers() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(py) = python() else { return };
    let py = py.to_str().unwrap().to_string();
    let (nw, ns) = (2, 2);
    let port = free_port();
    let mut env = cluster_env("scheduler", port, nw, ns);
    env.push(("PS_VERBOSE", "1".into()));
    let mut sched = Proc::spawn("scheduler", 60, &[&py, "-c", "import mxnet"], &env);
    let t = Duration::from_secs(40);
    let mut nodes = Vec::new();
    for role in [Role::Server, Role::Server, Role::Worker, Role::Worker] {
        let c = Config::local(role, port, nw, ns, t);
        nodes.push(std::thread::spawn(move || {
            let po = Postoffice::start(c)?;
            let id = po.my_id();
            if po.role() == Role::Worker {
                for _ in 0..3 {
                    po.barrier(0, WORKER_GROUP)?;
                }
            }
            // ids of the peers as the real scheduler listed them
            let listed: Vec<i32> = po.nodes().iter().map(|n| n.id).collect();
            po.finalize(true)?;
            Ok::<_, mxkv::error::Error>((po.role(), id, listed))
        }));
    }
    let mut ids = Vec::new();
    for n in nodes {
        match n.join().unwrap() {
            Ok((role, id, listed)) => {
                assert_eq!(listed.len(), nw + ns + 1);
                assert_eq!(*listed.last().unwrap(), 1, "scheduler last");
                ids.push((role == Role::Worker, id));
            }
            Err(e) => panic!("{e}\nscheduler log:\n{}", sched.log()),
        }
    }
    ids.sort();
    assert_eq!(ids, vec![(false, 8), (false, 10), (true, 9), (true, 11)]);
    let code = sched.wait(Duration::from_secs(20));
    assert_eq!(code, Some(0), "real scheduler:\n{}", sched.log());
    let log = sched.log();
    assert!(log.contains("Barrier count for 7"), "{log}");
    assert!(log.contains("Barrier count for 4"), "{log}");
    drop(sched);
}

/// What real MXNet 1.9.1 prints when its resender's last check at exit
/// finds a message still unacknowledged (see
/// `dist_interop_our_scheduler_real_cluster_resend`).
const RESENDER_EXIT_ABORT: &str = "van.h:63: Check failed: ready_: call Start() first";

/// Our scheduler, real servers and workers running a captured worker script.
/// Every real node must exit 0 — or, with `resender_exit_abort` (PS_RESEND
/// on), abort with SIGABRT and [`RESENDER_EXIT_ABORT`] once its work is done
/// (a worker after its script's `done OK`). Returns every real node's log.
fn our_scheduler_real_nodes(
    script: &str,
    nw: usize,
    ns: usize,
    extra: &[(&'static str, &str)],
    resender_exit_abort: bool,
) -> String {
    let Some(py) = python() else {
        return String::new();
    };
    let py = py.to_str().unwrap().to_string();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/dist/workers");
    let mut c = Config::local(Role::Scheduler, 0, nw, ns, Duration::from_secs(60));
    for (k, v) in extra {
        if *k == "PS_HEARTBEAT_INTERVAL" {
            c.heartbeat_interval = Duration::from_secs(v.parse().unwrap());
        }
        if *k == "PS_RESEND" {
            c.resend = *v != "0";
        }
    }
    let sched = scheduler::spawn(c).unwrap();
    let port = sched.port();
    let mut procs = Vec::new();
    for i in 0..ns {
        let mut env = cluster_env("server", port, nw, ns);
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        procs.push(Proc::spawn(
            &format!("server{i}"),
            90,
            &[&py, "-c", "import mxnet"],
            &env,
        ));
    }
    let mut workers = Vec::new();
    for i in 0..nw {
        let mut env = cluster_env("worker", port, nw, ns);
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        env.push(("WORKER_INDEX", i.to_string()));
        let path = format!("{dir}/{script}");
        workers.push(Proc::spawn(&format!("worker{i}"), 90, &[&py, &path], &env));
    }
    let mut report = String::new();
    let mut ok = true;
    for w in workers.iter_mut().chain(procs.iter_mut()) {
        let status = w.wait_status(Duration::from_secs(90));
        let log = w.log();
        let code = status.map(|s| s.code().unwrap_or(-1));
        let signal = status.and_then(|s| s.signal());
        report += &format!("== {} exit {code:?} signal {signal:?}\n{log}\n", w.name);
        let known_abort = resender_exit_abort
            && signal == Some(libc::SIGABRT)
            && log.contains(RESENDER_EXIT_ABORT)
            && (w.name.starts_with("server")
                || log
                    .find("done OK")
                    .is_some_and(|done| done < log.find(RESENDER_EXIT_ABORT).unwrap()));
        if known_abort {
            eprintln!(
                "{}: MXNet's resender abort at exit, accepted \
                 (see dist_interop_our_scheduler_real_cluster_resend)\n{log}",
                w.name
            );
        }
        ok &= code == Some(0) || known_abort;
    }
    let r = sched.join();
    assert!(ok, "{report}");
    r.unwrap_or_else(|e| panic!("our scheduler: {e}\n{report}"));
    for w in &workers {
        // the script checked every value it read, then printed this
        assert!(w.log().contains("done OK"), "{report}");
        assert!(!w.log().contains("MISMATCH"), "{report}");
    }
    report
}

#[test]
fn dist_interop_our_scheduler_real_cluster_int_keys_2x2() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    our_scheduler_real_nodes(
        "session_a_int_keys.py",
        2,
        2,
        &[("MXNET_KVSTORE_BIGARRAY_BOUND", "10")],
        false,
    );
}

#[test]
fn dist_interop_our_scheduler_real_cluster_heartbeats() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The worker checks that the scheduler is not counted dead, i.e. that our
    // scheduler answers its heartbeats.
    our_scheduler_real_nodes(
        "session_e_heartbeat.py",
        1,
        1,
        &[("PS_HEARTBEAT_INTERVAL", "1")],
        false,
    );
}

#[test]
fn dist_interop_real_server_sigkilled() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(py) = python() else { return };
    let py = py.to_str().unwrap().to_string();
    // Our scheduler and worker, a real MXNet server that is killed with
    // SIGKILL once the cluster is up: both of ours report the lost server
    // (real ps-lite would wait forever).
    let t = Duration::from_secs(60);
    let sched = scheduler::spawn(Config::local(Role::Scheduler, 0, 1, 1, t)).unwrap();
    let port = sched.port();
    let mut server = Proc::spawn(
        "server",
        90,
        &[&py, "-c", "import mxnet"],
        &cluster_env("server", port, 1, 1),
    );
    let po = Postoffice::start(Config::local(Role::Worker, port, 1, 1, t))
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    // the python process is the child of `timeout`
    let out = Command::new("pgrep")
        .arg("-P")
        .arg(server.child.id().to_string())
        .output()
        .unwrap();
    let pid = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(!pid.is_empty(), "no server process");
    let t0 = Instant::now();
    assert!(Command::new("kill")
        .arg("-KILL")
        .arg(&pid)
        .status()
        .unwrap()
        .success());
    let e = po.barrier(0, 7).unwrap_err();
    assert_eq!(e.kind(), mxkv::error::ErrorKind::PeerLost, "{e}");
    assert!(e.message().contains("server 0 (id 8)"), "{e}");
    let se = sched.join().unwrap_err();
    assert!(se.message().contains("server 0 (id 8)"), "{se}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(po.check_peer(8).is_err());
    let _ = po.finalize(false);
    drop(po);
    assert_ne!(server.wait(Duration::from_secs(5)), Some(0));
}

#[test]
fn dist_interop_our_scheduler_real_cluster_resend() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // With PS_RESEND=1 real nodes acknowledge every message and resend what
    // is not acknowledged, once a second (PS_RESEND_TIMEOUT), up to 10 tries:
    // our scheduler answers with ACKs and drops the duplicates.
    //
    // A real node may abort at exit whatever the scheduler does, from two
    // flaws of ps-lite (3rdparty/ps-lite of MXNet 1.9.1, dmlc/ps-lite
    // 34fd45c) that involve only the node itself and its peer:
    // - `Van::Send` hands the message to ZeroMQ (`SendMsg`) and only then
    //   records it in the resender (`Resender::AddOutgoing`). When the peer's
    //   ACK is handled first (`AddIncomming` erases nothing), the record
    //   stays until the message's next resend is acknowledged. In a
    //   PS_VERBOSE=2 log the ACK shows up before the send:
    //     van.cc:419: 8 => 9. Meta: request=0, control={ cmd=ACK, msg_sig=9929964388367 }
    //     van.cc:419: 8 => 9. Meta: request=0, timestamp=7, ..., simple_app=1, push=0, head=2
    //     van.cc:394: ? => 8. Meta: request=1, timestamp=7, ..., simple_app=1, push=0, head=2
    //   (worker 9's kStopServer command to server 8, acknowledged and
    //   answered before the worker logged sending it). Under load some
    //   message is left so in more than half the runs (40 of 70), to a
    //   server or to the scheduler alike.
    // - At exit the receive thread clears `ready_` on its TERMINATE
    //   (`Van::ProcessTerminateCommand`), then `Van::Stop` deletes the
    //   resender, whose monitor thread makes one last pass after its sleep;
    //   a record older than the timeout is resent with a warning that reads
    //   `van_->my_node()`, which checks `ready_` and throws in that thread:
    //     terminate called after throwing an instance of 'dmlc::Error'
    //       what():  ... van.h:63: Check failed: ready_: call Start() first
    //   So a node that stops less than a second after sending a message
    //   left recorded by the first flaw dies of SIGABRT after all its work
    //   is done: the worker in 5 runs of 115 on a loaded 2-core machine,
    //   each time after `done OK`. (An all-MXNet cluster under the same load
    //   failed 3 runs in 18, in another way: a node resent its last barrier
    //   request to a scheduler already gone until `resender.h:124 Check
    //   failed: it.second.num_retry < max_num_retry_`.) With heartbeats on
    //   a node's stop hits `ready_` in any case (the heartbeat thread sends
    //   once more after TERMINATE), hence none here.
    // No scheduler can prevent either: an ACK can only follow the message,
    // and the race is between the node's own threads. So a real node's exit
    // is accepted as 0 or exactly that abort after its work (the worker
    // after its script's `done OK`, i.e. every value it read was right), and
    // what cannot vary is asserted: the values, our scheduler's clean end,
    // and that it acknowledged every message (below).
    let logs = our_scheduler_real_nodes(
        "session_b_str_keys.py",
        1,
        2,
        &[
            ("PS_RESEND", "1"),
            ("PS_RESEND_TIMEOUT", "1000"),
            // Between its first barrier and its exit the worker lives at
            // least this long: enough for two resends of a message never
            // acknowledged (at most 2 s and 3 s after it was sent).
            ("DEAD_SLEEP", "4"),
        ],
        true,
    );
    // No message to our scheduler (id 1) went unacknowledged: without ACKs
    // every barrier request is resent again and again (retry=1, 2, …). One
    // resend is the first flaw above (our ACK came before the record), and
    // our ACK to that resend ends it.
    let repeated: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("=> 1.") && !l.contains("Resend (retry=1)") && l.contains("Resend"))
        .collect();
    assert!(repeated.is_empty(), "{logs}");
}

/// A node speaking ps-lite's wire protocol with raw ZeroMQ sockets, to do
/// what a real node's resender does only by chance.
struct WireNode {
    _ctx: zmq::Context,
    router: zmq::Socket,
    to_scheduler: zmq::Socket,
}

impl WireNode {
    fn send(&self, m: &Message) {
        let mut frames = vec![m.encode_meta()];
        frames.extend(m.data.iter().map(|d| d.to_vec()));
        self.to_scheduler.send_multipart(frames, 0).unwrap();
    }

    /// The next message, or None after `limit`.
    fn recv(&self, limit: Duration) -> Option<Message> {
        if self
            .router
            .poll(zmq::POLLIN, limit.as_millis() as i64)
            .unwrap()
            == 0
        {
            return None;
        }
        let frames = self.router.recv_multipart(0).unwrap();
        assert_eq!(frames[0], b"ps1", "only the scheduler talks to us");
        let data = frames[2..].iter().map(|f| Bytes::from(f.clone())).collect();
        Some(Message::decode(&frames[1], data).unwrap())
    }
}

/// ps-lite's `Resender::GetKey` of a control message from `sender` to the
/// scheduler, written out here so that the test does not trust ours.
fn ps_lite_sig(sender: i32, ts: i32, request: bool) -> u64 {
    ((sender as u64 & 0xFF) << 40) | (1u64 << 32) | ((ts as u64) << 1) | u64::from(request)
}

#[test]
fn dist_interop_our_scheduler_acks_every_resend() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A real node's resender resends a message whose ACK it missed, with the
    // same signature; in the real cluster above that happens by chance
    // (ps-lite's Van::Send race), so a scheduler that acknowledged only the
    // first copy, or counted a late copy towards the next barrier, would
    // fail there only now and then. Here a worker on the wire resends on
    // purpose: every copy is acknowledged, and no copy counts twice.
    let t = Duration::from_secs(30);
    let mut c = Config::local(Role::Scheduler, 0, 1, 1, t);
    c.resend = true;
    let sched = scheduler::spawn(c).unwrap();
    let port = sched.port();
    let server = std::thread::spawn(move || {
        let po = Postoffice::start(Config::local(Role::Server, port, 1, 1, t))?;
        po.finalize(true)
    });
    let ctx = zmq::Context::new();
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.set_linger(0).unwrap();
    router.bind("tcp://127.0.0.1:0").unwrap();
    let endpoint = router.get_last_endpoint().unwrap().unwrap();
    let my_port: i32 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let scheduler_at = format!("tcp://127.0.0.1:{port}");
    // registration, from a socket without a ps<id> identity (as ps-lite)
    let hello = ctx.socket(zmq::DEALER).unwrap();
    hello.set_linger(0).unwrap();
    hello.connect(&scheduler_at).unwrap();
    let mut ctl = Control::new(Cmd::AddNode);
    ctl.nodes.push(Node {
        role: Role::Worker,
        id: EMPTY,
        hostname: "127.0.0.1".into(),
        port: my_port,
        is_recovery: false,
        customer_id: 0,
        lane_port: None,
    });
    let add = postoffice::control_message(1, ctl, false, EMPTY, EMPTY, 0);
    hello.send_multipart([add.encode_meta()], 0).unwrap();
    let to_scheduler = ctx.socket(zmq::DEALER).unwrap();
    to_scheduler.set_linger(0).unwrap();
    let node = WireNode {
        _ctx: ctx,
        router,
        to_scheduler,
    };
    let reply = node.recv(t).expect("no ADD_NODE reply");
    let ctl = reply.control.unwrap();
    assert_eq!(ctl.cmd, Cmd::AddNode);
    let me = ctl.nodes.iter().find(|n| n.port == my_port).unwrap().id;
    assert_eq!(me, 9);
    node.to_scheduler
        .set_identity(format!("ps{me}").as_bytes())
        .unwrap();
    node.to_scheduler.connect(&scheduler_at).unwrap();
    let barrier = |ts: i32| {
        let mut ctl = Control::new(Cmd::Barrier);
        ctl.barrier_group = 7;
        postoffice::control_message(1, ctl, true, 0, 0, ts)
    };
    // What comes back: ACK signatures and barrier releases, in order.
    let next = |what: &str| -> (Cmd, u64) {
        let m = node
            .recv(t)
            .unwrap_or_else(|| panic!("no {what} from the scheduler"));
        let ctl = m.control.unwrap();
        (ctl.cmd, ctl.msg_sig)
    };
    // the start-up barrier request, then a resend of it
    node.send(&barrier(1));
    node.send(&barrier(1));
    let mut acks = 0;
    let mut released = false;
    while acks < 2 || !released {
        match next("ACK or release") {
            (Cmd::Ack, sig) => {
                assert_eq!(sig, ps_lite_sig(me, 1, true), "ACK signature");
                acks += 1;
            }
            (Cmd::Barrier, _) => {
                assert!(!released, "released twice");
                released = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(acks, 2, "every copy is acknowledged");
    // A late resend, after the release: acknowledged, and not taken as this
    // worker's request in the next (final) barrier, which the server and
    // the scheduler are entering now: nothing but its ACK may come back.
    node.send(&barrier(1));
    assert_eq!(next("ACK"), (Cmd::Ack, ps_lite_sig(me, 1, true)));
    // (a bounded wait: a wrong release would come within a round trip once
    // the server and the scheduler asked; it can only miss a fault, never
    // fail a correct scheduler)
    if let Some(m) = node.recv(Duration::from_secs(1)) {
        panic!("the late resend counted: {:?}", m.control);
    }
    assert!(!server.is_finished(), "the final barrier released early");
    node.send(&barrier(2));
    assert_eq!(next("ACK"), (Cmd::Ack, ps_lite_sig(me, 2, true)));
    assert_eq!(next("final release").0, Cmd::Barrier);
    server.join().unwrap().unwrap();
    sched.join().unwrap();
}

#[test]
fn dist_interop_real_server_ignores_our_lost_notice() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(py) = python() else { return };
    let py = py.to_str().unwrap().to_string();
    // Our scheduler tells the surviving nodes when one is lost (a HEARTBEAT
    // with a body): a real node must take it and stay up (here: our worker
    // dies, the real server is told).
    let t = Duration::from_secs(60);
    let sched = scheduler::spawn(Config::local(Role::Scheduler, 0, 1, 1, t)).unwrap();
    let port = sched.port();
    let mut env = cluster_env("server", port, 1, 1);
    env.push(("PS_VERBOSE", "2".into())); // logs every message it receives
    let mut server = Proc::spawn("server", 90, &[&py, "-c", "import mxnet"], &env);
    let po = Postoffice::start(Config::local(Role::Worker, port, 1, 1, t))
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    po.stop();
    drop(po);
    let e = sched.join().unwrap_err();
    assert!(e.message().contains("worker 0 (id 9)"), "{e}");
    // still running (it waits forever for its peers, as real ps-lite does)
    assert_eq!(
        server.wait(Duration::from_millis(500)),
        None,
        "{}",
        server.log()
    );
}
