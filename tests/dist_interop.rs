//! Our transport against real MXNet 1.9.1 processes (the reference venv's
//! `mxnet`), on 127.0.0.1 with free ports, every process under `timeout` and
//! ended by PID:
//! - a real scheduler (`python -c 'import mxnet'` with DMLC_ROLE=scheduler)
//!   with our server and workers joining: ids, start-up barrier, worker
//!   barriers, clean shutdown, the real scheduler exits 0;
//! - our scheduler with real servers and real workers running the captured
//!   worker scripts unchanged (they check every value and exit 1 on a
//!   mismatch), heartbeats included;
//! - a real server killed with SIGKILL: our worker and scheduler say so.
//!
//! Skipped (with a message) only when the reference venv does not exist;
//! `make test` creates it first.

use mxkv::dist::config::Config;
use mxkv::dist::message::Role;
use mxkv::dist::postoffice::{Postoffice, WORKER_GROUP};
use mxkv::dist::scheduler;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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

    /// Exit code, waiting at most `limit`.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s.code().unwrap_or(-1));
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

/// Our scheduler, real servers and workers running a captured worker script.
/// Returns every real node's log.
fn our_scheduler_real_nodes(
    script: &str,
    nw: usize,
    ns: usize,
    extra: &[(&'static str, &str)],
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
        let code = w.wait(Duration::from_secs(90));
        report += &format!("== {} exit {code:?}\n{}\n", w.name, w.log());
        ok &= code == Some(0);
    }
    let r = sched.join();
    assert!(ok, "{report}");
    r.unwrap_or_else(|e| panic!("our scheduler: {e}\n{report}"));
    for w in &workers {
        assert!(w.log().contains("OK"), "{report}");
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
    // is not acknowledged (aborting after 10 tries): our scheduler answers
    // with ACKs and drops the duplicates.
    // (the script's 2.5 s sleep gives the resender time to act on anything
    // unacknowledged; heartbeats are left off: with PS_RESEND they make real
    // ps-lite abort at exit, `Check failed: ready_: call Start() first`,
    // whoever the scheduler is)
    let logs = our_scheduler_real_nodes(
        "session_b_str_keys.py",
        1,
        2,
        &[("PS_RESEND", "1"), ("PS_RESEND_TIMEOUT", "1000")],
    );
    // No message to our scheduler (id 1) went unacknowledged: without ACKs
    // the first barrier request is resent again and again during the
    // script's sleep (retry=1, 2, …). A loaded machine can delay a real
    // node's handling of an ACK past the 1 s timeout once (real workers and
    // servers then resend to each other too), so one retry is tolerated.
    let repeated: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("=> 1.") && !l.contains("Resend (retry=1)") && l.contains("Resend"))
        .collect();
    assert!(repeated.is_empty(), "{logs}");
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
