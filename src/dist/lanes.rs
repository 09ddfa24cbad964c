//! A node's lanes ([`super::lane`]): a server's listener and one thread per
//! accepted lane (reading, handling and answering requests itself); a
//! worker's lane to every server that advertised one, read by the threads
//! waiting for answers and, while nobody waits, by one thread per lane.
#![forbid(unsafe_code)]

use super::lane::{self, Lane, Pumped, HELLO_LEN};
use super::message::{Bytes, Command, Message, Node, Role};
use super::postoffice::{peer_name, Postoffice};
use super::spin::watcher;
use super::van::TICK;
use crate::error::{Error, Result};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// The longest a handshake may take (a connection that sends nothing is
/// closed after it).
const HANDSHAKE: Duration = Duration::from_secs(10);

pub(crate) struct Lanes {
    enabled: bool,
    map: RwLock<HashMap<i32, Arc<Lane>>>,
    /// Peers whose lane broke, and why (their van connection coming back
    /// does not mend it).
    broken: Mutex<Vec<(i32, Error)>>,
    listener: Mutex<Option<TcpListener>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Worker: the threads that read lanes while nobody waits.
    readers: Mutex<Vec<Thread>>,
    /// Workers whose lane handshake is under way (a server's): one at a time.
    handshaking: Mutex<Vec<i32>>,
    /// Lanes being handshaken or served (a server's), at most [`Self::max_conns`].
    conns: AtomicUsize,
    max_conns: usize,
    stop: AtomicBool,
    /// Threads watching for answers (they read the lanes themselves).
    watchers: AtomicUsize,
    /// Threads sleeping until an answer comes (the reading threads read
    /// for them).
    sleepers: AtomicUsize,
}

impl Lanes {
    pub(crate) fn new(role: Role, lane: bool, resend: bool, num_worker: usize) -> Lanes {
        Lanes {
            enabled: role != Role::Scheduler && lane && !resend,
            map: RwLock::new(HashMap::new()),
            broken: Mutex::new(Vec::new()),
            listener: Mutex::new(None),
            threads: Mutex::new(Vec::new()),
            readers: Mutex::new(Vec::new()),
            handshaking: Mutex::new(Vec::new()),
            conns: AtomicUsize::new(0),
            max_conns: 2 * num_worker + 8,
            stop: AtomicBool::new(false),
            watchers: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
        }
    }

    /// A server's listener on `host`, port chosen by the system: its port,
    /// or `None` (lanes off, or no port: the van carries everything).
    pub(crate) fn listen(&self, role: Role, host: &str) -> Option<u16> {
        if !self.enabled || role != Role::Server {
            return None;
        }
        let l = TcpListener::bind((host, 0)).ok()?;
        l.set_nonblocking(true).ok()?;
        let port = l.local_addr().ok()?.port();
        *self.listener.lock() = Some(l);
        Some(port)
    }

    pub(crate) fn get(&self, peer: i32) -> Option<Arc<Lane>> {
        if !self.enabled {
            return None;
        }
        self.map.read().get(&peer).cloned()
    }

    pub(crate) fn is_broken(&self, peer: i32) -> bool {
        self.broken.lock().iter().any(|(p, _)| *p == peer)
    }

    /// Why the lane to `peer` broke, if it did.
    pub(crate) fn broken_because(&self, peer: i32) -> Option<Error> {
        self.broken
            .lock()
            .iter()
            .find(|(p, _)| *p == peer)
            .map(|(_, e)| e.clone())
    }

    pub(crate) fn count(&self) -> usize {
        self.map.read().len()
    }

    fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> Option<Thread> {
        let mut threads = self.threads.lock();
        // (checked under the lock `stop` takes the threads with: a thread
        // started after would never be joined)
        if self.stop.load(Ordering::Acquire) {
            return None;
        }
        let h = std::thread::Builder::new().name(name).spawn(f).ok()?;
        let t = h.thread().clone();
        // threads that ended (strangers' connections) are joined as we go
        let (done, live): (Vec<_>, Vec<_>) = std::mem::take(&mut *threads)
            .into_iter()
            .partition(|h| h.is_finished());
        *threads = live;
        threads.push(h);
        drop(threads);
        for h in done {
            let _ = h.join();
        }
        Some(t)
    }

