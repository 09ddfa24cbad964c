//! Real MXNet 1.9.1 workers (the captured worker scripts in
//! `tests/vectors/dist/workers/`, unchanged, run by `.venv/bin/python`)
//! against our scheduler and our KV servers on 127.0.0.1. Each script checks
//! every value it pulls and exits 1 on a mismatch; each process runs under a
//! deadline and is killed by its pid when it passes it.
//!
//! The servers' controller stands in for the Python one (which unpickles the
//! optimizer): it reads the learning rate of the plain SGD optimizer these
//! scripts pickle and installs `w -= lr * g` (dense, or the pushed rows of a
//! row_sparse table), MXNet's `sgd_update` without momentum, weight decay or
//! clipping.

use mxkv::dist::config::Config;
use mxkv::dist::kv_node::{serve, server_for};
use mxkv::dist::message::Role;
use mxkv::dist::postoffice::Postoffice;
use mxkv::dist::scheduler;
use mxkv::error::{Error, Result};
use mxkv::ndarray::dtype::DType;
use mxkv::ndarray::{NDArray, StorageType};
use mxkv::store::Updater;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    let p = root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run `make venv-ref` (these tests run real MXNet 1.9.1 workers)",
        p.display()
    );
    p
}

/// The learning rate of a protocol-0 pickle of MXNet's plain SGD optimizer
/// (`…SGD\n…Vlr\np8\nF0.5\n…`), refusing anything else.
fn sgd_lr(body: &[u8]) -> Result<f32> {
    let text = String::from_utf8_lossy(body);
    if !text.contains("(cmxnet.optimizer.optimizer\nSGD\n") {
        return Err(Error::usage("this test controller knows only mxnet SGD"));
    }
    // a dict entry: `V<name>\n`, a memo line `p<n>\n`, then the value line
    let field = |name: &str| -> Option<String> {
        let pat = format!("V{name}\n");
        let at = text
            .match_indices(&pat)
            .map(|(i, _)| i)
            // after an opcode that ends the previous item (`(`, `d`, `s`,
            // `N`, `t`) or a line end
            .find(|&i| i > 0 && b"\n(dsNt".contains(&text.as_bytes()[i - 1]))?;
        let rest = &text[at + pat.len()..];
        let rest = &rest[rest.find('\n')? + 1..];
        Some(rest[..rest.find('\n')?].to_string())
    };
    for (name, neutral) in [
        ("momentum", "F0.0"),
        ("wd", "F0.0"),
        ("rescale_grad", "F1.0"),
    ] {
        if field(name).as_deref() != Some(neutral) {
            return Err(Error::usage(format!("SGD with {name} {:?}", field(name))));
        }
    }
    let lr = field("lr").ok_or_else(|| Error::usage("SGD without lr"))?;
    lr.strip_prefix('F')
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::usage(format!("SGD lr {lr}")))
}

/// `w = 1 * w - lr * g` in float32 (dense, or the rows of a row_sparse `g`).
fn sgd(lr: f32) -> Arc<dyn Updater> {
    Arc::new(
        move |_: i32, _: Option<&[u8]>, g: &NDArray, w: &NDArray| -> Result<()> {
            if g.dtype() != DType::F32 {
                return Err(Error::usage("test sgd: float32 only"));
            }
            let step = |w: &mut [f32], g: &[f32]| {
                for (w, g) in w.iter_mut().zip(g) {
                    *w = 1.0 * *w - lr * g;
                }
            };
            if g.stype() == StorageType::RowSparse {
                let (gp, wp) = (g.parts()?, w.parts()?);
                let u = g.row_len();
                let gd = gp.data.read().typed::<f32>().to_vec();
                let mut wd = wp.data.write();
                for (k, &r) in g.rsp_indices()?.iter().enumerate() {
                    let r = r as usize;
                    step(
                        &mut wd.typed_mut::<f32>()[r * u..(r + 1) * u],
                        &gd[k * u..(k + 1) * u],
                    );
                }
                return Ok(());
            }
            let gd = g.read().typed::<f32>().to_vec();
            step(w.write().typed_mut::<f32>(), &gd);
            Ok(())
        },
    )
}

