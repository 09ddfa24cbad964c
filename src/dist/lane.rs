//! The lane: a direct TCP connection between a libmxkv worker and a
//! libmxkv server, beside the van, that carries the same ps-lite messages
//! (meta and data parts, [`Message`]) without libzmq's I/O threads.
//!
//! Why: on this kind of machine a thread that sleeps is woken ~10-20 us
//! after the data it waits for arrived, and a message through libzmq wakes
//! three threads (the sender's I/O thread, the receiver's I/O thread, the
//! receiver), so a request and its answer cost six wake-ups (44-52 us for a
//! bare libzmq round trip here). On a lane the caller writes the request
//! itself, the server's lane thread reads it, handles it and writes the
//! answer itself, and the waiting caller reads the answer itself; while
//! both watch (see [`super::spin`]) nobody sleeps.
//!
//! Only between our own nodes: a libmxkv server advertises its lane port in
//! its registration (an extra field of `PBNode`, which ps-lite skips and a
//! real MXNet scheduler drops, so that then there are no lanes), and a
//! libmxkv worker connects to every server that advertised one. Everything
//! a worker sends to a server with a lane, and everything that server sends
//! back, takes the lane; control messages (barriers, heartbeats, the
//! scheduler's) stay on the van. `MXKV_LANE=0` turns lanes off, and so does
//! `PS_RESEND` (resending and acknowledging are the van's).
//!
//! On the wire (after a handshake of `MAGIC`, [`VERSION`], the worker's id
//! and the server id it expects, answered with `MAGIC`, [`VERSION`] and the
//! server's id): per message a little-endian `u32` part count (the meta,
//! then the data parts), one `u64` length per part, then the parts' bytes.
//!
//! Faults: every blocking step has a deadline; a lane that breaks (end of
//! stream, a malformed frame, a write that cannot finish) is reported once
//! to the node, which treats it as the van treats a lost connection; bytes
//! that are not a handshake are dropped with the connection and a log line.
#![forbid(unsafe_code)]

use super::message::{Bytes, Message};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The first bytes of either side of a handshake.
pub const MAGIC: &[u8; 8] = b"MXKVLANE";
/// The lane protocol's version.
pub const VERSION: u32 = 1;
/// Most parts a message may have (MXNet's have at most 4).
pub const MAX_PARTS: usize = 64;
/// Largest meta (the first part) accepted.
pub const MAX_META: u64 = 1 << 30;
/// Bytes read at once when no large part is being filled.
const STAGE: usize = 64 * 1024;
/// A part at least this long is read straight into its own buffer.
const DIRECT: usize = 16 * 1024;
/// Most bytes reserved ahead for a part (it grows as it arrives).
const RESERVE_MAX: u64 = 128 << 20;
/// How long a server's lane writes on, without the socket taking any data,
/// before it queues the rest of a message.
const QUEUE_AFTER: Duration = Duration::from_millis(50);
/// Most bytes a server's lane queues for a worker that does not read
/// (beyond it a write waits for room, until its deadline).
pub const MAX_QUEUED: usize = 1 << 30;
/// How long a poll for writability lasts before the deadline is checked.
const POLL_SLICE_MS: i64 = 50;

/// Bytes of a client's handshake: magic, version, worker id, server id.
pub const HELLO_LEN: usize = 8 + 4 + 4 + 4;
/// Bytes of a server's answer: magic, version, server id.
pub const WELCOME_LEN: usize = 8 + 4 + 4;

/// A client's handshake.
pub fn hello(worker: i32, server: i32) -> Vec<u8> {
    let mut b = Vec::with_capacity(HELLO_LEN);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&worker.to_le_bytes());
    b.extend_from_slice(&server.to_le_bytes());
    b
}

/// Parses a client's handshake: (worker id, server id it expects).
pub fn parse_hello(b: &[u8; HELLO_LEN]) -> Result<(i32, i32)> {
    check_magic(&b[..12])?;
    let worker = i32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    let server = i32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
    Ok((worker, server))
}

