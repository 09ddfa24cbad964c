//! The KV worker and server on a ps-lite node ([`Postoffice`]): the
//! postoffice is their [`Transport`], and they receive through its
//! [`Customer`] interface (app 0, as MXNet uses it).
#![forbid(unsafe_code)]

use super::kv::Transport;
use super::message::Message;
use super::postoffice::{Customer, Postoffice, SCHEDULER};
use super::server::{Controller, Flow, KvServer, ServerConfig, ServerEvent};
use super::worker::{KvWorker, WorkerConfig};
use crate::error::{Error, Result};
use crate::store::UpdaterSlot;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

/// Sends through a postoffice without keeping it alive (the postoffice
/// holds the customers, so a strong reference would be a cycle).
struct PostofficeTransport(Weak<Postoffice>);

impl Transport for PostofficeTransport {
    fn send(&self, msg: Message) -> Result<()> {
        match self.0.upgrade() {
            Some(po) => po.send(msg),
            None => Err(Error::peer_lost("this node has stopped")),
        }
    }

    fn send_copying(&self, msg: Message, part: usize, src: &[u8]) -> Result<()> {
        match self.0.upgrade() {
            Some(po) => po.send_copying(msg, part, src),
            None => Err(Error::peer_lost("this node has stopped")),
        }
    }

    fn watch(&self, ready: &mut dyn FnMut() -> bool) -> bool {
        match self.0.upgrade() {
            Some(po) => po.watch_lanes(ready),
            None => ready(),
        }
    }

    fn sleeping(&self, asleep: bool) {
        if let Some(po) = self.0.upgrade() {
            po.lanes_sleeping(asleep);
        }
    }
}

impl Customer for KvWorker {
    fn on_message(&self, msg: Message) {
        self.handle_response(msg);
    }

    fn on_peer_lost(&self, peer: i32, err: &Error) {
        // A lost server fails every pending request, not only those waiting
        // for it: its keys are gone and the job cannot go on (a sync round on
        // another server would wait for workers that fail on this loss).
        let is_server = peer >= 8 && peer % 2 == 0;
        self.fail_peer(if is_server { None } else { Some(peer) }, err);
    }
}

/// Creates the KV worker of customer `customer_id` on a started worker node
/// and registers it for its responses.
pub fn worker_on(po: &Arc<Postoffice>, customer_id: i32) -> Arc<KvWorker> {
    let cfg = po.config();
    let w = Arc::new(KvWorker::new(
        WorkerConfig {
            rank: po.my_rank(),
            customer_id,
            num_servers: po.num_servers(),
            bigarray_bound: cfg.bigarray_bound,
            timeout: cfg.timeout,
        },
        Arc::new(PostofficeTransport(Arc::downgrade(po))),
    ));
    po.register_customer(0, customer_id, w.clone());
    w
}

/// A server node's receive side, on the van's receive thread, which must
/// never wait for the server: it also takes the scheduler's heartbeats, and
/// an updater may run for longer than the heartbeat timeout (the scheduler
/// then declared the server dead). Data requests are handled right here
/// while no updater is installed, the server is free (`try_lock`) and no
/// earlier message is still queued (a sum or an assign never waits, and
/// skipping the hand-off saves a thread wake-up per request, ~20 µs here);
/// everything else (commands, data requests once an updater is installed or
/// while the server is busy) goes through the queue to the thread running
/// [`serve`] (where MXNet runs its controller and updater), in arrival
/// order: a message is handled here only when every message queued before
/// it has been handled, so each worker's order is kept.
struct ServerInbox {
    server: Arc<Mutex<KvServer>>,
    /// The server's updater slot (read without the server lock).
    slot: UpdaterSlot,
    out: PostofficeTransport,
    tx: Mutex<mpsc::Sender<ServerEvent>>,
    /// Messages queued and not yet handled by [`serve`].
    queued: Arc<AtomicUsize>,
}

impl Customer for ServerInbox {
    fn on_message(&self, msg: Message) {
        if !msg.simple_app && self.queued.load(Ordering::Acquire) == 0 && self.slot.get().is_none()
        {
            if let Some(mut s) = self.server.try_lock() {
                // checked again under the lock: `serve` installs updaters
                // (its controller) while it holds the lock
                if self.queued.load(Ordering::Acquire) == 0 && s.updater_slot().get().is_none() {
                    let mut no_controller = |_: i32, _: &[u8]| -> Result<()> {
                        Err(Error::new(
                            "internal: a data request reached the controller",
                        ))
                    };
                    s.handle(msg, &self.out, &mut no_controller);
                    return;
                }
            }
        }
        self.queued.fetch_add(1, Ordering::AcqRel);
        // The receiver is gone only after `serve` returned: nothing to do.
        let _ = self.tx.lock().send(ServerEvent::Message(msg));
    }

