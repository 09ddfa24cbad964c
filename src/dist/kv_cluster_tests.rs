//! The KV server and worker against each other, in one process: servers on
//! threads, workers on threads, messages through channels (each meta
//! encoded to ps-lite's wire bytes and decoded again on the way).
#![forbid(unsafe_code)]

use super::keys::{server_range, Command};
use super::kv::{node_name, server_id, worker_id, Transport};
use super::message::Message;
use super::server::{KvServer, ServerConfig, ServerEvent};
use super::worker::{KvWorker, WorkerConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::ndarray::dtype::DType;
use crate::ndarray::{Context, NDArray, Shape, StorageType};
use crate::store::compression::CompressionParams;
use crate::store::Updater;
use crate::test_util::f32s;
use half::f16;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

pub(super) enum Endpoint {
    Server(mpsc::Sender<ServerEvent>),
    Worker(Weak<KvWorker>),
}

#[derive(Default)]
pub(super) struct Net {
    pub(super) endpoints: Mutex<HashMap<i32, Endpoint>>,
    /// Every message sent: (sender, message after the wire round trip).
    pub(super) log: Mutex<Vec<Message>>,
}

pub(super) struct Port {
    pub(super) net: Arc<Net>,
    pub(super) me: i32,
}

impl Transport for Port {
    fn send(&self, msg: Message) -> Result<()> {
        let recver = msg.recver;
        let mut m = Message::decode(&msg.encode_meta(), msg.data.clone())?;
        m.sender = self.me;
        m.recver = recver;
        self.net.log.lock().push(m.clone());
        enum To {
            S(mpsc::Sender<ServerEvent>),
            W(Weak<KvWorker>),
        }
        let to = match self.net.endpoints.lock().get(&recver) {
            Some(Endpoint::Server(tx)) => To::S(tx.clone()),
            Some(Endpoint::Worker(w)) => To::W(w.clone()),
            None => {
                return Err(Error::peer_lost(format!(
                    "no route to {}",
                    node_name(recver)
                )))
            }
        };
        match to {
            To::S(tx) => tx
                .send(ServerEvent::Message(m))
                .map_err(|_| Error::peer_lost(format!("{} is gone", node_name(recver)))),
            To::W(w) => {
                if let Some(w) = w.upgrade() {
                    w.handle_response(m);
                }
                Ok(())
            }
        }
    }
}

/// `stored -= lr * recv` (float32): the updater the test controller installs.
pub(super) fn sgd(lr: f32) -> Arc<dyn Updater> {
    Arc::new(
        move |_key: i32, _: Option<&[u8]>, recv: &NDArray, stored: &NDArray| -> Result<()> {
            if recv.dtype() != DType::F32 {
                return Err(Error::usage("test sgd: float32 only"));
            }
            let step = |w: &mut [f32], g: &[f32]| {
                for (w, g) in w.iter_mut().zip(g) {
                    *w = 1.0 * *w - lr * g;
                }
            };
            if recv.stype() == StorageType::RowSparse {
                // lazy update of the pushed rows of a whole table
                let (g, s) = (recv.parts()?, stored.parts()?);
                let u = recv.row_len();
                let gd = g.data.read().typed::<f32>().to_vec();
                let mut sd = s.data.write();
                let sd = sd.typed_mut::<f32>();
                for (k, &r) in recv.rsp_indices()?.iter().enumerate() {
                    let r = r as usize;
                    step(&mut sd[r * u..(r + 1) * u], &gd[k * u..(k + 1) * u]);
                }
                return Ok(());
            }
            let g = recv.read().typed::<f32>().to_vec();
            step(stored.write().typed_mut::<f32>(), &g);
            Ok(())
        },
    )
}

pub(super) struct Cluster {
    pub(super) net: Arc<Net>,
    pub(super) workers: Vec<Arc<KvWorker>>,
    servers: Vec<JoinHandle<(KvServer, Result<()>)>>,
    barrier: Arc<Barrier>,
}

pub(super) struct Opts {
    pub(super) workers: usize,
    pub(super) servers: usize,
    pub(super) bound: usize,
    pub(super) sync: bool,
    pub(super) timeout: Duration,
    pub(super) round_timeout: Duration,
    /// The learning rate of the SGD updater a pickled optimizer installs.
    pub(super) pickle_lr: Option<f32>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            workers: 2,
            servers: 2,
            bound: 10,
            sync: true,
            timeout: Duration::from_secs(20),
            round_timeout: Duration::from_secs(20),
            pickle_lr: None,
        }
    }
}