/// A server's answer to a handshake.
pub fn welcome(server: i32) -> Vec<u8> {
    let mut b = Vec::with_capacity(WELCOME_LEN);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&server.to_le_bytes());
    b
}

fn check_magic(b: &[u8]) -> Result<()> {
    if &b[..8] != MAGIC {
        return Err(Error::protocol(format!(
            "not an mxkv lane handshake (first bytes {:02x?})",
            &b[..8]
        )));
    }
    let v = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    if v != VERSION {
        return Err(Error::protocol(format!(
            "mxkv lane version {v}, this library speaks {VERSION}"
        )));
    }
    Ok(())
}

/// The worker's last handshake step, after the server's answer: from here
/// on both sides use the lane (a worker that gave up before it never
/// leaves a lane behind on the server).
pub const CONFIRM: &[u8; 4] = b"LANE";

/// How long a worker waits for a lane's TCP connection.
pub const CONNECT: Duration = Duration::from_secs(3);

/// Connects a worker's lane to `server` at `addr`: handshake (hello,
/// answer, confirmation) within `within`, then the stream is non-blocking.
pub fn connect(addr: &str, me: i32, server: i32, within: Duration) -> Result<TcpStream> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        Error::peer_lost(format!("lane to {addr}: {what}: {e}"))
    };
    let sa = std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(|e| fail("bad address", &e))?
        .next()
        .ok_or_else(|| Error::peer_lost(format!("lane to {addr}: no address")))?;
    let s =
        TcpStream::connect_timeout(&sa, within.min(CONNECT)).map_err(|e| fail("connect", &e))?;
    s.set_nodelay(true).map_err(|e| fail("nodelay", &e))?;
    s.set_write_timeout(Some(within))
        .and_then(|_| s.set_read_timeout(Some(within)))
        .map_err(|e| fail("timeouts", &e))?;
    (&s).write_all(&hello(me, server))
        .map_err(|e| fail("handshake", &e))?;
    let mut w = [0u8; WELCOME_LEN];
    (&s).read_exact(&mut w)
        .map_err(|e| fail("handshake answer", &e))?;
    check_magic(&w)?;
    let id = i32::from_le_bytes(w[12..16].try_into().expect("4 bytes"));
    if id != server {
        return Err(Error::protocol(format!(
            "lane to {addr}: answered by node {id}, expected {server}"
        )));
    }
    (&s).write_all(CONFIRM)
        .map_err(|e| fail("handshake confirmation", &e))?;
    s.set_nonblocking(true)
        .map_err(|e| fail("non-blocking", &e))?;
    Ok(s)
}

enum Stage {
    /// Waiting for a message's part count and lengths.
    Header,
    /// Filling part `parts.len()` of `lens`.
    Parts {
        lens: Vec<u64>,
        parts: Vec<Bytes>,
        cur: Vec<u8>,
    },
}

struct Reader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    stage: Stage,
}

