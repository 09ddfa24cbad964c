//! The libzmq calls the van needs that the `zmq` crate does not offer:
//!
//! - Zero-copy frames of shared bytes (the crate sends only frames it owns
//!   or copies). A value that a node keeps and also sends (a server's stored
//!   value in a pull reply) goes out without a copy: libzmq holds a clone of
//!   the `Bytes` until it has written the frame, then drops it.
//! - A context with ps-lite's socket limit: ps-lite's `zmq_van.h` calls
//!   `zmq_ctx_set(context_, ZMQ_MAX_SOCKETS, 65536)`; libzmq's default is
//!   1023 sockets per context, and the crate sets no context option but
//!   `ZMQ_IO_THREADS`. [`RawContext`] is such a context, and its sockets
//!   ([`ContextSocket`]) keep it alive.
//!
//! It lives here because `src/capi` is the crate's one `unsafe` boundary;
//! the van (`src/dist/van.rs`) calls [`ContextSocket::send_shared`] and [`RawContext`]'s
//! methods, which are safe.

use bytes::Bytes;
use std::ops::Deref;
use std::os::raw::{c_int, c_void};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// libzmq's free function of a frame made by [`ContextSocket::send_shared`]: drops the
/// `Bytes` clone (on whichever thread libzmq releases the frame; `Bytes` is
/// `Send`).
unsafe extern "C" fn release_bytes(_data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the `Box<Bytes>` leaked by `send_shared`, and
    // libzmq calls this once per frame, so the box is reclaimed once.
    let owner = unsafe { Box::from_raw(hint.cast::<Bytes>()) };
    // A panic must not unwind into libzmq's C++ frames.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(owner)));
}

fn last_error() -> zmq::Error {
    // SAFETY: `zmq_errno` only reads the calling thread's errno.
    zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })
}

/// ps-lite's socket limit per context (`zmq_van.h`: `ZMQ_MAX_SOCKETS`).
pub const MAX_SOCKETS: i32 = 65536;

/// A libzmq context made with a raised socket limit (`ZMQ_MAX_SOCKETS`).
/// Its sockets are [`ContextSocket`]s, each holding an `Arc` of it, so it
/// is terminated (`zmq_ctx_term`) only once every socket made from it is
/// closed and the last `Arc` is dropped.
pub struct RawContext {
    /// The `void *` of `zmq_ctx_new`; never null, terminated only by `drop`.
    ctx: *mut c_void,
    /// The limit libzmq took (read back from the context).
    max_sockets: i32,
}

// SAFETY: a libzmq context is thread safe ("a ZeroMQ context is thread
// safe and may be shared among as many application threads as necessary",
// zmq_ctx_new(3)); `RawContext` only calls zmq_ctx_get (thread safe, under
// the context's option lock), zmq_socket (under the context's slot lock)
// and, once, zmq_ctx_term from `drop`. The `zmq` crate's own context is
// `Send + Sync` for the same reason.
unsafe impl Send for RawContext {}
// SAFETY: as for `Send` above: every call made through `&RawContext` is
// one that libzmq allows from any thread at the same time.
unsafe impl Sync for RawContext {}

impl RawContext {
    /// A new context that allows `max_sockets` sockets. If libzmq refuses
    /// that many (its poller caps it: `ZMQ_SOCKET_LIMIT`), the context gets
    /// the most libzmq allows instead; [`RawContext::max_sockets`] tells
    /// which. An error if the context cannot be made or no limit is taken.
    pub fn with_max_sockets(max_sockets: i32) -> Result<Arc<RawContext>, zmq::Error> {
        // SAFETY: `zmq_ctx_new` takes no arguments; a null result is an
        // error (errno), checked below.
        let ctx = unsafe { zmq_sys::zmq_ctx_new() };
        if ctx.is_null() {
            return Err(last_error());
        }
        // From here on `drop` terminates `ctx`, also on the error paths.
        let mut me = RawContext {
            ctx,
            max_sockets: 0,
        };
        if me.set(zmq_sys::ZMQ_MAX_SOCKETS, max_sockets).is_err() {
            // libzmq takes a limit only up to what its poller allows
            let cap = me.get(zmq_sys::ZMQ_SOCKET_LIMIT)?;
            me.set(zmq_sys::ZMQ_MAX_SOCKETS, max_sockets.min(cap))?;
        }
        me.max_sockets = me.get(zmq_sys::ZMQ_MAX_SOCKETS)?;
        Ok(Arc::new(me))
    }

