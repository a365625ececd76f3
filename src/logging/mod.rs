//! Logs, written as klog writes them so that parsers built for the Go proxy-server keep working:
//! `I1130 08:05:22.054317   24735 server.rs:137] "msg" key="value"` on stderr (or the klog
//! log file), journald with structured fields when systemd runs us; and klog's verbosity rules.
//!
//! Verbosity follows klog: errors and warnings always show; an info line carries its V level in
//! a `v` field (`tracing::info!(v = 3, ...)`, none meaning V0) and shows when that level is at
//! most `-v`, or at most the `--vmodule` level of the file it comes from; `tracing::debug!` is
//! V5 and `tracing::trace!` V6. `--vmodule` matches as klog does: `pattern=N`, the pattern a
//! file name without its extension (`grpc`, `dispatch`) or a glob of one (`http_*`), and a
//! match can only raise the level. Other crates log warnings and errors only. `RUST_LOG`, when
//! set, replaces all of this with a tracing `EnvFilter`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::RwLock;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::LogFormat;

mod sink;

use sink::{batched, open_capped};
pub use sink::{finish, FileSink};

/// Our targets: the library (`kube_traffic`) and the programs (`konnectivity_server`,
/// `konnectivity_agent`, `kube_proxy`). Other crates' lines show only at warning and above.
const OURS: [&str; 3] = ["kube_traffic", "konnectivity_", "kube_proxy"];

/// `-v`.
static VERBOSITY: AtomicI64 = AtomicI64::new(4);
/// `--vmodule`, parsed: (file pattern, level), first match wins, as klog.
static VMODULE: RwLock<Vec<(String, i64)>> = RwLock::new(Vec::new());

/// Sets `-v` and `--vmodule` for every klog filter, at once (start-up and reload).
pub fn set_verbosity(verbosity: u32, vmodule: &str) {
    VERBOSITY.store(i64::from(verbosity), Ordering::Relaxed);
    *VMODULE.write().unwrap_or_else(|p| p.into_inner()) = parse_vmodule(vmodule);
    tracing::callsite::rebuild_interest_cache();
}

/// `pattern=N,...`; entries that do not parse are skipped (the flag was validated already).
pub fn parse_vmodule(vmodule: &str) -> Vec<(String, i64)> {
    vmodule
        .split(',')
        .filter_map(|entry| {
            let (pattern, level) = entry.split_once('=')?;
            let level = level.trim().parse::<i64>().ok()?;
            // Accept the module paths our earlier releases documented (`backend::dispatch`):
            // their last segment is the file name.
            let pattern = pattern.trim().rsplit("::").next().unwrap_or_default();
            let pattern = pattern.rsplit('/').next().unwrap_or_default();
            let pattern = pattern.strip_suffix(".rs").unwrap_or(pattern);
            (!pattern.is_empty()).then(|| (pattern.to_string(), level))
        })
        .collect()
}

/// Go's `filepath.Match` for one path element: `*`, `?`, and literal characters (klog only
/// calls it on a file name without its directory).
fn glob_match(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|i| glob_match(rest, &name[i..])),
        Some((b'?', rest)) => !name.is_empty() && glob_match(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && glob_match(rest, &name[1..]),
    }
}

/// The file name klog's vmodule looks at: no directory, no extension.
fn module_of(file: &str) -> &str {
    let name = file.rsplit(['/', '\\']).next().unwrap_or(file);
    name.strip_suffix(".rs").unwrap_or(name)
}

/// The V level up to which info lines of `file` show: `-v`, raised by a matching `--vmodule`.
fn threshold(file: Option<&str>) -> i64 {
    let global = VERBOSITY.load(Ordering::Relaxed);
    let filters = VMODULE.read().unwrap_or_else(|p| p.into_inner());
    if filters.is_empty() {
        return global;
    }
    let module = module_of(file.unwrap_or_default());
    filters
        .iter()
        .find(|(pattern, _)| glob_match(pattern.as_bytes(), module.as_bytes()))
        .map_or(global, |(_, level)| global.max(*level))
}

/// The V level a line of this level has when it carries no `v` field.
fn default_v(level: &Level) -> i64 {
    match *level {
        Level::DEBUG => 5,
        Level::TRACE => 6,
        _ => 0,
    }
}