impl Reader {
    fn avail(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Parses what is staged; a complete message comes back.
    fn step(&mut self) -> Result<Option<Vec<Bytes>>> {
        loop {
            match &mut self.stage {
                Stage::Header => {
                    let a = self.avail();
                    if a.len() < 4 {
                        return Ok(None);
                    }
                    let n = u32::from_le_bytes(a[..4].try_into().expect("4 bytes")) as usize;
                    if n == 0 || n > MAX_PARTS {
                        return Err(Error::protocol(format!(
                            "a lane message of {n} parts (1 to {MAX_PARTS})"
                        )));
                    }
                    if a.len() < 4 + 8 * n {
                        return Ok(None);
                    }
                    let lens: Vec<u64> = a[4..4 + 8 * n]
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect();
                    if lens[0] > MAX_META || lens.iter().any(|l| *l > isize::MAX as u64) {
                        return Err(Error::protocol(format!(
                            "a lane message with part lengths {lens:?}"
                        )));
                    }
                    self.start += 4 + 8 * n;
                    let cur = Vec::with_capacity(lens[0].min(RESERVE_MAX) as usize);
                    self.stage = Stage::Parts {
                        lens,
                        parts: Vec::with_capacity(n),
                        cur,
                    };
                }
                Stage::Parts { lens, parts, cur } => {
                    let want = lens[parts.len()] as usize - cur.len();
                    let take = want.min(self.end - self.start);
                    cur.extend_from_slice(&self.buf[self.start..self.start + take]);
                    self.start += take;
                    if cur.len() < lens[parts.len()] as usize {
                        return Ok(None);
                    }
                    parts.push(Bytes::from(std::mem::take(cur)));
                    if parts.len() == lens.len() {
                        let done = std::mem::take(parts);
                        self.stage = Stage::Header;
                        return Ok(Some(done));
                    }
                    *cur = Vec::with_capacity(lens[parts.len()].min(RESERVE_MAX) as usize);
                }
            }
        }
    }

    /// Bytes still missing from the part being filled, when that part is
    /// read straight into its buffer.
    fn direct_want(&self) -> Option<u64> {
        match &self.stage {
            Stage::Parts { lens, parts, cur } if self.start == self.end => {
                let want = lens[parts.len()] - cur.len() as u64;
                (want as usize >= DIRECT).then_some(want)
            }
            _ => None,
        }
    }
}

/// What reading a lane found.
pub enum Pumped {
    /// This many messages were handed over (0: nothing to read now, or
    /// another thread is reading).
    Messages(usize),
    /// The lane is broken (the error says why); reported once.
    Broken(Error),
}

/// Bytes written but not yet taken by the socket (a server's lanes: see
/// [`Lane::send`]).
#[derive(Default)]
struct Out {
    pending: VecDeque<Bytes>,
    /// Bytes of `pending`'s front already written.
    front_written: usize,
    bytes: usize,
    /// Since when nothing of `pending` could be written.
    stalled_since: Option<Instant>,
}

/// One end of a lane.
pub struct Lane {
    peer: i32,
    stream: TcpStream,
    /// Queue what the socket does not take at once (a server's lanes), or
    /// wait for room (a worker's).
    queue: bool,
    writer: Mutex<Out>,
    has_pending: AtomicBool,
    /// A server's lane: (sending end, receiving end) of a socket pair that
    /// wakes the lane's thread when another thread queued bytes (it may be
    /// waiting to read only).
    wake: Option<(UnixStream, UnixStream)>,
    reader: Mutex<Reader>,
    broken: AtomicBool,
}

/// A piece of a message to write: bytes the message owns (kept if queued)
/// or borrowed (copied if queued).
enum Piece<'a> {
    Owned(Bytes),
    Borrowed(&'a [u8]),
}

impl Piece<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Piece::Owned(b) => b,
            Piece::Borrowed(b) => b,
        }
    }

    fn into_owned(self, from: usize) -> Bytes {
        match self {
            Piece::Owned(b) => b.slice(from..),
            Piece::Borrowed(b) => Bytes::copy_from_slice(&b[from..]),
        }
    }
}

impl Lane {
    /// A lane over `stream` (non-blocking, handshake done) to node `peer`;
    /// `queue`: a server's end (see [`Lane::send`]).
    pub fn new(peer: i32, stream: TcpStream, queue: bool) -> Lane {
        Lane {
            peer,
            stream,
            queue,
            writer: Mutex::new(Out::default()),
            has_pending: AtomicBool::new(false),
            wake: queue
                .then(|| {
                    let (tx, rx) = UnixStream::pair().ok()?;
                    tx.set_nonblocking(true).ok()?;
                    rx.set_nonblocking(true).ok()?;
                    Some((tx, rx))
                })
                .flatten(),
            reader: Mutex::new(Reader {
                buf: vec![0; STAGE],
                start: 0,
                end: 0,
                stage: Stage::Header,
            }),
            broken: AtomicBool::new(false),
        }
    }

