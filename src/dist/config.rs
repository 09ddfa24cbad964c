//! The cluster configuration, read once from the environment into a value.
//!
//! The variables and defaults are ps-lite's (`Van::Start`, `Postoffice`,
//! `Environment`) and MXNet's (`MXNET_KVSTORE_BIGARRAY_BOUND`), looked up
//! through [`crate::psenv`] so that values given to `MXInitPSEnv` come first.
//! `MXKV_TIMEOUT_S` is ours: the deadline of every wait (default 120 s); so
//! is `MXKV_LANE` (default 1; 0 turns off lanes, [`super::lane`]).
#![forbid(unsafe_code)]

use super::message::Role;
use crate::error::{Error, Result};
use std::time::Duration;

/// Default of `MXKV_TIMEOUT_S`, seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 120.0;
/// Default of `MXNET_KVSTORE_BIGARRAY_BOUND`, elements.
pub const DEFAULT_BIGARRAY_BOUND: usize = 1_000_000;

/// One node's view of the cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `DMLC_ROLE`.
    pub role: Role,
    /// `DMLC_PS_ROOT_URI`: the scheduler's address (it binds there).
    pub root_uri: String,
    /// `DMLC_PS_ROOT_PORT`. 0 lets a scheduler take a free port (tests);
    /// other nodes need the real one.
    pub root_port: u16,
    /// `DMLC_NUM_WORKER`.
    pub num_worker: usize,
    /// `DMLC_NUM_SERVER`.
    pub num_server: usize,
    /// `DMLC_NODE_HOST`: the address a server or worker advertises and binds.
    pub node_host: Option<String>,
    /// `DMLC_INTERFACE`: used when `DMLC_NODE_HOST` is unset.
    pub interface: Option<String>,
    /// `PORT`: the node's port (otherwise a free one).
    pub port: Option<u16>,
    /// `PS_VERBOSE` (0, 1, 2).
    pub verbose: u32,
    /// `PS_HEARTBEAT_INTERVAL`, seconds; zero: no heartbeats.
    pub heartbeat_interval: Duration,
    /// `PS_HEARTBEAT_TIMEOUT`, seconds; zero: heartbeats never declare a node dead.
    pub heartbeat_timeout: Duration,
    /// `PS_RESEND` non-zero.
    pub resend: bool,
    /// `PS_RESEND_TIMEOUT`, milliseconds (default 1000).
    pub resend_timeout: Duration,
    /// `DMLC_PS_WATER_MARK`: `ZMQ_SNDHWM` of the sockets made once the id is known.
    pub water_mark: Option<i32>,
    /// `DMLC_USE_KUBERNETES` non-zero: the scheduler binds 0.0.0.0.
    pub use_kubernetes: bool,
    /// `DMLC_LOCAL` non-zero: `ipc:///tmp/<port>` endpoints instead of TCP.
    pub local: bool,
    /// `MXNET_KVSTORE_BIGARRAY_BOUND`, elements.
    pub bigarray_bound: usize,
    /// `MXKV_TIMEOUT_S`: the deadline of every wait.
    pub timeout: Duration,
    /// `MXKV_LANE` (default 1): direct connections between libmxkv workers
    /// and servers beside the van ([`super::lane`]); 0 turns them off.
    pub lane: bool,
}

fn parse<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value.trim().parse().map_err(|_| {
        Error::usage(format!(
            "environment variable {name}={value:?} is not a valid {}",
            std::any::type_name::<T>()
        ))
    })
}

/// The longest duration a variable may give, seconds (ten years): every
/// deadline is an `Instant` plus such a duration (or a small multiple),
/// which must not overflow. Longer values are refused, naming the variable.
pub const MAX_SECONDS: f64 = 10.0 * 365.25 * 86400.0;

