//! A guard on what an idle tunnel and an idle agent connection cost the server in heap bytes.
//!
//! The figures come from small patches to h2 and rustls (`vendor/`) and from the server's own
//! buffer discipline; a dependency update that brings the crates' per-connection buffers back
//! would otherwise pass every other test. The server runs on a runtime of its own whose
//! threads are marked, and this binary's global allocator counts the bytes live on marked
//! threads only, so the test clients (tonic, on another runtime) are not counted. The figure
//! is exact (bytes requested, not pages), so it does not move with the allocator or the
//! machine.
//!
//! The ceilings sit a little above the figures measured when they were set. If a change
//! raises a figure on purpose, raise its ceiling in the same commit and say why.

#![allow(clippy::unwrap_used)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use common::{dial_req, dial_rsp, Frontend, Harness, TestAgent, Tunnel};

/// Heap bytes the server may hold per idle established gRPC tunnel (one HTTP/2 connection
/// over the Unix socket with one `Proxy` stream, as kube-apiserver opens one per dial).
const CEILING_PER_TUNNEL: i64 = 11 * 1024;
/// Heap bytes the server may hold per idle agent (one TLS + HTTP/2 connection with one
/// `Connect` stream).
const CEILING_PER_AGENT: i64 = 21 * 1024;

const TUNNELS: usize = 300;
const AGENTS: usize = 100;

/// Counts live heap bytes allocated and freed on the server's threads. An allocation made
/// there and freed elsewhere (or the reverse) would skew the count; the server shares no heap
/// objects with the clients, which only talk to it over sockets.
struct Counting;

static SERVER_LIVE: AtomicI64 = AtomicI64::new(0);

thread_local! {
    static ON_SERVER_THREAD: Cell<bool> = const { Cell::new(false) };
}

fn on_server_thread() -> bool {
    // `try_with`: the allocator is also called while thread-locals are being torn down.
    ON_SERVER_THREAD.try_with(Cell::get).unwrap_or(false)
}

fn count(delta: i64) {
    if on_server_thread() {
        SERVER_LIVE.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged and only
// adds bookkeeping that neither allocates nor touches the memory, so `System`'s guarantees
// are the allocator's guarantees.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged (see the impl).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged (see the impl).
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged (see the impl).
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged (see the impl).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The server's live bytes once it has settled: the least of several readings a little apart,
/// so a PING or a timer that happens to be in flight at one reading does not count.
fn settled_live_bytes(client: &tokio::runtime::Runtime) -> i64 {
    client.block_on(async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut least = i64::MAX;
        for _ in 0..10 {
            least = least.min(SERVER_LIVE.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        least
    })
}

/// `n` frontends, each on its own connection with one established tunnel through `agent`.
async fn open_tunnels(
    harness: &Harness,
    agent: &mut TestAgent,
    first_id: i64,
    n: usize,
) -> Vec<(Frontend, Tunnel)> {
    let mut open = Vec::with_capacity(n);
    for i in 0..n as i64 {
        let id = first_id + i;
        let frontend = harness.frontend().await;
        let mut tunnel = frontend.open().await;
        tunnel.send(dial_req("10.0.0.1:443", id)).await;
        assert_eq!(agent.recv().await, dial_req("10.0.0.1:443", id));
        agent.send(dial_rsp(id, id, "")).await;
        assert_eq!(tunnel.recv().await, dial_rsp(id, id, ""));
        open.push((frontend, tunnel));
    }
    open
}

#[test]
fn idle_tunnels_and_agents_cost_the_server_no_more_than_their_ceilings() {
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(|| ON_SERVER_THREAD.with(|on| on.set(true)))
        .build()
        .unwrap();
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Started from a task, so even the server's start-up runs on its own threads.
    let harness = server.block_on(server.spawn(Harness::start())).unwrap();

    // Tunnels. A few first, so that whatever is created once (the agent's session, maps'
    // first growth, lazily built statics) is in the baseline.
    let mut agent = client.block_on(harness.agent("guard-agent"));
    let warm = client.block_on(open_tunnels(&harness, &mut agent, 1, 20));
    let before = settled_live_bytes(&client);
    let tunnels = client.block_on(open_tunnels(&harness, &mut agent, 1_000, TUNNELS));
    assert_eq!(harness.gauges(), (0, (20 + TUNNELS) as i64));
    let after = settled_live_bytes(&client);
    let per_tunnel = (after - before) / TUNNELS as i64;

    // Agents, the same way.
    let warm_agents: Vec<TestAgent> = client.block_on(async {
        let mut agents = Vec::new();
        for i in 0..5 {
            agents.push(harness.agent(&format!("warm-{i}")).await);
        }
        agents
    });
    let before_agents = settled_live_bytes(&client);
    let agents: Vec<TestAgent> = client.block_on(async {
        let mut agents = Vec::new();
        for i in 0..AGENTS {
            agents.push(harness.agent(&format!("idle-{i}")).await);
        }
        agents
    });
    client.block_on(harness.wait_agents(1 + 5 + AGENTS));
    let after_agents = settled_live_bytes(&client);
    let per_agent = (after_agents - before_agents) / AGENTS as i64;

    println!(
        "MEMORY-GUARD server heap per idle tunnel {per_tunnel} B (ceiling {CEILING_PER_TUNNEL}), \
         per idle agent {per_agent} B (ceiling {CEILING_PER_AGENT})"
    );
    assert!(
        per_tunnel > 0 && per_agent > 0,
        "the count saw nothing: the server's threads are not the ones counted"
    );
    assert!(
        per_tunnel <= CEILING_PER_TUNNEL,
        "an idle tunnel costs the server {per_tunnel} heap bytes, over its ceiling of \
         {CEILING_PER_TUNNEL}: did a dependency update bring per-connection buffers back \
         (vendor/README.md)?"
    );
    assert!(
        per_agent <= CEILING_PER_AGENT,
        "an idle agent costs the server {per_agent} heap bytes, over its ceiling of \
         {CEILING_PER_AGENT}: did a dependency update bring per-connection buffers back \
         (vendor/README.md)?"
    );

    drop((warm, tunnels, agent, warm_agents, agents));
    let _enter = server.enter();
    drop(harness);
}