impl Cluster {
    pub(super) fn start(o: Opts) -> Cluster {
        let net = Arc::new(Net::default());
        let mut servers = Vec::new();
        for r in 0..o.servers {
            let (tx, rx) = mpsc::channel();
            net.endpoints
                .lock()
                .insert(server_id(r), Endpoint::Server(tx));
            let port = Port {
                net: net.clone(),
                me: server_id(r),
            };
            let cfg = ServerConfig {
                rank: r,
                num_servers: o.servers,
                num_workers: o.workers,
            };
            let rt = o.round_timeout;
            let pickle_lr = o.pickle_lr;
            servers.push(std::thread::spawn(move || {
                let mut server = KvServer::new(cfg);
                let slot = server.updater_slot();
                // the controller: body "sgd <lr>" installs the test updater,
                // "fail" fails (as a refused pickle would)
                let mut controller = |head: i32, body: &[u8]| -> Result<()> {
                    assert_eq!(head, Command::Controller.head());
                    let text = String::from_utf8_lossy(body);
                    if let (Some(lr), true) = (pickle_lr, body.starts_with(b"ccopy_reg\n")) {
                        slot.set(Some(sgd(lr)));
                        return Ok(());
                    }
                    match text.split_once(' ') {
                        Some(("sgd", lr)) => {
                            slot.set(Some(sgd(lr.parse().unwrap())));
                            Ok(())
                        }
                        _ => Err(Error::usage(format!("refused optimizer '{text}'"))),
                    }
                };
                let r = server.run(&rx, &port, &mut controller, rt);
                (server, r)
            }));
        }
        let mut workers = Vec::new();
        for r in 0..o.workers {
            let port = Port {
                net: net.clone(),
                me: worker_id(r),
            };
            let w = Arc::new(KvWorker::new(
                WorkerConfig {
                    rank: r,
                    customer_id: 0,
                    num_servers: o.servers,
                    bigarray_bound: o.bound,
                    timeout: o.timeout,
                },
                Arc::new(port),
            ));
            net.endpoints
                .lock()
                .insert(worker_id(r), Endpoint::Worker(Arc::downgrade(&w)));
            workers.push(w);
        }
        if o.sync {
            workers[0].command(Command::SyncMode.head(), b"").unwrap();
        }
        Cluster {
            net,
            barrier: Arc::new(Barrier::new(o.workers)),
            workers,
            servers,
        }
    }

    /// Runs `f(rank, worker, barrier)` on one thread per worker.
    pub(super) fn run<F>(&self, f: F)
    where
        F: Fn(usize, &KvWorker, &Barrier) + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let hs: Vec<_> = self
            .workers
            .iter()
            .enumerate()
            .map(|(r, w)| {
                let (w, b, f) = (w.clone(), self.barrier.clone(), f.clone());
                std::thread::spawn(move || f(r, &w, &b))
            })
            .collect();
        for h in hs {
            h.join().expect("worker thread");
        }
    }

    /// kStopServer from worker 0, then the servers' final state.
    pub(super) fn stop(self) -> Vec<KvServer> {
        self.stop_via(0)
    }

    pub(super) fn stop_via(self, rank: usize) -> Vec<KvServer> {
        self.workers[rank]
            .command(Command::StopServer.head(), b"")
            .unwrap();
        self.servers
            .into_iter()
            .map(|h| {
                let (s, r) = h.join().expect("server thread");
                r.unwrap();
                s
            })
            .collect()
    }
}

fn shaped(shape: &[i64], dtype: DType, vals: &[f64]) -> NDArray {
    let a = NDArray::zeros(Shape(shape.to_vec()), DType::F64, Context::CPU0).unwrap();
    a.copy_from_bytes(bytemuck::cast_slice(vals)).unwrap();
    let b = NDArray::zeros(Shape(shape.to_vec()), dtype, Context::CPU0).unwrap();
    b.copy_from(&a).unwrap();
    b
}