    pub fn peer(&self) -> i32 {
        self.peer
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Marks the lane broken and closes it; true the first time.
    pub fn close(&self) -> bool {
        let first = !self.broken.swap(true, Ordering::AcqRel);
        let _ = self.stream.shutdown(Shutdown::Both);
        first
    }

    fn broke(&self, e: Error) -> Pumped {
        if self.close() {
            Pumped::Broken(e)
        } else {
            Pumped::Messages(0)
        }
    }

    /// Reads what has arrived, without waiting, and hands every complete
    /// message to `deliver` (in order, under the read lock). Another thread
    /// reading already: returns at once.
    pub fn pump(&self, deliver: &mut dyn FnMut(Vec<Bytes>)) -> Pumped {
        if self.is_broken() {
            return Pumped::Messages(0);
        }
        let Some(mut r) = self.reader.try_lock() else {
            return Pumped::Messages(0);
        };
        let mut n = 0;
        loop {
            match r.step() {
                Ok(Some(parts)) => {
                    deliver(parts);
                    n += 1;
                    continue;
                }
                Ok(None) => {}
                Err(e) => return self.broke(e),
            }
            let got = if let Some(want) = r.direct_want() {
                let Stage::Parts { cur, .. } = &mut r.stage else {
                    unreachable!("direct_want checked the stage")
                };
                let before = cur.len();
                match (&self.stream).take(want).read_to_end(cur) {
                    Ok(_) if cur.len() == before => Ok(0),
                    Ok(_) => Ok(cur.len() - before),
                    Err(e) if cur.len() > before => {
                        // bytes came before the error: keep them, and see
                        // the error (again) on the next read
                        let _ = e;
                        Ok(cur.len() - before)
                    }
                    Err(e) => Err(e),
                }
            } else {
                let r = &mut *r;
                if r.start == r.end {
                    r.start = 0;
                    r.end = 0;
                } else if r.start > 0 && r.buf.len() - r.end < 4 + 8 * MAX_PARTS {
                    r.buf.copy_within(r.start..r.end, 0);
                    r.end -= r.start;
                    r.start = 0;
                }
                let end = r.end;
                match (&self.stream).read(&mut r.buf[end..]) {
                    Ok(k) => {
                        r.end += k;
                        Ok(k)
                    }
                    Err(e) => Err(e),
                }
            };
            match got {
                Ok(0) => {
                    return self.broke(Error::peer_lost(format!(
                        "its lane (direct connection) closed{}",
                        if matches!(r.stage, Stage::Header) && r.start == r.end {
                            ""
                        } else {
                            " in the middle of a message"
                        }
                    )))
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Pumped::Messages(n),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return self.broke(Error::peer_lost(format!("its lane: {e}"))),
            }
        }
    }

    /// Writes `msg` (with data part `part` replaced by `src`, if given).
    /// Small parts go out with the meta in one write; large ones are written
    /// from where they are. (Plain writes, never `writev`: std's TCP write
    /// passes `MSG_NOSIGNAL`, so a peer that is gone gives an error, not a
    /// SIGPIPE that would end the host process.)
    ///
    /// What the socket does not take at once: a worker's lane waits for
    /// room until `deadline`, calling `drain` meanwhile (a worker reads its
    /// answers then, so that a server writing to it is never stuck behind
    /// this write); a server's lane queues it, behind anything queued
    /// before, for [`Lane::flush`] (as libzmq queues, so that a worker that
    /// stopped reading holds up nobody else; [`MAX_QUEUED`] bytes at most,
    /// beyond which it waits for room too). An I/O error breaks the lane.
    pub fn send(
        &self,
        msg: &Message,
        replace: Option<(usize, &[u8])>,
        deadline: Instant,
        drain: &dyn Fn(),
    ) -> Result<usize> {
        if let Some((p, _)) = replace {
            if p >= msg.data.len() {
                return Err(Error::new(format!(
                    "internal: no data part {p} in a message of {} parts",
                    msg.data.len()
                )));
            }
        }
        if self.is_broken() {
            return Err(Error::peer_lost("its lane (direct connection) is closed"));
        }
        let meta = msg.encode_meta();
        let part = |i: usize| -> &[u8] {
            match replace {
                Some((p, src)) if p == i => src,
                _ => &msg.data[i],
            }
        };
        let n = 1 + msg.data.len();
        let mut head = Vec::with_capacity(4 + 8 * n + meta.len());
        head.extend_from_slice(&(n as u32).to_le_bytes());
        head.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        for i in 0..msg.data.len() {
            head.extend_from_slice(&(part(i).len() as u64).to_le_bytes());
        }
        head.extend_from_slice(&meta);
        // small parts ride with the head; from the first large one on,
        // each part is its own piece
        let mut pieces: Vec<Piece<'_>> = Vec::with_capacity(n);
        let mut i = 0;
        while i < msg.data.len() && part(i).len() < DIRECT {
            head.extend_from_slice(part(i));
            i += 1;
        }
        let total = head.len() + (i..msg.data.len()).map(|j| part(j).len()).sum::<usize>();
        pieces.push(Piece::Owned(Bytes::from(head)));
        for j in i..msg.data.len() {
            pieces.push(match replace {
                Some((p, src)) if p == j => Piece::Borrowed(src),
                _ => Piece::Owned(msg.data[j].clone()),
            });
        }
        let mut out = self.writer.lock();
        let r = self.write_pieces(&mut out, pieces, deadline, drain);
        if let Err(e) = &r {
            // nothing queued will go out any more
            *out = Out::default();
            self.has_pending.store(false, Ordering::Release);
            self.close();
            return Err(e.clone());
        }
        Ok(total)
    }

    fn write_pieces(
        &self,
        out: &mut Out,
        pieces: Vec<Piece<'_>>,
        deadline: Instant,
        drain: &dyn Fn(),
    ) -> Result<()> {
        if self.queue {
            self.flush_locked(out)?;
            if !out.pending.is_empty() {
                for p in pieces.into_iter().filter(|p| !p.bytes().is_empty()) {
                    out.bytes += p.bytes().len();
                    out.pending.push_back(p.into_owned(0));
                }
                return self.wait_queue_below(out, MAX_QUEUED, deadline);
            }
        }
        let mut pieces = pieces.into_iter();
        // when the socket last took data
        let mut progress = Instant::now();
        while let Some(p) = pieces.next() {
            let mut off = 0;
            while off < p.bytes().len() {
                match (&self.stream).write(&p.bytes()[off..]) {
                    Ok(0) => return Err(Error::peer_lost("its lane (direct connection) closed")),
                    Ok(k) => {
                        off += k;
                        progress = Instant::now();
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        // a server writes on while the worker reads, and
                        // queues the rest once it took nothing for a while
                        if self.queue && progress.elapsed() < QUEUE_AFTER {
                            self.poll_writable(progress + QUEUE_AFTER);
                            continue;
                        }
                        if self.queue {
                            out.bytes += p.bytes().len() - off;
                            out.pending.push_back(p.into_owned(off));
                            for q in pieces.filter(|q| !q.bytes().is_empty()) {
                                out.bytes += q.bytes().len();
                                out.pending.push_back(q.into_owned(0));
                            }
                            out.stalled_since = Some(Instant::now());
                            self.has_pending.store(true, Ordering::Release);
                            if let Some((tx, _)) = &self.wake {
                                // full: a wake-up is pending already
                                let _ = (&*tx).write(&[1]);
                            }
                            return self.wait_queue_below(out, MAX_QUEUED, deadline);
                        }
                        drain();
                        self.wait_writable(deadline)?;
                    }
                    Err(e) => return Err(Error::peer_lost(format!("its lane: {e}"))),
                }
            }
        }
        Ok(())
    }

    /// Waits (for room, writing) until at most `max` bytes are queued.
    fn wait_queue_below(&self, out: &mut Out, max: usize, deadline: Instant) -> Result<()> {
        while out.bytes > max {
            self.wait_writable(deadline)?;
            self.flush_locked(out)?;
        }
        Ok(())
    }

    /// Waits until the socket takes data, at most one poll slice, or fails
    /// once `deadline` passed.
    fn wait_writable(&self, deadline: Instant) -> Result<()> {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::timeout(format!(
                "{} took no data from its lane (direct connection) before the deadline",
                super::postoffice::peer_name(self.peer)
            )));
        }
        self.poll_writable(deadline);
        Ok(())
    }

