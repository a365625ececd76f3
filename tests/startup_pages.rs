//! Releasing start-up pages (src/lifecycle/startup_pages.rs) in a process of its own: the
//! capture must happen before other threads start, which a shared test binary cannot promise.

use konnectivity_server::lifecycle::startup_pages::{Released, StartupMappings};

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("field")
}

/// The anonymous KiB of each read-only file mapping holding copied-on-write pages.
fn relocated_read_only() -> Vec<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let mut out = Vec::new();
    let mut current: Option<(bool, u64, u64)> = None;
    let mut flush = |c: Option<(bool, u64, u64)>| {
        if let Some((true, _, anon)) = c {
            if anon > 0 {
                out.push(anon);
            }
        }
    };
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            flush(current.take());
            let perms = fields.next().unwrap_or("");
            let inode = fields.nth(2).unwrap_or("0");
            current = Some((perms.starts_with("r-") && inode != "0", 0, 0));
        } else if let Some(c) = current.as_mut() {
            let kib = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            match first {
                "Rss:" => c.1 = kib,
                "Anonymous:" => c.2 = kib,
                _ => {}
            }
        }
    }
    flush(current);
    out
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
    let before = status_kib("RssFile:");
    let relocated_before = relocated_read_only();
    let released = mappings.release().expect("release");
    let after = status_kib("RssFile:");
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