fn zeros(shape: &[i64], dtype: DType) -> NDArray {
    NDArray::zeros(Shape(shape.to_vec()), dtype, Context::CPU0).unwrap()
}

fn row_sparse(shape: &[i64], rows: &[i64], vals: &[f32]) -> NDArray {
    let mut d = shape.to_vec();
    d[0] = rows.len() as i64;
    let data = NDArray::from_bytes(
        Shape(d),
        DType::F32,
        Context::CPU0,
        bytemuck::cast_slice(vals),
    )
    .unwrap();
    NDArray::row_sparse(Shape(shape.to_vec()), Context::CPU0, data, rows).unwrap()
}

fn rsp_zeros(shape: &[i64]) -> NDArray {
    NDArray::sparse_zeros(
        StorageType::RowSparse,
        Shape(shape.to_vec()),
        DType::F32,
        Context::CPU0,
        &[DType::I64],
        &[Shape(vec![0])],
    )
    .unwrap()
}

/// The dense value of any array, as f64.
fn dense_f64(a: &NDArray) -> Vec<f64> {
    let d = zeros(a.shape().dims(), a.dtype());
    d.copy_from(a).unwrap();
    d.to_f64_vec()
}

#[test]
fn sync_sums_2_workers_2_servers_all_float_dtypes_and_a_split_key() {
    let c = Cluster::start(Opts::default());
    c.run(|r, w, b| {
        if r == 0 {
            let k3 = shaped(&[2, 3], DType::F32, &[1.0; 6]);
            let k7 = shaped(
                &[15],
                DType::F32,
                &(0..15).map(f64::from).collect::<Vec<_>>(),
            );
            let k5 = shaped(&[4], DType::F64, &[1.0, 2.0, 3.0, 4.0]);
            let k11 = shaped(&[2], DType::F16, &[10.0, 20.0]);
            w.init(&[(3, &k3), (7, &k7), (5, &k5), (11, &k11)]).unwrap();
        }
        b.wait();
        // the init values, on every worker
        let o7 = zeros(&[15], DType::F32);
        w.pull(&[(7, &o7)]).unwrap();
        assert_eq!(o7.to_f64_vec(), (0..15).map(f64::from).collect::<Vec<_>>());
        b.wait();
        for round in 1..=3 {
            let m = (r + 1) as f64 * round as f64;
            let v3 = shaped(&[2, 3], DType::F32, &[m; 6]);
            let v7 = shaped(
                &[15],
                DType::F32,
                &(0..15).map(|i| i as f64 * m).collect::<Vec<_>>(),
            );
            let v5 = shaped(&[4], DType::F64, &[0.1 * m, 0.2 * m, 1e16 * m, -m]);
            let v11 = shaped(&[2], DType::F16, &[0.1 * m, 1000.0 * m]);
            w.push(&[(3, &v3), (7, &v7), (5, &v5), (11, &v11)]).unwrap();
            let (o3, o7, o5, o11) = (
                zeros(&[2, 3], DType::F32),
                zeros(&[15], DType::F32),
                zeros(&[4], DType::F64),
                zeros(&[2], DType::F16),
            );
            w.pull(&[(3, &o3), (7, &o7), (5, &o5), (11, &o11)]).unwrap();
            // sums of both workers' pushes (1x and 2x the round)
            let s = |x: f64| x * round as f64 + 2.0 * x * round as f64;
            assert_eq!(o3.to_f64_vec(), vec![s(1.0); 6], "round {round}");
            assert_eq!(
                o7.to_f64_vec(),
                (0..15).map(|i| s(i as f64)).collect::<Vec<_>>()
            );
            // float64 keys are summed in float32, as a real MXNet 1.9.1
            // server does (its float32 master copies)
            let f5 =
                |x: f64| f64::from(((x * round as f64) as f32) + ((x * 2.0 * round as f64) as f32));
            assert_eq!(
                o5.read().typed::<f64>(),
                &[f5(0.1), f5(0.2), f5(1e16), f5(-1.0)]
            );
            assert_ne!(f5(0.1), 0.1 * round as f64 + 0.2 * round as f64);
            // float16: each push rounded to half, summed in float32, rounded once
            let h = |x: f64| f16::from_f64(x);
            let hs = |x: f64| {
                f16::from_f32(h(x * round as f64).to_f32() + h(x * 2.0 * round as f64).to_f32())
            };
            assert_eq!(o11.read().typed::<f16>(), &[hs(0.1), hs(1000.0)]);
            b.wait();
        }
    });
    // key 7 (15 elements, bound 10) went to both servers: 8 + 7 elements
    let log = c.net.log.lock().clone();
    let b1 = server_range(1, 2).start;
    let pushes7: Vec<(i32, Vec<u8>)> = log
        .iter()
        .filter(|m| m.request && m.push && m.data.len() == 3)
        .filter(|m| {
            let k = u64::from_le_bytes(m.data[0][..8].try_into().unwrap());
            k == 7 || k == b1 + 7
        })
        .map(|m| (m.recver, m.data[2].to_vec()))
        .collect();
    assert!(pushes7.contains(&(8, 32i32.to_le_bytes().to_vec())));
    assert!(pushes7.contains(&(10, 28i32.to_le_bytes().to_vec())));
    let servers = c.stop();
    assert_eq!(servers[0].stored(7).unwrap().size(), 8);
    assert_eq!(servers[1].stored(7).unwrap().size(), 7);
    // key 3 lives on server 1 only ((3 * 9973) % 2 = 1)
    assert!(servers[0].stored(3).is_none());
    assert_eq!(servers[1].stored(3).unwrap().size(), 6);
}

