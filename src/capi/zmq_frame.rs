//! Zero-copy ZeroMQ frames of shared bytes: the one libzmq call the van
//! needs that the `zmq` crate does not offer (it sends only frames it owns
//! or copies). A value that a node keeps and also sends (a server's stored
//! value in a pull reply) goes out without a copy: libzmq holds a clone of
//! the `Bytes` until it has written the frame, then drops it.
//!
//! It lives here because `src/capi` is the crate's one `unsafe` boundary;
//! the van (`src/dist/van.rs`) calls [`send_shared`], which is safe.

use bytes::Bytes;
use std::os::raw::c_void;
use std::panic::AssertUnwindSafe;

/// Sends `data` as one frame of a (multipart) message on `sock`, with
/// `flags` as `zmq_msg_send` takes them, without copying the bytes. On an
/// error the frame was not queued and `data`'s clone is already dropped.
pub fn send_shared(sock: &mut zmq::Socket, data: Bytes, flags: i32) -> Result<(), zmq::Error> {
    let len = data.len();
    let ptr = data.as_ptr().cast_mut().cast::<c_void>();
    let owner: *mut Bytes = Box::into_raw(Box::new(data));
    let mut msg = zmq_sys::zmq_msg_t::default();
    // SAFETY: `ptr`/`len` are the bytes of `*owner`, which are immutable
    // (`Bytes` never writes them) and stay alive until `release_bytes` drops
    // `owner`; libzmq calls it exactly once, when the frame is done with
    // (or never, if this call fails, which is handled below). `msg` is a
    // fresh `zmq_msg_t` that this function owns.
    let rc = unsafe {
        zmq_sys::zmq_msg_init_data(&mut msg, ptr, len, Some(release_bytes), owner.cast())
    };
    if rc == -1 {
        // SAFETY: libzmq did not take `owner` (the init failed), so this is
        // the only pointer to the box leaked above.
        drop(unsafe { Box::from_raw(owner) });
        return Err(last_error());
    }
    // SAFETY: `msg` was initialised above; `sock.as_mut_ptr()` is the live
    // socket `sock` borrows mutably for this call (no other thread uses it).
    // On success libzmq owns `msg`'s content; on failure `msg` is still ours.
    let rc = unsafe { zmq_sys::zmq_msg_send(&mut msg, sock.as_mut_ptr(), flags) };
    if rc == -1 {
        let e = last_error();
        // SAFETY: the send failed, so `msg` is still initialised and ours;
        // closing it calls `release_bytes`, which drops `owner`.
        unsafe { zmq_sys::zmq_msg_close(&mut msg) };
        return Err(e);
    }
    Ok(())
}

/// libzmq's free function of a frame made by [`send_shared`]: drops the
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_shared_frame_arrives_whole_and_is_released_once_sent() {
        let ctx = zmq::Context::new();
        let rx = ctx.socket(zmq::PAIR).unwrap();
        rx.bind("inproc://shared-frame").unwrap();
        let mut tx = ctx.socket(zmq::PAIR).unwrap();
        tx.connect("inproc://shared-frame").unwrap();
        // a Bytes that tells when its last clone goes
        struct Owner(Vec<u8>, #[allow(dead_code)] Arc<()>);
        impl AsRef<[u8]> for Owner {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        let alive = Arc::new(());
        let value: Vec<u8> = (0..(3 << 20)).map(|i| (i * 7 % 251) as u8).collect();
        let data = Bytes::from_owner(Owner(value.clone(), alive.clone()));
        send_shared(&mut tx, Bytes::from_static(b"head"), zmq::SNDMORE).unwrap();
        send_shared(&mut tx, data, 0).unwrap();
        assert_eq!(rx.recv_bytes(0).unwrap(), b"head");
        let got = rx.recv_msg(0).unwrap();
        assert_eq!(&got[..], &value[..]);
        drop(got); // inproc passes the frame itself: the receiver held the clone
        assert_eq!(Arc::strong_count(&alive), 1, "the clone was released");
    }

    #[test]
    fn a_failed_send_releases_the_clone() {
        let ctx = zmq::Context::new();
        let mut tx = ctx.socket(zmq::DEALER).unwrap(); // connected to nobody
        let alive = Arc::new(());
        struct Owner(#[allow(dead_code)] Arc<()>);
        impl AsRef<[u8]> for Owner {
            fn as_ref(&self) -> &[u8] {
                b"value"
            }
        }
        let data = Bytes::from_owner(Owner(alive.clone()));
        let err = send_shared(&mut tx, data, zmq::DONTWAIT).unwrap_err();
        assert_eq!(err, zmq::Error::EAGAIN);
        assert_eq!(Arc::strong_count(&alive), 1);
    }
}
