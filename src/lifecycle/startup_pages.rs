//! Giving back the pages of code that ran only at start-up.
//!
//! Most of an idle agent's resident memory is not memory it allocated but pages of its own
//! executable and of the C library: parsing the configuration, loading certificates and the
//! first TLS handshake run once, and the kernel maps the pages of a cached file 64 KiB at a
//! time around each page fault, so start-up leaves most of the program's text resident
//! (benches/RESULTS.md measures it). Once start-up is over, [`StartupMappings::release`]
//! removes those clean pages from the process's page tables, as the kernel's reclaim would
//! under memory pressure; what runs afterwards maps its pages again from the page cache
//! (minor faults, no disk read while the file stays cached).
//!
//! Only mappings that are safe to drop are touched: file-backed, private, not writable,
//! holding no copied-on-write page (`Anonymous: 0` in smaps: the relocated read-only data
//! is excluded that way), and present when the process started ([`StartupMappings::capture`],
//! called before the runtime's threads exist), so a library that another thread maps and
//! relocates later can never be caught half set up.

use std::io;

use procfs::process::{MMPermissions, MMapPath, MemoryMap, Process};

/// Bytes a mapping holds that are not the file's own (copied on write).
const ANONYMOUS: &str = "Anonymous";
const RESIDENT: &str = "Rss";

/// What [`StartupMappings::release`] gave back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Mappings whose pages were dropped.
    pub mappings: usize,
    /// Their resident bytes before they were dropped.
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Region {
    start: u64,
    end: u64,
    inode: u64,
    perms: MMPermissions,
}

impl Region {
    fn of(map: &MemoryMap) -> Region {
        Region {
            start: map.address.0,
            end: map.address.1,
            inode: map.inode,
            perms: map.perms,
        }
    }
}

/// The read-only file mappings of the process as it started: the executable's text and
/// read-only data and those of the libraries it was linked with.
#[derive(Debug, Default)]
pub struct StartupMappings {
    regions: Vec<Region>,
}

fn read_only_file(map: &MemoryMap) -> bool {
    matches!(map.pathname, MMapPath::Path(_))
        && map.inode != 0
        && map.perms.contains(MMPermissions::PRIVATE)
        && !map.perms.contains(MMPermissions::WRITE)
}

fn proc_error(e: procfs::ProcError) -> io::Error {
    io::Error::other(e.to_string())
}

impl StartupMappings {
    /// Records the process's read-only file mappings. Call it before the runtime (or any
    /// thread that could load a library) starts, so that none is a library being loaded.
    pub fn capture() -> io::Result<StartupMappings> {
        let maps = Process::myself()
            .and_then(|p| p.maps())
            .map_err(proc_error)?;
        Ok(StartupMappings {
            regions: maps
                .iter()
                .filter(|m| read_only_file(m))
                .map(Region::of)
                .collect(),
        })
    }

    /// Drops the resident pages of every recorded mapping that is still the same mapping and
    /// holds no page of its own. The program behaves exactly as before: those pages are
    /// copies of the file, mapped again on their next use.
    ///
    /// Whatever runs after a mapping is dropped maps its pages back, so the choice is made
    /// first, the smaps are freed before any page is dropped, and the mapping holding this
    /// code goes last: after it only the return path runs, which the executable's symbol
    /// order places with the code an idle agent runs anyway.
    pub fn release(&self) -> io::Result<Released> {
        let now = Process::myself()
            .and_then(|p| p.smaps())
            .map_err(proc_error)?;
        let mut released = Released::default();
        let mut ranges = Vec::new();
        for map in now.iter() {
            let region = Region::of(map);
            let anonymous = map.extension.map.get(ANONYMOUS).copied();
            if !read_only_file(map) || anonymous != Some(0) || !self.regions.contains(&region) {
                continue;
            }
            let Ok(len) = usize::try_from(region.end - region.start) else {
                continue;
            };
            ranges.push((region.start, len));
            released.mappings += 1;
            released.bytes += map.extension.map.get(RESIDENT).copied().unwrap_or(0);
        }
        drop(now);
        let here = drop_pages as *const () as usize as u64;
        ranges.sort_by_key(|&(start, len)| (start..start + len as u64).contains(&here));
        for (start, len) in ranges {
            drop_pages(start, len)?;
        }
        Ok(released)
    }
}

/// Drops the resident pages of `len` bytes at `start`, one clean read-only file mapping
/// (checked by the caller from smaps). Kept out of line: benches/profile/agent-order.sh starts
/// recording at its last call.
#[inline(never)]
#[allow(unsafe_code)] // a documented site: see the SAFETY note
fn drop_pages(start: u64, len: usize) -> io::Result<()> {
    // SAFETY: the range is exactly one mapping of the process, private, not writable and
    // without a single copied-on-write page (the caller read its smaps entry), recorded before
    // the runtime's threads existed, so no other thread can have replaced it with a mapping
    // of its own. For such a mapping MADV_DONTNEED only removes page-table entries: the next
    // access maps the same bytes of the same file again. No Rust object lives there (only
    // code and constants, which nothing writes), so no value is changed or freed.
    let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Captures the start-up mappings, or says why it cannot (no /proc): the program runs the
/// same, keeping its start-up pages resident.
pub fn capture() -> Option<StartupMappings> {
    match StartupMappings::capture() {
        Ok(mappings) => Some(mappings),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the process's mappings; start-up pages stay resident");
            None
        }
    }
}

/// Releases the start-up pages and logs what it gave back. It runs on the calling task's
/// thread, once: reading the smaps takes about a millisecond, and a blocking-pool thread
/// would run its own start and exit code (mapping pages of it again) for this one call.
pub fn release(mappings: StartupMappings) {
    match mappings.release() {
        Ok(released) => tracing::info!(
            v = 2,
            mappings = released.mappings,
            bytes = released.bytes,
            "released the pages of start-up code"
        ),
        Err(e) => tracing::debug!(error = %e, "cannot release the pages of start-up code"),
    }
}