/// What a callsite's metadata alone decides: `Some(shown)`, or `None` when its `v` field must
/// be read (an info line while the threshold is below 4, the highest info level we use).
fn decide(meta: &Metadata<'_>) -> Option<bool> {
    let level = meta.level();
    if *level <= Level::WARN {
        return Some(true);
    }
    if !OURS.iter().any(|ours| meta.target().starts_with(ours)) {
        return Some(false);
    }
    let threshold = threshold(meta.file());
    match *level {
        Level::INFO if threshold >= 4 => Some(true),
        Level::INFO => None,
        ref other => Some(default_v(other) <= threshold),
    }
}

/// klog's V-level filter, as a layer in front of the writers.
pub struct KlogFilter;

impl<S: Subscriber> Layer<S> for KlogFilter {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        match decide(meta) {
            Some(true) => Interest::always(),
            Some(false) => Interest::never(),
            None => Interest::sometimes(),
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        decide(meta).unwrap_or(true)
    }

    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if decide(meta).is_some() {
            return true;
        }
        let mut v = VField(default_v(meta.level()));
        event.record(&mut v);
        v.0 <= threshold(meta.file())
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }
}

/// Reads an event's `v` field.
struct VField(i64);

impl Visit for VField {
    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "v" {
            self.0 = value;
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "v" {
            self.0 = i64::try_from(value).unwrap_or(i64::MAX);
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// Go's `strconv.Quote`: double quotes, backslash escapes, `\x`/`\u` for what is not printable.
pub fn go_quote(text: &str, out: &mut String) {
    out.push('"');
    // Most values (ids, addresses, messages) need no escape: copy them whole.
    if text
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        out.push_str(text);
        out.push('"');
        return;
    }
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// klog's key/value rendering of a string: quoted, or, when it has line breaks, klog's
/// `key=<` block of tab-indented lines closed by ` >`.
fn push_string_value(out: &mut String, value: &str) {
    if !value.contains('\n') {
        out.push('=');
        go_quote(value, out);
        return;
    }
    out.push_str("=<\n");
    let mut rest = value;
    while let Some(i) = rest.find('\n') {
        out.push('\t');
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
    }
    if rest.is_empty() {
        out.push_str(" >");
    } else {
        out.push('\t');
        out.push_str(rest);
        out.push_str("\n >");
    }
}

/// Collects an event's message and its fields in klog's `key=value` form.
#[derive(Default)]
struct KlogFields {
    message: String,
    pairs: String,
}

impl KlogFields {
    fn key(&mut self, field: &Field) -> bool {
        if field.name() == "v" {
            return false;
        }
        self.pairs.push(' ');
        self.pairs.push_str(field.name());
        true
    }
}

impl Visit for KlogFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else if self.key(field) {
            push_string_value(&mut self.pairs, value);
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.key(field) {
            let _ = write!(self.pairs, "={value}");
        }
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.key(field) {
            let _ = write!(self.pairs, "={value}");
        }
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.key(field) {
            let _ = write!(self.pairs, "={value}");
        }
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.key(field) {
            let _ = write!(self.pairs, "={value}");
        }
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        if self.key(field) {
            push_string_value(&mut self.pairs, &value.to_string());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else if self.key(field) {
            push_string_value(&mut self.pairs, &format!("{value:?}"));
        }
    }
}

/// The buffers one thread formats its lines in, kept between lines: at `-v=4` every tunnel
/// logs 6 or 7 lines, and growing fresh strings for each was a measurable part of its CPU.
#[derive(Default)]
struct Scratch {
    fields: KlogFields,
    line: String,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Appends `value` as exactly `width` decimal digits (klog's zero-padded header fields).
fn push_digits(out: &mut String, value: u32, width: u32) {
    for place in (0..width).rev() {
        let digit = (value / 10u32.pow(place)) % 10;
        out.push(char::from(b'0' + digit as u8));
    }
}

/// klog's text format: writes each event that gets this far (the filters decided) as one line.
pub struct KlogLayer<W> {
    make_writer: W,
    /// `{pid:>7}`, formatted once.
    pid: String,
}

impl<W> KlogLayer<W> {
    pub fn new(make_writer: W) -> Self {
        KlogLayer {
            make_writer,
            pid: format!("{:>7}", std::process::id()),
        }
    }

    /// One line into `out`: header, quoted message, `key=value` pairs, newline.
    fn line(&self, event: &Event<'_>, now: &jiff::Zoned, scratch: &mut Scratch) {
        let meta = event.metadata();
        let severity = match *meta.level() {
            Level::ERROR => 'E',
            Level::WARN => 'W',
            _ => 'I',
        };
        let file = meta
            .file()
            .map(|f| f.rsplit(['/', '\\']).next().unwrap_or(f))
            .unwrap_or("???");
        let Scratch { fields, line } = scratch;
        fields.message.clear();
        fields.pairs.clear();
        event.record(fields);
        line.clear();
        line.push(severity);
        push_digits(line, u32::from(now.month().unsigned_abs()), 2);
        push_digits(line, u32::from(now.day().unsigned_abs()), 2);
        line.push(' ');
        push_digits(line, u32::from(now.hour().unsigned_abs()), 2);
        line.push(':');
        push_digits(line, u32::from(now.minute().unsigned_abs()), 2);
        line.push(':');
        push_digits(line, u32::from(now.second().unsigned_abs()), 2);
        line.push('.');
        push_digits(line, now.subsec_nanosecond().unsigned_abs() / 1000, 6);
        line.push(' ');
        line.push_str(&self.pid);
        line.push(' ');
        line.push_str(file);
        line.push(':');
        line.push_str(itoa::Buffer::new().format(meta.line().unwrap_or(0)));
        line.push_str("] ");
        go_quote(&fields.message, line);
        line.push_str(&fields.pairs);
        line.push('\n');
    }
}

impl<S, W> Layer<S> for KlogLayer<W>
where
    S: Subscriber,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + 'static,
{
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let now = jiff::Zoned::now();
        let write = |scratch: &mut Scratch| {
            self.line(event, &now, scratch);
            // As every tracing writer: a line that cannot be written is not an error to raise.
            let _ = std::io::Write::write_all(
                &mut self.make_writer.make_writer_for(event.metadata()),
                scratch.line.as_bytes(),
            );
        };
        // A value whose Debug logs would find the buffers in use: it gets fresh ones.
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => write(&mut scratch),
            Err(_) => write(&mut Scratch::default()),
        });
    }
}

/// A klog-format writer layer over `make_writer`, for the file sink, stderr and tests.
pub fn klog_layer<S, W>(make_writer: W) -> impl Layer<S> + Send + Sync
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    KlogLayer::new(make_writer)
}

/// A whole subscriber writing klog lines to `make_writer` under `-v`/`--vmodule`: what `init`
/// installs for stderr, offered to tests that capture the log.
pub fn klog_subscriber<W>(verbosity: u32, vmodule: &str, make_writer: W) -> impl Subscriber
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    set_verbosity(verbosity, vmodule);
    tracing_subscriber::registry()
        .with(KlogFilter)
        .with(klog_layer(make_writer))
}