    fn on_peer_lost(&self, peer: i32, err: &Error) {
        let _ = self
            .tx
            .lock()
            .send(ServerEvent::PeerLost(peer, err.clone()));
    }
}

/// A KV server for a started server node.
pub fn server_for(po: &Postoffice) -> KvServer {
    KvServer::new(ServerConfig {
        rank: po.my_rank(),
        num_servers: po.num_servers(),
        num_workers: po.num_workers(),
    })
}

/// Runs `server` until a worker sends `kStopServer` (MXNet's
/// `KVStoreDistServer::Run`): commands, the controller and the updater run
/// on this thread; sync rounds that wait longer than 4/5 of the node's
/// deadline fail. The caller then finalizes the node.
///
/// Beyond MXNet (whose server then waits forever): once every worker is
/// lost, nobody is left to send `kStopServer`, and `serve` fails naming
/// every peer lost, in order (the first is the cause). It also fails, naming
/// the scheduler and every peer lost, one deadline (`config.timeout`) after
/// the scheduler is lost, unless every worker left before: the scheduler
/// leaves only once the job is over (or broken), and a worker that froze
/// with its connections open would otherwise keep the server waiting
/// forever. The workers still running get that deadline to fail on their
/// own (so that the usual "every worker is gone" names the first cause).
pub fn serve(
    po: &Arc<Postoffice>,
    server: &mut KvServer,
    controller: &mut Controller<'_>,
) -> Result<()> {
    let cfg = server.config();
    let shared = Arc::new(Mutex::new(std::mem::replace(server, KvServer::new(cfg))));
    let (tx, rx) = mpsc::channel();
    let early = tx.clone();
    let queued = Arc::new(AtomicUsize::new(0));
    po.register_customer(
        0,
        0,
        Arc::new(ServerInbox {
            slot: shared.lock().updater_slot(),
            server: shared.clone(),
            out: PostofficeTransport(Arc::downgrade(po)),
            tx: Mutex::new(tx),
            queued: queued.clone(),
        }),
    );
    // Peers lost before the server was registered were told to nobody (one
    // lost since may come twice: counted once below).
    for id in po.lost_peers() {
        if let Err(e) = po.check_peer(id) {
            let _ = early.send(ServerEvent::PeerLost(id, e));
        }
    }
    drop(early);
    let out = PostofficeTransport(Arc::downgrade(po));
    // A round fails before the waiting workers' own deadline (the node's
    // deadline, counted from their push), so that they hear from the server
    // which worker did not push rather than only that it did not answer.
    let timeout = po.config().timeout * 4 / 5;
    let tick = (timeout / 20).clamp(Duration::from_millis(10), Duration::from_secs(1));
    // Every peer lost so far, in order (the first is the cause).
    let mut lost: Vec<(i32, Error)> = Vec::new();
    // When the scheduler was lost: serving ends one deadline later.
    let mut scheduler_lost: Option<Instant> = None;
    let r = loop {
        match rx.recv_timeout(tick) {
            Ok(ServerEvent::Message(m)) => {
                let mut s = shared.lock();
                let flow = s.handle(m, &out, controller);
                // handled (under the lock): later messages may skip the queue
                queued.fetch_sub(1, Ordering::AcqRel);
                drop(s);
                if flow == Flow::Stop {
                    break Ok(());
                }
            }
            Ok(ServerEvent::PeerLost(id, e)) => {
                if lost.iter().any(|(p, _)| *p == id) {
                    continue;
                }
                shared.lock().on_peer_lost(id, &e, &out);
                if id == SCHEDULER {
                    scheduler_lost.get_or_insert(Instant::now());
                }
                lost.push((id, e));
                let is_worker = |id: i32| id >= 9 && id % 2 == 1;
                if lost.iter().filter(|(p, _)| is_worker(*p)).count() >= cfg.num_workers {
                    let why: Vec<&str> = lost.iter().map(|(_, e)| e.message()).collect();
                    break Err(Error::peer_lost(format!(
                        "server {}: every worker is gone, nobody is left to serve: {}",
                        cfg.rank,
                        why.join("; ")
                    )));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Err(Error::peer_lost(format!(
                    "server {}: the node stopped before kStopServer",
                    cfg.rank
                )))
            }
        }
        shared.lock().expire_rounds(timeout, &out);
        if let Some(t) = scheduler_lost {
            if t.elapsed() >= po.config().timeout {
                let why: Vec<&str> = lost.iter().map(|(_, e)| e.message()).collect();
                break Err(Error::peer_lost(format!(
                    "server {}: lost the scheduler (id {SCHEDULER}) {:.0?} ago and not every worker has left since: the job is over: {}",
                    cfg.rank,
                    t.elapsed(),
                    why.join("; ")
                )));
            }
        }
    };
    po.unregister_customer(0, 0);
    std::mem::swap(server, &mut shared.lock());
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::config::Config;
    use crate::dist::keys::Command;
    use crate::dist::message::Role;
    use crate::dist::postoffice::WORKER_GROUP;
    use crate::dist::scheduler;
    use crate::ndarray::NDArray;
    use crate::test_util::{cluster_cfg as cfg, f32s};

    /// 2 workers x 2 servers over ZeroMQ on 127.0.0.1: sync sums of a small
    /// key and of a key split over both servers, then a clean shutdown.
    #[test]
    fn two_workers_two_servers_over_loopback() {
        two_by_two(true);
    }

    /// The same through the van alone (`MXKV_LANE=0`).
    #[test]
    fn two_workers_two_servers_over_loopback_without_lanes() {
        two_by_two(false);
    }

    fn two_by_two(lane: bool) {
        let cfg = move |role, port| Config {
            lane,
            ..cfg(role, port)
        };
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
        let port = sched.port();
        let servers: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || -> Result<()> {
                    let po = Postoffice::start(cfg(Role::Server, port))?;
                    let mut s = server_for(&po);
                    let slot = s.updater_slot();
                    // kController installs `stored -= lr * sum`
                    let mut controller = |_: i32, body: &[u8]| -> Result<()> {
                        let lr: f32 = String::from_utf8_lossy(body).parse().unwrap();
                        slot.set(Some(Arc::new(
                            move |_: i32,
                                  _: Option<&[u8]>,
                                  g: &NDArray,
                                  w: &NDArray|
                                  -> Result<()> {
                                let g = g.read().typed::<f32>().to_vec();
                                for (w, g) in w.write().typed_mut::<f32>().iter_mut().zip(g) {
                                    *w -= lr * g;
                                }
                                Ok(())
                            },
                        )));
                        Ok(())
                    };
                    serve(&po, &mut s, &mut controller)?;
                    po.finalize(true)
                })
            })
            .collect();
        let workers: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || -> Result<Vec<f64>> {
                    let po = Postoffice::start(cfg(Role::Worker, port))?;
                    assert_eq!(po.lanes.count(), if lane { 2 } else { 0 });
                    let w = worker_on(&po, 0);
                    let r = po.my_rank();
                    if r == 0 {
                        w.command(Command::SyncMode.head(), b"")?;
                        w.init(&[(3, &f32s(&[0.0; 4])), (7, &f32s(&[0.0; 15]))])?;
                    }
                    po.barrier(0, WORKER_GROUP)?;
                    let m = (r + 1) as f32;
                    let big: Vec<f32> = (0..15).map(|i| i as f32 * m).collect();
                    w.push(&[(3, &f32s(&[m; 4])), (7, &f32s(&big))])?;
                    let (o3, o7) = (f32s(&[0.0; 4]), f32s(&[0.0; 15]));
                    w.pull(&[(3, &o3), (7, &o7)])?;
                    let out = f32s(&[0.0; 4]);
                    w.push_pull(&[(3, &f32s(&[1.0; 4]), &out)])?;
                    // with an updater (requests go to the serving thread)
                    w.command(Command::Controller.head(), b"0.25")?;
                    let upd = f32s(&[0.0; 4]);
                    w.push_pull(&[(3, &f32s(&[1.0; 4]), &upd)])?;
                    po.barrier(0, WORKER_GROUP)?;
                    if r == 0 {
                        w.command(Command::StopServer.head(), b"")?;
                    }
                    po.finalize(true)?;
                    let mut v = o3.to_f64_vec();
                    v.extend(o7.to_f64_vec());
                    v.extend(out.to_f64_vec());
                    v.extend(upd.to_f64_vec());
                    Ok(v)
                })
            })
            .collect();
        let mut want = vec![3.0; 4];
        want.extend((0..15).map(|i| 3.0 * i as f64));
        want.extend([2.0; 4]);
        want.extend([1.5; 4]); // 2 - 0.25 * 2
        for w in workers {
            assert_eq!(w.join().unwrap().unwrap(), want);
        }
        for s in servers {
            s.join().unwrap().unwrap();
        }
        sched.join().unwrap();
    }

    /// The van's receive thread never waits for the server: while the
    /// serving thread holds the server (an updater running for longer than
    /// the heartbeat timeout: the probe's scheduler then declared the server
    /// dead), a data request is queued and `on_message` returns at once;
    /// with the server free and nothing queued, it is handled right there.
    /// `on_message` used to take the server lock, and waited for the update.
    #[test]
    fn the_receive_side_never_waits_for_a_busy_server() {
        use crate::dist::kv::{i32_bytes, u64_bytes};
        let push = |ts: i32| {
            let v: &[u8] = bytemuck::cast_slice(&[1.0f32; 2]);
            Message {
                request: true,
                push: true,
                sender: 9,
                recver: 8,
                timestamp: ts,
                data: vec![u64_bytes(&[3]), v.to_vec().into(), i32_bytes(&[8])],
                ..Message::default()
            }
        };
        for with_updater in [true, false] {
            let server = KvServer::new(ServerConfig {
                rank: 0,
                num_servers: 1,
                num_workers: 1,
            });
            if with_updater {
                server.updater_slot().set(Some(Arc::new(
                    |_: i32, _: Option<&[u8]>, _: &NDArray, _: &NDArray| -> Result<()> { Ok(()) },
                )));
            }
            let (tx, rx) = mpsc::channel();
            let inbox = Arc::new(ServerInbox {
                slot: server.updater_slot(),
                server: Arc::new(Mutex::new(server)),
                out: PostofficeTransport(Weak::new()),
                tx: Mutex::new(tx),
                queued: Arc::new(AtomicUsize::new(0)),
            });
            // the serving thread, busy in an update
            let busy = inbox.server.lock();
            let (done_tx, done_rx) = mpsc::channel();
            let receiver = {
                let inbox = inbox.clone();
                std::thread::spawn(move || {
                    inbox.on_message(push(0));
                    let _ = done_tx.send(());
                })
            };
            let returned = done_rx.recv_timeout(Duration::from_secs(10));
            drop(busy);
            receiver.join().unwrap();
            assert!(
                returned.is_ok(),
                "on_message waited for the busy server (updater installed: {with_updater})"
            );
            match rx.try_recv() {
                Ok(ServerEvent::Message(m)) => assert_eq!(m.timestamp, 0),
                _ => panic!("the request was not queued for the serving thread"),
            }
            assert_eq!(inbox.queued.load(Ordering::Acquire), 1);
            // the server is free now, but a message is still queued: the
            // next one queues behind it (arrival order)
            inbox.on_message(push(1));
            assert!(matches!(rx.try_recv(), Ok(ServerEvent::Message(m)) if m.timestamp == 1));
            if !with_updater {
                // nothing queued, server free, no updater: handled here
                inbox.queued.store(0, Ordering::Release);
                inbox.on_message(push(2));
                assert!(rx.try_recv().is_err(), "handled on the receive side");
            }
        }
    }

    /// A worker that stays connected but does nothing (frozen) must not keep
    /// a server alive once the scheduler is gone: 2 workers, 1 server;
    /// worker 0 leaves abruptly, so the scheduler fails and exits; worker 1
    /// keeps its connections open. `serve` then ends, one deadline after the
    /// scheduler was lost, with an error naming the scheduler (before the
    /// fix it waited forever).
    #[test]
    fn serve_ends_when_the_scheduler_is_lost() {
        let cfg = |role, port| Config::local(role, port, 2, 1, Duration::from_secs(3));
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
        let port = sched.port();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = (|| -> Result<()> {
                let po = Postoffice::start(cfg(Role::Server, port))?;
                let mut s = server_for(&po);
                let r = serve(&po, &mut s, &mut |_, _| Ok(()));
                po.stop();
                r
            })();
            let _ = tx.send(r);
        });
        let workers: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || Postoffice::start(cfg(Role::Worker, port)).unwrap())
            })
            .collect();
        let pos: Vec<Arc<Postoffice>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        let (w0, w1) = if pos[0].my_rank() == 0 {
            (&pos[0], &pos[1])
        } else {
            (&pos[1], &pos[0])
        };
        w0.stop();
        // the scheduler fails on the lost worker and exits
        assert!(sched.join().is_err());
        let r = rx
            .recv_timeout(Duration::from_secs(15))
            .expect("the server still serves after losing the scheduler");
        let e = r.unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::PeerLost, "{e}");
        assert!(e.message().contains("scheduler"), "{e}");
        w1.stop();
    }
}