#[test]
fn pushpull_and_updaters_sync_and_async() {
    for sync in [true, false] {
        let c = Cluster::start(Opts {
            sync,
            ..Opts::default()
        });
        c.run(move |r, w, b| {
            if r == 0 {
                w.init(&[(4, &f32s(&[1.0, 2.0, 3.0])), (9, &f32s(&[0.0; 12]))])
                    .unwrap();
            }
            b.wait();
            w.command(Command::Controller.head(), b"sgd 0.5").unwrap();
            b.wait();
            let out = zeros(&[3], DType::F32);
            w.push_pull(&[(4, &f32s(&[1.0, 1.0, 1.0]), &out)]).unwrap();
            if sync {
                // both gradients summed, one update: w - 0.5 * 2
                assert_eq!(out.to_f64_vec(), vec![0.0, 1.0, 2.0]);
            }
            b.wait();
            let big = f32s(&(0..12).map(|i| i as f32).collect::<Vec<_>>());
            w.push(&[(9, &big)]).unwrap();
            w.wait_all().unwrap();
            b.wait();
            let o = zeros(&[12], DType::F32);
            w.pull(&[(9, &o)]).unwrap();
            // sync: one update with the sum; async: one update per push; the
            // same here: 0 - 0.5*i - 0.5*i
            assert_eq!(
                o.to_f64_vec(),
                (0..12).map(|i| -(i as f64)).collect::<Vec<_>>()
            );
            let o4 = zeros(&[3], DType::F32);
            w.pull(&[(4, &o4)]).unwrap();
            assert_eq!(o4.to_f64_vec(), vec![0.0, 1.0, 2.0]);
        });
        c.stop();
    }
}

