//! The scheduler's half of the protocol (ps-lite `Van::ProcessAddNodeCommand
//! AtScheduler`, `ProcessBarrierCommand`, `ProcessHearbeat`), run on the
//! scheduler's receive thread, and [`run`], a whole scheduler node.
//!
//! Ids: once `DMLC_NUM_SERVER + DMLC_NUM_WORKER` nodes registered, they are
//! sorted with ps-lite's comparator — `(a.hostname.compare(b.hostname) |
//! (a.port < b.port)) > 0`, which is hostname descending, then port
//! ascending — and numbered in that order, servers `8 + 2r` and workers
//! `9 + 2r`. The reply lists the sorted nodes and the scheduler last and goes
//! to every worker, then every server, by rank.
#![forbid(unsafe_code)]

use super::config::Config;
use super::message::{Command, Control, Message, Node, Role, EMPTY};
use super::postoffice::{
    group_members, group_name, peer_name, sender_name, server_rank_to_id, worker_rank_to_id,
    Postoffice, ALL_GROUP, SERVER_GROUP, WORKER_GROUP,
};
use crate::error::{Error, Result};
use std::cmp::Ordering as CmpOrdering;
use std::time::Instant;

/// Runs a scheduler node until the cluster finishes (the final barrier on
/// group 7) or fails (registration or start-up past the deadline, a lost
/// node): what `import mxnet` does with `DMLC_ROLE=scheduler`.
pub fn run(config: Config) -> Result<()> {
    if config.role != Role::Scheduler {
        return Err(Error::usage(format!(
            "scheduler::run needs DMLC_ROLE=scheduler, not {}",
            config.role
        )));
    }
    let po = Postoffice::start(config)?;
    po.finalize(true)
}

/// A scheduler running on its own thread (for tests and embedding).
pub struct SchedulerThread {
    port: u16,
    thread: std::thread::JoinHandle<Result<()>>,
}

impl SchedulerThread {
    /// The port the scheduler is bound to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits for the scheduler to finish; its result.
    pub fn join(self) -> Result<()> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(Error::new("the scheduler thread panicked")))
    }
}

/// Binds a scheduler (a `root_port` of 0 takes a free port) and runs it on a
/// new thread.
pub fn spawn(config: Config) -> Result<SchedulerThread> {
    if config.role != Role::Scheduler {
        return Err(Error::usage(format!(
            "scheduler::spawn needs role scheduler, not {}",
            config.role
        )));
    }
    let po = Postoffice::bind(config)?;
    let port = po.port();
    let thread = std::thread::Builder::new()
        .name("mxkv-scheduler".into())
        .spawn(move || {
            po.wait_ready()?;
            po.log_ready();
            po.barrier(0, ALL_GROUP)?;
            po.finalize(true)
        })
        .map_err(|e| Error::new(format!("cannot start the scheduler thread: {e}")))?;
    Ok(SchedulerThread { port, thread })
}

/// ps-lite's node order for id assignment.
pub fn node_order(a: &Node, b: &Node) -> CmpOrdering {
    b.hostname
        .as_bytes()
        .cmp(a.hostname.as_bytes())
        .then(a.port.cmp(&b.port))
}

/// Why a registering node's address cannot be connected to, if it cannot.
fn bad_address(node: &Node) -> Option<&'static str> {
    if node.hostname.is_empty() {
        Some("no hostname")
    } else if node.hostname.contains('\0') {
        Some("the hostname holds a NUL byte")
    } else if !(1..=65535).contains(&node.port) {
        Some("the port is not 1..65535")
    } else {
        None
    }
}

pub(crate) fn on_add_node(po: &Postoffice, msg: Message) {
    let Some(ctl) = msg.control else { return };
    let Some(node) = ctl.nodes.into_iter().next() else {
        po.van.drop_message(&format!(
            "an ADD_NODE without a node from {}",
            sender_name(msg.sender)
        ));
        return;
    };
    if node.role == Role::Scheduler {
        po.van.drop_message(&format!(
            "an ADD_NODE from another scheduler ({}:{})",
            node.hostname, node.port
        ));
        return;
    }
    // Every node connects to this address: one that cannot be an address
    // would fail the whole cluster once the last node registered (a NUL
    // byte made the receive thread panic in the `zmq` crate).
    if let Some(why) = bad_address(&node) {
        po.van.drop_message(&format!(
            "the registration of a {} at {:?}:{}: {why}",
            node.role, node.hostname, node.port
        ));
        return;
    }
    let cfg = po.config();
    let total = cfg.num_worker + cfg.num_server;
    let sorted = {
        let mut st = po.state.lock();
        let reg = &st.sched.registered;
        let count = |r: Role| reg.iter().filter(|n| n.role == r).count();
        let limit = match node.role {
            Role::Worker => cfg.num_worker,
            _ => cfg.num_server,
        };
        let why = if st.ready {
            Some("the cluster is complete".to_string())
        } else if reg
            .iter()
            .any(|n| n.hostname == node.hostname && n.port == node.port)
        {
            Some("a node at that address registered already".to_string())
        } else if count(node.role) >= limit {
            Some(format!("all {limit} have registered"))
        } else {
            None
        };
        if let Some(why) = why {
            drop(st);
            po.van.drop_message(&format!(
                "the registration of a {} at {}:{}: {why}",
                node.role, node.hostname, node.port
            ));
            return;
        }
        let reg = &mut st.sched.registered;
        reg.push(node);
        if reg.len() < total {
            return;
        }
        let mut sorted = std::mem::take(reg);
        sorted.sort_by(node_order);
        let (mut s, mut w) = (0, 0);
        for n in &mut sorted {
            if n.role == Role::Server {
                n.id = server_rank_to_id(s);
                s += 1;
            } else {
                n.id = worker_rank_to_id(w);
                w += 1;
            }
        }
        sorted
    };
    for n in &sorted {
        if let Err(e) = po.van.connect(n.id, &n.hostname, n.port) {
            let mut st = po.state.lock();
            st.fatal = Some(Error::peer_lost(format!(
                "the scheduler cannot connect to {} at {}:{}: {e}",
                peer_name(n.id),
                n.hostname,
                n.port
            )));
            po.cond.notify_all();
            return;
        }
    }
    let mut nodes = sorted;
    nodes.push(Node {
        role: Role::Scheduler,
        id: 1,
        hostname: cfg.root_uri.clone(),
        port: i32::from(po.port()),
        is_recovery: false,
        customer_id: 0,
        lane_port: None,
    });
    {
        let mut st = po.state.lock();
        let now = Instant::now();
        for n in &nodes {
            st.heartbeats.insert(n.id, now);
        }
        st.nodes = nodes.clone();
    }
    for id in group_members(ALL_GROUP & !1, cfg.num_worker, cfg.num_server) {
        let mut ctl = Control::new(Command::AddNode);
        ctl.nodes = nodes.clone();
        if let Err(e) = po.send_control(id, ctl, false, EMPTY, EMPTY) {
            eprintln!("[mxkv scheduler] ADD_NODE reply to {}: {e}", peer_name(id));
        }
    }
    po.state.lock().ready = true;
    po.cond.notify_all();
}

