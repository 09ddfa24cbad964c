//! The KV worker and server on a ps-lite node ([`Postoffice`]): the
//! postoffice is their [`Transport`], and they receive through its
//! [`Customer`] interface (app 0, as MXNet uses it).
#![forbid(unsafe_code)]

use super::kv::Transport;
use super::message::Message;
use super::postoffice::{Customer, Postoffice};
use super::server::{Controller, KvServer, ServerConfig, ServerEvent};
use super::worker::{KvWorker, WorkerConfig};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::{mpsc, Arc, Weak};

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
}

impl Customer for KvWorker {
    fn on_message(&self, msg: Message) {
        self.handle_response(msg);
    }

    fn on_peer_lost(&self, peer: i32, err: &Error) {
        self.fail_peer(Some(peer), err);
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

/// Hands a server node's messages and peer losses to the thread running
/// [`serve`].
struct ServerInbox(Mutex<mpsc::Sender<ServerEvent>>);

impl Customer for ServerInbox {
    fn on_message(&self, msg: Message) {
        // The receiver is gone only after `serve` returned: nothing to do.
        let _ = self.0.lock().send(ServerEvent::Message(msg));
    }

    fn on_peer_lost(&self, _peer: i32, err: &Error) {
        let _ = self.0.lock().send(ServerEvent::PeerLost(err.clone()));
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

/// Runs `server` on this thread until a worker sends `kStopServer` (MXNet's
/// `KVStoreDistServer::Run`); sync rounds that wait longer than the node's
/// deadline fail. The caller then finalizes the node.
pub fn serve(
    po: &Arc<Postoffice>,
    server: &mut KvServer,
    controller: &mut Controller<'_>,
) -> Result<()> {
    let (tx, rx) = mpsc::channel();
    po.register_customer(0, 0, Arc::new(ServerInbox(Mutex::new(tx))));
    let out = PostofficeTransport(Arc::downgrade(po));
    let r = server.run(&rx, &out, controller, po.config().timeout);
    po.unregister_customer(0, 0);
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
    use crate::ndarray::dtype::DType;
    use crate::ndarray::{Context, NDArray, Shape};
    use std::time::Duration;

    fn f32s(v: &[f32]) -> NDArray {
        NDArray::from_bytes(
            Shape(vec![v.len() as i64]),
            DType::F32,
            Context::CPU0,
            bytemuck::cast_slice(v),
        )
        .unwrap()
    }

    /// 2 workers x 2 servers over ZeroMQ on 127.0.0.1: sync sums of a small
    /// key and of a key split over both servers, then a clean shutdown.
    #[test]
    fn two_workers_two_servers_over_loopback() {
        fn cfg(role: Role, port: u16) -> Config {
            let mut c = Config::local(role, port, 2, 2, Duration::from_secs(30));
            c.bigarray_bound = 10;
            c
        }
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0)).unwrap();
        let port = sched.port();
        let servers: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || -> Result<()> {
                    let po = Postoffice::start(cfg(Role::Server, port))?;
                    let mut s = server_for(&po);
                    let mut refuse = |h: i32, _: &[u8]| -> Result<()> {
                        Err(Error::usage(format!("no controller for {h}")))
                    };
                    serve(&po, &mut s, &mut refuse)?;
                    po.finalize(true)
                })
            })
            .collect();
        let workers: Vec<_> = (0..2)
            .map(|_| {
                std::thread::spawn(move || -> Result<Vec<f64>> {
                    let po = Postoffice::start(cfg(Role::Worker, port))?;
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
                    po.barrier(0, WORKER_GROUP)?;
                    if r == 0 {
                        w.command(Command::StopServer.head(), b"")?;
                    }
                    po.finalize(true)?;
                    let mut v = o3.to_f64_vec();
                    v.extend(o7.to_f64_vec());
                    v.extend(out.to_f64_vec());
                    Ok(v)
                })
            })
            .collect();
        let mut want = vec![3.0; 4];
        want.extend((0..15).map(|i| 3.0 * i as f64));
        want.extend([2.0; 4]);
        for w in workers {
            assert_eq!(w.join().unwrap().unwrap(), want);
        }
        for s in servers {
            s.join().unwrap().unwrap();
        }
        sched.join().unwrap();
    }
}
