//! Releasing start-up pages (src/lifecycle/startup_pages.rs) in a process of its own: the
//! capture must happen before other threads start, which a shared test binary cannot promise.

use kube_traffic::lifecycle::startup_pages::{Released, StartupMappings};

use procfs::process::{MMPermissions, Process};

fn rss_file_kib() -> u64 {
    let status = Process::myself().and_then(|p| p.status()).expect("status");
    status.rssfile.expect("RssFile in status")
}

/// The anonymous bytes of each read-only file mapping holding copied-on-write pages.
fn relocated_read_only() -> Vec<u64> {
    let maps = Process::myself().and_then(|p| p.smaps()).expect("smaps");
    maps.iter()
        .filter(|m| m.inode != 0 && !m.perms.contains(MMPermissions::WRITE))
        .filter_map(|m| m.extension.map.get("Anonymous").copied())
        .filter(|&anon| anon > 0)
        .collect()
}

#[test]
fn startup_pages_are_released_and_the_program_runs_on() {
    // This binary is single-threaded here: the harness runs its only test on a thread of
    // its own, but no other test exists to start more.
    let mappings = StartupMappings::capture().expect("capture");
    assert_eq!(
        StartupMappings::default().release().expect("release"),
        Released::default(),
        "nothing captured, nothing released"
    );
    let before = rss_file_kib();
    let relocated_before = relocated_read_only();
    let released = mappings.release().expect("release");
    let after = rss_file_kib();
    assert!(
        released.mappings >= 2,
        "the executable's text and constants: {released:?}"
    );
    assert!(released.bytes > 0, "{released:?}");
    // Megabytes were dropped; reading the status maps back a few pages at most.
    assert!(
        after < before,
        "RssFile {before} kB -> {after} kB after {released:?}"
    );
    // Mappings with pages of their own (relocated read-only data) keep every page.
    assert_eq!(relocated_read_only(), relocated_before);
    // Code and constants are mapped again on use.
    let text = format!("{:?}", (1..=1000u64).map(|i| i * i).sum::<u64>());
    assert_eq!(text, "333833500");
}