#[test]
fn row_sparse_push_and_pull_one_server_and_split() {
    for bound in [1000, 4] {
        let c = Cluster::start(Opts {
            bound,
            ..Opts::default()
        });
        c.run(|r, w, b| {
            if r == 0 {
                // a 6x2 table, initialised from a row_sparse value with rows 1, 3
                let init = row_sparse(&[6, 2], &[1, 3], &[1.0, 1.0, 3.0, 3.0]);
                w.init(&[(1, &init)]).unwrap();
            }
            b.wait();
            let all = rsp_zeros(&[6, 2]);
            w.pull_row_sparse(1, &all, &[0, 1, 2, 3, 4, 5]).unwrap();
            assert_eq!(
                dense_f64(&all),
                vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 3.0, 3.0, 0.0, 0.0, 0.0, 0.0]
            );
            b.wait();
            // worker 0 pushes rows 1 and 4, worker 1 rows 4 and 5
            let g = if r == 0 {
                row_sparse(&[6, 2], &[1, 4], &[1.0, 2.0, 3.0, 4.0])
            } else {
                row_sparse(&[6, 2], &[4, 5], &[10.0, 20.0, 30.0, 40.0])
            };
            w.push(&[(1, &g)]).unwrap();
            let out = rsp_zeros(&[6, 2]);
            w.pull_row_sparse(1, &out, &[1, 3, 4]).unwrap();
            assert_eq!(out.rsp_indices().unwrap(), vec![1, 3, 4]);
            // no updater: the table becomes the sum (rows nobody pushed: 0)
            assert_eq!(
                dense_f64(&out),
                vec![0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 13.0, 24.0, 0.0, 0.0]
            );
            let none = rsp_zeros(&[6, 2]);
            w.pull_row_sparse(1, &none, &[]).unwrap();
            assert_eq!(none.rsp_indices().unwrap(), Vec::<i64>::new());
            b.wait();
            // an empty push from worker 1 still completes the round
            let g = if r == 0 {
                row_sparse(&[6, 2], &[0], &[5.0, 6.0])
            } else {
                rsp_zeros(&[6, 2])
            };
            w.push(&[(1, &g)]).unwrap();
            let out = rsp_zeros(&[6, 2]);
            w.pull_row_sparse(1, &out, &[0, 5]).unwrap();
            assert_eq!(dense_f64(&out)[..2], [5.0, 6.0]);
            assert_eq!(dense_f64(&out)[10..], [0.0, 0.0]);
        });
        let servers = c.stop();
        let rows: Vec<i64> = servers
            .iter()
            .filter_map(|s| s.stored(1))
            .map(|a| a.shape().dims()[0])
            .collect();
        if bound == 4 {
            assert_eq!(rows, vec![3, 3], "split over both servers");
        } else {
            assert_eq!(rows, vec![6]);
        }
    }
}

#[test]
fn two_bit_compressed_pushes_are_dequantized_and_summed() {
    for (bound, n) in [(1000, 10usize), (50, 100)] {
        let c = Cluster::start(Opts {
            bound,
            ..Opts::default()
        });
        let params = CompressionParams::parse(&[
            (b"type".to_vec(), b"2bit".to_vec()),
            (b"threshold".to_vec(), b"0.5".to_vec()),
        ])
        .unwrap();
        c.workers[0]
            .command(
                Command::SetGradientCompression.head(),
                params.encode().as_bytes(),
            )
            .unwrap();
        c.run(move |r, w, b| {
            w.set_compression(Some(params));
            if r == 0 {
                w.init(&[(1, &f32s(&vec![0.0; n]))]).unwrap();
            }
            b.wait();
            let g: Vec<f32> = (0..n)
                .map(|i| [0.7, -0.7, 0.2, -0.2, 0.5, -0.5, 1.5, 0.0, 0.49, -2.0][i % 10])
                .collect();
            let want_one = [0.5, -0.5, 0.0, 0.0, 0.5, -0.5, 0.5, 0.0, 0.0, -0.5];
            w.push(&[(1, &f32s(&g))]).unwrap();
            let out = zeros(&[n as i64], DType::F32);
            w.pull(&[(1, &out)]).unwrap();
            let want: Vec<f64> = (0..n).map(|i| 2.0 * want_one[i % 10]).collect();
            assert_eq!(out.to_f64_vec(), want, "worker {r}");
            b.wait();
            // the residuals carry over: 0.2 + 0.2 + 0.2 = 0.6 >= 0.5 on the 2nd push
            w.push(&[(1, &f32s(&g))]).unwrap();
            w.pull(&[(1, &out)]).unwrap();
            assert_eq!(out.to_f64_vec()[2], 0.0);
            w.push(&[(1, &f32s(&g))]).unwrap();
            w.pull(&[(1, &out)]).unwrap();
            assert_eq!(out.to_f64_vec()[2], 1.0);
        });
        // compressed pushes travel as cmd 3 with the dummy size key
        let compressed: Vec<Message> = c
            .net
            .log
            .lock()
            .iter()
            .filter(|m| m.request && m.head == 3 && m.push)
            .cloned()
            .collect();
        assert!(!compressed.is_empty());
        let k0 = u64::from_le_bytes(compressed[0].data[0][..8].try_into().unwrap());
        if n == 10 {
            // key 1 is on server 1: the size key is range(1).begin + 10
            assert_eq!(k0, server_range(1, 2).start + 10);
            assert_eq!(compressed[0].data[1].len(), 4);
        }
        c.stop();
    }
}