    /// How many sockets the context allows (libzmq counts the user's
    /// sockets, including the PAIR each `zmq_socket_monitor` opens).
    pub fn max_sockets(&self) -> i32 {
        self.max_sockets
    }

    /// A new socket of type `kind` in this context; `EMFILE` when the
    /// context has [`RawContext::max_sockets`] sockets open already or the
    /// process is out of file descriptors.
    pub fn socket(self: &Arc<Self>, kind: zmq::SocketType) -> Result<ContextSocket, zmq::Error> {
        // SAFETY: `self.ctx` is a live context (terminated only by `drop`,
        // which cannot run while `self` is borrowed); a null result is an
        // error (errno), checked below.
        let raw = unsafe { zmq_sys::zmq_socket(self.ctx, socket_type(kind)) };
        if raw.is_null() {
            return Err(last_error());
        }
        Ok(ContextSocket {
            // SAFETY: `raw` is a socket just made by libzmq that nothing
            // else refers to, so `zmq::Socket` owns it and closes it once
            // (on drop). Such a socket does not keep its context alive: the
            // `Arc` beside it does, and is dropped after it.
            sock: unsafe { zmq::Socket::from_raw(raw) },
            inproc: AtomicBool::new(false),
            _ctx: Arc::clone(self),
        })
    }

    fn set(&mut self, option: u32, value: i32) -> Result<(), zmq::Error> {
        // SAFETY: `self.ctx` is live; zmq_ctx_set takes an int option and
        // value by value.
        let rc = unsafe { zmq_sys::zmq_ctx_set(self.ctx, option as c_int, value) };
        if rc == -1 {
            return Err(last_error());
        }
        Ok(())
    }

    fn get(&self, option: u32) -> Result<i32, zmq::Error> {
        // SAFETY: `self.ctx` is live; zmq_ctx_get takes an int option by
        // value and returns the value (or -1 and errno).
        let value = unsafe { zmq_sys::zmq_ctx_get(self.ctx, option as c_int) };
        if value == -1 {
            return Err(last_error());
        }
        Ok(value)
    }
}

impl Drop for RawContext {
    fn drop(&mut self) {
        // zmq_ctx_term waits for every socket of the context to be closed
        // (and their linger); all of them were, as each held an `Arc` of
        // `self`. It may be interrupted by a signal (EINTR): call it again,
        // as the `zmq` crate does.
        loop {
            // SAFETY: `self.ctx` is live and is terminated only here; an
            // EINTR return leaves it live, so the retry is sound.
            let rc = unsafe { zmq_sys::zmq_ctx_term(self.ctx) };
            if rc == 0 || last_error() != zmq::Error::EINTR {
                break;
            }
        }
    }
}

/// libzmq's number of a socket type (the `zmq` crate keeps its own private).
fn socket_type(kind: zmq::SocketType) -> c_int {
    use zmq::SocketType as T;
    let raw = match kind {
        T::PAIR => zmq_sys::ZMQ_PAIR,
        T::PUB => zmq_sys::ZMQ_PUB,
        T::SUB => zmq_sys::ZMQ_SUB,
        T::REQ => zmq_sys::ZMQ_REQ,
        T::REP => zmq_sys::ZMQ_REP,
        T::DEALER => zmq_sys::ZMQ_DEALER,
        T::ROUTER => zmq_sys::ZMQ_ROUTER,
        T::PULL => zmq_sys::ZMQ_PULL,
        T::PUSH => zmq_sys::ZMQ_PUSH,
        T::XPUB => zmq_sys::ZMQ_XPUB,
        T::XSUB => zmq_sys::ZMQ_XSUB,
        T::STREAM => zmq_sys::ZMQ_STREAM,
    };
    raw as c_int
}