    /// Waits until the socket takes data, at most until `until` and at
    /// most one poll slice.
    fn poll_writable(&self, until: Instant) {
        let left = until.saturating_duration_since(Instant::now());
        let ms = left.as_millis().min(POLL_SLICE_MS as u128) as i64;
        let mut items = [zmq::PollItem::from_fd(
            self.stream.as_raw_fd(),
            zmq::POLLOUT,
        )];
        let _ = zmq::poll(&mut items, ms.max(1));
    }

    /// Writes what is queued, as far as the socket takes it now.
    fn flush_locked(&self, out: &mut Out) -> Result<()> {
        while let Some(front) = out.pending.front() {
            if out.front_written == front.len() {
                out.pending.pop_front();
                out.front_written = 0;
                continue;
            }
            match (&self.stream).write(&front[out.front_written..]) {
                Ok(0) => return Err(Error::peer_lost("its lane (direct connection) closed")),
                Ok(k) => {
                    out.front_written += k;
                    out.bytes -= k;
                    out.stalled_since = Some(Instant::now());
                    if out.front_written == front.len() {
                        out.pending.pop_front();
                        out.front_written = 0;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(Error::peer_lost(format!("its lane: {e}"))),
            }
        }
        out.stalled_since = None;
        self.has_pending.store(false, Ordering::Release);
        Ok(())
    }

    /// Whether bytes are queued (a server's lane).
    pub fn has_pending(&self) -> bool {
        self.has_pending.load(Ordering::Acquire)
    }

    /// Writes what is queued as far as the socket takes it (the server's
    /// lane thread, when the socket has room). The lane breaks when the
    /// socket took nothing for `stall` (the peer stopped reading) or on an
    /// I/O error; the error is returned once.
    pub fn flush(&self, stall: Duration) -> Option<Error> {
        if !self.has_pending() || self.is_broken() {
            return None;
        }
        let mut out = self.writer.try_lock()?;
        let r = self
            .flush_locked(&mut out)
            .and_then(|_| match out.stalled_since {
                Some(t) if t.elapsed() >= stall => Err(Error::timeout(format!(
                    "{} took no data from its lane (direct connection) for {stall:?}",
                    super::postoffice::peer_name(self.peer)
                ))),
                _ => Ok(()),
            });
        if r.is_err() {
            // nothing queued will go out any more
            *out = Out::default();
            self.has_pending.store(false, Ordering::Release);
        }
        drop(out);
        match r {
            Ok(()) => None,
            Err(e) => self.close().then_some(e),
        }
    }

    /// Waits until the lane has something to read, or (with bytes queued)
    /// room to write, at most `ms` milliseconds.
    pub fn wait_ready(&self, ms: i64) {
        let events = if self.has_pending() {
            zmq::POLLIN | zmq::POLLOUT
        } else {
            zmq::POLLIN
        };
        let mut items = vec![zmq::PollItem::from_fd(self.stream.as_raw_fd(), events)];
        if let Some((_, rx)) = &self.wake {
            items.push(zmq::PollItem::from_fd(rx.as_raw_fd(), zmq::POLLIN));
        }
        let _ = zmq::poll(&mut items, ms);
        if let Some((_, rx)) = &self.wake {
            let mut sink = [0u8; 64];
            while matches!((&*rx).read(&mut sink), Ok(k) if k > 0) {}
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (Lane, Lane) {
        pair_queued(false)
    }

    /// (a worker's end, the other end; `queue`: the other is a server's)
    fn pair_queued(queue: bool) -> (Lane, Lane) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        for s in [&a, &b] {
            s.set_nonblocking(true).unwrap();
        }
        (Lane::new(8, a, false), Lane::new(9, b, queue))
    }

    fn msg(parts: Vec<Vec<u8>>) -> Message {
        Message {
            recver: 8,
            data: parts.into_iter().map(Bytes::from).collect(),
            ..Message::default()
        }
    }

    fn recv_all(l: &Lane, n: usize) -> Vec<Vec<Bytes>> {
        recv_flushing(l, None, n)
    }

    #[test]
    fn messages_cross_a_lane_in_order_with_every_part() {
        let (a, b) = pair();
        let far = Instant::now() + Duration::from_secs(30);
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let sent = [
            msg(vec![]),
            msg(vec![vec![1, 2, 3], vec![], vec![9; 5]]),
            msg(vec![big.clone(), vec![7]]),
        ];
        let t = std::thread::scope(|s| {
            let h = s.spawn(|| recv_all(&b, 3));
            for m in &sent {
                a.send(m, None, far, &|| {}).unwrap();
            }
            h.join().unwrap()
        });
        for (m, parts) in sent.iter().zip(&t) {
            assert_eq!(parts[0].as_ref(), m.encode_meta().as_slice());
            assert_eq!(&parts[1..], m.data.as_slice());
        }
    }

    #[test]
    fn a_replaced_part_goes_out_in_place_of_the_message_part() {
        let (a, b) = pair();
        let m = msg(vec![vec![1], vec![0; 4]]);
        a.send(
            &m,
            Some((1, &[5, 6, 7])),
            Instant::now() + Duration::from_secs(30),
            &|| {},
        )
        .unwrap();
        let got = recv_all(&b, 1);
        assert_eq!(got[0][2].as_ref(), &[5, 6, 7]);
        assert!(a.send(&m, Some((2, &[1])), Instant::now(), &|| {}).is_err());
    }

    /// Reads `l` (which must deliver no message) until it breaks: why.
    fn broken(l: &Lane) -> Error {
        let t0 = Instant::now();
        loop {
            l.wait_ready(50);
            match l.pump(&mut |_| panic!("no message")) {
                Pumped::Broken(e) => return e,
                Pumped::Messages(_) => assert!(t0.elapsed() < Duration::from_secs(30)),
            }
        }
    }

    /// `n` messages read from `a`, while `b` (a server's end), if given,
    /// flushes its queue.
    fn recv_flushing(a: &Lane, b: Option<&Lane>, n: usize) -> Vec<Vec<Bytes>> {
        let t0 = Instant::now();
        let mut got = Vec::new();
        while got.len() < n {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "got {} of {n}",
                got.len()
            );
            if let Some(b) = b {
                assert!(b.flush(Duration::from_secs(30)).is_none(), "broken");
            }
            a.wait_ready(10);
            if let Pumped::Broken(e) = a.pump(&mut |m| got.push(m)) {
                panic!("broken: {e}");
            }
        }
        got
    }

    #[test]
    fn a_closed_peer_breaks_the_lane_once() {
        let (a, b) = pair();
        drop(a);
        let e = broken(&b);
        assert!(e.message().contains("closed"), "{e}");
        assert!(matches!(b.pump(&mut |_| {}), Pumped::Messages(0)));
        assert!(b.send(&msg(vec![]), None, Instant::now(), &|| {}).is_err());
    }

    #[test]
    fn malformed_frames_break_the_lane() {
        for bad in [
            vec![0u8, 0, 0, 0],
            (MAX_PARTS as u32 + 1).to_le_bytes().to_vec(),
            [
                1u32.to_le_bytes().to_vec(),
                (MAX_META + 1).to_le_bytes().to_vec(),
            ]
            .concat(),
        ] {
            let (a, b) = pair();
            (&a.stream).write_all(&bad).unwrap();
            let e = broken(&b);
            assert!(e.message().contains("lane message"), "{e}");
        }
    }

    #[test]
    fn a_write_to_a_peer_that_does_not_read_ends_at_its_deadline() {
        let (a, _b) = pair();
        let big = vec![0u8; 64 << 20];
        let t0 = Instant::now();
        let e = a
            .send(
                &msg(vec![big]),
                None,
                Instant::now() + Duration::from_millis(300),
                &|| {},
            )
            .unwrap_err();
        assert!(e.message().contains("took no data"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(20));
        assert!(a.is_broken());
    }

    /// A server's lane queues what the worker does not read yet (as libzmq
    /// queues), in order, and it arrives whole once the worker reads.
    #[test]
    fn a_server_lane_queues_what_is_not_read_yet() {
        let (a, b) = pair_queued(true);
        let far = Instant::now() + Duration::from_secs(30);
        let big: Vec<u8> = (0..64u32 << 20).map(|i| (i % 253) as u8).collect();
        let t0 = Instant::now();
        b.send(&msg(vec![big.clone()]), None, far, &|| {}).unwrap();
        b.send(&msg(vec![vec![1, 2]]), Some((0, &[3, 4, 5])), far, &|| {})
            .unwrap();
        assert!(b.has_pending(), "64 MB fit in the socket");
        assert!(t0.elapsed() < Duration::from_secs(10));
        let got = recv_flushing(&a, Some(&b), 2);
        assert_eq!(got[0][1].as_ref(), big.as_slice());
        assert_eq!(got[1][1].as_ref(), &[3, 4, 5]);
        assert!(!b.has_pending());
    }

    /// Empty parts queued behind a large one go out as empty parts (a
    /// zero-length write means nothing, not a closed peer).
    #[test]
    fn a_server_lane_queues_empty_parts() {
        let (a, b) = pair_queued(true);
        let far = Instant::now() + Duration::from_secs(30);
        let big = vec![7u8; 32 << 20];
        let m = msg(vec![big.clone(), vec![], vec![1]]);
        b.send(&m, None, far, &|| {}).unwrap();
        b.send(&m, None, far, &|| {}).unwrap();
        assert!(b.has_pending());
        let got = recv_flushing(&a, Some(&b), 2);
        for g in &got {
            assert_eq!(&g[1..], m.data.as_slice());
        }
        assert!(!b.is_broken());
    }

    /// A queue the worker takes nothing of for the stall time breaks the lane.
    #[test]
    fn a_server_lane_breaks_when_its_queue_stalls() {
        let (_a, b) = pair_queued(true);
        let big = vec![0u8; 64 << 20];
        b.send(
            &msg(vec![big]),
            None,
            Instant::now() + Duration::from_secs(30),
            &|| {},
        )
        .unwrap();
        assert!(b.has_pending());
        assert!(b.flush(Duration::from_secs(30)).is_none());
        let e = b.flush(Duration::ZERO).expect("stalled");
        assert!(e.message().contains("took no data"), "{e}");
        assert!(b.is_broken());
        assert!(b.flush(Duration::ZERO).is_none(), "reported once");
    }

    #[test]
    fn handshakes() {
        let h = hello(9, 8);
        assert_eq!(parse_hello(&h.clone().try_into().unwrap()).unwrap(), (9, 8));
        let mut bad: [u8; HELLO_LEN] = h.try_into().unwrap();
        bad[0] = b'G';
        assert!(parse_hello(&bad).is_err());
        let mut v2: [u8; HELLO_LEN] = hello(9, 8).try_into().unwrap();
        v2[8] = 2;
        assert!(parse_hello(&v2)
            .unwrap_err()
            .message()
            .contains("version 2"));
        assert_eq!(welcome(8).len(), WELCOME_LEN);
    }
}