/// Runs `script` on `workers` real MXNet workers against our scheduler and
/// `servers` of our servers; returns each worker's output.
fn run(script: &str, workers: usize, servers: usize, env: &[(&str, &str)]) -> Vec<String> {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let deadline = Duration::from_secs(60);
    let cfg = move |role, port| Config::local(role, port, workers, servers, deadline);
    let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
    let port = sched.port();
    let server_threads: Vec<_> = (0..servers)
        .map(|_| {
            std::thread::spawn(move || -> Result<()> {
                let po = Postoffice::start(cfg(Role::Server, port))?;
                let mut s = server_for(&po);
                let slot = s.updater_slot();
                let mut controller = |_head: i32, body: &[u8]| -> Result<()> {
                    slot.set(Some(sgd(sgd_lr(body)?)));
                    Ok(())
                };
                serve(&po, &mut s, &mut controller)?;
                po.finalize(true)
            })
        })
        .collect();
    let script_path = root().join("tests/vectors/dist/workers").join(script);
    let mut children: Vec<_> = (0..workers)
        .map(|_| {
            let mut c = Command::new(python());
            c.arg(&script_path)
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default())
                .env("HOME", std::env::var("HOME").unwrap_or_default())
                .env("DMLC_ROLE", "worker")
                .env("DMLC_PS_ROOT_URI", "127.0.0.1")
                .env("DMLC_PS_ROOT_PORT", port.to_string())
                .env("DMLC_NUM_WORKER", workers.to_string())
                .env("DMLC_NUM_SERVER", servers.to_string())
                .env("DMLC_NODE_HOST", "127.0.0.1")
                .env("OMP_NUM_THREADS", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().expect("start python")
        })
        .collect();
    let start = Instant::now();
    let mut outputs = Vec::new();
    for child in &mut children {
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if start.elapsed() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for child in children {
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{script}: worker failed ({}):\n{text}",
            out.status
        );
        outputs.push(text);
    }
    for t in server_threads {
        t.join().unwrap().unwrap();
    }
    sched.join().unwrap();
    outputs
}

fn assert_all_ok(outputs: &[String], checks: usize) {
    for out in outputs {
        assert!(out.contains("done OK"), "{out}");
        assert_eq!(out.matches(" OK ").count(), checks, "{out}");
        assert!(!out.contains("MISMATCH"), "{out}");
    }
}

#[test]
fn real_mxnet_workers_session_a_sync_2x2_split_key_and_sgd() {
    let out = run(
        "session_a_int_keys.py",
        2,
        2,
        &[("MXNET_KVSTORE_BIGARRAY_BOUND", "10")],
    );
    assert_all_ok(&out, 6);
}

#[test]
fn real_mxnet_worker_session_b_device_sync_string_keys() {
    let out = run("session_b_str_keys.py", 1, 2, &[("DEAD_SLEEP", "0")]);
    assert_all_ok(&out, 2);
}

#[test]
fn real_mxnet_worker_session_c_two_bit_compression() {
    let out = run("session_c_compression.py", 1, 1, &[]);
    assert!(out[0].contains("pull1 OK"), "{}", out[0]);
}

#[test]
fn real_mxnet_worker_session_d_async_row_sparse_and_sgd() {
    let out = run("session_d_async_rsp.py", 1, 1, &[]);
    assert_all_ok(&out, 2);
}

#[test]
fn the_test_controller_reads_only_plain_sgd() {
    let pickle = b"ccopy_reg\n_reconstructor\np0\n(cmxnet.optimizer.optimizer\nSGD\np1\nc__builtin__\nobject\np2\nNtp3\nRp4\n(dp5\nVrescale_grad\np6\nF1.0\nsVlr_scheduler\np7\nNsVlr\np8\nF0.5\nsVwd\np9\nF0.0\nsVmomentum\np27\nF0.0\ns";
    assert_eq!(sgd_lr(pickle).unwrap(), 0.5);
    let with_momentum = String::from_utf8_lossy(pickle).replace("p27\nF0.0", "p27\nF0.9");
    assert!(sgd_lr(with_momentum.as_bytes()).is_err());
    assert!(sgd_lr(b"cos\nsystem\n").is_err());
}