/// A socket of a [`RawContext`], used as a `zmq::Socket` (`Deref`); it
/// keeps its context alive, and is closed before it lets go of it.
pub struct ContextSocket {
    // Fields drop in declaration order: the socket is closed first, then
    // the context may be terminated.
    sock: zmq::Socket,
    /// Set once bound or connected over `inproc://` (through this type's
    /// own `bind`/`connect`, which shadow the socket's): its shared frames
    /// are then copies.
    inproc: AtomicBool,
    _ctx: Arc<RawContext>,
}

impl ContextSocket {
    /// Sends `data` as one frame of a (multipart) message, with `flags` as
    /// `zmq_msg_send` takes them, without copying the bytes: libzmq writes
    /// them to the connection and drops its clone of `data` once done. A
    /// socket bound or connected over `inproc://` sends a copy instead
    /// (libzmq would hand the receiver, in this process, a writable frame
    /// over the bytes every other holder of `data` reads). On an error the
    /// frame was not queued and the clone is already dropped.
    pub fn send_shared(&mut self, data: Bytes, flags: i32) -> Result<(), zmq::Error> {
        if self.inproc.load(Ordering::Acquire) {
            return self.sock.send(&data[..], flags);
        }
        let len = data.len();
        let ptr = data.as_ptr().cast_mut().cast::<c_void>();
        let owner: *mut Bytes = Box::into_raw(Box::new(data));
        let mut msg = zmq_sys::zmq_msg_t::default();
        // SAFETY: `ptr`/`len` are the bytes of `*owner`, which stay alive
        // until `release_bytes` drops `owner`; libzmq calls it exactly once,
        // when the frame is done with (or never, if this call fails, which
        // is handled below). Nothing writes them: `Bytes` never does, and
        // over tcp and ipc (the only transports this socket was bound or
        // connected with, see `inproc`) libzmq only reads them, to write
        // them to the connection. `msg` is a fresh `zmq_msg_t` owned here.
        let rc = unsafe {
            zmq_sys::zmq_msg_init_data(&mut msg, ptr, len, Some(release_bytes), owner.cast())
        };
        if rc == -1 {
            // SAFETY: libzmq did not take `owner` (the init failed), so this
            // is the only pointer to the box leaked above.
            drop(unsafe { Box::from_raw(owner) });
            return Err(last_error());
        }
        // SAFETY: `msg` was initialised above; `self.sock.as_mut_ptr()` is
        // the live socket borrowed mutably for this call (no other thread
        // uses it). On success libzmq owns `msg`'s content; on failure `msg`
        // is still ours.
        let rc = unsafe { zmq_sys::zmq_msg_send(&mut msg, self.sock.as_mut_ptr(), flags) };
        if rc == -1 {
            let e = last_error();
            // SAFETY: the send failed, so `msg` is still initialised and
            // ours; closing it calls `release_bytes`, which drops `owner`.
            unsafe { zmq_sys::zmq_msg_close(&mut msg) };
            return Err(e);
        }
        Ok(())
    }

    /// `zmq::Socket::connect`, noting an `inproc://` endpoint (see
    /// [`ContextSocket::send_shared`]).
    pub fn connect(&self, endpoint: &str) -> zmq::Result<()> {
        self.note(endpoint);
        self.sock.connect(endpoint)
    }

    /// `zmq::Socket::bind`, noting an `inproc://` endpoint.
    pub fn bind(&self, endpoint: &str) -> zmq::Result<()> {
        self.note(endpoint);
        self.sock.bind(endpoint)
    }