/// systemd sets JOURNAL_STREAM when our stderr is connected to the journal.
fn run_by_systemd() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some_and(|v| !v.is_empty())
}

/// Installs the global subscriber. Returns where logs go.
pub fn init(
    program: &'static str,
    verbosity: u32,
    vmodule: &str,
    format: LogFormat,
    file: Option<FileSink>,
) -> String {
    set_verbosity(verbosity, vmodule);
    let env = EnvFilter::try_from_default_env().ok();
    let klog = env.is_none().then_some(KlogFilter);
    let want_journald = match format {
        LogFormat::Journald => true,
        LogFormat::Stderr => false,
        LogFormat::Auto => run_by_systemd() && file.is_none(),
    };
    // tracing-journald needs the journal socket; without it, fall back to stderr. The message
    // (upstream's text) goes to MESSAGE, every field to a journal field of its own.
    let journald = want_journald
        .then(|| tracing_journald::layer().ok())
        .flatten()
        .map(|layer| {
            layer
                .with_field_prefix(None)
                .with_syslog_identifier(program.into())
        });
    let to_journal = journald.is_some();
    let mut file_error = None;
    let to_file = file.as_ref().and_then(|sink| match open_capped(sink) {
        Ok(writer) => Some(klog_layer(batched(writer, "log-file"))),
        Err(e) => {
            file_error = Some(format!("cannot open log file {}: {e}", sink.path.display()));
            None
        }
    });
    let has_file = to_file.is_some();
    let stderr_too = file.as_ref().is_some_and(|f| f.also_stderr);
    let stderr = (!to_journal && (!has_file || stderr_too))
        .then(|| klog_layer(batched(std::io::stderr(), "log-stderr")));
    let _ = tracing_subscriber::registry()
        .with(env)
        .with(klog)
        .with(journald)
        .with(to_file)
        .with(stderr)
        .try_init();
    if let Some(error) = file_error {
        tracing::warn!("{error}; logging to stderr");
    }
    match (to_journal, &file, has_file) {
        (true, _, _) => "journald".into(),
        (_, Some(sink), true) => sink.path.display().to_string(),
        _ => "stderr".into(),
    }
}

#[cfg(test)]
mod tests;