/// A port that was free a moment ago (the real scheduler binds exactly it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a real MXNet 1.9.1 node (`import mxnet` with `DMLC_ROLE`).
fn real_node(role: &str, port: u16, workers: usize, servers: usize) -> std::process::Child {
    Command::new(python())
        .args(["-c", "import mxnet"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::var("HOME").unwrap_or_default())
        .env("DMLC_ROLE", role)
        .env("DMLC_PS_ROOT_URI", "127.0.0.1")
        .env("DMLC_PS_ROOT_PORT", port.to_string())
        .env("DMLC_NUM_WORKER", workers.to_string())
        .env("DMLC_NUM_SERVER", servers.to_string())
        .env("DMLC_NODE_HOST", "127.0.0.1")
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python")
}

/// Waits for `child` until `deadline` (then kills it by its pid); its
/// success and output.
fn finish_child(mut child: std::process::Child, deadline: Instant) -> (bool, String) {
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Our workers against a real MXNet scheduler and real MXNet servers: sync
/// sums without an updater (what a real server computes deterministically),
/// dense float32/64/16 keys, a key split over both servers, 2-bit compressed
/// pushes, several rounds. A real MXNet 1.9.1 server keeps float64 values in
/// float32 (an init of 0.1 pulls back 0.10000000149011612), and so does ours.
#[test]
fn our_workers_with_real_mxnet_scheduler_and_servers() {
    use mxkv::dist::keys::Command as Cmd;
    use mxkv::dist::kv_node::worker_on;
    use mxkv::dist::postoffice::WORKER_GROUP;
    use mxkv::ndarray::{Context, Shape};
    use mxkv::store::compression::CompressionParams;

    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (workers, servers) = (2usize, 2usize);
    let port = free_port();
    let deadline = Instant::now() + Duration::from_secs(60);
    let sched = real_node("scheduler", port, workers, servers);
    let srv: Vec<_> = (0..servers)
        .map(|_| real_node("server", port, workers, servers))
        .collect();
    let arr = |v: &[f64], dt: DType| {
        let a = NDArray::from_bytes(
            Shape(vec![v.len() as i64]),
            DType::F64,
            Context::CPU0,
            bytemuck::cast_slice(v),
        )
        .unwrap();
        let b = NDArray::zeros(Shape(vec![v.len() as i64]), dt, Context::CPU0).unwrap();
        b.copy_from(&a).unwrap();
        b
    };
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            std::thread::spawn(move || -> Result<()> {
                let mut c = Config::local(
                    Role::Worker,
                    port,
                    workers,
                    servers,
                    Duration::from_secs(30),
                );
                c.bigarray_bound = 10;
                let po = Postoffice::start(c)?;
                let w = worker_on(&po, 0);
                let r = po.my_rank();
                if r == 0 {
                    w.command(Cmd::SyncMode.head(), b"")?;
                    let params = CompressionParams::parse(&[(b"type".to_vec(), b"2bit".to_vec())])?;
                    w.command(
                        Cmd::SetGradientCompression.head(),
                        params.encode().as_bytes(),
                    )?;
                }
                po.barrier(0, WORKER_GROUP)?;
                if r == 0 {
                    w.init(&[
                        (3, &arr(&[1.0; 6], DType::F32)),
                        (5, &arr(&[1.0, 2.0], DType::F64)),
                        (11, &arr(&[10.0, 20.0], DType::F16)),
                    ])?;
                }
                po.barrier(0, WORKER_GROUP)?;
                for round in 1..=3 {
                    let m = ((r + 1) * round) as f64;
                    w.push(&[
                        (3, &arr(&[m; 6], DType::F32)),
                        (5, &arr(&[0.1 * m, 1e16 * m], DType::F64)),
                        (11, &arr(&[0.1 * m, 1000.0 * m], DType::F16)),
                    ])?;
                    w.wait_all()?;
                    po.barrier(0, WORKER_GROUP)?;
                    let (o3, o5, o11) = (
                        arr(&[0.0; 6], DType::F32),
                        arr(&[0.0; 2], DType::F64),
                        arr(&[0.0; 2], DType::F16),
                    );
                    w.pull(&[(3, &o3), (5, &o5), (11, &o11)])?;
                    let rd = round as f64;
                    // float64 keys: the real server sums in float32
                    let f32sum = |x: f64| f64::from((x * rd) as f32 + (x * 2.0 * rd) as f32);
                    assert_eq!(o3.to_f64_vec(), vec![3.0 * rd; 6]);
                    assert_eq!(o5.read().typed::<f64>(), &[f32sum(0.1), f32sum(1e16)]);
                    let h = |x: f64| half::f16::from_f64(x);
                    let hs =
                        |x: f64| half::f16::from_f32(h(x * rd).to_f32() + h(x * 2.0 * rd).to_f32());
                    assert_eq!(o11.read().typed::<half::f16>(), &[hs(0.1), hs(1000.0)]);
                    po.barrier(0, WORKER_GROUP)?;
                }
                // 2-bit: key 7, 100 values, split over both servers (bound 10)
                w.set_compression(Some(CompressionParams::parse(&[(
                    b"type".to_vec(),
                    b"2bit".to_vec(),
                )])?));
                if r == 0 {
                    w.init(&[(7, &arr(&[0.0; 100], DType::F32))])?;
                }
                po.barrier(0, WORKER_GROUP)?;
                let g: Vec<f64> = (0..100)
                    .map(|i| [0.7, -0.7, 0.2, 0.5, -2.0][i % 5])
                    .collect();
                w.push(&[(7, &arr(&g, DType::F32))])?;
                w.wait_all()?;
                po.barrier(0, WORKER_GROUP)?;
                let o7 = arr(&[0.0; 100], DType::F32);
                w.pull(&[(7, &o7)])?;
                let q = [0.5, -0.5, 0.0, 0.5, -0.5];
                // no updater: the stored value becomes the sum of both workers' pushes
                assert_eq!(
                    o7.to_f64_vec(),
                    (0..100).map(|i| 2.0 * q[i % 5]).collect::<Vec<_>>()
                );
                po.barrier(0, WORKER_GROUP)?;
                if r == 0 {
                    w.command(Cmd::StopServer.head(), b"")?;
                }
                po.finalize(true)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
    let mut logs = Vec::new();
    for c in srv.into_iter().chain([sched]) {
        logs.push(finish_child(c, deadline));
    }
    let failures: Vec<String> = results
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("worker thread {i}: {e}")),
            Err(p) => Some(format!(
                "worker thread {i} panicked: {}",
                p.downcast_ref::<String>().cloned().unwrap_or_default()
            )),
        })
        .collect();
    assert!(failures.is_empty(), "{failures:#?}\nreal nodes: {logs:?}");
    for (ok, log) in &logs {
        assert!(ok, "a real MXNet node failed:\n{log}");
    }
}
