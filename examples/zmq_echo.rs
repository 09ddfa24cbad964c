//! The transport's own figure for the distributed benchmark (bench/dist):
//! a value sent over a libzmq DEALER to a ROUTER and echoed back, between two
//! processes on 127.0.0.1, with the same libzmq (the `zmq` crate's bundled
//! build) as libmxkv's van. Nothing of libmxkv runs here.
//!
//! `zmq_echo server` binds a free port, prints it, and echoes every message
//! until a 1-byte one. `zmq_echo client PORT SIZE REPS WARMUP` sends a SIZE
//! byte value REPS + WARMUP times (each time the frame it got back, so no
//! copy is made), and prints one JSON line with the REPS timed echoes.
use std::time::Instant;

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

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let ctx = zmq::Context::new();
    let err = |e: zmq::Error| e.to_string();
    match args.get(1).map(String::as_str) {
        Some("server") => {
            let s = ctx.socket(zmq::ROUTER).map_err(err)?;
            s.bind("tcp://127.0.0.1:*").map_err(err)?;
            let ep = s
                .get_last_endpoint()
                .map_err(err)?
                .map_err(|_| "endpoint")?;
            println!("{}", ep.rsplit(':').next().unwrap_or_default());
            loop {
                let id = s.recv_msg(0).map_err(err)?;
                let m = s.recv_msg(0).map_err(err)?;
                if m.len() == 1 {
                    return Ok(());
                }
                s.send(id, zmq::SNDMORE).map_err(err)?;
                s.send(m, 0).map_err(err)?;
            }
        }
        Some("client") => {
            let (port, size) = (arg(&args, 2)?, arg(&args, 3)?);
            let (reps, warmup) = (arg(&args, 4)?, arg(&args, 5)?);
            let s = ctx.socket(zmq::DEALER).map_err(err)?;
            s.connect(&format!("tcp://127.0.0.1:{port}")).map_err(err)?;
            let mut value = zmq::Message::from(vec![1u8; size.max(2)]);
            let mut times = Vec::with_capacity(reps);
            for i in 0..warmup + reps {
                let t = Instant::now();
                s.send(value, 0).map_err(err)?;
                value = s.recv_msg(0).map_err(err)?;
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
        _ => Err("usage: zmq_echo server | zmq_echo client PORT SIZE REPS WARMUP".into()),
    }
}
