//! The transport's own figure for the distributed benchmark (bench/dist):
//! a value sent over a libzmq DEALER to a ROUTER and echoed back, between two
//! processes on 127.0.0.1, with the same libzmq (the `zmq` crate's bundled
//! build) as libmxkv's van. Nothing of libmxkv runs here.
//!
//! `zmq_echo server [MODE]` binds a free port, prints it, and echoes every
//! message until a 1-byte one. `zmq_echo client PORT SIZE REPS WARMUP [MODE]`
//! sends a SIZE byte value REPS + WARMUP times (each time the frame it got
//! back, so no copy is made), and prints one JSON line with the REPS timed
//! echoes.
//!
//! MODE is how the side waits for a message: `block` (default: a blocking
//! `recv`, the thread sleeps until libzmq signals it), `spin` (`recv` with
//! `DONTWAIT` in a loop, never sleeping), `spin:N` (that loop for up to N µs,
//! then a blocking `recv`), `yield` / `yield:N` (the same, calling
//! `sched_yield` between two tries, as libmxkv's waits do). libzmq's own I/O
//! thread, which reads and writes the TCP connection, sleeps in `epoll` in
//! every mode.
use std::time::{Duration, Instant};

fn main() {
    if let Err(e) = run() {
        eprintln!("zmq_echo: {e}");
        std::process::exit(1);
    }
}

fn arg(args: &[String], i: usize) -> Result<usize, String> {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("argument {i}: a number is needed (usage: see the source)"))
}

/// How a side waits for the next message.
#[derive(Clone, Copy)]
struct Mode {
    /// How long to try without sleeping (`None`: forever).
    spin: Option<Duration>,
    /// `sched_yield` between two tries.
    yield_cpu: bool,
}

fn mode(a: Option<&String>) -> Result<Mode, String> {
    let a = a.map(String::as_str).unwrap_or("block");
    let (kind, n) = match a.split_once(':') {
        Some((k, n)) => (k, Some(n.parse::<u64>().map_err(|_| format!("mode {a}"))?)),
        None => (a, None),
    };
    let spin = n.map(Duration::from_micros);
    match kind {
        "block" if n.is_none() => Ok(Mode {
            spin: Some(Duration::ZERO),
            yield_cpu: false,
        }),
        "spin" => Ok(Mode {
            spin,
            yield_cpu: false,
        }),
        "yield" => Ok(Mode {
            spin,
            yield_cpu: true,
        }),
        _ => Err(format!("mode {a}: block, spin[:us] or yield[:us]")),
    }
}

fn recv(s: &zmq::Socket, m: Mode) -> zmq::Result<zmq::Message> {
    if m.spin != Some(Duration::ZERO) {
        let t0 = Instant::now();
        loop {
            match s.recv_msg(zmq::DONTWAIT) {
                Err(zmq::Error::EAGAIN) => {}
                r => return r,
            }
            if m.spin.is_some_and(|d| t0.elapsed() >= d) {
                break;
            }
            if m.yield_cpu {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
    s.recv_msg(0)
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let ctx = zmq::Context::new();
    let err = |e: zmq::Error| e.to_string();
    match args.get(1).map(String::as_str) {
        Some("server") => {
            let m = mode(args.get(2))?;
            let s = ctx.socket(zmq::ROUTER).map_err(err)?;
            s.bind("tcp://127.0.0.1:*").map_err(err)?;
            let ep = s
                .get_last_endpoint()
                .map_err(err)?
                .map_err(|_| "endpoint")?;
            println!("{}", ep.rsplit(':').next().unwrap_or_default());
            loop {
                let id = recv(&s, m).map_err(err)?;
                // the frames of a message arrive together
                let msg = s.recv_msg(0).map_err(err)?;
                if msg.len() == 1 {
                    return Ok(());
                }
                s.send(id, zmq::SNDMORE).map_err(err)?;
                s.send(msg, 0).map_err(err)?;
            }
        }
        Some("client") => {
            let (port, size) = (arg(&args, 2)?, arg(&args, 3)?);
            let (reps, warmup) = (arg(&args, 4)?, arg(&args, 5)?);
            let m = mode(args.get(6))?;
            let s = ctx.socket(zmq::DEALER).map_err(err)?;
            s.connect(&format!("tcp://127.0.0.1:{port}")).map_err(err)?;
            let mut value = zmq::Message::from(vec![1u8; size.max(2)]);
            let mut times = Vec::with_capacity(reps);
            for i in 0..warmup + reps {
                let t = Instant::now();
                s.send(value, 0).map_err(err)?;
                value = recv(&s, m).map_err(err)?;
                if i >= warmup {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            s.send(&[0u8][..], 0).map_err(err)?;
            let times: Vec<String> = times.iter().map(|t| format!("{t:.9}")).collect();
            println!(
                "{{\"figure\": \"zmq_echo\", \"size\": {size}, \"bytes_per_op\": {size}, \
                 \"times\": [{}]}}",
                times.join(", ")
            );
            Ok(())
        }
        _ => Err(
            "usage: zmq_echo server [MODE] | zmq_echo client PORT SIZE REPS WARMUP [MODE]".into(),
        ),
    }
}