#[test]
fn refused_requests_come_back_as_errors_of_their_kind() {
    let c = Cluster::start(Opts {
        workers: 1,
        servers: 2,
        ..Opts::default()
    });
    let w = &c.workers[0];
    // integer dtypes never leave the worker
    let ints = zeros(&[3], DType::I32);
    let e = w.push(&[(1, &ints)]).unwrap_err();
    assert!(e.message().contains("not int32"), "{e}");
    // a pull of a key nobody initialised: the server refuses, naming it
    let e = w.pull(&[(2, &zeros(&[3], DType::F32))]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotInited, "{e}");
    assert!(e.message().contains("init 2 first"), "{e}");
    // a pushed size that differs from the first one (MXNet's check and words)
    w.init(&[(5, &f32s(&[1.0, 2.0]))]).unwrap();
    let e = w.push(&[(5, &f32s(&[1.0, 2.0, 3.0]))]).unwrap_err();
    assert!(
        e.message()
            .starts_with("The value size cannot be changed 12. Key is 5"),
        "{e}"
    );
    // an optimizer the controller refuses
    let e = w
        .command(Command::Controller.head(), b"pickle of os.system")
        .unwrap_err();
    assert!(e.message().contains("refused optimizer"), "{e}");
    // unknown command heads
    let e = w.command(17, b"").unwrap_err();
    assert!(e.message().contains("unknown server command 17"), "{e}");
    c.stop();

    // async mode without an updater: MXNet's server dies; ours answers
    let c = Cluster::start(Opts {
        workers: 1,
        servers: 1,
        sync: false,
        ..Opts::default()
    });
    let w = &c.workers[0];
    w.init(&[(1, &f32s(&[1.0]))]).unwrap();
    w.push(&[(1, &f32s(&[1.0]))]).unwrap();
    let e = w.pull(&[(1, &zeros(&[1], DType::F32))]).unwrap_err();
    assert!(
        e.message()
            .contains("Updater needs to be set for async mode"),
        "{e}"
    );
    // the error was reported once; the next pull works
    let out = zeros(&[1], DType::F32);
    w.pull(&[(1, &out)]).unwrap();
    assert_eq!(out.to_f64_vec(), vec![1.0]);
    c.stop();
}

#[test]
fn a_round_that_cannot_complete_times_out_naming_the_missing_worker() {
    // the server gives up first and says who did not push
    let c = Cluster::start(Opts {
        round_timeout: Duration::from_millis(200),
        ..Opts::default()
    });
    let w = &c.workers[0];
    w.init(&[(3, &f32s(&[1.0]))]).unwrap();
    w.push(&[(3, &f32s(&[1.0]))]).unwrap();
    let e = w.pull(&[(3, &zeros(&[1], DType::F32))]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.message().contains("no push from worker 1 (id 11)"), "{e}");
    assert!(e.message().contains("key 3"), "{e}");
    c.stop();

    // the worker gives up first and says which server did not answer
    let c = Cluster::start(Opts {
        timeout: Duration::from_millis(300),
        ..Opts::default()
    });
    let w = &c.workers[0];
    w.init(&[(3, &f32s(&[1.0]))]).unwrap();
    w.push(&[(3, &f32s(&[1.0]))]).unwrap();
    let e = w.wait_all().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        e.message().contains("no answer from server 1 (id 10)"),
        "{e}"
    );
    assert!(e.message().contains("push of key 3"), "{e}");
    // let the round finish so that the servers stop cleanly
    c.workers[1].push(&[(3, &f32s(&[1.0]))]).unwrap();
    c.workers[1].wait_all().unwrap();
    c.stop();
}

