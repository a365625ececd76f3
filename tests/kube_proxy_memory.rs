//! A guard on what kube-proxy's sync planning holds, in heap bytes, at 10,000 Services of 10
//! endpoints each: the record of the kernel's table kept between syncs (`KernelView`), and the
//! peak while a first full sync is planned (the wanted state aside). Both grow with the
//! cluster and stay for the life of the process or set its peak RSS, and a change of a type's
//! layout (a vector where a boxed slice was, a second copy of a value) would pass every other
//! test.
//!
//! This binary's global allocator counts the bytes requested and freed on the thread that
//! marks itself, so the figures are exact and do not move with the allocator or the machine.
//! The ceilings sit a little above the figures measured when they were set; a change that
//! raises one on purpose raises its ceiling in the same commit and says why.

#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Instant;

use kube_traffic::kube_proxy::model::{IpFamily, Protocol, ServiceName};
use kube_traffic::kube_proxy::nft::objects::Transaction;
use kube_traffic::kube_proxy::ruleset::sync::{KernelView, SyncKind};
use kube_traffic::kube_proxy::testing::scenario::{Net, Scenario, READY};

const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;

/// Bytes the view may keep per Service once the first sync is in (measured: 721).
const CEILING_VIEW_PER_SERVICE: i64 = 800;
/// Bytes the planning of the first sync may hold at its peak, per Service (measured: 1,883).
const CEILING_PLAN_PEAK_PER_SERVICE: i64 = 2_100;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
}

fn count(delta: i64) {
    // `try_with`: the allocator is also called while thread-locals are being torn down.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = LIVE.try_with(|live| {
            let now = live.get() + delta;
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
    }
}

fn live() -> i64 {
    LIVE.with(Cell::get)
}

/// Starts the peak again from what is live now.
fn reset_peak() {
    PEAK.with(|peak| peak.set(live()));
}

fn peak() -> i64 {
    PEAK.with(Cell::get)
}

/// Counts the bytes of the marked thread.
struct Counting;

// SAFETY: every method forwards to `System` with the caller's arguments unchanged and only
// adds bookkeeping in thread-locals of plain integers, which neither allocates nor touches the
// memory, so `System`'s guarantees are the allocator's guarantees.
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

fn scenario() -> Scenario {
    let mut s = Scenario::default();
    for i in 0..SERVICES {
        let ip = IpAddr::from([172, 30, (i / 250) as u8, (i % 250) as u8 + 1]);
        let mut svc = s
            .service("ns", &format!("svc{i}"), ip)
            .port("p80", Protocol::Tcp, 80, 0);
        for j in 0..ENDPOINTS {
            let ep = IpAddr::from([10, 180 + j as u8, (i / 250) as u8, (i % 250) as u8 + 1]);
            svc = svc.endpoint("p80", ep, 8080, READY);
        }
        svc.done();
    }
    s
}

fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[test]
fn the_view_and_the_first_sync_plan_stay_under_their_ceilings() {
    COUNTING.with(|c| c.set(true));
    let settings = Net::of(IpFamily::V4).settings();
    let wanted = scenario();
    let mut view = KernelView::new();

    let before = live();
    reset_peak();
    let mut plan = wanted.plan(&view, &settings, SyncKind::Full, &HashSet::new());
    let plan_peak = peak() - before;
    let plan_held = live() - before;
    let operations = plan.tx.len();
    // The transaction goes to the kernel and is dropped before the view takes the plan.
    drop(std::mem::replace(
        &mut plan.tx,
        Transaction::new(IpFamily::V4),
    ));
    view.commit(plan, Instant::now());
    let view_bytes = live() - before;

    // A partial sync plans from the view: it must still know every Service.
    let changed: HashSet<ServiceName> = [ServiceName::new("ns", "svc5")].into();
    let partial = wanted.plan(&view, &settings, SyncKind::Partial, &changed);
    COUNTING.with(|c| c.set(false));

    let n = SERVICES as i64;
    eprintln!(
        "{SERVICES} Services x {ENDPOINTS} endpoints: {operations} operations; planning peak \
         {:.2} MiB ({} B per Service, ceiling {CEILING_PLAN_PEAK_PER_SERVICE}), the plan \
         {:.2} MiB; view {:.2} MiB ({} B per Service, ceiling {CEILING_VIEW_PER_SERVICE})",
        mib(plan_peak),
        plan_peak / n,
        mib(plan_held),
        mib(view_bytes),
        view_bytes / n,
    );
    assert_eq!(view.counts().0, SERVICES, "the view knows every Service");
    assert!(
        partial.kind == SyncKind::Partial && !partial.tx.is_empty(),
        "a partial sync plans from the view"
    );
    assert!(
        view_bytes <= CEILING_VIEW_PER_SERVICE * n,
        "the view holds {view_bytes} B, over {CEILING_VIEW_PER_SERVICE} B per Service"
    );
    assert!(
        plan_peak <= CEILING_PLAN_PEAK_PER_SERVICE * n,
        "planning peaked at {plan_peak} B, over {CEILING_PLAN_PEAK_PER_SERVICE} B per Service"
    );
}