    /// Closes every lane and ends the lane threads (bounded: their sockets
    /// are shut, and each looks at the stop flag at least every [`TICK`]).
    pub(crate) fn stop(&self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        for l in self.map.read().values() {
            l.close();
        }
        self.listener.lock().take();
        for t in self.readers.lock().iter() {
            t.unpark();
        }
        let me = std::thread::current().id();
        let threads = std::mem::take(&mut *self.threads.lock());
        for h in threads {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

impl Postoffice {
    /// A server's: the thread accepting lanes.
    pub(crate) fn start_lane_listener(self: &Arc<Self>) {
        if self.lanes.listener.lock().is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        self.lanes
            .spawn("mxkv-lane-accept".into(), move || accept_loop(weak));
    }

    /// A worker's: connects a lane to every server that advertised one
    /// (after the node knows its peers, before it sends them anything). A
    /// server that cannot be reached this way is reached through the van.
    pub(crate) fn connect_lanes(self: &Arc<Self>) {
        if !self.lanes.enabled || self.role() != Role::Worker {
            return;
        }
        let me = self.my_id();
        let servers: Vec<_> = self
            .nodes()
            .into_iter()
            .filter(|n| n.role == Role::Server && n.lane_port.is_some())
            .collect();
        let within = self.config.timeout.min(HANDSHAKE);
        // all at once: a server whose lane port cannot be reached costs one
        // wait, not one per server
        std::thread::scope(|scope| {
            for n in &servers {
                scope.spawn(move || self.connect_lane(me, n, within));
            }
        });
    }

    fn connect_lane(self: &Arc<Self>, me: i32, n: &Node, within: Duration) {
        let Some(port) = n.lane_port else { return };
        let addr = format!("{}:{port}", n.hostname);
        // the reading thread first: without it there is no lane
        let (tx, rx) = std::sync::mpsc::channel::<Arc<Lane>>();
        let weak = Arc::downgrade(self);
        let Some(reader) = self.lanes.spawn(format!("mxkv-lane-{}", n.id), move || {
            if let Ok(l) = rx.recv() {
                read_loop(weak, l)
            }
        }) else {
            eprintln!(
                "[mxkv worker] no lane to {} (no thread for it); its messages go through the van",
                peer_name(n.id)
            );
            return;
        };
        match lane::connect(&addr, me, n.id, within) {
            Ok(s) => {
                let l = Arc::new(Lane::new(n.id, s, false));
                self.lanes.map.write().insert(n.id, l.clone());
                self.lanes.readers.lock().push(reader);
                let _ = tx.send(l);
                if self.config.verbose >= 1 {
                    eprintln!("[mxkv worker] lane to {} at {addr}", peer_name(n.id));
                }
            }
            Err(e) => eprintln!(
                "[mxkv worker] no lane to {} ({e}); its messages go through the van",
                peer_name(n.id)
            ),
        }
    }

    /// Reads every lane without waiting (a worker's waiting thread, and a
    /// write waiting for room); true when a message was handed over.
    pub(crate) fn pump_lanes(&self) -> bool {
        if !self.lanes.enabled {
            return false;
        }
        // (under the read lock: a worker's lanes are all made before it
        // reads any, and reading takes no lane lock)
        let mut any = false;
        for l in self.lanes.map.read().values() {
            any |= self.pump_lane(l);
        }
        any
    }

    fn pump_lane(&self, l: &Lane) -> bool {
        let peer = l.peer();
        match l.pump(&mut |parts| self.lane_deliver(peer, parts)) {
            Pumped::Messages(n) => n > 0,
            Pumped::Broken(e) => {
                self.lane_broken(peer, &e);
                false
            }
        }
    }

    /// Watches `ready` as [`super::spin::Watcher::watch`] does, reading the
    /// lanes between two looks (so that an answer needs no other thread).
    pub(crate) fn watch_lanes(&self, ready: &mut dyn FnMut() -> bool) -> bool {
        if self.lanes.count() == 0 {
            return watcher().watch(ready);
        }
        self.lanes.watchers.fetch_add(1, Ordering::AcqRel);
        let got = watcher().watch(|| {
            self.pump_lanes();
            ready()
        });
        self.lanes.watchers.fetch_sub(1, Ordering::AcqRel);
        got
    }

    /// A worker's thread starts or ends sleeping until an answer comes: the
    /// lanes' reading threads read while any thread sleeps (and are woken
    /// for it), and leave the reading to the watching threads otherwise.
    pub(crate) fn lanes_sleeping(&self, asleep: bool) {
        if self.lanes.count() == 0 {
            return;
        }
        if asleep {
            self.lanes.sleepers.fetch_add(1, Ordering::AcqRel);
            for t in self.lanes.readers.lock().iter() {
                t.unpark();
            }
        } else {
            self.lanes.sleepers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Sends `msg` on the lane to its receiver, if there is one (`None`
    /// then: the van sends it).
    pub(crate) fn send_on_lane(
        &self,
        msg: &Message,
        replace: Option<(usize, &[u8])>,
    ) -> Option<Result<usize>> {
        if msg.cmd() != Command::Empty {
            return None;
        }
        let l = self.lanes.get(msg.recver)?;
        let deadline = Instant::now() + self.config.timeout;
        let worker = self.role() == Role::Worker;
        let r = l.send(msg, replace, deadline, &|| {
            if worker {
                self.pump_lanes();
            }
        });
        if let Err(e) = &r {
            if l.is_broken() {
                self.lane_broken(l.peer(), e);
            }
        }
        Some(r)
    }

    fn lane_deliver(&self, peer: i32, mut parts: Vec<Bytes>) {
        let meta = parts.remove(0);
        match Message::decode(&meta, parts) {
            Ok(mut msg) if msg.cmd() == Command::Empty => {
                msg.sender = peer;
                msg.recver = self.my_id();
                self.deliver(msg);
            }
            Ok(msg) => self.van.drop_message(&format!(
                "a {:?} control message on the lane from {} (lanes carry data only)",
                msg.cmd(),
                peer_name(peer)
            )),
            Err(e) => self.van.drop_message(&format!(
                "a message on the lane from {} whose meta does not decode: {e}",
                peer_name(peer)
            )),
        }
    }

    /// A lane broke: as a connection the van lost (the peer is suspected,
    /// and lost unless it is finishing); a broken lane is never mended.
    fn lane_broken(&self, peer: i32, e: &Error) {
        {
            let mut b = self.lanes.broken.lock();
            if !b.iter().any(|(p, _)| *p == peer) {
                b.push((peer, e.clone()));
            }
        }
        let mut st = self.state.lock();
        if st.finishing || st.lost.contains_key(&peer) {
            return;
        }
        if self.config.verbose >= 1 {
            eprintln!("[mxkv {}] lane to {}: {e}", self.role(), peer_name(peer));
        }
        st.suspects.entry(peer).or_insert_with(Instant::now);
    }
}

/// A worker's lane while nobody waits for an answer: reads what arrives
/// (answers to pushes nobody waited for, the end of the stream).
fn read_loop(weak: Weak<Postoffice>, l: Arc<Lane>) {
    let tick_ms = TICK.as_millis() as i64;
    loop {
        let Some(po) = weak.upgrade() else { return };
        if po.lanes.stop.load(Ordering::Acquire) || l.is_broken() {
            return;
        }
        if po.lanes.watchers.load(Ordering::Acquire) > 0
            && po.lanes.sleepers.load(Ordering::Acquire) == 0
        {
            // a watching thread reads; a thread that goes to sleep wakes
            // this one
            drop(po);
            std::thread::park_timeout(TICK);
            continue;
        }
        drop(po);
        l.wait_ready(tick_ms);
        let Some(po) = weak.upgrade() else { return };
        po.pump_lane(&l);
    }
}

fn accept_loop(weak: Weak<Postoffice>) {
    let tick_ms = TICK.as_millis() as i64;
    loop {
        let Some(po) = weak.upgrade() else { return };
        if po.lanes.stop.load(Ordering::Acquire) {
            return;
        }
        let accepted = {
            let g = po.lanes.listener.lock();
            let Some(l) = g.as_ref() else { return };
            match l.accept() {
                Ok((s, from)) => Some((s, from)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let fd = l.as_raw_fd();
                    drop(g);
                    drop(po);
                    let mut items = [zmq::PollItem::from_fd(fd, zmq::POLLIN)];
                    let _ = zmq::poll(&mut items, tick_ms);
                    None
                }
                Err(e) => {
                    // (out of file descriptors, say: the listener stays
                    // readable) a back-off, not a synchronisation
                    drop(g);
                    po.van
                        .log_drop(&format!("a lane connection: accept failed: {e}"));
                    drop(po);
                    std::thread::sleep(TICK);
                    None
                }
            }
        };
        let Some((s, from)) = accepted else { continue };
        let Some(po) = weak.upgrade() else { return };
        if po.lanes.conns.fetch_add(1, Ordering::AcqRel) >= po.lanes.max_conns {
            po.lanes.conns.fetch_sub(1, Ordering::AcqRel);
            po.van.drop_message(&format!(
                "a lane connection from {from} beyond the {} this server takes",
                po.lanes.max_conns
            ));
            continue;
        }
        let w = weak.clone();
        let spawned = po.lanes.spawn("mxkv-lane-serve".into(), move || {
            serve_lane(&w, s, from);
            if let Some(po) = w.upgrade() {
                po.lanes.conns.fetch_sub(1, Ordering::AcqRel);
            }
        });
        if spawned.is_none() {
            po.lanes.conns.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reads `buf.len()` bytes of a handshake before `deadline`, in short
/// slices (a connection that sends nothing does not hold up the node's
/// stop).
fn read_handshake(po: &Postoffice, s: &TcpStream, buf: &mut [u8], deadline: Instant) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match (&mut &*s).read(&mut buf[got..]) {
            Ok(0) => {
                return Err(Error::protocol(format!(
                    "lane handshake: the connection closed after {got} of {} bytes",
                    buf.len()
                )))
            }
            Ok(k) => got += k,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(Error::protocol(format!("lane handshake: {e}"))),
        }
        if po.lanes.stop.load(Ordering::Acquire) {
            return Err(Error::protocol("lane handshake: the node stopped"));
        }
        if got < buf.len() && Instant::now() >= deadline {
            return Err(Error::protocol(format!(
                "lane handshake: {got} of {} bytes in {HANDSHAKE:?}",
                buf.len()
            )));
        }
    }
    Ok(())
}

/// The handshake of an accepted connection (hello, answer, confirmation):
/// the worker it comes from. Nothing is registered before the worker
/// confirmed, so a worker that gave up leaves no lane behind.
fn handshake<'a>(po: &'a Postoffice, s: &TcpStream, from: IpAddr) -> Result<Handshaking<'a>> {
    let io = |e: std::io::Error| Error::protocol(format!("lane handshake: {e}"));
    s.set_nodelay(true).map_err(io)?;
    s.set_write_timeout(Some(HANDSHAKE)).map_err(io)?;
    s.set_read_timeout(Some(TICK)).map_err(io)?;
    let deadline = Instant::now() + HANDSHAKE;
    let mut h = [0u8; HELLO_LEN];
    read_handshake(po, s, &mut h, deadline)?;
    let (worker, server) = lane::parse_hello(&h)?;
    // (the worker learnt of this lane from the scheduler's answer, which
    // this node may not have taken in yet)
    {
        let mut st = po.state.lock();
        while !st.ready {
            if po.lanes.stop.load(Ordering::Acquire) || Instant::now() >= deadline {
                return Err(Error::protocol(
                    "lane handshake before this server knew its peers",
                ));
            }
            po.cond.wait_for(&mut st, TICK);
        }
    }
    let me = po.my_id();
    if server != me {
        return Err(Error::protocol(format!(
            "a lane for node {server} reached node {me}"
        )));
    }
    let Some(node) = po
        .nodes()
        .into_iter()
        .find(|n| n.role == Role::Worker && n.id == worker)
    else {
        return Err(Error::protocol(format!(
            "a lane from node {worker}, which is not a worker of this cluster"
        )));
    };
    if po.check_peer(worker).is_err() || po.lanes.is_broken(worker) {
        return Err(Error::protocol(format!(
            "a lane from {}, which is lost",
            peer_name(worker)
        )));
    }
    // from where the worker registered (a stranger naming a worker would
    // take its answers)
    let at: Vec<IpAddr> = (node.hostname.as_str(), 0)
        .to_socket_addrs()
        .map(|a| a.map(|a| a.ip()).collect())
        .unwrap_or_default();
    if !at.contains(&from) {
        return Err(Error::protocol(format!(
            "a lane naming {}, which registered at {}, not {from}",
            peer_name(worker),
            node.hostname
        )));
    }
    // one handshake per worker at a time, and none once it has its lane
    let reserved = {
        let mut h = po.lanes.handshaking.lock();
        if h.contains(&worker) || po.lanes.get(worker).is_some() {
            return Err(Error::protocol(format!(
                "a second lane from {}",
                peer_name(worker)
            )));
        }
        h.push(worker);
        Handshaking { po, worker }
    };
    (&mut &*s).write_all(&lane::welcome(me)).map_err(io)?;
    let mut c = [0u8; 4];
    read_handshake(po, s, &mut c, Instant::now() + HANDSHAKE)?;
    if &c != lane::CONFIRM {
        return Err(Error::protocol(format!(
            "lane handshake: {c:02x?} where the confirmation belongs"
        )));
    }
    Ok(reserved)
}

/// A worker's lane handshake under way; ends (the reservation given up)
/// when dropped, once the lane is registered or the handshake failed.
struct Handshaking<'a> {
    po: &'a Postoffice,
    worker: i32,
}

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        self.po
            .lanes
            .handshaking
            .lock()
            .retain(|w| *w != self.worker);
    }
}

fn serve_lane(weak: &Weak<Postoffice>, s: TcpStream, from: std::net::SocketAddr) {
    let Some(po) = weak.upgrade() else { return };
    let reserved = match handshake(&po, &s, from.ip()) {
        Ok(r) => r,
        Err(e) => {
            po.van
                .drop_message(&format!("a lane connection from {from}: {e}"));
            return;
        }
    };
    let worker = reserved.worker;
    if s.set_nonblocking(true).is_err() {
        return;
    }
    let l = Arc::new(Lane::new(worker, s, true));
    po.lanes.map.write().insert(worker, l.clone());
    drop(reserved);
    let tick_ms = TICK.as_millis() as i64;
    let stall = po.config.timeout;
    drop(po);
    loop {
        let Some(po) = weak.upgrade() else { return };
        if po.lanes.stop.load(Ordering::Acquire) || l.is_broken() {
            return;
        }
        if let Some(e) = l.flush(stall) {
            po.lane_broken(worker, &e);
            return;
        }
        if po.pump_lane(&l) {
            continue;
        }
        // the next request usually follows at once: watch for it a while
        // (unless bytes wait to be written: then for room or a request)
        if l.has_pending() || !watcher().watch(|| po.pump_lane(&l) || l.is_broken()) {
            drop(po);
            l.wait_ready(tick_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::config::Config;
    use crate::dist::keys::Command as Kv;
    use crate::dist::kv_node::{serve, server_for, worker_on};
    use crate::dist::scheduler;
    use crate::test_util::f32s;
    use std::sync::mpsc;

    fn cfg(role: Role, port: u16, lane: bool) -> Config {
        let mut c = Config::local(role, port, 1, 1, Duration::from_secs(30));
        c.lane = lane;
        c
    }

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < Duration::from_secs(30), "never: {what}");
            std::thread::yield_now();
        }
    }

    /// Runs a 1 + 1 cluster (lanes on the server's side as `server_lane`, on
    /// the worker's as `worker_lane`); `during` gets the server's node and
    /// the worker's once the cluster is up. The worker then pushes and
    /// pulls; the pulled values come back.
    fn cluster(
        server_lane: bool,
        worker_lane: bool,
        during: impl FnOnce(&Arc<Postoffice>, &Arc<Postoffice>),
    ) -> Vec<f64> {
        let sched = scheduler::spawn(cfg(Role::Scheduler, 0, true)).unwrap();
        let port = sched.port();
        let (tx, rx) = mpsc::channel();
        let server = std::thread::spawn(move || -> Result<()> {
            let po = Postoffice::start(cfg(Role::Server, port, server_lane))?;
            tx.send(po.clone()).unwrap();
            let mut s = server_for(&po);
            serve(&po, &mut s, &mut |_: i32, _: &[u8]| Ok(()))?;
            po.finalize(true)
        });
        let po = Postoffice::start(cfg(Role::Worker, port, worker_lane)).unwrap();
        let spo = rx.recv().unwrap();
        during(&spo, &po);
        drop(spo);
        let w = worker_on(&po, 0);
        w.command(Kv::SyncMode.head(), b"").unwrap();
        w.init(&[(3, &f32s(&[1.0; 4]))]).unwrap();
        let out = f32s(&[0.0; 4]);
        for i in 0..50 {
            w.push(&[(3, &f32s(&[i as f32; 4]))]).unwrap();
            w.pull(&[(3, &out)]).unwrap();
            assert_eq!(out.to_f64_vec(), vec![i as f64; 4]);
        }
        w.push_pull(&[(3, &f32s(&[7.5; 4]), &out)]).unwrap();
        w.command(Kv::StopServer.head(), b"").unwrap();
        let t0 = Instant::now();
        po.finalize(true).unwrap();
        server.join().unwrap().unwrap();
        sched.join().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        out.to_f64_vec()
    }

    #[test]
    fn a_worker_and_a_server_of_ours_talk_over_a_lane() {
        let got = cluster(true, true, |server, worker| {
            assert!(server.my_node.lock().lane_port.is_some());
            assert_eq!(worker.lanes.count(), 1);
            until("the server took the lane", || server.lanes.count() == 1);
        });
        assert_eq!(got, vec![7.5; 4]);
    }

    /// With `MXKV_LANE=0` on either side, everything goes through the van.
    #[test]
    fn without_lanes_the_van_carries_everything() {
        for (s, w) in [(false, true), (true, false), (false, false)] {
            let got = cluster(s, w, |server, worker| {
                assert_eq!(server.my_node.lock().lane_port.is_some(), s);
                assert_eq!((worker.lanes.count(), server.lanes.count()), (0, 0));
            });
            assert_eq!(got, vec![7.5; 4]);
        }
    }

    /// A worker that gives up before it confirmed the handshake (here: a
    /// client that reads the answer and leaves) leaves no lane on the
    /// server and is not suspected: the worker's messages and their answers
    /// go through the van. A second handshake naming the same worker while
    /// one is under way is refused.
    #[test]
    fn a_handshake_never_confirmed_leaves_no_lane() {
        let got = cluster(true, false, |server, worker| {
            let port = server.my_node.lock().lane_port.unwrap();
            let before = server.dropped_messages();
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(&lane::hello(worker.my_id(), server.my_id()))
                .unwrap();
            let mut w = [0u8; lane::WELCOME_LEN];
            s.read_exact(&mut w).unwrap();
            assert_eq!(w.to_vec(), lane::welcome(server.my_id()));
            // while that handshake is under way, another naming the same
            // worker is refused before any answer
            let mut second = TcpStream::connect(("127.0.0.1", port)).unwrap();
            second
                .write_all(&lane::hello(worker.my_id(), server.my_id()))
                .unwrap();
            second
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            assert_eq!(second.read(&mut w).unwrap(), 0);
            drop(s);
            until("the drop was counted", || {
                server.dropped_messages() > before
            });
            assert_eq!(server.lanes.count(), 0);
            assert!(!server.lanes.is_broken(worker.my_id()));
        });
        assert_eq!(got, vec![7.5; 4]);
    }

    /// Strangers on a server's lane port (bytes that are no handshake, a
    /// connection that sends nothing, a handshake naming a node that is no
    /// worker, another server, or a worker that has its lane already) are
    /// dropped with a log line each; the node lives, the worker's lane
    /// carries on, and the open connection does not hold up the shutdown.
    #[test]
    fn strangers_on_a_lane_port_are_dropped_and_the_node_lives() {
        let mut silent = None;
        let got = cluster(true, true, |server, _worker| {
            let port = server.my_node.lock().lane_port.unwrap();
            let at = ("127.0.0.1", port);
            silent = Some(TcpStream::connect(at).unwrap());
            let mut garbage = b"GET / HTTP/1.0\r\n\r\n".to_vec();
            garbage.resize(HELLO_LEN, b'x');
            let me = server.my_id();
            for bytes in [
                garbage,
                lane::hello(11, me),
                lane::hello(9, me + 2),
                lane::hello(9, me),
            ] {
                let before = server.dropped_messages();
                let mut s = TcpStream::connect(at).unwrap();
                s.write_all(&bytes).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let mut buf = [0u8; 64];
                // closed without an answer
                assert_eq!(s.read(&mut buf).unwrap(), 0);
                until("the drop was counted", || {
                    server.dropped_messages() > before
                });
            }
        });
        assert_eq!(got, vec![7.5; 4]);
        drop(silent);
    }
}