#[test]
fn a_lost_server_fails_pending_and_later_requests() {
    let c = Cluster::start(Opts::default());
    let w = &c.workers[0];
    w.init(&[(3, &f32s(&[1.0]))]).unwrap();
    w.push(&[(3, &f32s(&[1.0]))]).unwrap();
    w.fail_peer(
        Some(server_id(1)),
        &Error::peer_lost("server 1 (id 10) disconnected"),
    );
    let e = w.wait_all().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PeerLost);
    let e = w.pull(&[(3, &zeros(&[1], DType::F32))]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PeerLost, "{e}");
    // worker 1 completes the round worker 0's push started
    c.workers[1].push(&[(3, &f32s(&[1.0]))]).unwrap();
    c.workers[1].wait_all().unwrap();
    c.stop_via(1);
}

/// A transport whose messages are never answered.
struct Void;

impl Transport for Void {
    fn send(&self, _msg: Message) -> Result<()> {
        Ok(())
    }
}

#[test]
fn a_call_on_several_keys_has_one_deadline() {
    let timeout = Duration::from_millis(400);
    let w = KvWorker::new(
        WorkerConfig {
            rank: 0,
            customer_id: 0,
            num_servers: 2,
            bigarray_bound: 1000,
            timeout,
        },
        Arc::new(Void),
    );
    let outs: Vec<NDArray> = (0..3).map(|_| zeros(&[2], DType::F32)).collect();
    let items: Vec<(i32, &NDArray)> = outs
        .iter()
        .enumerate()
        .map(|(k, o)| (k as i32, o))
        .collect();
    let t = std::time::Instant::now();
    let e = w.pull(&items).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    // one deadline, not one per key (which would take 3 x 400 ms)
    assert!(t.elapsed() < timeout * 2, "{:?}", t.elapsed());
    assert!(t.elapsed() >= timeout);
}

#[test]
fn large_values_go_without_copies_and_pinned_outputs_keep_their_address() {
    // Values of SHARE_MIN bytes and more are lent to the transport and
    // adopted from it (NDArray::share / assign_bytes): what a worker pushed
    // must stay what the servers sum even when it writes the array at once,
    // and an output whose address is out (MXNDArrayGetData) is written in
    // place, as MXNet writes it.
    let n = crate::ndarray::SHARE_MIN; // f32 values: 4x the bound, split over 2 servers too
    for servers in [1, 2] {
        let c = Cluster::start(Opts {
            servers,
            bound: n / 2,
            ..Opts::default()
        });
        c.run(move |r, w, b| {
            if r == 0 {
                w.init(&[(3, &zeros(&[n as i64], DType::F32))]).unwrap();
            }
            b.wait();
            let grad = zeros(&[n as i64], DType::F32);
            let pinned = zeros(&[n as i64], DType::F32);
            let at = pinned.write().as_mut_ptr() as usize;
            let free = zeros(&[n as i64], DType::F32);
            for round in 0..3 {
                let v: Vec<f32> = (0..n)
                    .map(|i| (i % 97) as f32 + (r + round) as f32)
                    .collect();
                grad.copy_from_bytes(bytemuck::cast_slice(&v)).unwrap();
                w.push(&[(3, &grad)]).unwrap();
                // written while (maybe) still being sent
                grad.copy_from_bytes(bytemuck::cast_slice(&vec![-1e9f32; n]))
                    .unwrap();
                w.wait_all().unwrap();
                b.wait();
                w.pull(&[(3, &pinned)]).unwrap();
                let want: Vec<f64> = (0..n)
                    .map(|i| 2.0 * (i % 97) as f64 + (2 * round + 1) as f64)
                    .collect();
                assert_eq!(pinned.to_f64_vec(), want, "round {round}");
                assert_eq!(pinned.write().as_mut_ptr() as usize, at);
                b.wait();
                // grad holds -1e9 now: both workers' sum comes back
                w.push_pull(&[(3, &grad, &free)]).unwrap();
                assert_eq!(free.to_f64_vec(), vec![-2e9; n], "round {round}");
                b.wait();
            }
        });
        c.stop();
    }
}