fn seconds(name: &str, value: &str) -> Result<Duration> {
    let s: f64 = parse(name, value)?;
    if !(s.is_finite() && (0.0..=MAX_SECONDS).contains(&s)) {
        return Err(Error::usage(format!(
            "environment variable {name}={value:?} must be a number of seconds from 0 to {MAX_SECONDS} (ten years)"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

/// A number of milliseconds, at most [`MAX_SECONDS`] seconds.
fn millis(name: &str, value: &str) -> Result<Duration> {
    let ms: u64 = parse(name, value)?;
    if ms as f64 > MAX_SECONDS * 1000.0 {
        return Err(Error::usage(format!(
            "environment variable {name}={value:?} must be a number of milliseconds from 0 to {} (ten years)",
            MAX_SECONDS * 1000.0
        )));
    }
    Ok(Duration::from_millis(ms))
}

impl Config {
    /// Reads the configuration through [`crate::psenv::get`]: values given to
    /// `MXInitPSEnv`, then the process environment.
    pub fn from_env() -> Result<Config> {
        Config::from_lookup(crate::psenv::get)
    }

    /// Reads the configuration from `lookup` (a test passes a map).
    /// A missing required variable is an error naming every one missing.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        let required = [
            "DMLC_ROLE",
            "DMLC_PS_ROOT_URI",
            "DMLC_PS_ROOT_PORT",
            "DMLC_NUM_WORKER",
            "DMLC_NUM_SERVER",
        ];
        let missing: Vec<&str> = required
            .iter()
            .copied()
            .filter(|v| get(v).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(Error::usage(format!(
                "the distributed store needs the environment variable{} {} (set by the launcher, or with MXInitPSEnv)",
                if missing.len() > 1 { "s" } else { "" },
                missing.join(", ")
            )));
        }
        let role_s = get("DMLC_ROLE").unwrap_or_default();
        let role = match role_s.as_str() {
            "scheduler" => Role::Scheduler,
            "server" => Role::Server,
            "worker" => Role::Worker,
            other => {
                return Err(Error::usage(format!(
                    "DMLC_ROLE={other:?} is none of scheduler, server, worker"
                )))
            }
        };
        if let Some(t) = get("DMLC_PS_VAN_TYPE") {
            if t != "zmq" && t != "none" {
                return Err(Error::usage(format!(
                    "Unsupported van type: {t} (DMLC_PS_VAN_TYPE; only zmq is available)"
                )));
            }
        }
        let num = |name: &str| -> Result<usize> {
            let v = get(name).unwrap_or_default();
            let n: usize = parse(name, &v)?;
            Ok(n)
        };
        let num_worker = num("DMLC_NUM_WORKER")?;
        let num_server = num("DMLC_NUM_SERVER")?;
        if num_worker == 0 || num_server == 0 {
            return Err(Error::usage(format!(
                "DMLC_NUM_WORKER={num_worker} and DMLC_NUM_SERVER={num_server}: a cluster needs at least one of each"
            )));
        }
        let flag = |name: &str| -> Result<bool> {
            match get(name) {
                None => Ok(false),
                Some(v) => Ok(parse::<i64>(name, &v)? != 0),
            }
        };
        let opt_secs = |name: &str| -> Result<Duration> {
            match get(name) {
                None => Ok(Duration::ZERO),
                Some(v) => seconds(name, &v),
            }
        };
        let timeout = match get("MXKV_TIMEOUT_S") {
            None => Duration::from_secs_f64(DEFAULT_TIMEOUT_S),
            Some(v) => {
                let d = seconds("MXKV_TIMEOUT_S", &v)?;
                if d.is_zero() {
                    return Err(Error::usage("MXKV_TIMEOUT_S must be greater than 0"));
                }
                d
            }
        };
        Ok(Config {
            role,
            root_uri: get("DMLC_PS_ROOT_URI").unwrap_or_default(),
            root_port: parse("DMLC_PS_ROOT_PORT", &get("DMLC_PS_ROOT_PORT").unwrap())?,
            num_worker,
            num_server,
            node_host: get("DMLC_NODE_HOST"),
            interface: get("DMLC_INTERFACE"),
            port: get("PORT").map(|v| parse("PORT", &v)).transpose()?,
            verbose: get("PS_VERBOSE")
                .map(|v| parse("PS_VERBOSE", &v))
                .transpose()?
                .unwrap_or(0),
            heartbeat_interval: opt_secs("PS_HEARTBEAT_INTERVAL")?,
            heartbeat_timeout: opt_secs("PS_HEARTBEAT_TIMEOUT")?,
            resend: flag("PS_RESEND")?,
            resend_timeout: get("PS_RESEND_TIMEOUT")
                .map(|v| millis("PS_RESEND_TIMEOUT", &v))
                .transpose()?
                .unwrap_or(Duration::from_millis(1000)),
            water_mark: get("DMLC_PS_WATER_MARK")
                .map(|v| parse("DMLC_PS_WATER_MARK", &v))
                .transpose()?,
            use_kubernetes: flag("DMLC_USE_KUBERNETES")?,
            local: flag("DMLC_LOCAL")?,
            bigarray_bound: get("MXNET_KVSTORE_BIGARRAY_BOUND")
                .map(|v| parse("MXNET_KVSTORE_BIGARRAY_BOUND", &v))
                .transpose()?
                .unwrap_or(DEFAULT_BIGARRAY_BOUND),
            timeout,
            lane: match get("MXKV_LANE") {
                Some(v) => parse::<i64>("MXKV_LANE", &v)? != 0,
                None => true,
            },
        })
    }

    /// A loopback cluster for tests: scheduler at `127.0.0.1:root_port`,
    /// nodes on 127.0.0.1 with free ports, deadline `timeout`.
    pub fn local(
        role: Role,
        root_port: u16,
        num_worker: usize,
        num_server: usize,
        timeout: Duration,
    ) -> Config {
        Config {
            role,
            root_uri: "127.0.0.1".into(),
            root_port,
            num_worker,
            num_server,
            node_host: Some("127.0.0.1".into()),
            interface: None,
            port: None,
            verbose: 0,
            heartbeat_interval: Duration::ZERO,
            heartbeat_timeout: Duration::ZERO,
            resend: false,
            resend_timeout: Duration::from_millis(1000),
            water_mark: None,
            use_kubernetes: false,
            local: false,
            bigarray_bound: DEFAULT_BIGARRAY_BOUND,
            timeout,
            lane: true,
        }
    }

    /// The address this node advertises and binds: the scheduler's is
    /// `DMLC_PS_ROOT_URI`; a server's or worker's is `DMLC_NODE_HOST`, else
    /// the IPv4 address of `DMLC_INTERFACE`, else of the first non-loopback
    /// interface (ps-lite `Van::Start`).
    pub fn host(&self) -> Result<String> {
        if self.role == Role::Scheduler {
            return Ok(self.root_uri.clone());
        }
        if let Some(h) = &self.node_host {
            return Ok(h.clone());
        }
        interface_ipv4(self.interface.as_deref()).ok_or_else(|| {
            Error::usage(match &self.interface {
                Some(i) => format!(
                    "failed to get the interface: no IPv4 address on DMLC_INTERFACE={i:?} (set DMLC_NODE_HOST)"
                ),
                None => "failed to get the interface: no non-loopback IPv4 interface (set DMLC_NODE_HOST or DMLC_INTERFACE)".into(),
            })
        })
    }
}

/// The IPv4 address of interface `name` (or of the first non-loopback
/// interface), read from the kernel's routing tables in /proc (no libc).
fn interface_ipv4(name: Option<&str>) -> Option<String> {
    if name == Some("lo") {
        return Some("127.0.0.1".into());
    }
    let locals = local_addresses()?;
    let routes = std::fs::read_to_string("/proc/net/route").ok()?;
    for line in routes.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 8 || f[0] == "lo" || name.is_some_and(|n| n != f[0]) {
            continue;
        }
        let (Ok(dest), Ok(mask)) = (u32::from_str_radix(f[1], 16), u32::from_str_radix(f[7], 16))
        else {
            continue;
        };
        if mask == 0 {
            continue;
        }
        // /proc/net/route prints the address words as the host (little-endian)
        // reads the network-order bytes.
        let dest = u32::from_be_bytes(dest.to_le_bytes());
        let mask = u32::from_be_bytes(mask.to_le_bytes());
        if let Some(a) = locals.iter().find(|a| {
            let v = u32::from(**a);
            v & mask == dest & mask && !a.is_loopback()
        }) {
            return Some(a.to_string());
        }
    }
    None
}

/// Addresses of this host (`/32 host LOCAL` entries of /proc/net/fib_trie).
fn local_addresses() -> Option<Vec<std::net::Ipv4Addr>> {
    let trie = std::fs::read_to_string("/proc/net/fib_trie").ok()?;
    let mut out = Vec::new();
    let mut last: Option<std::net::Ipv4Addr> = None;
    for line in trie.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(a) = t.parse::<std::net::Ipv4Addr>() {
            last = Some(a);
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(a) = last {
                if !out.contains(&a) {
                    out.push(a);
                }
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    const BASE: [(&str, &str); 5] = [
        ("DMLC_ROLE", "worker"),
        ("DMLC_PS_ROOT_URI", "127.0.0.1"),
        ("DMLC_PS_ROOT_PORT", "9000"),
        ("DMLC_NUM_WORKER", "2"),
        ("DMLC_NUM_SERVER", "1"),
    ];

    #[test]
    fn defaults() {
        let c = cfg(&BASE).unwrap();
        assert_eq!(c.role, Role::Worker);
        assert_eq!((c.num_worker, c.num_server, c.root_port), (2, 1, 9000));
        assert_eq!(c.timeout, Duration::from_secs(120));
        assert_eq!(c.bigarray_bound, 1_000_000);
        assert_eq!(c.heartbeat_interval, Duration::ZERO);
        assert_eq!(c.resend_timeout, Duration::from_millis(1000));
        assert_eq!(
            (c.port, c.water_mark, c.verbose, c.resend),
            (None, None, 0, false)
        );
        assert!(c.lane);
    }

    #[test]
    fn mxkv_lane() {
        for (v, on) in [("0", false), ("1", true), ("2", true)] {
            let mut vars = BASE.to_vec();
            vars.push(("MXKV_LANE", v));
            assert_eq!(cfg(&vars).unwrap().lane, on, "MXKV_LANE={v}");
        }
        let mut vars = BASE.to_vec();
        vars.push(("MXKV_LANE", "off"));
        let e = cfg(&vars).unwrap_err();
        assert!(e.message().contains("MXKV_LANE"), "{e}");
    }

    #[test]
    fn every_variable() {
        let mut v = BASE.to_vec();
        v.extend([
            ("DMLC_NODE_HOST", "10.1.2.3"),
            ("DMLC_INTERFACE", "eth7"),
            ("PORT", "9123"),
            ("PS_VERBOSE", "2"),
            ("PS_HEARTBEAT_INTERVAL", "1"),
            ("PS_HEARTBEAT_TIMEOUT", "5"),
            ("PS_RESEND", "1"),
            ("PS_RESEND_TIMEOUT", "300"),
            ("DMLC_PS_WATER_MARK", "50"),
            ("MXNET_KVSTORE_BIGARRAY_BOUND", "10"),
            ("MXKV_TIMEOUT_S", "0.5"),
            ("DMLC_LOCAL", "1"),
            ("DMLC_USE_KUBERNETES", "1"),
        ]);
        let c = cfg(&v).unwrap();
        assert_eq!(c.host().unwrap(), "10.1.2.3");
        assert_eq!(c.interface.as_deref(), Some("eth7"));
        assert_eq!((c.port, c.verbose), (Some(9123), 2));
        assert_eq!(c.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(c.heartbeat_timeout, Duration::from_secs(5));
        assert!(c.resend);
        assert_eq!(c.resend_timeout, Duration::from_millis(300));
        assert_eq!((c.water_mark, c.bigarray_bound), (Some(50), 10));
        assert_eq!(c.timeout, Duration::from_millis(500));
        assert!(c.local && c.use_kubernetes);
    }

    #[test]
    fn errors_name_the_variable() {
        let e = cfg(&BASE[1..]).unwrap_err();
        assert!(e.message().contains("DMLC_ROLE"), "{e}");
        assert_eq!(e.kind(), crate::error::ErrorKind::Usage);
        let e = cfg(&[("DMLC_ROLE", "server")]).unwrap_err();
        for v in [
            "DMLC_PS_ROOT_URI",
            "DMLC_PS_ROOT_PORT",
            "DMLC_NUM_WORKER",
            "DMLC_NUM_SERVER",
        ] {
            assert!(e.message().contains(v), "{e}");
        }
        let mut v = BASE.to_vec();
        v.push(("PS_HEARTBEAT_INTERVAL", "often"));
        let e = cfg(&v).unwrap_err();
        assert!(e.message().contains("PS_HEARTBEAT_INTERVAL"), "{e}");
        let mut v = BASE.to_vec();
        v[0] = ("DMLC_ROLE", "boss");
        assert!(cfg(&v).unwrap_err().message().contains("boss"));
        let mut v = BASE.to_vec();
        v.push(("MXKV_TIMEOUT_S", "0"));
        assert!(cfg(&v).unwrap_err().message().contains("MXKV_TIMEOUT_S"));
        let mut v = BASE.to_vec();
        v.push(("DMLC_PS_VAN_TYPE", "ibverbs"));
        assert!(cfg(&v)
            .unwrap_err()
            .message()
            .contains("Unsupported van type: ibverbs"));
    }

    /// Durations that would overflow an `Instant` (or panic converting to
    /// a `Duration`) are refused with the variable's name; ten years pass.
    #[test]
    fn huge_durations_are_refused_naming_the_variable() {
        for name in [
            "MXKV_TIMEOUT_S",
            "PS_HEARTBEAT_INTERVAL",
            "PS_HEARTBEAT_TIMEOUT",
        ] {
            for bad in ["1e20", "1e19", "315576001", "inf", "NaN", "-1"] {
                let mut v = BASE.to_vec();
                v.push((name, bad));
                let e = cfg(&v).unwrap_err();
                assert_eq!(e.kind(), crate::error::ErrorKind::Usage, "{name}={bad}");
                assert!(e.message().contains(name), "{name}={bad}: {e}");
            }
            let mut v = BASE.to_vec();
            v.push((name, "315576000"));
            let c = cfg(&v).unwrap();
            let d = Duration::from_secs(315_576_000);
            assert_eq!(
                [c.timeout, c.heartbeat_interval, c.heartbeat_timeout]
                    .iter()
                    .filter(|x| **x == d)
                    .count(),
                1
            );
            // the largest accepted value still makes a deadline
            assert!(std::time::Instant::now().checked_add(d * 4).is_some());
        }
        let mut v = BASE.to_vec();
        v.push(("PS_RESEND_TIMEOUT", "18446744073709551615"));
        let e = cfg(&v).unwrap_err();
        assert!(e.message().contains("PS_RESEND_TIMEOUT"), "{e}");
        let mut v = BASE.to_vec();
        v.push(("PS_RESEND_TIMEOUT", "315576000000"));
        assert_eq!(
            cfg(&v).unwrap().resend_timeout,
            Duration::from_secs(315_576_000)
        );
    }

    #[test]
    fn loopback_interface() {
        let mut v = BASE.to_vec();
        v.push(("DMLC_INTERFACE", "lo"));
        assert_eq!(cfg(&v).unwrap().host().unwrap(), "127.0.0.1");
        let mut v = BASE.to_vec();
        v.push(("DMLC_INTERFACE", "no-such-if0"));
        let e = cfg(&v).unwrap().host().unwrap_err();
        assert!(e.message().contains("failed to get the interface"), "{e}");
    }
}
