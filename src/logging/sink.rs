//! Where klog lines go: klog's log file (capped in size), and the batched writer thread each
//! output gets, which `finish` drains.

/// klog's file output: `--log-file`, or `<--log-dir>/<program>.log`, used when
/// `--logtostderr=false` (klog ignores both otherwise). The file restarts empty once it
/// reaches `--log-file-max-size` MB (0: unlimited), so it cannot fill the disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileSink {
    pub path: std::path::PathBuf,
    pub max_bytes: u64,
    /// `--alsologtostderr`: also write to stderr.
    pub also_stderr: bool,
}

impl FileSink {
    pub fn from_klog(
        program: &str,
        logtostderr: bool,
        log_file: &str,
        log_dir: &str,
        max_mb: u64,
        also: bool,
    ) -> Option<FileSink> {
        if logtostderr {
            return None;
        }
        let path = if !log_file.is_empty() {
            std::path::PathBuf::from(log_file)
        } else if !log_dir.is_empty() {
            std::path::Path::new(log_dir).join(format!("{program}.log"))
        } else {
            return None;
        };
        Some(FileSink {
            path,
            max_bytes: max_mb.saturating_mul(1 << 20),
            also_stderr: also,
        })
    }
}

/// A log file that starts over when it reaches its cap.
pub(super) struct CappedFile {
    file: std::fs::File,
    written: u64,
    max_bytes: u64,
}

impl std::io::Write for CappedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.max_bytes > 0 && self.written + buf.len() as u64 > self.max_bytes {
            self.file.set_len(0)?;
            std::io::Seek::seek(&mut self.file, std::io::SeekFrom::Start(0))?;
            self.written = 0;
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

pub(super) fn open_capped(sink: &FileSink) -> std::io::Result<CappedFile> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&sink.path)?;
    let written = file.metadata()?.len();
    Ok(CappedFile {
        file,
        written,
        max_bytes: sink.max_bytes,
    })
}

/// How long the log writer waits after writing a batch before it takes the next one. Under a
/// burst (thousands of tunnels a second, 6 or 7 lines each at `-v=4`) the lines of that window
/// go out in one write(2) instead of one each; a quiet server's line is written at once. Lines
/// wait at most this long.
const BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);
/// Lines the writer thread may hold: 10 ms of 400,000 lines a second. When stderr or the file
/// cannot keep up, logging blocks (no line is lost, as when every line was written in place)
/// rather than growing memory. The channel's slots are allocated up front, 32 bytes
/// each (128 KiB); tracing-appender's default of 128,000 would keep 4 MB resident.
const BUFFERED_LINES: usize = 4_096;
/// What one batch may gather before it is written.
const BATCH_BYTES: usize = 64 * 1024;

/// The output below the batching buffer: `flush` ends a batch, so it is where the writer
/// thread waits for the next window (see [`BATCH_WINDOW`]).
struct Paced<W>(W);

impl<W: std::io::Write> std::io::Write for Paced<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let flushed = self.0.flush();
        std::thread::sleep(BATCH_WINDOW);
        flushed
    }
}

/// The writer threads' guards: dropping one writes what its thread still holds.
static WRITERS: std::sync::Mutex<Vec<tracing_appender::non_blocking::WorkerGuard>> =
    std::sync::Mutex::new(Vec::new());

/// A writer for stderr or the log file whose lines are written by a thread of its own
/// (tracing-appender), in batches. Lines are whole and in order; none is dropped.
pub(super) fn batched<W: std::io::Write + Send + 'static>(
    output: W,
    thread: &str,
) -> tracing_appender::non_blocking::NonBlocking {
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(BUFFERED_LINES)
        .thread_name(thread)
        .finish(std::io::BufWriter::with_capacity(
            BATCH_BYTES,
            Paced(output),
        ));
    WRITERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(guard);
    writer
}

/// Writes out every line still held for stderr or the log file. Call it before the process
/// ends (a return from `main`, `std::process::exit`) and before printing to stderr directly,
/// so nothing is lost or out of order. Lines logged after it are dropped.
pub fn finish() {
    let guards = std::mem::take(
        &mut *WRITERS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    drop(guards);
}