    fn note(&self, endpoint: &str) {
        if endpoint.starts_with("inproc://") {
            self.inproc.store(true, Ordering::Release);
        }
    }
}

impl Deref for ContextSocket {
    type Target = zmq::Socket;

    fn deref(&self) -> &zmq::Socket {
        &self.sock
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A Bytes that tells when its last clone goes.
    struct Owner(Vec<u8>, #[allow(dead_code)] Arc<()>);
    impl AsRef<[u8]> for Owner {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    fn pair(ctx: &Arc<RawContext>, transport: &str) -> (ContextSocket, ContextSocket) {
        let rx = ctx.socket(zmq::PAIR).unwrap();
        let ep = match transport {
            "tcp" => {
                rx.bind("tcp://127.0.0.1:*").unwrap();
                rx.get_last_endpoint().unwrap().unwrap()
            }
            _ => {
                let ep = format!("inproc://shared-frame-{}", std::process::id());
                rx.bind(&ep).unwrap();
                ep
            }
        };
        let tx = ctx.socket(zmq::PAIR).unwrap();
        tx.connect(&ep).unwrap();
        (rx, tx)
    }

    #[test]
    fn a_shared_frame_arrives_whole_and_is_released_once_sent() {
        let ctx = RawContext::with_max_sockets(MAX_SOCKETS).unwrap();
        for transport in ["tcp", "inproc"] {
            let (rx, mut tx) = pair(&ctx, transport);
            let alive = Arc::new(());
            let value: Vec<u8> = (0..(3 << 20)).map(|i| (i * 7 % 251) as u8).collect();
            let data = Bytes::from_owner(Owner(value.clone(), alive.clone()));
            let at = data.as_ptr();
            tx.send_shared(Bytes::from_static(b"head"), zmq::SNDMORE)
                .unwrap();
            tx.send_shared(data, 0).unwrap();
            assert_eq!(rx.recv_bytes(0).unwrap(), b"head");
            let got = rx.recv_msg(0).unwrap();
            assert_eq!(&got[..], &value[..]);
            // over inproc the receiver gets a copy, never the shared bytes
            if transport == "inproc" {
                assert_ne!(got.as_ptr(), at);
            }
            drop(got);
            // libzmq releases the clone once written (tcp: from its I/O
            // thread, shortly after; bounded wait)
            let t = std::time::Instant::now();
            while Arc::strong_count(&alive) > 1 && t.elapsed() < std::time::Duration::from_secs(10)
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(
                Arc::strong_count(&alive),
                1,
                "{transport}: the clone was released"
            );
        }
    }

    #[test]
    fn a_failed_send_releases_the_clone() {
        let ctx = RawContext::with_max_sockets(MAX_SOCKETS).unwrap();
        let mut tx = ctx.socket(zmq::DEALER).unwrap(); // connected to nobody
        let alive = Arc::new(());
        let data = Bytes::from_owner(Owner(b"value".to_vec(), alive.clone()));
        let err = tx.send_shared(data, zmq::DONTWAIT).unwrap_err();
        assert_eq!(err, zmq::Error::EAGAIN);
        assert_eq!(Arc::strong_count(&alive), 1);
    }

    #[test]
    fn a_raw_context_allows_its_limit_of_sockets_and_no_more() {
        let ctx = RawContext::with_max_sockets(5).unwrap();
        assert_eq!(ctx.max_sockets(), 5);
        let socks: Vec<ContextSocket> = (0..5).map(|_| ctx.socket(zmq::DEALER).unwrap()).collect();
        assert_eq!(ctx.socket(zmq::DEALER).err(), Some(zmq::Error::EMFILE));
        assert_eq!(ctx.socket(zmq::PAIR).err(), Some(zmq::Error::EMFILE));
        // (a closed socket's place is freed later, by libzmq's reaper thread)
        drop(socks);
        // no limit at all is refused, not taken
        assert_eq!(
            RawContext::with_max_sockets(0).err(),
            Some(zmq::Error::EINVAL)
        );
    }

    #[test]
    fn ps_lites_limit_lifts_libzmqs_default_of_1023() {
        const N: usize = 1100;
        // libzmq's default: the 1024th socket of a context fails
        let plain = zmq::Context::new();
        let mut socks: Vec<zmq::Socket> = Vec::new();
        let refused = loop {
            match plain.socket(zmq::DEALER) {
                Ok(s) => socks.push(s),
                Err(e) => break e,
            }
            assert!(socks.len() <= N, "no limit");
        };
        assert_eq!((socks.len(), refused), (1023, zmq::Error::EMFILE));
        drop(socks);
        // ps-lite's
        let ctx = RawContext::with_max_sockets(MAX_SOCKETS).unwrap();
        assert_eq!(ctx.max_sockets(), MAX_SOCKETS); // epoll: no cap
        let socks: Vec<ContextSocket> = (0..N).map(|_| ctx.socket(zmq::DEALER).unwrap()).collect();
        assert_eq!(socks.len(), N);
    }

    #[test]
    fn every_socket_type_is_made_as_asked() {
        use zmq::SocketType as T;
        let ctx = RawContext::with_max_sockets(16).unwrap();
        for kind in [
            T::PAIR,
            T::PUB,
            T::SUB,
            T::REQ,
            T::REP,
            T::DEALER,
            T::ROUTER,
            T::PULL,
            T::PUSH,
            T::XPUB,
            T::XSUB,
            T::STREAM,
        ] {
            assert_eq!(ctx.socket(kind).unwrap().get_socket_type(), Ok(kind));
        }
    }

    #[test]
    fn sockets_keep_their_context_alive_and_it_ends_after_the_last() {
        let ctx = RawContext::with_max_sockets(MAX_SOCKETS).unwrap();
        let rx = ctx.socket(zmq::PAIR).unwrap();
        rx.bind("inproc://raw-context-alive").unwrap();
        let mut tx = ctx.socket(zmq::PAIR).unwrap();
        tx.connect("inproc://raw-context-alive").unwrap();
        let weak = Arc::downgrade(&ctx);
        drop(ctx);
        // the sockets still work: their context is alive
        tx.send_shared(Bytes::from(vec![5u8; 100 << 10]), 0)
            .unwrap();
        assert_eq!(rx.recv_bytes(0).unwrap(), vec![5u8; 100 << 10]);
        drop(rx);
        assert!(weak.upgrade().is_some(), "tx still holds the context");
        drop(tx); // the last one: the context is terminated (zmq_ctx_term returned)
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn a_monitor_pair_in_the_same_context_sees_the_handshake() {
        let ctx = RawContext::with_max_sockets(MAX_SOCKETS).unwrap();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let ep = router.get_last_endpoint().unwrap().unwrap();
        let dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_linger(0).unwrap();
        let mon_ep = format!("inproc://raw-context-monitor-{}", std::process::id());
        dealer
            .monitor(
                &mon_ep,
                zmq::SocketEvent::HANDSHAKE_SUCCEEDED.to_raw().into(),
            )
            .unwrap();
        let mon = ctx.socket(zmq::PAIR).unwrap();
        mon.set_linger(0).unwrap();
        mon.set_rcvtimeo(10_000).unwrap(); // bounded wait
        mon.connect(&mon_ep).unwrap();
        dealer.connect(&ep).unwrap();
        let event = mon.recv_bytes(0).expect("the handshake event within 10 s");
        assert_eq!(
            u16::from_le_bytes([event[0], event[1]]),
            zmq::SocketEvent::HANDSHAKE_SUCCEEDED.to_raw()
        );
        assert!(mon.get_rcvmore().unwrap());
        assert_eq!(mon.recv_bytes(0).unwrap(), ep.as_bytes());
    }
}