pub(crate) fn on_barrier_request(po: &Postoffice, msg: Message) {
    let Some(ctl) = &msg.control else { return };
    let group = ctl.barrier_group;
    if !(1..=7).contains(&group) {
        po.van.drop_message(&format!(
            "a barrier request for group {group} from {}: not a group (1..7)",
            sender_name(msg.sender)
        ));
        return;
    }
    let members = po.group_members(group);
    let last = (msg.app_id, msg.customer_id);
    let release = {
        let mut st = po.state.lock();
        // Only a member of the group counts, once per barrier: a request
        // from a peer without an id, from a node outside the group (a
        // request for group 1 from anyone but the scheduler itself), before
        // the nodes have their ids, or a second one from the same node
        // would release the group early.
        let why = if !st.ready {
            Some("before every node registered")
        } else if !members.contains(&msg.sender) {
            Some("not a member of the group")
        } else if st
            .sched
            .barrier_requests
            .get(&group)
            .is_some_and(|asked| asked.contains(&msg.sender))
        {
            Some("it asked already in this barrier")
        } else {
            None
        };
        if let Some(why) = why {
            drop(st);
            po.van.drop_message(&format!(
                "a barrier request for group {group} ({}) from {}: {why}",
                group_name(group),
                sender_name(msg.sender)
            ));
            return;
        }
        st.sched.barrier_last.insert(group, last);
        let asked = st.sched.barrier_requests.entry(group).or_default();
        asked.push(msg.sender);
        if po.config().verbose >= 1 {
            eprintln!(
                "[mxkv scheduler] Barrier count for {group} : {}",
                asked.len()
            );
        }
        if asked.len() >= members.len() {
            asked.clear();
            true
        } else {
            false
        }
    };
    if release {
        for id in members {
            let mut ctl = Control::new(Command::Barrier);
            ctl.barrier_group = group;
            if let Err(e) = po.send_control(id, ctl, false, last.0, last.1) {
                eprintln!("[mxkv scheduler] barrier release to {}: {e}", peer_name(id));
            }
        }
    }
}

pub(crate) fn on_heartbeat(po: &Postoffice, msg: Message) {
    // A node's heartbeat comes from its DEALER (identity ps<id>) and lists
    // that node (ps-lite's `Van::Heartbeat`): it counts for its sender only,
    // whatever it lists (another peer must not keep a lost node alive), and
    // only from a node of the cluster (nobody else has a socket for the
    // answer, and the entries of strangers would pile up).
    if msg.sender == EMPTY {
        po.van
            .drop_message(&format!("a heartbeat from {}", sender_name(msg.sender)));
        return;
    }
    if !po
        .group_members(WORKER_GROUP | SERVER_GROUP)
        .contains(&msg.sender)
    {
        po.van.drop_message(&format!(
            "a heartbeat from {}, which is not a node of this cluster",
            sender_name(msg.sender)
        ));
        return;
    }
    po.state
        .lock()
        .heartbeats
        .insert(msg.sender, Instant::now());
    let me = po.my_node.lock().clone();
    let mut reply = Control::new(Command::Heartbeat);
    reply.nodes.push(Node {
        hostname: po.config().root_uri.clone(),
        ..me
    });
    if let Err(e) = po.send_control(msg.sender, reply, false, EMPTY, EMPTY) {
        eprintln!(
            "[mxkv scheduler] heartbeat answer to {}: {e}",
            sender_name(msg.sender)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(host: &str, port: i32) -> Node {
        Node {
            role: Role::Worker,
            id: EMPTY,
            hostname: host.into(),
            port,
            is_recovery: false,
            customer_id: 0,
            lane_port: None,
        }
    }

    #[test]
    fn ps_lite_order() {
        let mut v = vec![
            n("127.0.0.1", 9303),
            n("127.0.0.1", 9301),
            n("10.0.0.2", 1),
            n("10.0.0.10", 5),
        ];
        v.sort_by(node_order);
        let got: Vec<(String, i32)> = v.into_iter().map(|n| (n.hostname, n.port)).collect();
        assert_eq!(
            got,
            vec![
                ("127.0.0.1".into(), 9301),
                ("127.0.0.1".into(), 9303),
                ("10.0.0.2".into(), 1),
                ("10.0.0.10".into(), 5)
            ]
        );
    }
}
